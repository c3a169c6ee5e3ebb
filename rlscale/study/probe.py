"""A critical-batch probe: branches of a run at several batches (launch/cbs_probe.py).

From the checkpoint of step S of a run (`init.branch_from`, `init.branch_step`), one branch per
batch B (P = B / G prompts of the run's G responses), rate and seed, each a sweep point of
`configs/branch.py:RUN_DIR` (the run's own config) in `<probe dir>/step_<S>/`: resumable,
listed in that directory's sweep.json, run by the local, Slurm or XManager launcher. Every
branch generates the same `responses` and scores the held-out set at `evals` marks, by its
reference responses' likelihood (eval.reference) or by a study's accuracy (`metric`, METRICS):
analysis/probe.py reads the critical batch from them.

- Rates: each batch runs `rates` learning rates a factor sqrt(2) apart, centred on the rate
  the rule under test gives it (`optim.lr_scaling`, anchored at the run's batch and rate unless
  told another anchor), so that E at each batch is read at that batch's own best rate; with
  `rates=1`, the rule's rate alone (the report then asks whether E follows the rule). With
  `rates_from` (a study's directory), each batch's rates are centred on the rate that study
  chose for its P instead: the study's own rate policy, for a probe read like for like with it.
- Target: by default analysis/probe.py reads E at a gain relative to the branches' own; with
  `target` (a study's), E is the responses to that value, as the study reads it, and each
  branch stops at its first evaluation past 1.25 x its crossing (the study's stop).
- Optimizer state: `optimizer="fresh"` (default) starts each branch's Adam moments empty, as
  every run's are: the parent's first moment is its recent direction at its own batch, and its
  second moment (beta2 = 0.99-0.999: 100-1,000 steps of memory, longer than any branch) the
  size of its own batch's gradient noise, so a branch that kept them would be partly a
  continuation at the parent's batch. "parent" keeps them (optim.branched).
- Length: a branch runs at least 1 / (1 - beta1) steps of the largest batch with a fresh state
  (Adam's start-up, the momentum's memory) and 3 / (1 - beta1) with the parent's (to forget
  it); by default twice that minimum.

Sizes the branches need are derived, not asked for: the micro-batch ('auto', the batch plan's),
the length, checkpoints about four times a branch (a killed branch resumes), the evaluation
spacing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError

SWEEP = "cbs_probe"
RULES = ("none", "sqrt", "linear")
OPTIMIZER = ("fresh", "parent")  # init.branch_optimizer
RATE_STEP = math.sqrt(2)  # between the rates a batch scans
# The shortest branch, in optimizer steps of the largest batch, as a multiple of Adam's first-
# moment memory 1 / (1 - beta1): with a fresh state, its start-up; with the parent's, enough
# steps that the parent's momentum has decayed to 0.9^30 = 4%.
MEMORIES = {"fresh": 1, "parent": 3}
STOP_MARGIN = 0.25  # with a target: a branch stops at 1.25 x its responses to it (the study's)
# The held-out metric a branch's progress is read from, and the evaluation that scores it: the
# reference responses' likelihood (smooth: few evaluations resolve a small gain), or a study's
# accuracies (eval/accuracy_sampled: the policy's expected reward, the CPU study's metric), so
# that a probe and a study can be compared on one metric.
METRICS = {
    "eval/reference_prob": {"eval.reference": True, "eval.greedy": False, "eval.sampled": False},
    "eval/accuracy_sampled": {"eval.reference": False, "eval.greedy": False, "eval.sampled": True},
    "eval/accuracy_greedy": {"eval.reference": False, "eval.greedy": True, "eval.sampled": False},
}


@dataclasses.dataclass(frozen=True)
class Probe:
  run_dir: str  # the run to branch (its config.json and checkpoints/)
  steps: tuple[int, ...]  # branch points: steps whose checkpoints the run kept
  batches: tuple[int, ...]  # B, responses per optimizer step, each a multiple of G
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
  responses: int = 0  # per branch; 0: twice the shortest length (MEMORIES)
  evals: int = 16  # evaluations per branch (and one at the branch point)
  rates: int = 5  # learning rates per batch, RATE_STEP apart, centred on the rule's
  optimizer: str = "fresh"  # the branches' optimizer state: fresh | parent
  lr_scaling: str = "sqrt"  # the rule the rates are centred on: none | sqrt | linear
  # The rule's anchor: `lr` at `reference_batch` responses per optimizer step; 0: the run's
  # own B and effective rate (the run's batch then trains at the run's rate).
  lr: float = 0.0
  reference_batch: int = 0
  probe_dir: str = ""  # default <run_dir>/probe
  metric: str = "eval/reference_prob"  # a branch's progress (METRICS)
  # A study's directory (its study.json): each batch's rates centred on the rate that study
  # chose for its P (the stage `<kind>_lr`), not on a rule's: the study's own rate policy.
  rates_from: str = ""
  # The value of `metric` to reach (0: `gain` of the least median gain, analysis/probe.py): a
  # study's target, so that E is read as the study reads it; branches then stop at their first
  # evaluation past STOP_MARGIN beyond their crossing, as the study's runs do.
  target: float = 0.0

  @property
  def dir(self) -> str:
    return self.probe_dir or os.path.join(self.run_dir, "probe")

  @property
  def config(self) -> str:
    return "configs/branch.py:" + os.path.abspath(self.run_dir)

  def step_dir(self, step: int) -> str:
    return os.path.join(self.dir, f"step_{step}")


def parent_config(run_dir: str) -> dict:
  """The parent run's config, as this code reads it (config/files.run_config)."""
  try:
    return config_files.run_config(run_dir)
  except FileNotFoundError as e:
    raise ConfigError(str(e)) from e


def kept_steps(run_dir: str) -> list[int]:
  folder = os.path.join(run_dir, "checkpoints")
  return sorted(int(s) for s in os.listdir(folder) if s.isdigit()) if os.path.isdir(folder) else []


def check(p: Probe) -> dict:
  """The parent's config, once everything the probe asks for is possible; a ConfigError
  naming each problem otherwise."""
  cfg = parent_config(p.run_dir)
  errors = []
  if cfg.get("kind") == "sft" or "rl" not in cfg:
    raise ConfigError(f"{p.run_dir} is an SFT run: the probe branches RL runs")
  g = cfg["rl"]["group_size"]
  kept = kept_steps(p.run_dir)
  missing = [s for s in p.steps if s not in kept]
  if not p.steps:
    errors.append("--at: give at least one step to branch from")
  if missing:
    errors.append(f"--at={','.join(map(str, missing))}: {p.run_dir} kept the checkpoints of "
                  f"steps {kept or 'none'}; run it with train.keep_period dividing the steps "
                  "to probe")
  if len(set(p.batches)) < 3:
    errors.append(f"--batches={','.join(map(str, p.batches))}: give 3 or more batches (the fit "
                  "E = E_min (1 + B/B_crit) has two parameters)")
  bad = [b for b in p.batches if b <= 0 or b % g]
  if bad:
    errors.append(f"--batches: {', '.join(map(str, bad))} not a positive multiple of the run's "
                  f"G = {g} responses per prompt")
  if len(set(p.seeds)) < 3:
    errors.append(f"--seeds={len(set(p.seeds))}: 3 or more (fewer give no interval)")
  if p.optimizer not in OPTIMIZER:
    errors.append(f"--optimizer={p.optimizer!r}: one of {', '.join(OPTIMIZER)}")
  elif p.responses and p.batches and all(b > 0 for b in p.batches):
    steps = shortest(p, cfg)
    if p.responses < steps * max(p.batches):
      errors.append(f"--responses={p.responses}: at least {steps} steps of the largest batch "
                    f"({steps * max(p.batches)}): {MEMORIES[p.optimizer]} / (1 - beta1) with "
                    f"the {p.optimizer} optimizer state, beta1 = {_b1(cfg):g}")
  if not (isinstance(p.rates, int) and p.rates >= 1 and p.rates % 2):
    errors.append(f"--rates={p.rates}: an odd number >= 1 (the rule's rate in the middle)")
  if p.evals < 2:
    errors.append(f"--evals={p.evals}: 2 or more evaluations per branch")
  if p.lr < 0 or p.reference_batch < 0 or (p.lr > 0) != (p.reference_batch > 0):
    errors.append(f"--lr={p.lr:g} --reference_batch={p.reference_batch}: give both (the rule's "
                  "anchor) or neither (the run's own)")
  if p.metric not in METRICS:
    errors.append(f"--metric={p.metric!r}: one of {', '.join(METRICS)}")
  if p.lr_scaling not in RULES:
    errors.append(f"--lr_scaling={p.lr_scaling!r}: one of {', '.join(RULES)}")
  if p.target < 0:
    errors.append(f"--target={p.target:g}: a value of {p.metric} to reach, or 0 (a gain)")
  if p.rates_from:
    if p.lr:
      errors.append(f"--rates_from={p.rates_from} --lr={p.lr:g}: the rates come from one of them")
    else:
      try:
        rates = study_rates(p.rates_from, cfg.get("kind", "grpo"))
        absent = [b for b in p.batches if b > 0 and not b % g and b // g not in rates]
        if absent:
          errors.append(f"--rates_from={p.rates_from}: the study chose no rate at P = "
                        f"{', '.join(str(b // g) for b in absent)} (B = B / G with the run's "
                        f"G = {g}); it chose at P = {', '.join(map(str, sorted(rates)))}")
      except ConfigError as e:
        errors.append(str(e))
  if errors:
    raise ConfigError("; ".join(errors))
  return cfg


def study_rates(study_dir: str, kind: str) -> dict[int, float]:
  """{P: the rate the study chose for it}: the choice its `<kind>_lr` stage recorded per P in
  `study_dir/study.json` (launch/study.py writes it; docs/study holds the CPU study's)."""
  path = os.path.join(study_dir, "study.json")
  if not os.path.isfile(path):
    raise ConfigError(f"--rates_from={study_dir}: no study.json there (a study's directory, "
                      "as launch/study.py writes it)")
  with open(path) as f:
    chosen = json.load(f).get("chosen", {})
  entry = next((c for c in chosen.values() if c.get("stage") == f"{kind}_lr"
                and c.get("per") == ["p"]), None)
  if entry is None:
    raise ConfigError(f"--rates_from={study_dir}: its study.json records no rate chosen per P "
                      f"by a '{kind}_lr' stage (it has: "
                      f"{', '.join(c.get('stage', '?') for c in chosen.values()) or 'none'})")
  return {int(k.split("=")[1]): float(v) for k, v in entry["values"].items()}


def _b1(cfg: dict) -> float:
  from rlscale.rl import optim as optim_lib
  parent_b = cfg["rl"]["num_prompts"] * cfg["rl"]["group_size"]
  return optim_lib.scale(cfg["optim"], parent_b).b1 if "optim" in cfg else 0.9


def shortest(p: Probe, cfg: dict) -> int:
  """The fewest optimizer steps of the largest batch a branch may run: MEMORIES[optimizer] x
  1 / (1 - beta1) (at least 2)."""
  return max(2, math.ceil(MEMORIES[p.optimizer] / (1 - _b1(cfg)) - 1e-9))


def budget(p: Probe, cfg: dict) -> int:
  """Responses per branch: --responses (else twice the shortest length), rounded up to whole
  steps of every batch (a run's length is whole steps)."""
  unit = math.lcm(*p.batches)
  return -(-(p.responses or 2 * shortest(p, cfg) * max(p.batches)) // unit) * unit


def rate_factors(n: int) -> list[float]:
  """The factors a batch's rates are of its rule's rate: RATE_STEP^k, k = -(n-1)/2 ... (n-1)/2."""
  return [RATE_STEP ** (k - (n - 1) // 2) for k in range(n)]


def overrides(p: Probe, cfg: dict, step: int) -> list[dict]:
  """The branch points of one step: every batch x seed."""
  g = cfg["rl"]["group_size"]
  parent_b = cfg["rl"]["num_prompts"] * g // cfg["rl"].get("num_minibatches", 1)
  n = budget(p, cfg)
  every = max(1, n // p.evals)
  optim = cfg["optim"]
  # The rule under test, anchored at the run's own batch and effective rate: reference_batch
  # is the run's B, lr the rate it trained with there.
  from rlscale.rl import optim as optim_lib
  scaled = optim_lib.scale(optim, parent_b)
  lr, ref = (p.lr, p.reference_batch) if p.lr else (scaled.lr, parent_b)
  centre = {b: lr for b in p.batches}  # the rate each batch's scan is centred on
  if p.rates_from:  # the study's choice per P, at that batch (no rule: each is its own)
    by_p = study_rates(p.rates_from, cfg.get("kind", "grpo"))
    centre = {b: by_p[b // g] for b in p.batches}
  stop = ({"target.value": p.target, "target.stop": True, "target.stop_margin": STOP_MARGIN}
          if p.target else {"target.value": 1.0, "target.stop": False})
  adam = {"optim.b1": scaled.b1, "optim.b2": scaled.b2, "optim.eps": scaled.eps,
          "optim.adam_scaling": False} if optim.get("adam_scaling") else {}
  # One saving interval for all (the point names hold what varies: batch and seed): about four
  # saves in a branch of the batches' geometric middle.
  middle = math.sqrt(min(p.batches) * max(p.batches))
  save_every = max(1, round(n / middle / 4))
  out = []
  for b in sorted(set(p.batches)):
    for factor in rate_factors(p.rates):
      for seed in p.seeds:
        out.append({
          "init.branch_from": os.path.abspath(p.run_dir), "init.branch_step": step,
          "init.branch_optimizer": p.optimizer,
          "rl.num_prompts": b // g, "rl.num_minibatches": 1, "rl.microbatch": "auto",
          "seed": seed, "optim.lr": round_rate(centre[b] * factor),
          "optim.lr_scaling": "none" if p.rates_from else p.lr_scaling,
          **adam,
          "optim.reference_batch": b if p.rates_from else ref,
          "train.total_responses": n,
          "train.eval_every": 0, "train.eval_every_responses": every,
          "train.checkpoint_every": save_every, "train.keep_period": 0,
          **METRICS[p.metric],
          "target.metric": p.metric, **stop,
          "noise.enabled": False,
        })
  return out


def round_rate(lr: float) -> float:
  """A rate to 6 significant figures: the points' names and configs stay readable, and the
  report groups branches by it."""
  return float(f"{lr:.6g}")


def points(p: Probe, cfg: dict, step: int):
  from rlscale.sweep import points as points_lib
  return points_lib.build(p.config, f"{SWEEP}_at_{step}", overrides(p, cfg, step),
                          p.step_dir(step))


def run(p: Probe, kind: str = "local", parallel: int = 1, command: list[str] | None = None,
        dry_run: bool = False) -> tuple[int, list[str]]:
  """Run (or, dry, list) every step's branches. Returns (exit status as launch/sweep.py's,
  lines to print)."""
  from rlscale.sweep import launchers
  from rlscale.sweep import manifest as mf
  from rlscale.trainer.preemption import EXIT_REQUEUE
  cfg = check(p)
  n = budget(p, cfg)
  chose = (f"--responses={p.responses} rounded up to whole steps of every batch"
           if p.responses else f"twice the shortest, {shortest(p, cfg)} steps of the largest "
           f"batch with the {p.optimizer} optimizer state")
  lines, status = [f"{n} responses per branch ({chose}); {p.rates} rate(s) per batch, "
                   f"{len(p.batches) * p.rates * len(p.seeds)} branches per step"], 0
  for step in p.steps:
    pts = points(p, cfg, step)
    m = mf.open_sweep(p.step_dir(step), f"{SWEEP}_at_{step}", p.config, kind, pts)
    runner = launchers.make(kind, p.config, m, pts, parallel, command)
    if dry_run:
      lines.append(runner.dry_run())
      continue
    m.save()
    counts = runner.run()
    lines.append(f"step {step}: {counts}")
    if counts[mf.FAILED]:
      status = 1
    if counts[mf.PREEMPTED] or (kind != "slurm" and counts[mf.PENDING]):
      return EXIT_REQUEUE, lines  # stopped: the later steps wait for the next launch
  return status, lines
