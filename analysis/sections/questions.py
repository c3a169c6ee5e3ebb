"""The questions the project started from (the Hunyuan study of
GRPO/PPO batch size), each marked from this study's numbers: *reproduced*, *not reproduced*
(with the interval that says so), *not settled* (the interval straddles the line, or misses it
with too little coverage to rule anything out), *not testable here* (the study's data cannot
tell the claim from its alternative) or *not testable on a CPU* (with the command that tests
it on a GPU).

Each mark reads what the other sections measured; the marks are mechanical and their rule is
printed beside them, so a reader can disagree with the rule, not with the arithmetic. An
interval rules a value out only when its coverage is at least MIN_COVERAGE (`rules_out`); the
interval is printed with its seeds and coverage wherever a claim rests on what it excludes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import series as se
from analysis import study_table as st
from analysis.report_md import iv, num
from analysis.sections.types import Section

MIN_COVERAGE = 0.9  # an interval of less coverage that misses a value only suggests
COVERAGE_RULE = (f"an interval rules a value out only when its coverage (printed with its "
                 f"seeds: n=seeds, coverage) is at least {MIN_COVERAGE:.0%}; one of lower "
                 "coverage that misses a value only suggests it, and the claim is *not "
                 "settled*")


def rules_out(coverage: float) -> bool:
  """Whether an interval of this coverage (of the true value: exact, simulated, or a fit's
  nominal level) may be said to exclude the values it misses (NaN: unknown, it may not)."""
  return bool(coverage >= MIN_COVERAGE)


def _low(q) -> str:
  """' (coverage 75% < 90%: it only suggests)' for an interval too weak to rule out."""
  cov = "unknown" if math.isnan(q.coverage) else f"{q.coverage:.0%}"
  return f"its coverage {cov} (n={q.n}) is below {MIN_COVERAGE:.0%}: it only suggests"


GPU_STUDY = ("python launch/study.py --study=configs/studies/chain_sum_cpu.py "
             "--workdir=runs/study-gpu --parallel=1   # on a GPU machine")
GPU_GENERATION = ("python benchmarks/generation_scaling.py --batches=64,128,256,512,1024,2048 "
                  "--new_tokens=64   # on a GPU: tokens/s against the generation batch")
GPU_SCALING = ("python benchmarks/scale_validation.py --published_only; python "
               "launch/main.py --config=configs/grpo_math.py --config.mesh.shape='(-1,1,1)'   "
               "# on 1, 2, 4, 8 GPUs: time per step against chips")


def _chosen_rows(done: dict, kind: str) -> pd.DataFrame | None:
  """The invariance rows of the kind's chosen-lr series without dynamic sampling (series.py:
  named after the rule that chose it)."""
  sec = done.get("invariance")
  rows = sec.facts.get("rows") if sec else None
  if rows is None:
    return None
  names = [n for n in rows[rows.kind == kind].series.unique()
           if se.is_chosen(n) and se.is_plain(n)]
  r = rows[(rows.kind == kind) & (rows.series == names[0])] if names else rows.iloc[:0]
  return r if len(r) else None


def q_range(study: st.Study, done: dict) -> dict:
  """GRPO at G = 8: invariant over a 16x range of P with the lr adjusted, deviating beyond.
  Read from the chosen-lr series' bracket (analysis/bracket.py): reproduced when it is settled
  invariant over 16x from the reference, not reproduced when a batch within 16x of it is
  settled broken; where the bracket leaves it open, from the joint fit of E(B) over every batch
  (analysis/joint_fit.py), said to rest on its law; else not settled (with what more seeds
  would take)."""
  rows = _chosen_rows(done, "grpo")
  claim = ("GRPO (G = 8): curves against responses align from P = 64 to P = 1024 (16×) with the "
           "lr adjusted; P = 2048 and 4096 deviate")
  if rows is None:
    return dict(claim=claim, mark="not tested", why="no GRPO chosen-lr series in this study")
  sec = done.get("invariance")
  b = (sec.facts.get("brackets") or {}).get(("grpo", rows.series.iloc[0])) if sec else None
  b0 = int(rows[rows.is_reference].B.iloc[0])
  if b is None:
    return dict(claim=claim, mark="not settled", why="no bracket: the reference never reached "
                "the target in the median")
  x, y, hi = b["x"], b["y"], int(rows.B.max())
  text = f"{b['text']} (reference B = {b0})"
  if y is not None and y < 16 * b0:
    return dict(claim=claim, mark="not reproduced",
                why=f"{text}: a batch within 16× of the reference is settled broken")
  if x >= 16 * b0:
    return dict(claim=claim, mark="reproduced",
                why=f"{text}: settled invariant over {x // b0}× from the reference" + (
                    "" if y is not None else f"; whether it deviates beyond B = {hi} is not "
                    "tested"))
  j = b.get("joint")
  if j is not None and j["identified"]:  # the joint fit, where the per-batch bracket is open
    law = (f"{text}; the joint fit of E(B) = E_min (1 + B/B_crit) over every batch's seeds: "
           f"invariant up to B = {j['invariant_up_to']}"
           + ("" if j["broken_from"] is None else f", broken from B = {j['broken_from']}"))
    if j["broken_from"] is not None and j["broken_from"] < 16 * b0:
      return dict(claim=claim, mark="not reproduced",
                  why=f"{law}: under the law a batch within 16× of the reference is broken")
    if j["invariant_up_to"] >= 16 * b0:
      return dict(claim=claim, mark="reproduced",
                  why=f"{law}: under the law, invariant over "
                      f"{j['invariant_up_to'] // b0}× from the reference")
  p = b.get("power")
  more = (f"; at the measured spread {b['sigma']:.2f}, {p['seeds_invariant_1.0']} seeds a side "
          f"would settle a truly invariant batch at 80% ({b['n']} here)" if p else "")
  span = (f"settled invariant up to {x // b0}× it" if x > b0 else
          "no batch above it settled invariant")
  if j is not None and j["identified"]:
    span += (f" (the joint fit: invariant up to B = {j['invariant_up_to']}"
             + ("" if j["broken_from"] is None else f", broken from B = {j['broken_from']}")
             + ", short of 16×)")
  return dict(claim=claim, mark="not settled",
              why=f"{text}: the range tried reaches {hi // b0}× the reference, {span}" + more)


def q_fixed(study: st.Study, done: dict) -> dict:
  claim = "Keeping the lr fixed breaks invariance: 1.5–1.67× more responses to target"
  sec = done.get("learning_rate")
  d = (sec.facts.get("fixed_cost") or {}).get("grpo") if sec else None
  if d is None or d.empty:
    return dict(claim=claim, mark="not tested", why="no fixed-lr runs beside best-lr ones")
  b0 = float(study.runs[study.runs.kind == "grpo"].B0.dropna().mode().iloc[0])
  far = d.loc[(np.log(d.B.astype(float)) - math.log(b0)).abs().idxmax()]
  q = far.ratio
  text = f"at B = {far.B} (farthest from B0 = {b0:g}): {iv(q, '×')}"
  if not q.has_bounds:
    return dict(claim=claim, mark="not settled", why=text + " (no interval)")
  strong = rules_out(q.coverage)
  if q.lo <= 1.67 and q.hi >= 1.5 and q.lo > 1:
    if not strong:
      return dict(claim=claim, mark="not settled", why=text + " (the interval meets 1.5–1.67 "
                  f"and misses 1, but {_low(q)} a cost)")
    return dict(claim=claim, mark="reproduced", why=text + " (the interval meets 1.5–1.67 and "
                "excludes 1)")
  if q.hi < 1.5 or q.lo > 1.67:
    if not strong:
      return dict(claim=claim, mark="not settled", why=text + " (the interval misses "
                  f"1.5–1.67, but {_low(q)} another cost)")
    return dict(claim=claim, mark="not reproduced", why=text + " (the interval misses "
                "1.5–1.67)" + (": a fixed lr costs nothing measurable here" if q.lo <= 1 else
                               ""))
  return dict(claim=claim, mark="not settled", why=text + " (the interval includes 1 and "
              "1.5–1.67)")


def q_pairs(study: st.Study, done: dict) -> dict:
  claim = "Equal P×G gives similar curves: (128, 8) ≈ (64, 16)"
  sec = done.get("pairs")
  d = sec.facts.get("pairs") if sec else None
  if d is None:
    return dict(claim=claim, mark="not tested", why="no configurations of equal P×G")
  qs = [(r.configuration, r.q) for r in d.itertuples() if r.q is not None]
  misses = [(c, q) for c, q in qs if q.has_bounds and not q.lo <= 1 <= q.hi]
  differ = [(c, q) for c, q in misses if rules_out(q.coverage)]
  text = "; ".join(f"{c}: {iv(q, '×')}" for c, q in qs)
  if differ:
    return dict(claim=claim, mark="not reproduced", why=text + " (an interval excludes 1)")
  if misses:
    return dict(claim=claim, mark="not settled", why=text + " (an interval misses 1, but "
                f"{_low(misses[0][1])} a difference)")
  if all(q.has_bounds for _, q in qs):
    return dict(claim=claim, mark="reproduced", why=text + " (every interval includes 1)")
  return dict(claim=claim, mark="not settled", why=text)


def q_actor_critic(study: st.Study, done: dict) -> dict:
  claim = ("PPO: the actor's gradient norm falls with the batch; the critic's stays flat and "
           "noisy: actor and critic may need different batches")
  sec = done.get("actor_critic")
  rows = {r["model"]: r for r in (sec.facts.get("rows") or []) if r["kind"] == "ppo"} \
      if sec else {}
  if not {"actor", "critic"} <= set(rows):
    return dict(claim=claim, mark="not tested", why="no PPO grad norms at two or more batches")
  a, c = rows["actor"]["power"], rows["critic"]["power"]
  text = (f"actor ∝ B^{num(a['exponent'])} [{num(a['exponent_lo'])}, {num(a['exponent_hi'])}]"
          f", critic ∝ B^{num(c['exponent'])} [{num(c['exponent_lo'])}, "
          f"{num(c['exponent_hi'])}] (nominal 95% intervals of the log-log fit over "
          f"{rows['actor']['runs']} and {rows['critic']['runs']} runs at "
          f"{rows['actor']['batches']} batches)")
  if not (math.isfinite(a["exponent_hi"]) and math.isfinite(c["exponent_hi"])):
    return dict(claim=claim, mark="not settled", why=text + " (too few batches for intervals)")
  signal = {m: rows[m]["fit"].get("grad_sq_true_interval") for m in ("actor", "critic")}
  if all(iv_ is not None and iv_[0] <= 0 <= iv_[1] for iv_ in signal.values()):
    # No gradient signal measured for either model: at every batch tried both norms are
    # noise (|g| ∝ B^-1/2 whatever the model), so nothing here can show one flat and one not.
    return dict(claim=claim, mark="not testable here",
                why=text + "; every |G|² interval includes 0 (actor [" + ", ".join(
                    num(v) for v in signal["actor"]) + "], critic [" + ", ".join(
                    num(v) for v in signal["critic"]) + "]): at every batch tried both "
                "gradients are noise-dominated, so the test of a flat against a falling norm "
                "has no power at this scale (it needs batches near B_simple, where the signal "
                "shows)")
  falls = a["exponent_hi"] < 0
  flat = (c["exponent_lo"] <= 0 <= c["exponent_hi"]
          or abs(c["exponent"]) <= abs(a["exponent"]) / 3)
  rule = " (rule: the actor's interval below 0; the critic's includes 0 or its slope is at "\
         "most a third of the actor's)"
  if falls and flat:
    return dict(claim=claim, mark="reproduced", why=text + rule)
  if not falls and a["exponent_lo"] >= 0:
    return dict(claim=claim, mark="not reproduced", why=text + " (the actor's norm does not "
                "fall)" + rule)
  if falls and not flat:
    return dict(claim=claim, mark="not reproduced", why=text + " (the critic's norm falls "
                "about as fast)" + rule)
  return dict(claim=claim, mark="not settled", why=text + " (the actor's interval reaches 0)"
              + rule)


def _platforms(study: st.Study) -> set:
  return {str(r.summary.get("platform", "unknown")) for r in study.records.values()}


def q_not_on_cpu(study: st.Study, claim: str, command: str, seen: str = "") -> dict:
  """A claim about accelerators: on a CPU-only study, what the CPU shows (`seen`) and the GPU
  command that tests the claim itself."""
  plats = _platforms(study)
  if plats <= {"cpu", "unknown"}:
    return dict(claim=claim, mark="not testable on a CPU",
                why=(seen + "; " if seen else "") + "the claim's mechanism (memory-bound decoding"
                    " of large batches on an accelerator, chips to add) is not on this machine; "
                    f"on a GPU: `{command}`")
  return dict(claim=claim, mark="measured on " + ", ".join(sorted(plats)),
              why="see the timing section")


def _timing_seen(done: dict) -> str:
  """What the timing section measured on the CPU, in one clause."""
  sec = done.get("timing")
  rows = (sec.facts.get("rows") or []) if sec else []
  power = (sec.facts.get("gen_power") or {}) if sec else {}
  parts = [f"{r['kind']} generation ∝ N^{r['gen_exponent']}, training ∝ tokens^"
           f"{r.get('train_exponent', '—')}" for r in rows if "gen_exponent" in r]
  if not parts:
    return ""
  sub = [k for k, p in power.items() if p.get("exponent_hi", np.inf) < 1]
  return (f"on this CPU (N = the study's {_batch_range(done)} responses per step): "
          + "; ".join(parts)
          + (f"; {', '.join(sub)} generation is sublinear here from the fixed per-call "
             "overhead of small batches, not from memory-bound decoding" if sub else ""))


def _batch_range(source) -> str:
  """The study's batches (responses per optimizer step) as 'lo-hi', from its runs (a Study) or
  the timing section's (a dict of sections); 'its' when unknown."""
  runs = getattr(source, "runs", None)
  if runs is None or "B" not in getattr(runs, "columns", ()):
    sec = source.get("timing") if isinstance(source, dict) else None
    lo_hi = (sec.facts.get("batches") if sec else None) or ()
  else:
    b = pd.to_numeric(runs.B, errors="coerce").dropna()
    lo_hi = (int(b.min()), int(b.max())) if len(b) else ()
  return f"{lo_hi[0]}-{lo_hi[1]}" if lo_hi else "its"


def questions(study: st.Study, table: pd.DataFrame, done: dict | None = None) -> Section:
  sec = Section("The questions the project started from", lead=True)
  done = done or {}
  marks = [q_range(study, done), q_fixed(study, done), q_pairs(study, done),
           q_actor_critic(study, done),
           q_not_on_cpu(study, "Generation time grows sublinearly with the batch (PPO 256 → "
                        "1024 responses: 39 → 68 s); training time linearly", GPU_GENERATION,
                        _timing_seen(done)),
           q_not_on_cpu(study, "With the adjusted lr, P = 512 and 1024 cut time to target to "
                        "0.74× and 0.71× of P = 128 (a throughput gain)", GPU_STUDY),
           q_not_on_cpu(study, "How time per step changes with the number of chips (all-reduce "
                        "cost, idle time)", GPU_SCALING)]
  sec.text.append("Each claim of the reference study against this study: "
                  "*reproduced* when the interval agrees with it, *not reproduced* when the "
                  "interval rules it out, *not settled* when it straddles the line or misses it "
                  "with too little coverage, *not testable* here when this study's data cannot "
                  "tell the claim from its alternative, or on a CPU when the claim's mechanism "
                  f"needs an accelerator (with the command that tests it). Rule: "
                  f"{COVERAGE_RULE}. The study's scale (batches of {_batch_range(study)} "
                  "responses, its model's) is far below the claims' (a 30B MoE, 512-32k "
                  "responses): agreement is in kind, not in size.")
  sec.facts["marks"] = marks
  for m in marks:
    sec.verdict.append(f"*{m['mark']}*: {m['claim']} — {m['why']}.")
  return sec
