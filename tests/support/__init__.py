"""Helpers of the tests: files they read, processes they start, small models and tokenizers."""

import os

SUPPORT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(SUPPORT))
FIXTURES = os.path.join(SUPPORT, "fixtures")
WORKERS = os.path.join(SUPPORT, "workers")
FAKE_SLURM = os.path.join(SUPPORT, "fake_slurm")


def filled_optim(section: dict):
  """An optimizer section given in part (`{"lr": ...}`) as a config file's reads once migrated
  (rlscale/config/migrate.py): the fields it lacks at what configs without them ran with."""
  import ml_collections

  from rlscale.config import migrate
  return migrate.migrate(ml_collections.ConfigDict({"optim": section})).optim
