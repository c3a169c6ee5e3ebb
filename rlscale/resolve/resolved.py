"""The one resolve step: a config becomes a checked, frozen description of a run.

`resolve` takes a config of this code's schema version (config/migrate.py: a config file and a
run's config.json are migrated where they are read, once), has every section check its own
values and the schema the types (config/typed.check; the algorithm checks the names of its
registered parts, rl/algorithm.check), builds the meshes, model config and task from the
devices and files, each refusing what they cannot build (resolve/experiment.py), plans the
batch once against the mesh and the device memory (plan/batch.py) and, for an RL run that starts
from an SFT base, resolves that SFT recipe on the same meshes, model and task -- every error in
one ConfigError naming each bad field, and all of it before any compilation. Trainers take the
result, never a bare config. The base policy is found or built (run/base_policy.py) from
`recipe` before the RL trainer is constructed, and recorded in `base`.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from rlscale.config import fields, migrate, schema, typed
from rlscale.config.errors import ConfigError
from rlscale.plan import batch
from rlscale.resolve import experiment
from rlscale.rl import algorithm


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A run as it will execute: its typed config, its setup (meshes, rules, task, model config),
  its batch plan, its directory and, for RL, the folder of the policy it starts from and the
  SFT run that builds that policy when none is given.

  `cfg` is the config as typed sections (config/schema.py): the library reads its fields, so a
  misspelt field fails when checked, not when reached. `raw` is the same config as the
  ml_collections edge wrote it: what config.json records and the config hash reads."""
  cfg: schema.Config
  raw: ml_collections.FrozenConfigDict
  workdir: str | None  # None: planned only (no directory checked or written)
  config_file: str | None
  setup: experiment.Setup
  plan: batch.BatchPlan
  base: str | None = None  # RL: a Hugging Face folder with the starting policy
  # RL from init.sft_config: the SFT run building the base policy in its cache folder. None
  # when a Hugging Face folder is the base, or when a relative init.sft_config was not found
  # without the config file it may sit beside (run/base_policy.py then says so).
  recipe: "Resolved | None" = None

  @property
  def kind(self) -> str:
    return self.cfg.kind

  def with_base(self, folder: str) -> "Resolved":
    return dataclasses.replace(self, base=folder)

  def config(self) -> ml_collections.ConfigDict:
    """An unfrozen copy of the config as written (to derive another config from it)."""
    return self.raw.as_configdict()


def resolve(cfg: ml_collections.ConfigDict, workdir: str | None, config_file: str | None = None,
            setup: experiment.Setup | None = None,
            allow_config_change: tuple[str, ...] = ()) -> Resolved:
  """Check `cfg` and build what the run needs before compiling anything (a ConfigError naming
  every bad field otherwise).

  `workdir`, when given, must be a directory the run can create or reuse, and one holding
  checkpoints of another config is refused (but for the fields in `allow_config_change`, each
  of which must be a field of the config: experiment.check_resume); `setup` replaces the one
  the config describes (benchmarks/rl_step.py trains on a task of its own); `config_file`
  locates a relative init.sft_config as the run will.
  """
  lacking = migrate.missing(cfg)
  if lacking:
    raise ConfigError(f"the config is not of this code's schema (version {migrate.SCHEMA_VERSION}): "
                      f"it lacks {', '.join(lacking)}; read config files with "
                      "rlscale.config.files.load and config.json with config/migrate.migrate, "
                      "which set what older configs ran with")
  errors = fields.check_directory(workdir) if workdir is not None else []
  errors += _allowed(cfg, allow_config_change)
  d = cfg.to_dict()
  owners, crash = [], None
  if typed.structure(d) != "sft":
    try:
      owners = algorithm.check(cfg)
    except _BUILD_ERRORS as e:  # a section of the wrong shape, which the schema names
      crash = e
  checked = typed.check(d, owners)
  if crash is not None and not checked.errors:
    raise crash
  errors += checked.errors
  checked_count = len(errors)  # the fields' own errors; what follows depends on the devices too
  env = setup or _built(lambda: experiment.setup(cfg, errors), errors)
  plan = recipe = None
  if env is not None:
    plan = _built(lambda: batch.plan_for(cfg, env, errors, memory=not {
        "train.remat", "train.logprob_chunk"} & checked.named), errors)
    recipe = _built(lambda: _recipe(cfg, config_file, env, errors), errors)
  if errors and not checked_count and workdir is not None and env is not None:
    _refuse_another_layout(workdir, cfg, env, errors)
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(e.strip() for e in errors))
  frozen = ml_collections.FrozenConfigDict(cfg)
  if workdir is not None:
    experiment.check_resume(workdir, frozen, allow_config_change)
  return Resolved(checked.config, frozen, workdir, config_file, env, plan, recipe=recipe)


# A part built from a value the checks above already refused (a str where a number goes, a
# section that is no dict) can fail inside its builder: that value's error is in the list, and
# the part is left unbuilt. With no error in the list, the failure is the code's: raised.
_BUILD_ERRORS = (TypeError, AttributeError, KeyError, ValueError)


def _built(step, errors: list[str]):
  try:
    return step()
  except ConfigError:
    raise
  except _BUILD_ERRORS:
    if not errors:
      raise
    return None


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


def _refuse_another_layout(workdir: str, cfg, env: experiment.Setup,
                           errors: list[str]) -> None:
  """A run directory whose checkpoints were saved on another layout than this launch's, where
  the config's meshes or batch plan fail on this one (a requeue on a number of devices or
  processes that does not divide the batch): one line naming both layouts."""
  import jax

  from rlscale.checkpoints import checkpointer
  saved = checkpointer.saved_layout(os.path.join(workdir, "checkpoints"))
  if saved is None:
    return
  if env.mesh is not None:
    now = checkpointer.mesh_layout(env.mesh)
    here = checkpointer.describe_layout(now)
  else:  # the mesh itself could not be built on these devices
    now = {"devices": jax.device_count(), "processes": jax.process_count()}
    here = (f"mesh.shape={tuple(cfg.mesh.shape)} on {now['devices']} devices in "
            f"{now['processes']} process{'es' if now['processes'] != 1 else ''}")
  if all(saved.get(k) == v for k, v in now.items()):
    return
  raise ConfigError(
      f"{workdir} holds checkpoints saved on {checkpointer.describe_layout(saved)}; this "
      f"launch's {here} cannot go on with them: {'; '.join(e.strip() for e in errors)}. "
      f"Resume on devices and processes that divide the batch, or give another --workdir")


def validate(cfg: ml_collections.ConfigDict, config_file: str | None = None,
             workdir: str | None = None) -> None:
  """Raise the ConfigError `resolve` would (nothing is compiled, no directory written)."""
  resolve(cfg, workdir, config_file)


def _recipe(cfg, config_file: str | None, env: experiment.Setup,
            errors: list[str]) -> Resolved | None:
  """The SFT run that builds an RL run's base policy, resolved as it will run: init.sft_config
  with this run's model, task and mesh (and their setup), in its cache folder. Its errors join
  `errors`, each prefixed with the init.sft_config field."""
  if cfg.kind == "sft" or cfg.init.hf_checkpoint or cfg.model.hf_checkpoint:
    return None
  spec = cfg.init.sft_config
  field = f"init.sft_config={spec!r}"
  if not isinstance(spec, str) or not spec:
    errors.append(f"{field} must name an SFT config file (or set init.hf_checkpoint)")
    return None
  try:
    sft_cfg = experiment.recipe(cfg, config_file)
  except FileNotFoundError as e:
    if config_file is not None or os.path.isabs(spec.partition(":")[0]):
      errors.append(f"{field}: {e}")
    return None
  except (ValueError, TypeError, AttributeError, ImportError, SyntaxError) as e:
    errors.append(f"{field}: {type(e).__name__}: {e}")
    return None
  if sft_cfg.get("kind") != "sft":
    errors.append(f"{field} has kind={sft_cfg.get('kind')!r}; the base policy needs kind='sft'")
    return None
  folder = experiment.recipe_folder(cfg, sft_cfg)
  try:
    run = resolve(sft_cfg, None, setup=env)
  except ConfigError as e:  # "invalid config:" and its lines, or one line (a CheckpointError)
    lines = str(e).splitlines()
    errors += [f"{field}: {line.strip()}" for line in lines[lines[0] == "invalid config:":]
               if line.strip() not in errors]
    return None
  return dataclasses.replace(run, workdir=folder)
