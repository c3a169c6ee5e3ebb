"""The config of a run, read back from its directory: what a branch of it starts from.

    python launch/main.py --config=configs/branch.py:RUN_DIR --workdir=RUN_DIR/probe/x \\
        --config.init.branch_from=RUN_DIR --config.init.branch_step=20 --config.rl.num_prompts=8

`RUN_DIR/config.json` (the config the run resolved and wrote), with the fields it lacks at their
defaults; the command line's overrides then apply as to any config. launch/cbs_probe.py runs its
branches with it.
"""

import json
import os

import ml_collections
from ml_collections.config_dict import FieldReference

from rlscale.config import migrate


def _untyped(node):
  """Nested dicts as a ConfigDict whose every field holds any type: a JSON file does not say
  which fields are 'auto'-or-integer (rl.microbatch) or optional, and an override of such a
  field must not be refused for its type (the config's checks judge its value)."""
  if isinstance(node, dict):
    return ml_collections.ConfigDict({k: _untyped(v) for k, v in node.items()})
  if isinstance(node, list):
    node = tuple(node)
  return FieldReference(node, field_type=object)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if not arg:
    raise ValueError("configs/branch.py needs a run directory: --config=configs/branch.py:RUN_DIR")
  path = os.path.join(arg, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"configs/branch.py:{arg}: {path} does not exist (a run writes it "
                            "when it starts)")
  with open(path) as f:
    return migrate.migrate(_untyped(json.load(f)))
