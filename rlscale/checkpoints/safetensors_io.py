"""Read and write the safetensors format with numpy, bfloat16 included.

Reading memory-maps the file, so a tensor is paged in only when (and as far as) it is used;
every header field is checked and a malformed file raises `CheckpointError` naming the file.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterator, Mapping

import ml_dtypes
import numpy as np

from rlscale.config.errors import ConfigError

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 << 20


class CheckpointError(ConfigError):
  """A checkpoint file or folder that cannot be read as what it claims to be: a user's input,
  reported as one line (exit status 2) as a config field's is."""


class SafetensorsFile:
  """One .safetensors file: names, shapes, dtypes and memory-mapped tensors."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    size = os.path.getsize(self.path)
    with open(self.path, "rb") as f:
      head = f.read(8)
      if len(head) < 8:
        raise CheckpointError(f"{self.path}: too short to be a safetensors file ({size} bytes)")
      (n,) = struct.unpack("<Q", head)
      if n > min(_MAX_HEADER, size - 8):
        raise CheckpointError(f"{self.path}: header length {n} exceeds the file ({size} bytes)")
      try:
        header = json.loads(f.read(n))
      except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{self.path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
      raise CheckpointError(f"{self.path}: header is not a JSON object")
    self.metadata = header.pop("__metadata__", {}) or {}
    self._data_start = 8 + n
    data_len = size - self._data_start
    self._entries = {}
    for name, e in header.items():
      try:
        dtype = DTYPES[e["dtype"]]
        shape = tuple(int(s) for s in e["shape"])
        begin, end = (int(o) for o in e["data_offsets"])
      except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{self.path}: tensor {name!r} has a malformed entry {e!r}") from None
      nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
      if any(s < 0 for s in shape) or begin < 0 or end - begin != nbytes or end > data_len:
        raise CheckpointError(
            f"{self.path}: tensor {name!r} {e['dtype']}{list(shape)} has offsets {[begin, end]} "
            f"that do not fit its size ({nbytes} bytes) or the data ({data_len} bytes)")
      self._entries[name] = (dtype, shape, begin)
    self._mmap = None

  def keys(self) -> list[str]:
    return list(self._entries)

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def shape(self, name: str) -> tuple[int, ...]:
    return self._entries[name][1]

  def dtype(self, name: str) -> np.dtype:
    return self._entries[name][0]

  def get(self, name: str) -> np.ndarray:
    """A read-only memory-mapped view of one tensor."""
    if name not in self._entries:
      raise CheckpointError(f"{self.path}: no tensor {name!r}")
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
    dtype, shape, begin = self._entries[name]
    start = self._data_start + begin
    count = int(np.prod(shape, dtype=np.int64))
    return self._mmap[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def write(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
          metadata: Mapping[str, str] | None = None) -> None:
  """Write tensors to one .safetensors file."""
  specs = [(name, np.shape(a), np.asarray(a).dtype) for name, a in tensors.items()]
  write_stream(path, specs, iter(tensors.values()), metadata)


def write_stream(path: str | os.PathLike, specs: list[tuple[str, tuple[int, ...], np.dtype]],
                 arrays: Iterator[np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
  """Write one .safetensors file whose tensors arrive one at a time, in the order of `specs`.

  The file appears under its name only once complete (written to a temporary name first).
  """
  header: dict = {"__metadata__": dict(metadata)} if metadata else {}
  offset = 0
  for name, shape, dtype in specs:
    dtype = np.dtype(dtype)
    if dtype not in _NAMES:
      raise ValueError(f"tensor {name!r}: dtype {dtype} has no safetensors name")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    header[name] = {"dtype": _NAMES[dtype], "shape": [int(s) for s in shape],
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  tmp = os.fspath(path) + ".tmp"
  try:
    with open(tmp, "wb") as f:
      f.write(struct.pack("<Q", len(blob)))
      f.write(blob)
      for (name, shape, dtype), a in zip(specs, arrays, strict=True):
        a = np.asarray(a)  # tobytes() writes C order whatever the strides
        if a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
          raise ValueError(
              f"tensor {name!r}: got {a.dtype}{list(a.shape)}, announced {dtype}{list(shape)}")
        f.write(a.tobytes())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


class SafetensorsFolder:
  """All tensors of a checkpoint folder: one model.safetensors, or shards with an index."""

  def __init__(self, folder: str | os.PathLike):
    self.folder = os.fspath(folder)
    index = os.path.join(self.folder, "model.safetensors.index.json")
    self._where: dict[str, str] = {}
    if os.path.exists(index):
      try:
        with open(index) as f:
          weight_map = json.load(f)["weight_map"]
      except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index}: not a safetensors index ({e!r})") from None
      self._where = dict(weight_map)
      files = sorted(set(self._where.values()))
    else:
      files = sorted(n for n in os.listdir(self.folder) if n.endswith(".safetensors"))
      if not files:
        raise CheckpointError(f"{self.folder}: no *.safetensors files (weights must be safetensors)")
    self._files: dict[str, SafetensorsFile] = {}
    for name in files:
      p = os.path.join(self.folder, name)
      if not os.path.exists(p):
        raise CheckpointError(f"{index}: names {name}, which is missing")
      self._files[name] = SafetensorsFile(p)
      for k in self._files[name].keys():
        if self._where.get(k, name) != name:
          raise CheckpointError(f"{p}: holds {k!r}, which the index puts in {self._where[k]}")
        self._where[k] = name
    for k, name in self._where.items():
      if k not in self._files[name]:
        raise CheckpointError(f"{index}: says {k!r} is in {name}, which lacks it")

  def keys(self) -> Iterator[str]:
    return iter(self._where)

  def __contains__(self, name: str) -> bool:
    return name in self._where

  def _file(self, name: str) -> SafetensorsFile:
    if name not in self._where:
      raise CheckpointError(f"{self.folder}: checkpoint has no tensor {name!r}")
    return self._files[self._where[name]]

  def shape(self, name: str) -> tuple[int, ...]:
    return self._file(name).shape(name)

  def dtype(self, name: str) -> np.dtype:
    return self._file(name).dtype(name)

  def get(self, name: str) -> np.ndarray:
    return self._file(name).get(name)
