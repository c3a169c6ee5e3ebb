"""The checks of config fields that no part of rlscale builds from: the run's schedule and
logging, the evaluation and the target read from it, the noise scale's switches, the folders a
run reads or writes. Each error names the field and its value.

The parts that are built check their own fields as the resolve step builds them (the mesh, the
model, the task, the batch plan: rlscale/resolve/resolved.py); the algorithm, optimizer and
sampling fields are checked by their owners (rlscale/resolve/owner_checks.py calls them).
"""

from __future__ import annotations

import math
import os

from rlscale.config import migrate
from rlscale.config.errors import ConfigError

COMPILE_BUCKETS = ("auto", "ahead", "on_use")  # train.compile_buckets (rlscale/rl/packing.py)

__all__ = ["EVAL_METRICS", "check", "check_directory", "integer", "number", "boolean",
           "hf_folder"]

# What rlscale.trainer.evaluation.Evaluator reports: eval/<key>_greedy with eval.greedy, and
# eval/<key>_sampled with eval.sampled (tests/unit/resolve/test_bad_configs.py reads the names from
# rlscale/trainer/evaluation.py).
_EVAL_KEYS = ("accuracy", "reward", "response_len", "finished")
EVAL_METRICS = tuple(f"eval/{k}_{m}" for m in ("greedy", "sampled") for k in _EVAL_KEYS)
# With eval.reference: the reference response's mean log-likelihood and probability.
REFERENCE_METRICS = ("eval/reference_logprob", "eval/reference_prob")
_FRACTIONS = ("accuracy", "finished", "reference_prob")  # metrics in [0, 1]

# Sections a config of each kind needs; a missing one is reported alone.
_SECTIONS = {"sft": ("model", "mesh", "task", "sft", "optim", "train", "eval"),
             "rl": ("model", "mesh", "task", "init", "rollout", "rl", "optim", "noise", "target",
                    "train", "eval")}
_DTYPES = ("float32", "bfloat16", "float16")
BRANCH_OPTIMIZER = ("fresh", "parent")  # init.branch_optimizer


def integer(errors: list[str], field: str, value, minimum: int = 1, why: str = "") -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    errors.append(f"{field}={value!r} must be {allowed}{why}")


def number(errors: list[str], field: str, value, allowed: str, ok) -> None:
  """`value` is a finite number for which `ok(value)` holds, else an error saying `allowed`."""
  if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
      or not ok(value)):
    errors.append(f"{field}={value!r} must be {allowed}")


def boolean(errors: list[str], field: str, value) -> None:
  if not isinstance(value, bool):
    errors.append(f"{field}={value!r} must be True or False")


def check_directory(path, field: str = "--workdir") -> list[str]:
  """Errors of a folder a run creates or reuses: not a file, and creatable and writable."""
  if not isinstance(path, str) or not path:
    return [f"{field}={path!r} must name a directory"]
  if os.path.exists(path) and not os.path.isdir(path):
    return [f"{field}={path!r} is a file; give a directory (created when missing)"]
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return [f"{field}={path!r} cannot be created: {existing!r} is a file"]
  if not os.access(existing, os.W_OK | os.X_OK):
    return [f"{field}={path!r}: {existing!r} is not writable"]
  return []


def _has_weights(folder: str) -> bool:
  return any(n.endswith(".safetensors") for n in os.listdir(folder))


def hf_folder(errors: list[str], field: str, folder, *, weights: bool = False,
              tokenizer: bool = False) -> bool:
  """A Hugging Face folder with config.json (and the weights, the tokenizer when asked)."""
  need = ["config.json"] + (["tokenizer.json"] if tokenizer else [])
  if not isinstance(folder, str) or not os.path.isdir(folder):
    what = "is not a directory" if os.path.exists(str(folder)) else "does not exist"
    errors.append(f"{field}={folder!r} {what}: give a Hugging Face folder with "
                  f"{', '.join(need)}{' and *.safetensors' if weights else ''}")
    return False
  missing = [n for n in need if not os.path.isfile(os.path.join(folder, n))]
  if weights and not _has_weights(folder):
    missing.append("*.safetensors")
  if missing:
    errors.append(f"{field}={folder!r} lacks {', '.join(missing)} (a Hugging Face checkpoint "
                  f"folder needs them)")
  return not missing


def sections(cfg) -> str:
  """The config's kind, once it has one and the sections that kind needs (a ConfigError
  naming what is missing, alone, otherwise)."""
  kind = cfg.get("kind")
  if not isinstance(kind, str):
    raise ConfigError(f"invalid config:\n  kind={kind!r} must name sft or an algorithm")
  missing = [s for s in _SECTIONS["sft" if kind == "sft" else "rl"] if s not in cfg]
  if missing:
    raise ConfigError(f"invalid config:\n  kind={kind!r} needs the section(s) "
                      f"{', '.join(missing)}, which this config lacks")
  return kind


def check(cfg, workdir: str | None = None, allow_config_change: tuple[str, ...] = ()) -> list[str]:
  """The errors of the fields below (`workdir`, when given, must be a directory the run can
  create or reuse; each of `allow_config_change` must name a field of `cfg`)."""
  errors = check_directory(workdir) if workdir is not None else []
  errors += _allowed(cfg, allow_config_change)
  m = cfg.model
  errors += [f"model.{f}={m[f]!r}: use {', '.join(_DTYPES[:-1])} or {_DTYPES[-1]}"
             for f in ("dtype", "param_dtype") if m[f] not in _DTYPES]
  if m.hf_checkpoint:
    hf_folder(errors, "model.hf_checkpoint", m.hf_checkpoint, tokenizer=True)
  _train(errors, cfg)
  if cfg.kind != "sft":
    _rollout(errors, cfg)
    n = cfg.noise
    boolean(errors, "noise.enabled", n.enabled)
    boolean(errors, "noise.prompt_level", n.prompt_level)
    number(errors, "noise.decay", n.decay, "in (0, 1)", lambda v: 0 < v < 1)
    _target(errors, cfg)
    _folders(errors, cfg)
  return errors


def _allowed(cfg, allow: tuple[str, ...]) -> list[str]:
  """A field --allow_config_change names that the config lacks would be ignored: an error."""
  import difflib
  paths = list(migrate.flat(cfg.to_dict()))
  errors = []
  for name in allow:
    if name not in paths:
      close = difflib.get_close_matches(name, paths, n=1)
      errors.append(f"--allow_config_change={name!r} is not a field of the config"
                    + (f"; did you mean {close[0]}?" if close else ""))
  return errors


def _train(errors: list[str], cfg) -> None:
  t = cfg.train
  for f in ("eval_every", "checkpoint_every", "log_every", "eval_every_responses"):
    if f in t:
      integer(errors, f"train.{f}", t[f], minimum=0)
  integer(errors, "train.keep_checkpoints", t.keep_checkpoints,
          why=" (at 0 orbax deletes every checkpoint it saves)")
  if "keep_period" in t:
    integer(errors, "train.keep_period", t.keep_period, minimum=0)
  if "peer_timeout_s" in t:
    integer(errors, "train.peer_timeout_s", t.peer_timeout_s,
            why=" (whole seconds: jax.distributed's heartbeat timeout)")
  for f in ("async_checkpoint", "tensorboard"):
    boolean(errors, f"train.{f}", t[f])
  if t.get("compile_buckets", "auto") not in COMPILE_BUCKETS:
    errors.append(f"train.compile_buckets={t.compile_buckets!r} must be one of "
                  f"{', '.join(map(repr, COMPILE_BUCKETS))}")
  if "peak_flops" in t:
    number(errors, "train.peak_flops", t.peak_flops, ">= 0 (0: known accelerators only)",
           lambda v: v >= 0)
  integer(errors, "seed", cfg.seed, minimum=0)
  e = cfg.eval
  integer(errors, "eval.generation_batch", e.generation_batch,
          why=" (held-out rows per compiled decode call)")
  if "sampled" in e:
    boolean(errors, "eval.sampled", e.sampled)
  if "reference" in e:
    boolean(errors, "eval.reference", e.reference)
  if "greedy" in e:
    boolean(errors, "eval.greedy", e.greedy)
    if e.greedy is False and e.sampled is False and e.get("reference") is not True:
      errors.append("eval.greedy=False with eval.sampled=False: the held-out set would never "
                    "be scored; keep one of them (or eval.reference=True)")
  if "adaptive" in e:
    boolean(errors, "eval.adaptive", e.adaptive)
    number(errors, "eval.adaptive_z", e.adaptive_z, "> 0 (standard errors)", lambda v: v > 0)
    metric = cfg.get("target", {}).get("metric") if cfg.kind != "sft" else None
    if e.adaptive is True and metric not in ("eval/accuracy_sampled", "eval/accuracy_greedy"):
      errors.append(f"eval.adaptive=True with target.metric={metric!r}: an evaluation in "
                    f"stages settles the target's side on an accuracy (eval/accuracy_sampled "
                    f"or eval/accuracy_greedy)")


def _rollout(errors: list[str], cfg) -> None:
  """The RL sampling temperature, and the staleness bound: a step trains on responses of the
  policy up to k updates back, so the ratio's denominator must be the sampler's log-probs,
  which know the lag. (SamplingParams checks the other sampling fields.)"""
  ro = cfg.rollout
  number(errors, "rollout.temperature", ro.temperature, "> 0 for RL sampling", lambda v: v > 0)
  if "max_staleness" not in ro:
    return
  k = ro.max_staleness
  integer(errors, "rollout.max_staleness", k, minimum=0)
  stale = isinstance(k, int) and not isinstance(k, bool) and k > 0
  if stale and cfg.rl.old_logprobs == "recompute":
    errors.append(f"rollout.max_staleness={k} with rl.old_logprobs='recompute': the recomputed "
                  "log-probs are the trainer's, not the policy that sampled (up to "
                  f"{k} update(s) older); use rl.old_logprobs='sampler'")
  if stale and k > 1 and ro.get("dynamic_sampling") is True:
    errors.append(f"rollout.max_staleness={k} with rollout.dynamic_sampling=True: a step's "
                  "refill rounds decide where the next step's prompts start, so the sampler "
                  "can run one step ahead at most; use rollout.max_staleness=1 (or 0)")
  if "dynamic_sampling" not in ro:
    return
  boolean(errors, "rollout.dynamic_sampling", ro.dynamic_sampling)
  number(errors, "rollout.filter_min_std", ro.filter_min_std, ">= 0", lambda v: v >= 0)
  integer(errors, "rollout.max_rounds", ro.max_rounds, minimum=1)
  if ro.oversample != "auto":
    number(errors, "rollout.oversample", ro.oversample, "'auto' or a number >= 1",
           lambda v: v >= 1)


def _target(errors: list[str], cfg) -> None:
  """The target is read from an evaluation metric: one that no evaluation reports is never met."""
  t = cfg.target
  on = {"sampled": cfg.eval.sampled is True, "greedy": cfg.eval.greedy is not False}
  known = [m for m in EVAL_METRICS if on[m.rsplit("_", 1)[1]]]
  known += list(REFERENCE_METRICS) if cfg.eval.get("reference") is True else []
  if t.metric not in known:
    off = [k for k, v in on.items() if not v]
    hint = (f" (eval.{off[0]}=False: no *_{off[0]} metric)" if off and t.metric in EVAL_METRICS
            else "")
    errors.append(f"target.metric={t.metric!r} is not an evaluation metric{hint}; known: "
                  f"{', '.join(known)}")
  name = t.metric.split("/")[-1] if isinstance(t.metric, str) else ""
  fraction = name.split("_")[0] in _FRACTIONS or name in _FRACTIONS
  if fraction:
    number(errors, "target.value", t.value, f"in [0, 1] ({t.metric} is a fraction)",
           lambda v: 0 <= v <= 1)
  else:
    number(errors, "target.value", t.value, "a finite number", lambda v: True)
  boolean(errors, "target.stop", t.stop)
  number(errors, "target.stop_margin", t.stop_margin, ">= 0 (a fraction of the responses to "
         "target)", lambda v: v >= 0)


def _folders(errors: list[str], cfg) -> None:
  """Folders an RL run reads (checkpoints) and writes (the base policy cache); the SFT recipe
  itself is checked by the resolve step, as the run will resolve it."""
  i = cfg.init
  if i.hf_checkpoint:
    hf_folder(errors, "init.hf_checkpoint", i.hf_checkpoint, weights=True)
  elif cfg.model.hf_checkpoint:  # its own base: its weights are read too
    folder = cfg.model.hf_checkpoint
    if os.path.isdir(folder) and not _has_weights(folder):
      errors.append(f"model.hf_checkpoint={folder!r} lacks *.safetensors: the run starts from "
                    f"its weights (or set init.hf_checkpoint)")
  else:
    errors += check_directory(i.cache_dir, "init.cache_dir")
  _branch(errors, i)
  if "critic" in cfg and cfg.critic.hf_checkpoint:
    hf_folder(errors, "critic.hf_checkpoint", cfg.critic.hf_checkpoint, weights=True)


def _branch(errors: list[str], i) -> None:
  """init.branch_from names a run directory holding the checkpoint of init.branch_step."""
  if "branch_from" not in i:
    return
  integer(errors, "init.branch_step", i.branch_step, minimum=0)
  if i.get("branch_optimizer", "parent") not in BRANCH_OPTIMIZER:
    errors.append(f"init.branch_optimizer={i.branch_optimizer!r}; known: "
                  f"{', '.join(BRANCH_OPTIMIZER)}")
  if not i.branch_from:
    return
  if not isinstance(i.branch_from, str):
    errors.append(f"init.branch_from={i.branch_from!r} must name a run directory")
    return
  folder = os.path.join(i.branch_from, "checkpoints")
  if not os.path.isdir(folder):
    errors.append(f"init.branch_from={i.branch_from!r} has no checkpoints/ folder: name the run "
                  "directory of the run to branch from")
    return
  steps = sorted(int(s) for s in os.listdir(folder) if s.isdigit())
  if isinstance(i.branch_step, int) and i.branch_step not in steps:
    errors.append(f"init.branch_step={i.branch_step!r}: {i.branch_from} keeps the checkpoints "
                  f"of steps {steps or 'none'} (train.keep_period keeps more)")
