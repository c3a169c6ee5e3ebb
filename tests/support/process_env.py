"""Environment of one process of a multi-process JAX run on this machine's CPU (for tests)."""

import os
import socket



def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def process_env(port: int | None, count: int = 2, index: int = 0, devices: int = 4) -> dict:
  """os.environ for process `index` of `count` (coordinator on `port`), each with `devices`
  simulated CPU devices; with `port` None, a single process (no jax.distributed)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(var, None)
  if port is not None:
    env.update(JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES=str(count),
               JAX_PROCESS_ID=str(index))
  return env
