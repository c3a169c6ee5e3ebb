"""Multi-process start-up and each process's share of the data.

One process per host (Slurm task, TPU VM worker). `initialize()` starts `jax.distributed` when
the environment says there are several processes and is a no-op otherwise. A global batch of
`n` rows is split into contiguous, equal shares: process p owns rows `process_rows(n)`, loads
only those, and hands them to `sharding.put_batch`, which assembles the global array.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from absl import logging

from rlscale.parallel import declared

_started = False

# train.peer_timeout_s when a config lacks it: JAX's own heartbeat timeout, what every run used
# before the field existed.
PEER_TIMEOUT_S = 100


def initialize(peer_timeout_s: int = PEER_TIMEOUT_S) -> None:
  """Start jax.distributed once when launched as several processes.

  `peer_timeout_s` (train.peer_timeout_s) is jax.distributed's heartbeat timeout: a process
  that sends no heartbeat for that long is lost, and XLA's coordination service then ends
  every other process (it aborts them; the command line's supervisor, rlscale/run/supervise.py,
  turns that into one line and exit status 75). A lost process 0, which hosts the service, ends
  the others as soon as their connection to it breaks.
  """
  global _started
  if _started or declared.processes() <= 1:
    return
  kwargs = {}
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):  # explicit: address, count, id
    kwargs = dict(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                  num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                  process_id=int(os.environ["JAX_PROCESS_ID"]))
    if os.environ.get("JAX_LOCAL_DEVICE_IDS"):
      kwargs["local_device_ids"] = [int(i) for i in os.environ["JAX_LOCAL_DEVICE_IDS"].split(",")]
  if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # Slurm, Open MPI and TPU pods are detected by JAX.
  jax.distributed.initialize(**kwargs, heartbeat_timeout_seconds=int(peer_timeout_s))
  _started = True
  logging.info("jax.distributed: process %d of %d, %d local of %d devices; a process lost for "
               "%d s (train.peer_timeout_s) stops the run", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(), peer_timeout_s)


def process_rows(n: int) -> slice:
  """This process's contiguous share of `n` global rows (n must divide evenly)."""
  count, index = jax.process_count(), jax.process_index()
  if n % count:
    raise ValueError(f"a global batch of {n} rows does not split over {count} processes")
  share = n // count
  return slice(index * share, (index + 1) * share)


def host_local(x: jax.Array) -> np.ndarray:
  """The rows of a batch-sharded global array that this process owns, as numpy."""
  if jax.process_count() == 1:
    return np.asarray(x)
  rows = process_rows(x.shape[0])
  parts = {}
  for shard in x.addressable_shards:
    start = shard.index[0].start or 0
    parts.setdefault(start, np.asarray(shard.data))
  out = np.concatenate([parts[k] for k in sorted(parts)], axis=0)
  if out.shape[0] != rows.stop - rows.start:
    raise ValueError(f"array of {x.shape[0]} rows is not batch-sharded over this process's "
                     f"devices: it holds {out.shape[0]} rows, its share is {rows.stop - rows.start}")
  return out


def global_sum(x) -> float:
  """The sum of `x` over every process's values (each process passes its own rows)."""
  x = float(np.sum(x))
  if jax.process_count() == 1:
    return x
  return float(np.sum(_allgather_float64(x)))


def global_max(x) -> float:
  """The max of `x` over every process's values."""
  x = float(np.max(x))
  if jax.process_count() == 1:
    return x
  return float(np.max(_allgather_float64(x)))


def _allgather_float64(x: float) -> np.ndarray:
  """Every process's `x`, exactly: without jax_enable_x64 an all-gather of float64 values
  returns them rounded to float32 (counts past 2**24 lose units), so the bits travel as int32."""
  from jax.experimental import multihost_utils
  bits = np.array([x], np.float64).view(np.int32)
  gathered = np.asarray(multihost_utils.process_allgather(bits)).reshape(-1, 2)
  return gathered.copy().view(np.float64).reshape(-1)


def global_mean(x) -> float:
  """The mean over every process's rows; each process holds the same number."""
  x = np.asarray(x, np.float64)
  return global_sum(x) / (x.size * jax.process_count())
