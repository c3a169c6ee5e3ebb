"""Writes train.jsonl and test.jsonl beside this file: templated grade-school word problems.

Each row is {"question": ..., "answer": ...} in GSM8K's form: a short worked solution with
<<a*b=c>> calculator annotations, then "#### N". The numbers are drawn with a fixed seed and
every answer is computed here, so the files are the same on every run:
`python -m rlscale.data.gsm8k_style.make` rewrites them (tests check they match).
"""

from __future__ import annotations

import json
import os
import random

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal")
ITEMS = ("apples", "stickers", "marbles", "pencils", "cookies", "cards")
SEED, NUM_TRAIN, NUM_TEST = 8, 64, 24


def _packs(r: random.Random) -> tuple[str, list[str], int]:
  name, item = r.choice(NAMES), r.choice(ITEMS)
  n, k = r.randint(2, 9), r.randint(3, 12)
  total = n * k
  g = r.randint(1, total - 1)
  return (f"{name} buys {n} packs of {item}. Each pack holds {k} {item}. {name} gives away {g} "
          f"{item}. How many {item} does {name} have left?",
          [f"{name} buys {n}*{k} = <<{n}*{k}={total}>>{total} {item}.",
           f"After giving some away, {name} has {total}-{g} = <<{total}-{g}={total - g}>>"
           f"{total - g} {item} left."], total - g)


def _bakery(r: random.Random) -> tuple[str, list[str], int]:
  a, b, p = r.randint(10, 60), r.randint(10, 60), r.randint(2, 9)
  s = a + b
  return (f"A baker makes {a} loaves in the morning and {b} loaves in the afternoon. Each loaf "
          f"sells for ${p}. How many dollars does the baker earn if every loaf is sold?",
          [f"The baker makes {a}+{b} = <<{a}+{b}={s}>>{s} loaves.",
           f"They sell for {s}*{p} = <<{s}*{p}={s * p}>>{s * p} dollars."], s * p)


def _school(r: random.Random) -> tuple[str, list[str], int]:
  c, s = r.randint(3, 12), r.randint(18, 32)
  total = c * s
  f = r.randint(1, 20)
  return (f"A school has {c} classes with {s} students in each class. On Monday {f} students "
          f"are absent. How many students are at school on Monday?",
          [f"The school has {c}*{s} = <<{c}*{s}={total}>>{total} students.",
           f"On Monday {total}-{f} = <<{total}-{f}={total - f}>>{total - f} are at school."],
          total - f)


def _shopping(r: random.Random) -> tuple[str, list[str], int]:
  name, n, p = r.choice(NAMES), r.randint(2, 8), r.randint(2, 9)
  cost = n * p
  m = cost + r.randint(1, 40)
  return (f"{name} has ${m}. {name} buys {n} notebooks that cost ${p} each. How many dollars "
          f"does {name} have left?",
          [f"The notebooks cost {n}*{p} = <<{n}*{p}={cost}>>{cost} dollars.",
           f"{name} has {m}-{cost} = <<{m}-{cost}={m - cost}>>{m - cost} dollars left."],
          m - cost)


def _farm(r: random.Random) -> tuple[str, list[str], int]:
  c, h = r.randint(2, 30), r.randint(2, 40)
  return (f"A farmer has {c} cows and {h} hens. How many legs do the animals have in total?",
          [f"The cows have {c}*4 = <<{c}*4={4 * c}>>{4 * c} legs.",
           f"The hens have {h}*2 = <<{h}*2={2 * h}>>{2 * h} legs.",
           f"Together they have {4 * c}+{2 * h} = <<{4 * c}+{2 * h}={4 * c + 2 * h}>>"
           f"{4 * c + 2 * h} legs."], 4 * c + 2 * h)


def _savings(r: random.Random) -> tuple[str, list[str], int]:
  name, w, n = r.choice(NAMES), r.randint(3, 25), 2 * r.randint(2, 8)
  total = w * n
  return (f"{name} saves ${w} every week. After {n} weeks, {name} spends half of the savings on "
          f"a gift. How many dollars does {name} have left?",
          [f"{name} saves {w}*{n} = <<{w}*{n}={total}>>{total} dollars.",
           f"Half of it is {total}/2 = <<{total}/2={total // 2}>>{total // 2} dollars."],
          total // 2)


def _trip(r: random.Random) -> tuple[str, list[str], int]:
  v, t, w = r.randint(30, 70), r.randint(2, 6), r.randint(5, 40)
  d = v * t
  return (f"A train travels at {v} miles per hour for {t} hours and then {w} more miles. How "
          f"many miles does it travel in total?",
          [f"In {t} hours it travels {v}*{t} = <<{v}*{t}={d}>>{d} miles.",
           f"In total it travels {d}+{w} = <<{d}+{w}={d + w}>>{d + w} miles."], d + w)


TEMPLATES = (_packs, _bakery, _school, _shopping, _farm, _savings, _trip)


def generate(seed: int = SEED) -> tuple[list[dict], list[dict]]:
  """(train rows, test rows), distinct questions, cycling through the templates."""
  r, seen, rows = random.Random(seed), set(), []
  while len(rows) < NUM_TRAIN + NUM_TEST:
    question, steps, answer = TEMPLATES[len(rows) % len(TEMPLATES)](r)
    if question not in seen:
      seen.add(question)
      rows.append({"question": question, "answer": "\n".join(steps) + f"\n#### {answer}"})
  return rows[:NUM_TRAIN], rows[NUM_TRAIN:]


def write(folder: str) -> None:
  for name, rows in zip(("train.jsonl", "test.jsonl"), generate()):
    with open(os.path.join(folder, name), "w") as f:
      f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
  write(os.path.dirname(os.path.abspath(__file__)))
