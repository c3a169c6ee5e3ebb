"""Two processes, one mesh: each loads only its rows and gets what one process gets."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from rlscale import distributed

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_decode_like_one(tmp_path):
  sys.path.insert(0, os.path.join(HERE, "workers"))
  import two_process_decode
  _, want_tokens, want_logp = two_process_decode.run((2, 2, 2))  # this process: 8 devices

  port = _free_port()
  procs = []
  for pid in range(2):
    env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(pid), JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    procs.append(subprocess.Popen(
        [sys.executable, os.path.join(HERE, "workers", "two_process_decode.py"),
         str(tmp_path / f"out{pid}.npz")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  for p in procs:
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out.decode()[-3000:]
  for pid in range(2):
    got = np.load(tmp_path / f"out{pid}.npz")
    rows = slice(int(got["start"]), int(got["start"]) + 4)
    np.testing.assert_array_equal(got["tokens"], want_tokens[rows])
    np.testing.assert_array_equal(got["tokens4"], want_tokens[rows])
    assert np.abs(got["logprobs"] - want_logp[rows]).max() <= 1e-5


def test_process_rows_single_process():
  assert distributed.process_rows(6) == slice(0, 6)
