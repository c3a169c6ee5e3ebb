"""`launch/cbs_probe.py`: branch a run at some of its steps (rlscale/study/probe.py), then
write the probe's report (analysis/probe.py) in `<probe dir>/report/`.

    python launch/cbs_probe.py RUN_DIR --at=10,20,30 --batches=8,16,32,64 --seeds=3
    python launch/cbs_probe.py RUN_DIR ... --lr=1e-4 --reference_batch=16   # another anchor
    python launch/cbs_probe.py RUN_DIR ... --rates=1    # the rule's rate alone: does E follow it?
    python launch/cbs_probe.py RUN_DIR ... --rates=1 --rates_from=docs/study --target=0.51 \
        --metric=eval/accuracy_sampled   # a study's rates, metric and target: like for like

Run the same command again to continue: done branches are skipped, killed ones resume from
their checkpoints. Exit status as launch/sweep.py's: 0 done, 1 a branch failed, 75 stopped,
2 bad input.
"""

from __future__ import annotations

import os

from absl import flags

from rlscale.config.errors import ConfigError
from rlscale.study import cli_kit
from rlscale.trainer.preemption import EXIT_REQUEUE

_FLAGS: dict = {}


def define_flags() -> None:
  if _FLAGS:
    return
  _FLAGS.update(
      at=flags.DEFINE_list("at", None, "steps to branch from (the run kept their checkpoints: "
                           "train.keep_period)"),
      batches=flags.DEFINE_list("batches", None, "B of the branches, responses per optimizer "
                                "step (multiples of the run's G); 3 or more"),
      seeds=flags.DEFINE_integer("seeds", 5, "seeds per batch (0 ... n-1)"),
      responses=flags.DEFINE_integer("responses", 0, "responses each branch generates (0: "
                                     "twice the shortest: 2 / (1 - beta1) steps of the largest "
                                     "batch with a fresh optimizer state, 6 / (1 - beta1) with "
                                     "the parent's)"),
      rates=flags.DEFINE_integer("rates", 5, "learning rates per batch, a factor sqrt(2) "
                                 "apart, centred on the rule's (odd; 1: the rule's alone)"),
      optimizer=flags.DEFINE_enum("optimizer", "fresh", ["fresh", "parent"],
                                  "the branches' Adam moments: fresh (empty, as a run's start) "
                                  "or the parent's"),
      evals=flags.DEFINE_integer("evals", 16, "evaluations of the reference responses per "
                                 "branch"),
      lr_scaling=flags.DEFINE_enum("lr_scaling", "sqrt", ["none", "sqrt", "linear"],
                                   "the learning-rate rule the rates are centred on, from the "
                                   "run's B and lr"),
      lr=flags.DEFINE_float("lr", 0.0, "the rule's anchor: this rate at --reference_batch "
                            "(0: the run's rate at its own batch)"),
      reference_batch=flags.DEFINE_integer("reference_batch", 0, "the rule's anchor batch, in "
                                           "responses per optimizer step (0: the run's)"),
      metric=flags.DEFINE_enum("metric", "eval/reference_prob",
                               ["eval/reference_prob", "eval/accuracy_sampled",
                                "eval/accuracy_greedy"],
                               "a branch's progress: the reference responses' likelihood, or "
                               "a study's accuracy (the CPU study's: eval/accuracy_sampled)"),
      rates_from=flags.DEFINE_string("rates_from", None, "a study's directory (its study.json): "
                                     "centre each batch's rates on the rate the study chose "
                                     "for its P, the study's rate policy (with --rates=1: that "
                                     "rate alone)"),
      target=flags.DEFINE_float("target", 0.0, "the value of --metric to reach, as a study "
                                "reads its target (0: --gain); branches stop at 1.25 x their "
                                "responses to it"),
      gain=flags.DEFINE_float("gain", 0.5, "the report's gain to reach: this fraction of the "
                              "least median gain over the batches"),
      workdir=flags.DEFINE_string("workdir", None, "the probe's directory (default: "
                                  "RUN_DIR/probe)"),
      launcher=flags.DEFINE_enum("launcher", "local", ["local", "slurm", "xm"],
                                 "where the branches run"),
      **cli_kit.launch_flags("branches", "; slurm: 0, no limit"))


def _ints(name: str, values) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in values or ())
  except ValueError:
    raise ConfigError(f"--{name}={','.join(values)}: integers, comma-separated") from None


def run(argv) -> int:
  from rlscale.study import probe
  if len(argv) != 2:
    raise ConfigError("give one run directory: python launch/cbs_probe.py RUN_DIR --at=... "
                      "--batches=...")
  v = cli_kit.values(_FLAGS)
  p = probe.Probe(run_dir=argv[1], steps=_ints("at", v["at"]),
                  batches=_ints("batches", v["batches"]), seeds=tuple(range(v["seeds"])),
                  responses=v["responses"], evals=v["evals"], rates=v["rates"],
                  optimizer=v["optimizer"], lr_scaling=v["lr_scaling"],
                  lr=v["lr"], reference_batch=v["reference_batch"],
                  probe_dir=v["workdir"] or "", metric=v["metric"],
                  rates_from=v["rates_from"] or "", target=v["target"])
  rc, lines = probe.run(p, v["launcher"], v["parallel"], cli_kit.run_command(v["run_command"]),
                        v["dry_run"])
  for line in lines:
    print(line)
  if v["dry_run"] or rc == EXIT_REQUEUE or not v["report"]:
    return rc
  out = os.path.join(p.dir, "report")
  report = cli_kit.write_report(["-m", "analysis.probe", p.dir, f"--run={p.run_dir}",
                                 f"--gain={v['gain']}", f"--metric={p.metric}", f"--out={out}",
                                 *([f"--target={p.target}"] if p.target else [])],
                                out)
  return rc or (1 if report else 0)


def main() -> None:
  cli_kit.main(define_flags, run)


if __name__ == "__main__":
  main()
