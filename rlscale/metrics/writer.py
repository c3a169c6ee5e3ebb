"""Where a run's numbers go: metrics.jsonl (the source of truth), TensorBoard, the console."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import math
import os
import sys
import time
from typing import Any

import jax
import numpy as np
from absl import logging

from rlscale.metrics import rows


def _plain(v: Any) -> Any:
  if isinstance(v, (np.generic, jax.Array, np.ndarray)):
    v = np.asarray(v).item()
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)  # JSON has no NaN; keep it visible
  return v


def pack(lines: list[str] | bytes) -> str:
  """metrics.jsonl lines (or the file's bytes) as compact text for a checkpoint's meta (gzip,
  base64)."""
  data = lines if isinstance(lines, bytes) else "".join(lines).encode()
  return base64.b64encode(gzip.compress(data, mtime=0)).decode()


def unpack(text: str) -> list[str]:
  return gzip.decompress(base64.b64decode(text)).decode().splitlines(keepends=True)


def _summary_writer(folder: str):
  """tensorboardX's SummaryWriter (protobuf only, no TensorFlow), imported without PyTorch.

  tensorboardX imports torch when it is installed, only to accept torch tensors, which
  rlscale never logs: ~1.5 s of CPU in every run process (torch comes with the HF parity
  tests' extras). It is imported with torch hidden; a torch imported before or after is
  untouched.
  """
  hide = "torch" not in sys.modules
  if hide:
    sys.modules["torch"] = None  # `import torch` raises ImportError: tensorboardX skips it
  try:
    from tensorboardX import SummaryWriter
  finally:
    if hide:
      del sys.modules["torch"]
  return SummaryWriter(folder, flush_secs=10)


class MetricsWriter:
  """One JSON object per step in metrics.jsonl, the same scalars as TensorBoard events.

  Only process 0 writes. A checkpoint carries the rows up to its step (`packed()`, read back
  from the file: no row is held in memory, which over a run of days would grow by each step's);
  a resumed run passes them back as `restore`, and the file is rewritten from them atomically:
  exactly one valid row per step up to the restored step, whatever a crash did to the file.
  Without `restore`, on resume from step k the valid lines up to step k are kept.
  """

  def __init__(self, workdir: str, resume_step: int | None = None, tensorboard: bool = True,
               restore: str | None = None):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    if restore is not None:
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(unpack(restore))
      os.replace(tmp, self.path)
    elif os.path.exists(self.path):
      keep = [line if line.endswith("\n") else line + "\n"
              for line, row in rows.iter_rows(self.path)  # a line cut by a crash is dropped
              if resume_step is not None and row.get("step", 0) <= resume_step]
      with open(self.path, "w") as f:
        f.writelines(keep)
    if tensorboard:
      self._tb = _summary_writer(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    if not self.enabled:
      return
    row = {"step": int(step)}
    row.update({k: _plain(v) for k, v in metrics.items()})
    line = json.dumps(row) + "\n"
    with named(self.path), open(self.path, "a") as f:
      f.write(line)
    if self._tb is not None:
      for k, v in row.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
          self._tb.add_scalar(k, v, step)

  def packed(self) -> str:
    """The rows written so far, for a checkpoint's meta (`pack` of the file's lines)."""
    if not self.enabled or not os.path.exists(self.path):
      return pack([])
    with open(self.path, "rb") as f:
      return pack(f.read())

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def write_json(path: str, obj: dict[str, Any]) -> None:
  if jax.process_index() != 0:
    return
  tmp = path + ".tmp"
  with named(path), open(tmp, "w") as f:
    json.dump({k: _plain(v) for k, v in obj.items()}, f, indent=2)
  os.replace(tmp, path)


@contextlib.contextmanager
def named(path: str):
  """A write's OSError (a full disk: its write or close carries no file name) naming `path`."""
  try:
    yield
  except OSError as e:
    if e.filename is not None:
      raise
    raise OSError(e.errno, e.strerror, path) from e


class Progress:
  """A console line every `every` steps: step, samples, reward, eval accuracy, speed, ETA."""

  def __init__(self, total_steps: int, every: int = 1, start_step: int = 0):
    self.total, self.every = total_steps, max(1, every)
    self.start_step, self.t0 = start_step, time.time()

  def update(self, step: int, fields: dict[str, Any]) -> None:
    if jax.process_index() != 0 or (step % self.every and step != self.total):
      return
    done = step - self.start_step
    rate = (time.time() - self.t0) / max(done, 1)
    eta = rate * (self.total - step)
    parts = [f"step {step}/{self.total}"]
    for k, v in fields.items():
      if v is None:
        continue
      parts.append(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}")
    parts.append(f"{rate:.2f} s/step, ETA {int(eta // 60)}m{int(eta % 60):02d}s")
    logging.info(" | ".join(parts))
