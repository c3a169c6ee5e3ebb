"""Problems from the user's own files: JSONL, Parquet or a `datasets` save_to_disk folder.

`task.train_files` (comma-separated paths or globs) holds one problem per row: the text in
`task.prompt_field`, the reference in `task.answer_field`. The reference is what follows the last
"####" (GSM8K), else the content of the last \\boxed{...} (MATH; nested braces kept), else the
whole field; the field itself is kept as the worked solution for demonstrations. The held-out set
is `task.eval_files`, or a seeded `task.eval_fraction` of the training rows (then never trained
on). Skipped once, at load, and counted in `data_report` (summary.json's "data"): prompts longer
than `task.max_prompt_len` tokens, rows whose reference is empty (`#### ` with nothing after it,
an empty \\boxed{}), and training rows whose prompt is also a held-out one (whitespace and case
aside), so that the held-out accuracy never scores what was trained on.

Why Hugging Face `datasets` and not grain: the Task contract is random access by a global index
(`problem(i)`, rlscale/tasks/base.py), with the data position one integer in the checkpoint, and
the loop already hands each process its own rows of that one stream (rl_loop.py:
`task.problems(first + rows.start, n)`): sharding is by index, and what is needed is a reader with
random access to rows, not a pipeline. `datasets` is one such reader for the three formats: a
save_to_disk folder is memory-mapped in place; a JSONL or Parquet file is converted once per
process to an Arrow file in a private temporary folder (removed at exit; nothing written to the
user's cache) and memory-mapped from there, so a file larger than memory still works. Only local
paths reach it (resolved and checked here first) and HF_DATASETS_OFFLINE is set: nothing is
downloaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import re
import tempfile
from typing import Any, Mapping

import numpy as np
from absl import logging

from rlscale.config.errors import ConfigError
from rlscale.tasks.base import Problem, Tokenizer
from rlscale.tasks.text import TextTask

SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_EVAL_STREAM = 2**32 - 1  # the held-out draw's seed key; epochs of the stream never reach it
_DEMO_STREAM = 2**32 - 2  # the demonstrations' order (PPO-ptx)
_CALC = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: 48/2 = <<48/2=24>>24
_BOXED = re.compile(r"\\boxed\s*\{")


# --- paths ---
def _is_saved_dataset(path: str) -> bool:
  return os.path.isfile(os.path.join(path, "state.json"))


def _kind(path: str, field: str) -> str:
  if os.path.isdir(path):
    if _is_saved_dataset(path):
      return "saved"
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
      splits = sorted(d for d in os.listdir(path) if _is_saved_dataset(os.path.join(path, d)))
      raise ConfigError(f"{field}: {path!r} holds several splits {splits}; name one split's "
                        f"folder (e.g. {os.path.join(path, splits[0] if splits else 'train')!r})")
    raise ConfigError(f"{field}: {path!r} is a folder but not a `datasets` save_to_disk folder "
                      f"(no state.json); for a folder of files use a glob such as "
                      f"{os.path.join(path, '*.jsonl')!r}")
  ext = os.path.splitext(path)[1].lower()
  if ext not in SUFFIXES:
    raise ConfigError(f"{field}: {path!r} has the unknown extension {ext or '(none)'!r}; "
                      f"known: {sorted(SUFFIXES)} or a `datasets` save_to_disk folder")
  return SUFFIXES[ext]


def resolve(spec: str, field: str) -> list[str]:
  """The files of a comma-separated list of paths or globs, each pattern's matches sorted;
  ConfigError (naming `field`) for an empty list, a pattern without matches, a missing path or
  an unknown extension."""
  if not isinstance(spec, str) or not spec.strip():
    raise ConfigError(f"{field}={spec!r} must name one or more files (comma-separated paths or "
                      f"globs)")
  paths: list[str] = []
  for part in (p.strip() for p in spec.split(",")):
    if not part:
      continue
    part = os.path.expanduser(part)
    if glob.has_magic(part):
      found = sorted(glob.glob(part))
      if not found:
        raise ConfigError(f"{field}: the pattern {part!r} matches no file")
      paths += found
    elif not os.path.exists(part):
      raise ConfigError(f"{field}: {part!r} does not exist (current directory {os.getcwd()!r})")
    else:
      paths.append(part)
  for p in paths:
    _kind(p, field)
  return paths


def check(cfg: Mapping[str, Any]) -> list[str]:
  """The errors of a files task's fields that need no reading: the fields named, the paths
  there, the held-out split chosen (the resolve step reports them before any compute)."""
  errors = []
  for f in ("prompt_field", "answer_field"):
    if not isinstance(cfg[f], str) or not cfg[f]:
      errors.append(f"task.{f}={cfg[f]!r} must name a column of the files")
  checks = [lambda: resolve(cfg["train_files"], "task.train_files"),
            lambda: _check_split(cfg["eval_files"], cfg["eval_fraction"])]
  if cfg["eval_files"]:
    checks.append(lambda: resolve(cfg["eval_files"], "task.eval_files"))
  for c in checks:
    try:
      c()
    except ConfigError as e:
      errors.append(str(e))
  return errors


# --- answers and demonstrations ---
def last_boxed(text: str) -> str | None:
  """The content of the last \\boxed{...} with balanced braces, else None."""
  for m in reversed(list(_BOXED.finditer(text))):
    depth, start = 1, m.end()
    for i in range(start, len(text)):
      depth += {"{": 1, "}": -1}.get(text[i], 0)
      if depth == 0:
        return text[start:i].strip()
  return None


def reference_answer(solution: str) -> str:
  """GSM8K's "... #### 72" -> "72"; MATH's last \\boxed{...}; else the text stripped."""
  if "####" in solution:
    return solution.rsplit("####", 1)[1].strip()
  boxed = last_boxed(solution)
  return boxed if boxed is not None else solution.strip()


def demonstration_text(solution: str, answer: str) -> str:
  """A worked solution ending in \\boxed{answer}: GSM8K's "#### x" line becomes "The final
  answer is \\boxed{x}." (its <<...>> calculator annotations dropped), a MATH solution stays as
  it is, and a field that is only the answer gives \\boxed{answer}."""
  if "####" in solution:
    work = _CALC.sub("", solution.rsplit("####", 1)[0]).strip()
    final = f"The final answer is \\boxed{{{answer}}}."
    return f"{work}\n{final}" if work else final
  if last_boxed(solution) is not None:
    return solution.strip()
  return f"\\boxed{{{answer}}}"


def _answer_value(v: Any) -> str | None:
  """An answer cell as text: strings, and integers or finite floats written as numbers."""
  if isinstance(v, str):
    return v if v.strip() else None
  if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
    if not np.isfinite(v):
      return None
    return str(int(v)) if float(v).is_integer() else str(v)
  return None


# --- reading ---
@contextlib.contextmanager
def _quiet_datasets():
  """`datasets` offline and without progress bars, its earlier state restored after."""
  os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
  import datasets
  was_on = datasets.is_progress_bar_enabled()
  datasets.disable_progress_bars()
  try:
    yield datasets
  finally:
    if was_on:
      datasets.enable_progress_bars()


def _read(path: str, field: str, cache_dir: str):
  """One file or save_to_disk folder as a memory-mapped `datasets.Dataset`."""
  kind = _kind(path, field)
  if kind != "saved" and os.path.getsize(path) == 0:
    raise ConfigError(f"{field}: {path!r} is empty")
  with _quiet_datasets() as datasets:
    try:
      if kind == "saved":
        ds = datasets.load_from_disk(path)
      elif kind == "json":
        ds = datasets.Dataset.from_json(path, cache_dir=cache_dir)
      else:
        ds = datasets.Dataset.from_parquet(path, cache_dir=cache_dir)
    except Exception as e:  # malformed files raise anything from pyarrow or json
      if kind == "json" and _blank(path):
        raise ConfigError(f"{field}: {path!r} holds no rows (only blank lines)") from None
      raise ConfigError(f"{field}: {path!r} cannot be read as {kind} "
                        f"({type(e).__name__}: {str(e)[:300]})") from None
  if not isinstance(ds, datasets.Dataset):
    raise ConfigError(f"{field}: {path!r} is not one `datasets.Dataset` ({type(ds).__name__})")
  return ds


@dataclasses.dataclass
class _Source:
  path: str
  data: Any  # a datasets.Dataset of the prompt and answer columns
  questions: list[str]  # read once at load, dropped after the prompts are measured
  answers: list[str]  # likewise: the answer cells as text


def _blank(path: str) -> bool:
  with open(path, "rb") as f:
    return not any(line.strip() for line in f)


def _column(ds, path: str, field: str, which: str, as_text) -> list[str]:
  """Every cell of a column as text, read once; an error naming the first row that has none."""
  try:
    values = list(ds[field])
  except UnicodeDecodeError:  # a row's bytes are not UTF-8: find it to name it
    for i in range(len(ds)):
      try:
        ds[i]
      except UnicodeDecodeError as e:
        raise ConfigError(f"task.{which}_field={field!r}: {path!r} row {i} is not valid UTF-8 "
                          f"({e.reason} at byte {e.start} of a cell); fix or drop it") from None
    raise
  out = [as_text(v) for v in values]
  bad = [i for i, v in enumerate(out) if v is None]
  if bad:
    raise ConfigError(
        f"task.{which}_field={field!r}: {path!r} row {bad[0]} holds {values[bad[0]]!r:.80}, not "
        f"non-empty text ({len(bad)} of {len(values)} rows are missing, empty or not text; "
        f"drop or fix them)")
  return out


def _load_source(path: str, field: str, fields: tuple[str, str], cache_dir: str) -> _Source:
  ds = _read(path, field, cache_dir)
  missing = [f for f in fields if f not in ds.column_names]
  if missing:
    which = "prompt" if missing[0] == fields[0] else "answer"
    raise ConfigError(f"task.{which}_field={missing[0]!r} is not a column of {path!r}; its "
                      f"columns: {ds.column_names}")
  ds = ds.select_columns(list(dict.fromkeys(fields)))
  text = lambda v: v if isinstance(v, str) and v.strip() else None
  questions = _column(ds, path, fields[0], "prompt", text)
  answers = _column(ds, path, fields[1], "answer", _answer_value)  # every answer is text
  return _Source(path, ds, questions, answers)


class _Files:
  """The rows of several files as one sequence, by global row number."""

  def __init__(self, sources: list[_Source]):
    self.sources = sources
    self.starts = np.cumsum([0] + [len(s.questions) for s in sources])

  def __len__(self) -> int:
    return int(self.starts[-1])

  def questions(self) -> list[str]:
    return [q for s in self.sources for q in s.questions]

  def empty_references(self) -> np.ndarray:
    """Whether each row's reference (what its answer cell grades against) is empty: `#### `
    with nothing after it, an empty \\boxed{}."""
    return np.asarray([not reference_answer(a) for s in self.sources for a in s.answers], bool)

  def problem(self, row: int, fields: tuple[str, str]) -> Problem:
    k = int(np.searchsorted(self.starts, row, side="right")) - 1
    source, local = self.sources[k], int(row - self.starts[k])
    record = source.data[local]
    solution = _answer_value(record[fields[1]])
    return Problem(record[fields[0]], reference_answer(solution),
                   meta={"solution": solution, "file": source.path, "row": local})


def _normal(text: str) -> str:
  """A prompt as the overlap check compares it: whitespace collapsed, case folded."""
  return " ".join(text.split()).casefold()


def _check_split(eval_files: str, fraction) -> None:
  if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
      or not 0 <= fraction < 1):
    raise ConfigError(f"task.eval_fraction={fraction!r} must be a number in [0, 1)")
  if not eval_files and not fraction:
    raise ConfigError("task.eval_files is empty and task.eval_fraction=0: the files task needs "
                      "a held-out set; set task.eval_files (paths or globs) or task.eval_fraction "
                      "(e.g. 0.05 of the training rows)")


class FileTask(TextTask):
  """Problems from `task.train_files`, in a seeded shuffle epoch after epoch (TextTask's order)
  over the rows that fit; the held-out set from `task.eval_files` or `task.eval_fraction`.

  `data_report` holds, per split, the rows read, held out, skipped as too long and used.
  """

  def __init__(self, cfg: Mapping[str, Any], tokenizer: Tokenizer):
    super().__init__(cfg, tokenizer)
    self.fields = (str(cfg["prompt_field"]), str(cfg["answer_field"]))
    eval_files, fraction = cfg["eval_files"] or "", cfg["eval_fraction"]
    _check_split(eval_files, fraction)
    if eval_files and fraction:
      logging.warning("task.eval_files is set: task.eval_fraction=%s is ignored", fraction)
    self._cache = tempfile.TemporaryDirectory(prefix="rlscale-files-")  # removed with the task
    self._train = self._load(cfg["train_files"], "task.train_files")
    held = self._load(eval_files, "task.eval_files") if eval_files else self._train
    train_len = self._measure(self._train)
    held_len = train_len if held is self._train else self._measure(held)
    # The held-out draw: a seeded order of the held-out candidates (all of eval_files, or the
    # first eval_fraction of the training rows in it); the set is its first num_eval that fit.
    draw = np.random.default_rng([self.seed, _EVAL_STREAM]).permutation(len(held))
    train_rows = np.arange(len(self._train))
    if held is self._train:
      k = max(1, int(round(fraction * len(train_rows))))
      if k >= len(train_rows):
        raise ConfigError(f"task.eval_fraction={fraction} holds out all {len(train_rows)} rows "
                          f"of task.train_files; use a smaller fraction or task.eval_files")
      train_rows, draw = np.sort(draw[k:]), draw[:k]
    # Rows whose reference is empty would score every response 0: counted and skipped.
    held_answered = draw[~held.empty_references()[draw]]
    fit = self._fitting(held_answered, held_len, "held-out")
    eval_rows = np.sort(fit[:self.num_eval])
    self._eval = [held.problem(int(r), self.fields) for r in eval_rows]
    answered = train_rows[~self._train.empty_references()[train_rows]]
    # A training prompt that is also a held-out one (by its text, whitespace and case aside)
    # would be scored on what it trained on: removed from training, and counted.
    held_q = held.questions()
    evaluated = {_normal(held_q[r]) for r in eval_rows}
    train_q = self._train.questions()
    unseen = answered[[_normal(train_q[r]) not in evaluated for r in answered]]
    self._train_rows = self._fitting(unseen, train_len, "training")
    self._train_size = len(self._train_rows)
    self.data_report = {
        "max_prompt_len": self.max_prompt_len,
        "train": {"files": [s.path for s in self._train.sources], "rows": len(self._train),
                  "held_out": len(self._train) - len(train_rows),
                  "empty_answer": len(train_rows) - len(answered),
                  "also_held_out": len(answered) - len(unseen),
                  "too_long": len(unseen) - self._train_size, "used": self._train_size},
        "eval": {"files": [s.path for s in held.sources], "rows": len(draw),
                 "empty_answer": len(draw) - len(held_answered),
                 "too_long": len(held_answered) - len(fit), "used": len(self._eval)}}
    for s in self._train.sources + held.sources:
      s.questions, s.answers = [], []  # measured: rows are read from the mapped tables from now
    logging.info("task files: %s", self.data_report)
    skipped = [f"{split}.{what}={n}" for split in ("train", "eval")
               for what, n in self.data_report[split].items()
               if what in ("empty_answer", "also_held_out") and n]
    if skipped:
      logging.warning("task files: rows skipped (%s): an empty reference scores every response "
                      "0; a training prompt that is also held out would be scored on what it "
                      "trained on", ", ".join(skipped))

  def _load(self, spec: str, field: str) -> _Files:
    paths = resolve(spec, field)
    out = _Files([_load_source(p, field, self.fields, self._cache.name) for p in paths])
    if not len(out):
      raise ConfigError(f"{field}: {', '.join(paths)} hold no rows")
    return out

  def _measure(self, files: _Files) -> np.ndarray:
    """Every row's prompt length in tokens (template included), measured once."""
    return np.asarray(self.prompt_lengths([Problem(q, "") for q in files.questions()]), np.int64)

  def _fitting(self, rows: np.ndarray, lengths: np.ndarray, split: str) -> np.ndarray:
    """The rows whose prompts fit max_prompt_len, in their order; an error when none does."""
    if not len(rows):
      raise ConfigError(f"task: no {split} row is left: every one has an empty reference "
                        f"answer{' or is a held-out prompt' if split == 'training' else ''}")
    fit = rows[lengths[rows] <= self.max_prompt_len]
    if not len(fit):
      raise ConfigError(
          f"task.max_prompt_len={self.max_prompt_len}: none of the {len(rows)} {split} prompts "
          f"fits (they have {lengths[rows].min()} to {lengths[rows].max()} tokens with the "
          f"template); raise task.max_prompt_len")
    return fit

  # --- the Task contract ---
  def _train_item(self, i: int) -> Problem:
    return self._train.problem(int(self._train_rows[i]), self.fields)

  def problem(self, index: int) -> Problem:
    """Row `index` of the seeded shuffle, epoch after epoch; every row fits (checked at load)."""
    n = self._train_size
    return self._train_item(int(self._order(index // n)[index % n]))

  def eval_problems(self) -> list[Problem]:
    return list(self._eval)

  def demonstration(self, problem: Problem) -> str:
    meta = problem.meta if isinstance(problem.meta, dict) else {}
    return demonstration_text(meta.get("solution") or problem.answer, problem.answer)


def demonstration_pairs(cfg: Mapping[str, Any], task: TextTask) -> list[tuple[Problem, str]]:
  """(problem, demonstration text) of every row of `task.demo_files` whose prompt fits
  `task.max_prompt_len` (PPO-ptx, rl/ptx.py), in a seeded order; the prompt in
  `task.prompt_field`, the response as written in `task.demo_field`. Rows read at once: a
  demonstration set is small next to the model."""
  if not isinstance(task, TextTask):
    raise ConfigError(f"task.demo_files needs a task on text (files, tfds_math, reasoning_gym), "
                      f"not task.name={cfg['name']!r}; leave it empty for the task's own")
  fields = (str(cfg["prompt_field"]), str(cfg["demo_field"]))
  with tempfile.TemporaryDirectory(prefix="rlscale-demos-") as cache:
    found = _Files([_load_source(p, "task.demo_files", fields, cache)
                    for p in resolve(cfg["demo_files"], "task.demo_files")])
    rows = [found.problem(i, fields) for i in range(len(found))]
  pairs = [(Problem(p.question, "", p.meta), p.meta["solution"]) for p in rows]
  lengths = task.prompt_lengths([p for p, _ in pairs])
  fit = [pair for pair, n in zip(pairs, lengths) if n <= task.max_prompt_len]
  logging.info("task.demo_files: %d rows, %d with prompts over max_prompt_len=%d skipped",
               len(pairs), len(pairs) - len(fit), task.max_prompt_len)
  if not fit:
    raise ConfigError(f"task.demo_files: no prompt of its {len(pairs)} rows fits "
                      f"task.max_prompt_len={task.max_prompt_len}")
  order = np.random.default_rng([int(cfg["seed"]), _DEMO_STREAM]).permutation(len(fit))
  return [fit[i] for i in order]
