"""The command line: `rlscale --config=configs/grpo.py [--workdir=DIR] [--config.x=y]`.

Also `python -m rlscale` and, in a checkout, `python launch/main.py`, with the same flags.
`--config` names a file as ml_collections expects, or a shipped config (`configs/grpo.py:tiny`,
`grpo.py`, `rlscale.configs.grpo`) found by rlscale.config.files from any directory.

A user's mistake (a config field, a flag, a path) is refused before any compute as one line,
`error: <message>` on stderr with exit status 2; `--verbose` shows the Python traceback too.
A SIGTERM or SIGUSR2 (preemption) stops the run at the next step boundary with that step saved,
one line on stderr and exit status 75 (preemption.EXIT_REQUEUE): run the same command again
to resume. A process of a multi-process run whose peer is lost (killed, its host down) stops
within train.peer_timeout_s with one line naming it and exit status 75 too: the command runs
as the child of a supervisor that turns XLA's abort into that (rlscale/run/supervise.py).
"""

import difflib
import errno
import re
import sys

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from rlscale.run import command_line, supervise
from rlscale.config import files as config_files
from rlscale.trainer import preemption
from rlscale.config.errors import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (default: runs/<config>-<hash>)")
flags.DEFINE_bool("verbose", False, "on a config or command-line error, show the traceback too")
_BASE_ONLY = flags.DEFINE_bool("base_policy_only", False, "build (or find) the base policy the "
                                "run starts from, then stop: a sweep does it once for its points")
_ALLOW = flags.DEFINE_list("allow_config_change", [], "fields a resumed run may change, e.g. "
                           "train.num_steps to extend it (the others must match config.json)")
_SEEDS = flags.DEFINE_list("seeds", [], "run the config at these seeds side by side in this "
                           "process (rlscale/trainer/lanes.py), each in its own run directory: "
                           "--workdir with {seed} in it")
_LANES = flags.DEFINE_string("lanes", None, "runs side by side from a JSON list of {run_dir, "
                             "overrides} (what launch/sweep.py --vectorize writes)")


def main(argv):
  del argv
  preemption.install()  # SIGTERM, SIGUSR2: finish the step, save it, exit with EXIT_REQUEUE
  side_by_side = bool(_SEEDS.value or _LANES.value)
  if side_by_side:
    _lane_devices(len(_SEEDS.value) or _count_lanes(_LANES.value))
  from rlscale.metrics import compiles
  compiles.install()  # what this process compiles, in summary.json
  # After absl parsed flags: JAX starts here.
  from rlscale.parallel import distributed
  from rlscale.run import logs
  from rlscale.run import train
  logs.quiet_libraries()
  distributed.initialize(_peer_timeout(_CONFIG.value))
  import jax
  logging.info("process %d of %d, %d local devices of %d (%s)", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(),
               jax.default_backend())
  config_file = flags.FLAGS["config"].config_filename
  from rlscale.config import migrate
  cfg = migrate.migrate(_CONFIG.value)  # get_config's and the overrides': this code's version
  if side_by_side and not _BASE_ONLY.value:
    try:
      seeds = [int(s) for s in _SEEDS.value]
    except ValueError as e:
      raise ConfigError(f"--seeds={','.join(_SEEDS.value)}: integers, comma-separated") from e
    cfgs, workdirs = train.lane_configs(cfg, seeds, _LANES.value, _WORKDIR.value,
                                        config_file)
    train.main_lanes(cfgs, workdirs, config_file, allow_config_change=tuple(_ALLOW.value))
    return
  train.main(cfg, _WORKDIR.value, config_file=config_file,
             allow_config_change=tuple(_ALLOW.value), base_policy_only=_BASE_ONLY.value)


def _peer_timeout(cfg) -> int:
  """train.peer_timeout_s, checked before jax.distributed starts with it (the resolve step,
  which checks every other field, comes later)."""
  from rlscale.config import fields
  from rlscale.parallel import distributed
  value = cfg.get("train", {}).get("peer_timeout_s", distributed.PEER_TIMEOUT_S)
  errors = []
  fields.integer(errors, "train.peer_timeout_s", value,
                 why=" (whole seconds: jax.distributed's heartbeat timeout)")
  if errors:
    raise ConfigError(errors[0])
  return value


def _count_lanes(path: str) -> int:
  import json
  try:
    with open(path) as f:
      return len(json.load(f))
  except (OSError, ValueError, TypeError) as e:
    raise ConfigError(f"--lanes={path}: {e}") from e


def _lane_devices(n: int) -> None:
  """A CPU device per lane, unless the process was given a count: runs side by side share the
  CPU's cores as separate processes would (XLA reads the flag when JAX first starts)."""
  import os
  flag = "--xla_force_host_platform_device_count"
  if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}={n}".strip()


def _located(value: str) -> str:
  path, arg = config_files.find(value)
  if path == value.partition(":")[0]:
    return value  # a file here, as written: train.main sees the same config_file as before
  return path + (":" + arg if arg else "")


def _config_values(argv: list[str]):
  """(index, text before the value, value) of each `--config` value in argv."""
  for i, a in enumerate(argv):
    if re.match(r"--?config=", a):
      yield i, a.partition("=")[0] + "=", a.partition("=")[2]
    elif a in ("--config", "-config") and i + 1 < len(argv):
      yield i + 1, "", argv[i + 1]


def locate_config(argv: list[str]) -> list[str]:
  """argv with each `--config` value made a path that config_flags can open from here."""
  out = list(argv)
  for i, before, value in _config_values(argv):
    out[i] = before + _located(value)
  return out


def check_overrides(argv: list[str]) -> None:
  """Load the config as config_flags will and refuse an override that names no field.

  config_flags reports a typo (`--config.rl.num_promts=3`) as a chained traceback; here it is
  one line naming the flag, with the nearest field or the fields there are.
  """
  specs = [value for _, _, value in _config_values(argv)]
  if not specs:
    raise ConfigError("--config is required: an experiment config file, e.g. "
                      "--config=configs/grpo.py or --config=configs/grpo.py:tiny")
  spec = specs[-1]  # absl keeps the last
  try:
    cfg = config_files.load(spec)
  except FileNotFoundError as e:
    raise ConfigError(f"--config: {e}") from e
  except Exception as e:  # the config file's own error (an unknown variant, a typo in it)
    raise ConfigError(f"--config={spec}: {type(e).__name__}: {e}") from e
  for a in argv[1:]:
    m = re.match(r"--?config\.([^=]+)", a)
    if not m:
      continue
    path = [re.sub(r"\[.*\]$", "", p) for p in m.group(1).split(".")]
    node = cfg
    for depth, name in enumerate(path):
      where = ".".join(path[:depth])
      if not isinstance(node, ml_collections.ConfigDict):
        raise ConfigError(f"--config.{m.group(1)}: {where}={node!r} is a value, not a section")
      if name not in node:
        fields = sorted(node.keys())
        close = difflib.get_close_matches(name, fields, n=1)
        hint = (f"did you mean --config.{'.'.join(path[:depth] + close)}?" if close else
                f"its fields: {', '.join(fields)}")
        raise ConfigError(f"--config.{m.group(1)}: {where or 'the config'} has no field "
                          f"{name!r}; {hint}")
      node = node[name]


# Beside what the storage refuses (checkpoints/storage.ERRNOS): a run directory in a pseudo
# filesystem such as /proc, or under a file. One line, not a traceback.
_NOT_A_DIRECTORY = (errno.EPERM, errno.ENOENT, errno.ENOTDIR)


def run() -> None:
  """The console script `rlscale`."""
  if supervise.wanted():  # several processes: this one only watches the run's (a child)
    code = supervise.run()
    supervise.record_exit(code)
    sys.exit(code)
  verbose = command_line.verbose(sys.argv)
  try:
    try:
      argv = locate_config(sys.argv)
    except FileNotFoundError as e:
      raise ConfigError(f"--config: {e}") from e
    check_overrides(argv)
    app.run(main, argv=argv, flags_parser=command_line.parse_flags)
  except ConfigError as e:
    if verbose:
      raise
    print(command_line.one_line(e), file=sys.stderr)
    sys.exit(2)
  except preemption.Preempted as e:  # the step in flight is saved: start the same command again
    print(e, file=sys.stderr)
    sys.exit(preemption.EXIT_REQUEUE)
  except OSError as e:  # a write refused (a full disk, a read-only or foreign directory)
    from rlscale.checkpoints import storage  # numpy comes with the package: only here
    if verbose or e.errno not in storage.ERRNOS + _NOT_A_DIRECTORY:
      raise
    print(f"error: {e.filename or 'a write'}: {e.strerror}; the last checkpoint is intact: make "
          f"room or give a directory this user can write, and run the command again",
          file=sys.stderr)
    sys.exit(2)

