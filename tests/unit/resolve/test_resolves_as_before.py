"""Every bad config of the table, every shipped config and every committed run config.json
resolve exactly as they did before the checks moved into the schema's sections: the same
error text, line for line, or the same batch plan and config hash.

The expected results (tests/support/fixtures/resolve/as_before.json) were written by the code
of cceba07, before the move:

    python -m tests.unit.resolve.test_resolves_as_before --record

One entry was edited since, by hand: task.name='chess' was refused in two lines naming the same
problem (the schema's and the task's own), and is refused in the task's line alone now. Rows
added to the table since are in ADDED, with what the old code did with them.
"""

from __future__ import annotations

import json
import os
import sys

import ml_collections
import pytest

from tests.support import FIXTURES, REPO
from tests.unit.config.test_schema import SHIPPED, _run_configs
from tests.unit.resolve.test_bad_configs import (BAD, _path, _set, folders,  # noqa: F401
                                                 make_folders)
from rlscale.config import files as config_files
from rlscale.config import migrate
from rlscale.config.errors import ConfigError
from rlscale.resolve import experiment
from rlscale.resolve.resolved import resolve

EXPECTED = os.path.join(FIXTURES, "resolve", "as_before.json")
# Rows added to the table since, with what the code of cceba07 did with them (run on it): it
# accepted them, or it failed inside a builder with a traceback instead of a ConfigError.
ADDED = {
    # accepted: GRPO's shared policy loss reads the dual clip, only PPO's check looked at it
    "grpo.py:rl.dual_clip=0.5: rl.dual_clip=0.5 must be > 1",
    "grpo.py:rl.kl_coef=nan: rl.kl_coef=nan, rl.entropy_coef=0.0 must be >= 0",  # accepted
    "grpo.py:model.rope_theta=-1.0: model.rope_theta=-1.0 must be a positive number",  # accepted
    # AttributeError: 'int' object has no attribute 'temperature'
    "grpo.py:rollout=5: rollout=5: a section",
    # TypeError: '<=' not supported between instances of 'int' and 'str'
    "ppo.py:rl.gamma='x': rl.gamma='x': a float",
    "grpo.py:optim.state_dtype='x': optim.state_dtype='x'; known:",  # TypeError: data type 'x'
    # TypeError: expected str, bytes or os.PathLike object, not NoneType
    "grpo.py:init.cache_dir=None: init.cache_dir=None must name a directory",
    # TypeError: '<' not supported between instances of 'str' and 'int'
    "grpo.py:rollout.max_new_tokens='x': rollout.max_new_tokens='x': an int",
    "grpo.py:rl.advantage=['grpo']: rl.advantage=['grpo']; known:",  # unhashable type: 'list'
    # a ConfigError of two lines naming it twice (the schema's and the task's); one now
    "grpo.py:task.name=['x']: task.name=['x'] is not one of",
}


def _plain(text: str, root: str | None) -> str:
  """Paths of this checkout and of the test's temporary folder as placeholders."""
  if root:
    text = text.replace(str(root), "<tmp>")
  for folder in config_files.packaged_dirs():  # the shipped configs, where rlscale is installed
    text = text.replace(os.path.dirname(os.path.abspath(folder)), "<repo>")
  return text.replace(REPO, "<repo>")


def _outcome(cfg, config_file, root=None, workdir=None) -> dict:
  """The error's text, or the plan and the config hash (of the run and of its SFT recipe)."""
  try:
    run = resolve(cfg, workdir, config_file)
  except ConfigError as e:
    return {"error": _plain(str(e), root)}
  out = {"hash": experiment.config_hash(run.config()), "plan": run.plan.describe()}
  if run.recipe is not None:
    out["recipe"] = {"hash": experiment.config_hash(run.recipe.config()),
                     "plan": run.recipe.plan.describe(),
                     "folder": _plain(run.recipe.workdir, root)}
  return json.loads(_plain(json.dumps(out, sort_keys=True, default=str), root))


def _key(param) -> str:
  """A row's name, the same in every checkout: its config, field, value (this checkout's path
  as <repo>) and expected text (two rows share the rest)."""
  config, field, value, expect = param.values[:4]
  return _plain(f"{config}:{field}={value!r}: {expect}", None)


def _bad(param, root) -> dict:
  config, field, value, _, also, _, workdir = param.values
  config_file = os.path.join(REPO, "configs", config)
  cfg = config_files.load(config_file)
  for f, v in also.items():
    _set(cfg, f, v)
  _set(cfg, field, _path(value, root))
  return _outcome(cfg, config_file, root, _path(workdir, root) if workdir else None)


def _shipped(spec: str) -> dict:
  path = os.path.join(REPO, "configs", spec)
  return _outcome(config_files.load(path), path.partition(":")[0])


def _committed(path: str) -> dict:
  with open(os.path.join(REPO, path)) as fh:
    cfg = migrate.migrate(ml_collections.ConfigDict(json.load(fh)))
  return _outcome(cfg, None)


def _expected() -> dict:
  with open(EXPECTED) as fh:
    return json.load(fh)


@pytest.mark.parametrize("index", range(len(BAD)), ids=[p.id for p in BAD])
def test_each_bad_config_is_refused_as_before(index, folders):  # noqa: F811
  key = _key(BAD[index])
  if key in ADDED:  # test_bad_configs.py checks its refusal
    assert key not in _expected()["bad"]
    return
  assert _bad(BAD[index], folders) == _expected()["bad"][key]


@pytest.mark.parametrize("spec", SHIPPED)
def test_each_shipped_config_resolves_as_before(spec):
  assert _shipped(spec) == _expected()["shipped"][spec]


def test_each_committed_run_config_resolves_as_before():
  expected = _expected()["committed"]
  paths = _run_configs()
  assert set(paths) == set(expected)
  for path in paths:
    assert _committed(path) == expected[path], path


def _record() -> None:
  """Write the record; refused where one exists: the record is of cceba07's code, and one
  written by the code under test would compare that code with itself."""
  if os.path.exists(EXPECTED):
    sys.exit(f"{EXPECTED} exists: it records the code before the move; delete it first only to "
             "record a new baseline from a commit checked out for that")
  import tempfile
  from pathlib import Path
  with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    make_folders(root)
    out = {"bad": {_key(p): _bad(p, root) for p in BAD},
           "shipped": {s: _shipped(s) for s in SHIPPED},
           "committed": {p: _committed(p) for p in _run_configs()}}
  os.makedirs(os.path.dirname(EXPECTED), exist_ok=True)
  with open(EXPECTED, "w") as fh:
    json.dump(out, fh, indent=1, sort_keys=True)
    fh.write("\n")
  print(f"wrote {EXPECTED}: {len(out['bad'])} bad, {len(out['shipped'])} shipped, "
        f"{len(out['committed'])} committed")


if __name__ == "__main__" and "--record" in sys.argv:
  _record()
