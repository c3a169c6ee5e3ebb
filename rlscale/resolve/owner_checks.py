"""Check a whole config before any compute; every error names the field and its value.

The owners of each part check it: the batch plan (rlscale/plan/batch.py) every size, the
algorithm's file its own fields (rlscale/rl/algorithm.py), the optimizer module its section,
SamplingParams the rollout's, the model and task constructors their shapes. What is left here
is what no constructor sees: the mesh against the devices, the files and folders a run will
read or write, the run's schedule, and the evaluation the target is read from.
"""

from __future__ import annotations

import math
import os

import jax
import ml_collections

from rlscale import tasks
from rlscale.plan import batch
from rlscale.config import files as config_files
from rlscale.rl import optim
from rlscale.parallel import sharding
from rlscale.config.errors import ConfigError
from rlscale.sampling import SamplingParams

__all__ = ["ConfigError", "EVAL_METRICS", "check_directory", "validate"]

# What rlscale.trainer.evaluation.Evaluator reports: eval/<key>_greedy with eval.greedy, and
# eval/<key>_sampled with eval.sampled (tests/unit/resolve/test_bad_configs.py reads the names from
# rlscale/trainer/evaluation.py).
_EVAL_KEYS = ("accuracy", "reward", "response_len", "finished")
EVAL_METRICS = tuple(f"eval/{k}_{m}" for m in ("greedy", "sampled") for k in _EVAL_KEYS)
_FRACTIONS = ("accuracy", "finished")  # metrics in [0, 1]

# Sections a config of each kind needs; a missing one is reported alone.
_SECTIONS = {"sft": ("model", "mesh", "task", "sft", "optim", "train", "eval"),
             "rl": ("model", "mesh", "task", "init", "rollout", "rl", "optim", "noise", "target",
                    "train", "eval")}


def _int(errors: list[str], field: str, value, minimum: int = 1, why: str = "") -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    errors.append(f"{field}={value!r} must be {allowed}{why}")


def _number(errors: list[str], field: str, value, allowed: str, ok) -> None:
  """`value` is a finite number for which `ok(value)` holds, else an error saying `allowed`."""
  if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
      or not ok(value)):
    errors.append(f"{field}={value!r} must be {allowed}")


def _bool(errors: list[str], field: str, value) -> None:
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


def _hf_folder(errors: list[str], field: str, folder, *, weights: bool = False,
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


def _mesh(errors: list[str], cfg) -> tuple[int, int]:
  """Batch shards of the trainer's and the sampler's meshes on this run's devices (1 when the
  mesh section is wrong; rlscale/parallel/roles.py checks the roles and shapes)."""
  from rlscale.parallel import roles
  m = cfg.mesh
  bad = roles.check(m, jax.device_count(), jax.process_count())
  if bad:
    errors += bad
    return 1, 1
  try:
    rules = sharding.rules_from_config(m.rules)
  except (ValueError, TypeError) as e:
    errors.append(f"mesh.rules={m.rules!r}: {e}")
    return 1, 1
  n, split = jax.device_count(), m.roles == "split"
  trainer = batch.batch_shards(m.shape, rules, n - m.sampler_devices if split else n)
  if not split:
    return trainer, trainer
  return trainer, batch.batch_shards(m.sampler_shape, rules, m.sampler_devices)


def _model(errors: list[str], cfg):
  """The model's shape, built as the run builds it (None when it cannot be)."""
  m = cfg.model
  bad = [f"model.{f}={m[f]!r}: use float32, bfloat16 or float16"
         for f in ("dtype", "param_dtype") if m[f] not in ("float32", "bfloat16", "float16")]
  errors += bad
  if bad or (m.hf_checkpoint and not _hf_folder(errors, "model.hf_checkpoint", m.hf_checkpoint,
                                                tokenizer=True)):
    return None
  from rlscale.resolve import experiment
  try:
    return experiment.model_config(cfg)
  except (ValueError, TypeError, OSError) as e:  # CheckpointError is a ValueError
    msg = str(e)
    if m.hf_checkpoint:
      errors.append(f"model.hf_checkpoint={m.hf_checkpoint!r}: {msg}")
    elif msg.startswith("model config: "):  # "model config: a=1 must ...; b=2 ..."
      errors.extend("model." + part for part in msg.removeprefix("model config: ").split("; "))
    else:
      errors.append(msg)
  return None


def _arithmetic_problems(t) -> int:
  """Distinct questions of the arithmetic task: the held-out set and training draw from them."""
  n, m = 10 ** t.digits, 10 ** t.mul_digits
  return sum({"+": n * n, "-": n * (n + 1) // 2, "*": n * m}[op] for op in set(t.ops))


def _task(errors: list[str], cfg, model_cfg) -> None:
  t = cfg.task
  if t.name not in tasks.NAMES:
    errors.append(f"task.name={t.name!r} is not one of {tasks.NAMES}")
    return
  before = len(errors)
  _int(errors, "task.num_eval", t.num_eval)
  _int(errors, "task.seed", t.seed, minimum=0)
  if t.name not in tasks.EMBEDDED:
    if not cfg.model.hf_checkpoint:
      errors.append(f"task.name={t.name!r} needs a tokenizer: set model.hf_checkpoint")
    for f in ("max_prompt_len", "max_answer_len") + (("rg_size",) if t.name == "reasoning_gym"
                                                     else ()):
      _int(errors, f"task.{f}", t[f])
    if t.name == "files":  # the paths and fields; the rows are read when the run builds it
      from rlscale.tasks import files
      errors.extend(files.check(t))
    return  # the text tasks read their data when built: the run builds them
  if t.name != "arithmetic":  # another embedded task: its constructor checks its fields
    try:
      task = tasks.make(t)
    except (ValueError, TypeError) as e:
      errors.append(str(e))
      return
    _vocabulary(errors, task, model_cfg)
    return
  _int(errors, "task.digits", t.digits)
  _int(errors, "task.mul_digits", t.mul_digits)
  _bool(errors, "task.partial_credit", t.partial_credit)
  if len(errors) > before:
    return
  try:
    task = tasks.make(t)
  except (ValueError, TypeError) as e:
    errors.append(str(e))
    return
  space = _arithmetic_problems(t)
  if t.num_eval > space // 2:
    errors.append(f"task.num_eval={t.num_eval} leaves too few training problems: "
                  f"task.digits={t.digits}, task.ops={t.ops!r} give {space} problems; use at most "
                  f"{space // 2}")
  _vocabulary(errors, task, model_cfg)


def _vocabulary(errors: list[str], task, model_cfg) -> None:
  if model_cfg is not None and model_cfg.vocab_size < task.tokenizer.vocab_size:
    errors.append(f"model.vocab_size={model_cfg.vocab_size} is smaller than the task's "
                  f"vocabulary ({task.tokenizer.vocab_size})")


def _train(errors: list[str], cfg) -> None:
  t = cfg.train
  for f in ("eval_every", "checkpoint_every", "log_every", "eval_every_responses"):
    if f in t:
      _int(errors, f"train.{f}", t[f], minimum=0)
  _int(errors, "train.keep_checkpoints", t.keep_checkpoints,
       why=" (at 0 orbax deletes every checkpoint it saves)")
  for f in ("async_checkpoint", "tensorboard"):
    _bool(errors, f"train.{f}", t[f])
  if "peak_flops" in t:
    _number(errors, "train.peak_flops", t.peak_flops, ">= 0 (0: known accelerators only)",
            lambda v: v >= 0)
  _int(errors, "seed", cfg.seed, minimum=0)
  e = cfg.eval
  _int(errors, "eval.generation_batch", e.generation_batch,
       why=" (held-out rows per compiled decode call)")
  if "sampled" in e:
    _bool(errors, "eval.sampled", e.sampled)
  if "greedy" in e:
    _bool(errors, "eval.greedy", e.greedy)
    if e.greedy is False and e.sampled is False:
      errors.append("eval.greedy=False with eval.sampled=False: the held-out set would never "
                    "be scored; keep one of them")


def _rl(errors: list[str], cfg) -> None:
  from rlscale.rl import algorithm
  errors += algorithm.check(cfg)
  if "critic" in cfg:
    errors += optim.check(cfg.critic.optim, "critic.optim")
  ro = cfg.rollout
  _number(errors, "rollout.temperature", ro.temperature, "> 0 for RL sampling", lambda v: v > 0)
  try:
    SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=1.0, top_k=ro.top_k,
                   top_p=ro.top_p, decode_chunk=ro.decode_chunk)
  except (ValueError, TypeError) as e:  # "sampling: a=1 must ...; b=2 must ..."
    errors += ["rollout." + m for m in str(e).removeprefix("sampling: ").split("; ")]
  _overlap(errors, cfg)
  n = cfg.noise
  _bool(errors, "noise.enabled", n.enabled)
  _bool(errors, "noise.prompt_level", n.prompt_level)
  _number(errors, "noise.decay", n.decay, "in (0, 1)", lambda v: 0 < v < 1)
  _target(errors, cfg)


def _overlap(errors: list[str], cfg) -> None:
  """Overlapped generation trains on responses of the policy one update back: the ratio's
  denominator must be the sampler's log-probs, which know the lag."""
  ro = cfg.rollout
  if "overlap" not in ro:
    return
  _bool(errors, "rollout.overlap", ro.overlap)
  if ro.overlap is True and cfg.rl.old_logprobs == "recompute":
    errors.append("rollout.overlap=True with rl.old_logprobs='recompute': the recomputed "
                  "log-probs are the trainer's, not the policy that sampled (one update "
                  "older); use rl.old_logprobs='sampler'")


def _target(errors: list[str], cfg) -> None:
  """The target is read from an evaluation metric: one that no evaluation reports is never met."""
  t = cfg.target
  on = {"sampled": cfg.eval.sampled is True, "greedy": cfg.eval.greedy is not False}
  known = [m for m in EVAL_METRICS if on[m.rsplit("_", 1)[1]]]
  if t.metric not in known:
    off = [k for k, v in on.items() if not v]
    hint = (f" (eval.{off[0]}=False: no *_{off[0]} metric)" if off and t.metric in EVAL_METRICS
            else "")
    errors.append(f"target.metric={t.metric!r} is not an evaluation metric{hint}; known: "
                  f"{', '.join(known)}")
  fraction = isinstance(t.metric, str) and t.metric.split("/")[-1].split("_")[0] in _FRACTIONS
  if fraction:
    _number(errors, "target.value", t.value, f"in [0, 1] ({t.metric} is a fraction)",
            lambda v: 0 <= v <= 1)
  else:
    _number(errors, "target.value", t.value, "a finite number", lambda v: True)
  _bool(errors, "target.stop", t.stop)


def _sft_base(errors: list[str], cfg, config_file: str | None) -> None:
  """The SFT recipe an RL run builds its base policy from when it is given no checkpoint.

  Checked as base_policy.resolve will run it: with this config's model, task, mesh and seed.
  Without `config_file`, a relative path that may be beside the config file is left to the run.
  """
  spec = cfg.init.sft_config
  field = f"init.sft_config={spec!r}"
  if not isinstance(spec, str) or not spec:
    errors.append(f"{field} must name an SFT config file (or set init.hf_checkpoint)")
    return
  try:
    sft_cfg = config_files.load(spec, config_file)
  except FileNotFoundError as e:
    if config_file is not None or os.path.isabs(spec.partition(":")[0]):
      errors.append(f"{field}: {e}")
    return
  except (ValueError, TypeError, AttributeError, ImportError, SyntaxError) as e:
    errors.append(f"{field}: {type(e).__name__}: {e}")
    return
  if sft_cfg.get("kind") != "sft":
    errors.append(f"{field} has kind={sft_cfg.get('kind')!r}; the base policy needs kind='sft'")
    return
  with sft_cfg.unlocked():
    sft_cfg.model, sft_cfg.task, sft_cfg.mesh = cfg.model, cfg.task, cfg.mesh
    sft_cfg.seed = cfg.seed
  try:
    validate(sft_cfg)
  except ConfigError as e:
    errors += [f"{field}: {line.strip()}" for line in str(e).splitlines()[1:]
               if line.strip() not in errors]


def _files(errors: list[str], cfg, config_file: str | None) -> None:
  """Folders a run reads (checkpoints, the SFT recipe) and writes (the base policy cache)."""
  if cfg.kind == "sft" or "init" not in cfg:
    return
  i = cfg.init
  if i.hf_checkpoint:
    _hf_folder(errors, "init.hf_checkpoint", i.hf_checkpoint, weights=True)
  elif cfg.model.hf_checkpoint:  # its own base: its weights are read too
    folder = cfg.model.hf_checkpoint
    if os.path.isdir(folder) and not _has_weights(folder):
      errors.append(f"model.hf_checkpoint={folder!r} lacks *.safetensors: the run starts from "
                    f"its weights (or set init.hf_checkpoint)")
  else:
    errors += check_directory(i.cache_dir, "init.cache_dir")
    _sft_base(errors, cfg, config_file)
  if "critic" in cfg and cfg.critic.hf_checkpoint:
    _hf_folder(errors, "critic.hf_checkpoint", cfg.critic.hf_checkpoint, weights=True)


def validate(cfg: ml_collections.ConfigDict, config_file: str | None = None,
             workdir: str | None = None) -> None:
  """Raise ConfigError listing every problem found in `cfg` (the sizes too: the batch plan's
  own checks run on the mesh's shard counts; the run's plan is built once, by
  resolve/resolved.py, with the task's lengths and the device memory).

  `config_file` (the file `cfg` came from) locates a relative init.sft_config as the run will;
  `workdir`, when given, must be a directory the run can create or reuse.
  """
  kind = cfg.get("kind")
  if not isinstance(kind, str):
    raise ConfigError(f"invalid config:\n  kind={kind!r} must name sft or an algorithm")
  missing = [s for s in _SECTIONS["sft" if kind == "sft" else "rl"] if s not in cfg]
  if missing:
    raise ConfigError(f"invalid config:\n  kind={kind!r} needs the section(s) "
                      f"{', '.join(missing)}, which this config lacks")
  errors: list[str] = []
  if workdir is not None:
    errors += check_directory(workdir)
  shards, gen_shards = _mesh(errors, cfg)
  model_cfg = _model(errors, cfg)
  _task(errors, cfg, model_cfg)
  errors += optim.check(cfg.optim, "optim")
  _train(errors, cfg)
  if kind != "sft":
    _rl(errors, cfg)
  _files(errors, cfg, config_file)
  try:
    batch.plan(cfg, shards=shards, processes=jax.process_count(), gen_shards=gen_shards)
  except ConfigError as e:
    errors += [line.strip() for line in str(e).splitlines()[1:]]
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(e.strip() for e in errors))
