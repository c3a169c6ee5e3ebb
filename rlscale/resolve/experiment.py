"""What every run builds first: mesh, task, model config, run directory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import jax
import ml_collections
from absl import logging
from jax.sharding import Mesh

from rlscale import models, tasks
from rlscale.parallel import roles
from rlscale.parallel import sharding
from rlscale.checkpoints import hf_checks
from rlscale.checkpoints.hf import config_from_folder
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.config import files as config_files
from rlscale.config import migrate
from rlscale.metrics.writer import write_json


@dataclasses.dataclass
class Setup:
  mesh: Mesh
  rules: dict
  task: tasks.Task
  model_cfg: models.ModelConfig
  sampler_mesh: Mesh | None = None  # mesh.roles='split': the sampler's; None: `mesh` samples

  @property
  def meshes(self) -> roles.Meshes:
    return roles.Meshes(self.mesh, self.sampler_mesh or self.mesh)


def model_config(cfg: ml_collections.ConfigDict) -> models.ModelConfig:
  m = cfg.model.to_dict()
  if m.get("hf_checkpoint"):
    return config_from_folder(m["hf_checkpoint"], dtype=m["dtype"], param_dtype=m["param_dtype"])
  m.pop("hf_checkpoint", None)
  return models.from_config_dict(m)


def setup(cfg: ml_collections.ConfigDict, errors: list[str] | None = None,
          devices: list | None = None) -> Setup:
  """The run's meshes, sharding rules, model config and task, each built once.

  Without `errors` a part that cannot be built raises ValueError. With it (the resolve step's
  list), each part's problems are appended, naming the fields, and that part is None: a part
  whose fields already failed (a `model.`/`task.` error in the list) is not built, and a task
  that reads data (files, tfds, reasoning-gym) is built only for a config with no error.
  """
  own = [] if errors is None else errors
  meshes = roles.make_meshes(cfg.mesh, own, devices)  # devices: a lane's (runs side by side)
  try:
    rules = sharding.rules_from_config(cfg.mesh.rules)
  except (ValueError, TypeError) as e:
    own.append(f"mesh.rules={cfg.mesh.rules!r}: {e}")
    rules = None
  model_cfg = _model(cfg, own)
  if model_cfg is not None and cfg.kind != "sft":
    own += _weight_errors(cfg, model_cfg, own)
  task = _task(cfg, model_cfg, own)
  if own and errors is None:
    raise ValueError("; ".join(own))
  if meshes is not None and task is not None and model_cfg is not None:
    logging.info("mesh %s over %d devices (%d processes); model %s, %.2fM parameters",
                 dict(meshes.trainer.shape), jax.device_count(), jax.process_count(),
                 model_cfg.family, model_cfg.num_params() / 1e6)
    if meshes.split:
      logging.info("roles split: the trainer's mesh %s on %d devices, the sampler's %s on %d",
                   dict(meshes.trainer.shape), meshes.trainer.size, dict(meshes.sampler.shape),
                   meshes.sampler.size)
  return Setup(meshes and meshes.trainer, rules, task, model_cfg,
               meshes.sampler if meshes and meshes.split else None)


def _model(cfg, errors: list[str]) -> models.ModelConfig | None:
  if any(e.startswith("model.") for e in errors):
    return None
  try:
    return model_config(cfg)
  except (ValueError, TypeError, OSError) as e:  # CheckpointError is a ValueError
    msg = str(e)
    if cfg.model.hf_checkpoint:
      errors.append(f"model.hf_checkpoint={cfg.model.hf_checkpoint!r}: {msg}")
    elif msg.startswith("model config: "):  # "model config: a=1 must ...; b=2 ..."
      errors.extend("model." + part for part in msg.removeprefix("model config: ").split("; "))
    else:
      errors.append(msg)
  return None


def _weight_errors(cfg, model_cfg: models.ModelConfig, errors: list[str]) -> list[str]:
  """The checkpoint folders an RL run loads weights from, checked against its model from their
  headers (a folder whose fields already failed is left to that error)."""
  folders = []
  if cfg.init.hf_checkpoint:  # the policy: the model the run planned for
    folders.append(("init.hf_checkpoint", cfg.init.hf_checkpoint, models.CausalLM, model_cfg))
  elif cfg.model.hf_checkpoint:
    folders.append(("model.hf_checkpoint", cfg.model.hf_checkpoint, models.CausalLM, model_cfg))
  if "critic" in cfg and cfg.critic.hf_checkpoint:  # a critic loads its own folder's shape
    folders.append(("critic.hf_checkpoint", cfg.critic.hf_checkpoint, models.ValueModel, None))
  out = []
  for field, folder, model_cls, model in folders:
    if not any(e.startswith(field) for e in errors):
      out += hf_checks.folder_errors(field, folder, model_cls, model)
  return out


def _task(cfg, model_cfg, errors: list[str]) -> tasks.Task | None:
  text = cfg.task.name not in tasks.EMBEDDED
  if cfg.task.name == "files":  # its paths and columns, on disk (the schema checked the rest)
    from rlscale.tasks import files
    errors += files.check(cfg.task)
  if any(e.startswith("task.") for e in errors) or (text and errors):
    return None
  try:
    task = tasks.make(cfg.task, HFTokenizer(cfg.model.hf_checkpoint) if text else None)
  except (ValueError, TypeError) as e:
    msg = str(e)
    if text and msg.startswith(("chat template", "this tokenizer")):  # the folder's, by name
      msg = f"model.hf_checkpoint={cfg.model.hf_checkpoint!r}: its {msg}"
    errors.append(msg)
    return None
  if model_cfg is not None and model_cfg.vocab_size < task.tokenizer.vocab_size:
    errors.append(f"model.vocab_size={model_cfg.vocab_size} is smaller than the task's "
                  f"vocabulary ({task.tokenizer.vocab_size})")
  # A task whose answer comes after a worked scratchpad (chain_sum) knows the tokens its longest
  # right response needs: a rollout cut shorter would score most responses 0 without a word
  # (task.terms=5 needs 30 tokens, its config gives 24).
  need = getattr(task, "needs_new_tokens", 0)
  if cfg.kind != "sft" and cfg.rollout.max_new_tokens < need:
    errors.append(f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} is shorter than the "
                  f"task's longest right response ({need} tokens, task "
                  f"{cfg.task.name}): raise it to at least {need}")
  return task


def recipe(cfg: ml_collections.ConfigDict, config_file: str | None) -> ml_collections.ConfigDict:
  """init.sft_config, the SFT recipe of an RL run's base policy, with the run's model, task and
  mesh. Its seed is its own (the `seed=` of init.sft_config), not the run's: RL seeds of a sweep
  share one base policy."""
  sft_cfg = config_files.load(cfg.init.sft_config, config_file)
  with sft_cfg.unlocked():
    for section in ("model", "task", "mesh"):
      sft_cfg[section] = ml_collections.ConfigDict(cfg[section])  # an unfrozen copy
  return sft_cfg


def recipe_folder(cfg: ml_collections.ConfigDict, sft_cfg: ml_collections.ConfigDict) -> str:
  """Where the base policy built by `sft_cfg` is cached: init.cache_dir/sft-<its hash>."""
  return os.path.join(cfg.init.cache_dir, f"sft-{config_hash(sft_cfg, ('mesh',))}")


# Fields the hash leaves out: added after runs were named by it, and changing no number a run
# computes; a run directory and a cached base policy keep the name they had before.
UNHASHED = ("train.peer_timeout_s", "train.compile_buckets")


def config_hash(cfg: ml_collections.ConfigDict, drop: tuple[str, ...] = ()) -> str:
  """A short stable hash of the config's content (sections in `drop` left out, and the fields
  in UNHASHED)."""
  d = {k: v for k, v in cfg.to_dict().items() if k not in drop}
  for field in UNHASHED:
    section, _, name = field.rpartition(".")
    if isinstance(d.get(section), dict) and name in d[section]:
      d[section] = {k: v for k, v in d[section].items() if k != name}
  blob = json.dumps(d, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:12]


# Fields a resumed run may change without asking: they change no number the run computes.
# Also free: how the same numbers are computed (to float rounding): a run started before
# these fields existed (filled with the layout it ran: shared_prompt False, pack_responses
# False, decode_chunk 64) resumes under the new defaults with no flag.
FREE_TO_CHANGE = ("train.log_every", "train.tensorboard", "train.async_checkpoint",
                  "train.shared_prompt", "train.pack_responses", "rollout.decode_chunk",
                  "train.peer_timeout_s", "train.compile_buckets")


def _inert(key: str, old: dict, new: dict) -> bool:
  """Whether `key` changes no number in either run: how a branch starts its optimizer, in a
  run that is no branch (an old run reads "parent", today's default is "fresh")."""
  return (key == "init.branch_optimizer" and not old.get("init.branch_from")
          and not new.get("init.branch_from"))


# The run directory's format: how this code lays out and reads a run's files and checkpoints.
# It goes up when an older rlscale would misread a newer run; a newer rlscale reads every older
# format (config/migrate.py reads their config.json with the values those runs used), and
# an older one refuses a newer run in one line naming both formats.
#   0: before run_format.json (every run of ba4a25a and earlier: tests/integration/test_old_runs)
#   1: run_format.json records the format and the rlscale version that wrote it
RUN_FORMAT = 1
FORMAT_FILE = "run_format.json"


def _format_record(workdir: str) -> dict:
  """run_format.json as written ({"format": 0} where the run predates it), checked."""
  path = os.path.join(workdir, FORMAT_FILE)
  if not os.path.exists(path):
    return {"format": 0}
  from rlscale.config.errors import ConfigError
  try:
    with open(path) as f:
      record = json.load(f)
    value = record["format"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"{path} is not a run format record ({type(e).__name__}: {e}); it was "
                      "damaged or written by hand") from None
  if not isinstance(value, int) or isinstance(value, bool) or value < 0:
    raise ConfigError(f"{path}: format {value!r} is not a run format (a count from 0)")
  return record


def run_format(workdir: str) -> int:
  """The format of the run in `workdir` (0 where it predates run_format.json)."""
  return _format_record(workdir)["format"]


def check_format(workdir: str) -> None:
  """Refuse a run directory written by a newer rlscale, whose files this code may misread."""
  record = _format_record(workdir)
  if record["format"] > RUN_FORMAT:
    from rlscale.config.errors import ConfigError
    by = record.get("rlscale", "an unknown version")
    raise ConfigError(f"{workdir} was written in run format {record['format']} (rlscale {by}); "
                      f"this rlscale ({_version()}) reads formats 0-{RUN_FORMAT}: resume it with "
                      f"rlscale {by} or newer")


def _version() -> str:
  from importlib import metadata
  try:
    return metadata.version("rlscale")
  except metadata.PackageNotFoundError:
    return "unknown"


def _has_checkpoint(workdir: str) -> bool:
  folder = os.path.join(workdir, "checkpoints")
  return os.path.isdir(folder) and any(n.isdigit() for n in os.listdir(folder))


def check_resume(workdir: str, cfg: ml_collections.ConfigDict,
                 allow: tuple[str, ...] = ()) -> None:
  """Refuse to resume a run directory's checkpoints with another config.

  The config of a run with checkpoints is config.json; a field that differs (but those in
  FREE_TO_CHANGE and `allow`, e.g. train.num_steps to extend a run) is a ConfigError naming
  each field with its old and new value. Reads two small files; runs before any compute.
  """
  path = os.path.join(workdir, "config.json")
  if not (os.path.exists(path) and _has_checkpoint(workdir)):
    return
  check_format(workdir)
  old = migrate.flat(config_files.run_config(workdir))  # as this code reads it
  new = migrate.flat(json.loads(cfg.to_json_best_effort()))
  changed = [f"{k}: {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}"
             for k in sorted(set(old) | set(new))
             if old.get(k) != new.get(k) and k not in FREE_TO_CHANGE + tuple(allow)
             and not _inert(k, old, new)]
  if changed:
    from rlscale.config.errors import ConfigError
    raise ConfigError(f"{workdir} holds checkpoints of a run with another config: "
                      f"{'; '.join(changed)}. Resume with the same config, use another --workdir, "
                      f"or allow the change with --allow_config_change="
                      f"{','.join(c.split(':')[0] for c in changed)}")


def prepare_workdir(workdir: str, cfg: ml_collections.ConfigDict) -> None:
  """config.json (the run's config), run_format.json (this code's RUN_FORMAT, after check_resume
  read the old one) and config_history.jsonl (every config it started with)."""
  os.makedirs(workdir, exist_ok=True)
  config = migrate.stamped(json.loads(cfg.to_json_best_effort()))
  write_json(os.path.join(workdir, "config.json"), config)
  write_json(os.path.join(workdir, FORMAT_FILE), {"format": RUN_FORMAT, "rlscale": _version()})
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config_history.jsonl"), "a") as f:
      f.write(json.dumps({"time": time.time(), "config": config}, sort_keys=True) + "\n")

