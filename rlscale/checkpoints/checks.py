"""Checksums of checkpointed arrays, their verification on restore, and one verdict that
every process agrees on (used by rlscale/checkpoints/checkpointer.py).

Every array is checksummed, because storage damages files quietly: a truncated file used to end
a restart with a TensorStore traceback, and a flipped bit in a data file loaded without a word.

* What is hashed: the SHA-256 of the bytes of each shard that orbax writes, i.e. each distinct
  `index` of an array's sharding, hashed on the host from the values being saved (before the
  save returns, so a donated buffer is never read). Hashing per shard needs no array to be
  gathered: on several hosts each process hashes only the shards it owns (replica 0 of each
  index, the ones orbax writes from it) and one all-gather of the digests builds the table.
* Where: in the step's meta JSON under the reserved key `_checksums`: {array: {dtype, shape,
  sha256: {"0:8,0:4": hex}}}. The meta is an item of the same orbax save, committed with the
  arrays in one step (a temporary folder renamed, or a commit marker on object stores), so
  checksums exist exactly when the save completed, async or not; an interrupted save leaves
  no step at all. A step whose meta has no `_checksums` was written before checksums existed
  (this code never writes one) and is restored with a warning that it was not verified.
* Verify: each process hashes the saved shards it holds after the restore (the restored layout
  may differ; a saved shard is checked from any local shard that contains it) and all
  processes agree on the verdict, so every process falls back to the same step. A `like` that
  asks for other arrays or shapes than the step holds is a ValueError, not damage.
* Fall back: `restore_latest` tries steps newest first; a damaged step is logged in one line
  (step, array, unreadable or checksum mismatch) and moved to `<directory>/damaged/` so the
  resumed run can save that step again and the keep limit never counts it.

Cost (2-core CPU, 8 simulated devices): SHA-256 runs at about 2 GB/s a core; checksums take
about 5 ms for the default model's state (0.8M parameters and their Adam moments), 0.11 s for
100M float32 parameters; a restore hashes the same bytes again.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

_MSG_BYTES = 1024  # room for one process's verdict in the all-gather


def checksums(state: Any) -> dict[str, dict[str, Any]]:
  """{array name: {dtype, shape, sha256: {shard index: hex digest}}} of every leaf of `state`.

  Each process hashes the shards it writes; on several processes one all-gather completes the
  table, so every process returns all of it.
  """
  leaves = [(array_name(p), x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]]
  owned = [(i, key, data) for i, (_, x) in enumerate(leaves) for key, data in _owned_shards(x)]
  digests = _hash_all([data for _, _, data in owned])
  table = {name: {"dtype": str(_dtype(x)), "shape": list(np.shape(x)), "sha256": {}}
           for name, x in leaves}
  for (i, key, _), d in zip(owned, digests):
    table[leaves[i][0]]["sha256"][key] = d.hex()
  if jax.process_count() > 1:
    _gather_digests(leaves, table)
  return table


def _gather_digests(leaves, table) -> None:
  """Fill in the shards other processes own: one all-gather of a [shards, 32] byte table whose
  rows (every distinct index of every array, in one order on all processes) are zero except
  where the owner wrote its digest."""
  from jax.experimental import multihost_utils
  rows = [(name, key) for name, x in leaves for key in _all_shard_keys(x)]
  local = np.zeros((len(rows), 32), np.uint8)
  for r, (name, key) in enumerate(rows):
    d = table[name]["sha256"].get(key)
    if d is not None:
      local[r] = np.frombuffer(bytes.fromhex(d), np.uint8)
  full = np.asarray(multihost_utils.process_allgather(local)).max(axis=0)
  for r, (name, key) in enumerate(rows):
    table[name]["sha256"][key] = full[r].tobytes().hex()


def verify(state: Any, saved: dict[str, Any]) -> tuple[tuple[str, str], list[tuple]]:
  """((array, problem) or ("", ""), [(array, shard, checked here)]) for the restored `state`."""
  problems, tasks, shards = [], [], []
  for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
    name = array_name(path)
    rec = saved.get(name)
    if rec is None:
      problems.append((name, "no checksum was saved for it"))
      continue
    same = str(_dtype(x)) == rec["dtype"] and list(np.shape(x)) == rec["shape"]
    read = _local_reader(x) if same else lambda key: None
    for key, digest in sorted(rec["sha256"].items()):
      data = read(key)
      shards.append((name, key, data is not None))
      if data is not None:
        tasks.append((name, key, digest, data))
  for (name, key, digest, _), got in zip(tasks, _hash_all([t[3] for t in tasks])):
    if got.hex() != digest:
      problems.append((name, f"checksum mismatch in shard [{key}] (sha256 {digest[:12]}… "
                             f"saved, {got.hex()[:12]}… read)"))
  return (problems[0] if problems else ("", "")), shards


class Verdict:
  """What this process found wrong with a step: damage (array, problem) or a mismatch."""

  def __init__(self):
    self.array, self.problem, self.mismatch = "", "", ""
    self.read_failed = False

  @property
  def ok(self) -> bool:
    return not (self.problem or self.mismatch)

  @contextlib.contextmanager
  def reading(self, what: str):
    """A read whose failure is damage to `what` (for the arrays: the array the error names)."""
    try:
      yield
    except Exception as e:  # noqa: BLE001 -- any failure to read a committed step is damage
      self.array = _array_in_error(e) if what == "state" else what
      self.problem = f"unreadable ({_short(e)})"
      self.read_failed = True


def agree(v: Verdict) -> tuple[str, str, str]:
  """("damaged" | "mismatch" | "", array, problem): the first process's complaint, the same on
  every process (one all-gather of fixed size), so that all fall back or go on together."""
  mine = ("damaged", v.array, v.problem) if v.problem else (
      ("mismatch", "", v.mismatch) if v.mismatch else ("", "", ""))
  if jax.process_count() == 1:
    return mine
  from jax.experimental import multihost_utils
  row = np.zeros(_MSG_BYTES, np.uint8)
  if mine[0]:
    where = f" (on process {jax.process_index()})"
    text = json.dumps([mine[0], mine[1], mine[2] + where]).encode()
    if len(text) > _MSG_BYTES:
      text = json.dumps([mine[0], mine[1][:200], mine[2][:500] + "…" + where]).encode()
    row[:len(text)] = np.frombuffer(text, np.uint8)
  for got in np.asarray(multihost_utils.process_allgather(row)):
    if got.any():
      return tuple(json.loads(got.tobytes().rstrip(b"\0").decode()))
  return "", "", ""


def mismatch(held: dict[str, tuple], like: Any) -> str:
  """What `like` asks for that the step does not hold (names, shapes), in one line; "" if none."""
  asked = {array_name(p): tuple(np.shape(x)) for p, x in jax.tree_util.tree_flatten_with_path(like)[0]}
  out = []
  if missing := sorted(set(asked) - set(held)):
    out.append(f"not saved: {', '.join(missing[:5])}" + (" …" if len(missing) > 5 else ""))
  if extra := sorted(set(held) - set(asked)):
    out.append(f"not asked for: {', '.join(extra[:5])}" + (" …" if len(extra) > 5 else ""))
  shapes = [f"{n} saved {list(held[n])}, asked {list(asked[n])}"
            for n in sorted(set(held) & set(asked)) if held[n] != asked[n]]
  if shapes:
    out.append("shapes: " + "; ".join(shapes[:5]) + (" …" if len(shapes) > 5 else ""))
  return "; ".join(out)


def unchecked(shards: list[tuple[str, str, bool]]) -> list[str]:
  """Saved shards no process could hash (a restore into a finer layout on several hosts)."""
  checked = np.array([c for _, _, c in shards], np.uint8)
  if jax.process_count() > 1 and len(shards):
    from jax.experimental import multihost_utils
    checked = np.asarray(multihost_utils.process_allgather(checked)).max(axis=0)
  return [f"{n}[{k}]" for (n, k, _), c in zip(shards, checked) if not c]


def _hash_all(arrays: list[Any]) -> list[bytes]:
  """SHA-256 digests of the arrays' bytes. hashlib releases the GIL, so the shards are dealt,
  largest first, to one thread a core, each hashing its share in turn (a task a shard would
  cost more than hashing the small ones)."""
  sizes = [np.size(a) * np.dtype(_dtype(a)).itemsize for a in arrays]
  workers = min(os.cpu_count() or 1, 16, len(arrays))
  if workers <= 1 or sum(sizes) < 1 << 22:
    return [_sha256(a) for a in arrays]
  shares = [[] for _ in range(workers)]
  load = [0] * workers
  for i in sorted(range(len(arrays)), key=lambda i: -sizes[i]):
    w = load.index(min(load))
    shares[w].append(i)
    load[w] += sizes[i]
  out = [None] * len(arrays)

  def run(share):
    for i in share:
      out[i] = _sha256(arrays[i])

  with ThreadPoolExecutor(workers) as pool:
    list(pool.map(run, shares))
  return out


def _sha256(x: Any) -> bytes:
  a = np.ascontiguousarray(np.asarray(x)).reshape(-1)
  return hashlib.sha256(a.view(np.uint8)).digest()


def _owned_shards(x: Any) -> list[tuple[str, Any]]:
  """(index key, data) of the shards of `x` this process saves: replica 0 of each index."""
  if isinstance(x, jax.Array):
    x = _key_data(x)
    return [(_index_key(s.index, x.shape), s.data) for s in x.addressable_shards
            if s.replica_id == 0]
  return [(_index_key((), np.shape(x)), np.asarray(x))]


def _all_shard_keys(x: Any) -> list[str]:
  if isinstance(x, jax.Array):
    x = _key_data(x)
    indices = x.sharding.devices_indices_map(x.shape).values()
    return sorted({_index_key(i, x.shape) for i in indices})
  return [_index_key((), np.shape(x))]


def _local_reader(x: Any):
  """read(key): the part of `x` that saved shard `key` covers, from data on this process (None
  when no local data covers it)."""
  if not isinstance(x, jax.Array):
    return lambda key: np.asarray(x)[_parse_key(key)]
  x = _key_data(x)
  local = {}
  for s in sorted(x.addressable_shards, key=lambda s: s.replica_id):
    local.setdefault(_index_key(s.index, x.shape), s.data)

  def read(key):
    if key in local:  # the restored layout is usually the saved one: the shard itself
      return local[key]
    want = _parse_key(key)
    for have_key, data in local.items():  # a coarser layout: a shard that contains it
      have = _parse_key(have_key)
      if all(h.start <= w.start and w.stop <= h.stop for h, w in zip(have, want)):
        return np.asarray(data)[tuple(slice(w.start - h.start, w.stop - h.start)
                                      for h, w in zip(have, want))]
    return np.asarray(x)[want] if x.is_fully_addressable else None

  return read


def _index_key(index: tuple, shape: tuple) -> str:
  """A shard's index as "start:stop" per dimension, e.g. "0:8,0:4"; "" for a scalar."""
  parts = []
  for dim, n in enumerate(shape):
    s = index[dim] if dim < len(index) else slice(None)
    start, stop, _ = s.indices(n)
    parts.append(f"{start}:{stop}")
  return ",".join(parts)


def _parse_key(key: str) -> tuple[slice, ...]:
  return tuple(slice(*map(int, p.split(":"))) for p in key.split(",")) if key else ()


def _key_data(x: jax.Array) -> jax.Array:
  return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def _dtype(x: Any) -> np.dtype:
  if isinstance(x, jax.Array):
    return _key_data(x).dtype
  return np.asarray(x).dtype


def array_name(path) -> str:
  """An array's name: its tree path joined with dots, as orbax names the saved arrays."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return ".".join(parts)


def quiet_late_reads() -> None:
  """Keep a failed read to its one warning line. The restore's other reads die later, each
  printed as an "Exception ignored" traceback with TensorStore's whole spec: orbax's read
  coroutines when they are collected, and TensorStore's callbacks into orbax's event loop,
  closed by then ("Event loop is closed"). Drop exactly those; collect the coroutines now."""
  previous = sys.unraisablehook
  if not getattr(previous, "_rlscale_quiet", False):

    def hook(u):
      code = getattr(u.object, "cr_code", None)
      from_orbax = code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
      closed = isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value)
      if not (from_orbax or closed):
        previous(u)

    hook._rlscale_quiet = True
    sys.unraisablehook = hook
  gc.collect()


def _chain(e: BaseException) -> list[BaseException]:
  """`e` and the errors it was raised from (orbax wraps TensorStore's error in its own)."""
  out = [e]
  while out[-1].__cause__ is not None and len(out) < 10:
    out.append(out[-1].__cause__)
  return out


def _short(e: Exception) -> str:
  """The root cause of a read error in one line, without TensorStore's spec dumps."""
  text = str(_chain(e)[-1]).split(" [tensorstore_spec")[0].strip().splitlines()
  text = text[0] if text else type(e).__name__
  return text if len(text) <= 400 else text[:400] + "…"


def _array_in_error(e: Exception) -> str:
  """The array a read error names: "w/1.0" in the OCDBT database, or the spec's path "w/"."""
  text = "\n".join(str(x) for x in _chain(e))
  m = re.search(r'Error reading "([^"]+)/[^"/]*" in OCDBT', text)
  if m:
    return m.group(1)
  paths = re.findall(r"""\\?['"]path\\?['"]\s*:\s*\\?['"]([^'"\\]+)/""", text)
  names = [p for p in paths if not p.startswith("/") and "://" not in p]  # not the folder's
  return names[-1] if names else "state"
