"""The Slurm launcher's settings: the --slurm flag (a file like slurm_config.py, its fields
overridden as --slurm.<field>=...) and the checks that refuse a setting in one line naming it."""

from __future__ import annotations

import os
import re
import shlex
import sys
import warnings

from absl import flags
from ml_collections import config_flags

from rlscale.config.errors import ConfigError

DEFAULT_SETTINGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm_config.py")


def _define_flag():
  """--slurm, a config file (the shipped one by default) with --slurm.<field> overrides.

  config_flags applies the overrides in sys.argv as the flag is defined, at import: one that
  names no field would be a traceback there. Such an override is kept from config_flags, so
  that absl refuses it in one line as an unknown flag.
  """
  from rlscale.sweep.launchers import slurm_config
  fields = set(slurm_config.get_config())
  argv = [a for a in sys.argv
          if not (m := re.match(r"--?(?:no)?slurm\.([^=]+)", a)) or m.group(1) in fields]
  with warnings.catch_warnings():  # config_flags loads the file with importlib's load_module
    warnings.filterwarnings("ignore", "the load_module", DeprecationWarning)
    return config_flags.DEFINE_config_file(
        "slurm", DEFAULT_SETTINGS, "the Slurm launcher's settings: a file like "
        "rlscale/sweep/launchers/slurm_config.py, its fields overridden as --slurm.partition=gpu",
        lock_config=True, sys_argv=None if argv == sys.argv else argv)


_SLURM = _define_flag()

_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_NAME = re.compile(r"[A-Za-z0-9_.,:+-]+")



def current_settings():
  """The --slurm settings, or the shipped defaults when flags were not parsed (a library call)."""
  if flags.FLAGS.is_parsed():
    try:
      _SLURM.value.get("nodes")
    except OSError as e:  # config_flags keeps a file it could not load until it is read
      lines = [line.strip() for line in str(e).splitlines() if line.strip()]
      raise ConfigError(f"--slurm={flags.FLAGS['slurm'].config_filename}: cannot load it "
                        f"({lines[-1]})") from e
    return _SLURM.value
  from rlscale.sweep.launchers import slurm_config
  return slurm_config.get_config()


def time_seconds(text: str) -> int:
  """Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S -> seconds."""
  m = _TIME.fullmatch(text.strip())
  if not m:
    raise ValueError(text)
  days, a, b, c = m.groups()
  nums = [int(x) for x in (a, b, c) if x is not None]
  if days is not None:  # D-H, D-H:M, D-H:M:S
    h, mi, s = (nums + [0, 0])[:3]
  elif len(nums) == 3:
    h, mi, s = nums
  else:  # M, M:S
    h, (mi, s) = 0, (nums + [0])[:2]
  return ((int(days or 0) * 24 + h) * 60 + mi) * 60 + s


def check(s) -> None:
  """Refuse a setting Slurm would reject or a run could not use, in one line naming it."""
  def bad(field, why):
    raise ConfigError(f"--slurm.{field}={s[field]!r}: {why}")
  from rlscale.sweep.launchers import slurm_config
  want, have = set(slurm_config.get_config()), set(s)
  if want != have:
    missing, unknown = sorted(want - have), sorted(have - want)
    raise ConfigError(f"--slurm: the settings {'lack ' + ', '.join(missing) if missing else ''}"
                      f"{' and ' if missing and unknown else ''}"
                      f"{'have unknown ' + ', '.join(unknown) if unknown else ''}; start a site "
                      "file from rlscale/sweep/launchers/slurm_config.py")
  for field, least in (("nodes", 1), ("tasks_per_node", 1), ("gpus_per_node", 0),
                       ("cpus_per_task", 0), ("signal_seconds", 0), ("max_requeues", 0)):
    if not isinstance(s[field], int) or s[field] < least:
      bad(field, f"must be an integer >= {least}")
  gpus, tasks = s.gpus_per_node, s.tasks_per_node
  if gpus and tasks not in (1, gpus):
    bad("tasks_per_node", f"with gpus_per_node={gpus}, give 1 (one process per node, driving "
        f"all its GPUs) or {gpus} (one process per GPU)")
  if s.signal_seconds > 65535:
    bad("signal_seconds", "Slurm's --signal allows at most 65535 seconds")
  if s.mem and not re.fullmatch(r"\d+[KMGT]?", s.mem):
    bad("mem", "give a size like 64G, 500M or 0 (all of the node's memory)")
  if s.time:
    try:
      limit = time_seconds(s.time)
    except ValueError:
      bad("time", "give minutes or [days-]hours:minutes:seconds, e.g. 4:00:00 or 1-00:00:00")
    if limit <= s.signal_seconds:
      bad("time", f"the runs are signalled signal_seconds={s.signal_seconds} before the limit; "
          "give a longer time or fewer signal_seconds")
  for field in ("partition", "account", "qos", "job_name"):
    if s[field] and not _NAME.fullmatch(s[field]):
      bad(field, "letters, digits and _.,:+- only")
  if re.search(r"\s", s.constraint):
    bad("constraint", "no spaces: features joined by & or |, e.g. h100&ib")
  for field in ("sbatch_args", "srun_args"):
    try:
      args = shlex.split(s[field])
    except ValueError as e:
      bad(field, f"not shell words: {e}")
    for a in args:
      if not a.startswith("-"):
        bad(field, f"{a!r} is not an option; write each as --name=value")
