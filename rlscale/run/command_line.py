"""What every command-line tool of rlscale shares: a user's mistake is one line, not a traceback.

`error: <message>` on stderr with exit status 2; `--verbose` (read before absl parses, since a
parse error needs it) shows the traceback too.
"""

from __future__ import annotations

import re
import sys
from typing import Callable

from absl import app, flags

from rlscale.config.errors import ConfigError


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parse, with every flag error as a one-line ConfigError."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    raise ConfigError(lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}") from e


def verbose(argv: list[str]) -> bool:
  """--verbose as absl will read it, known before absl parses (a parse error needs it)."""
  on = False
  for a in argv[1:]:
    if a in ("--verbose", "-verbose") or re.fullmatch(r"--?verbose=(?i:true|1|yes)", a):
      on = True
    elif a in ("--noverbose", "-noverbose") or re.fullmatch(r"--?verbose=.*", a):
      on = False
  return on


def one_line(error: ConfigError) -> str:
  """`error: <message>` on one line; the resolve step's list of problems joined by '; '."""
  problems = [line.strip() for line in str(error).splitlines() if line.strip()]
  if len(problems) > 1 and problems[0] == "invalid config:":
    problems = ["invalid config: " + "; ".join(problems[1:])]
  return "error: " + " ".join(problems)


def run_app(run: Callable[[list[str]], int]) -> None:
  """absl's app.run of `run(argv) -> exit status`, with a ConfigError (a user's mistake) as one
  line and exit status 2 (with --verbose, its traceback too)."""
  show_traceback = verbose(sys.argv)
  try:
    app.run(lambda argv: sys.exit(run(argv)), flags_parser=parse_flags)
  except ConfigError as e:
    if show_traceback:
      raise
    print(one_line(e), file=sys.stderr)
    sys.exit(2)
