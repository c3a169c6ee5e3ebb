"""Helpers of the tests: files they read, processes they start, small models and tokenizers."""

import os

SUPPORT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(SUPPORT))
FIXTURES = os.path.join(SUPPORT, "fixtures")
WORKERS = os.path.join(SUPPORT, "workers")
FAKE_SLURM = os.path.join(SUPPORT, "fake_slurm")
