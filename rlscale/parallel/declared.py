"""The processes of a run as its launcher declares them in the environment, read before JAX
starts (rlscale/run/supervise.py reads them without importing JAX at all)."""

from __future__ import annotations

import os


def processes(environ=os.environ) -> int:
  """How many processes the run has: JAX_NUM_PROCESSES, Slurm's tasks, Open MPI's world, a TPU
  pod's workers; 1 when none is declared."""
  for var in ("JAX_NUM_PROCESSES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    if environ.get(var):
      return int(environ[var])
  hosts = environ.get("TPU_WORKER_HOSTNAMES") or environ.get("TPU_HOSTNAMES")
  return len(hosts.split(",")) if hosts else 1


def index(environ=os.environ) -> int | None:
  """This process's index among them (None where only JAX can tell: a TPU pod's workers)."""
  for var in ("JAX_PROCESS_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
    if environ.get(var):
      return int(environ[var])
  return None
