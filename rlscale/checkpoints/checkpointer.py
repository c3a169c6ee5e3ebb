"""Preemption-safe checkpoints with orbax: state, RNG, data position and counters.

A run saves periodically and at the end; re-running the same command in the same workdir
resumes from the latest intact checkpoint. Saves are asynchronous (the next step runs while
the files are written); a state is saved only after it was checked finite (rlscale/trainer/loop.py),
so a NaN never reaches a checkpoint. Every array is checksummed when saved and verified when
restored (rlscale/checkpoints/checks.py); `restore_latest` falls back past damaged steps, each
logged in one line (step, array, unreadable or checksum mismatch) and moved to
`<directory>/damaged/` so that the resumed run can save that step again and the keep limit
never counts it.

A step records the layout its arrays were saved on (the mesh's axes, the devices and processes
of the run: `layout_of`). A restore onto another layout -- a requeue on fewer or more devices
or hosts -- goes through orbax's resharding: every array comes back bit for bit (the checksums
say so) on the new mesh, and the change is logged in one line and kept in `layout_change`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from rlscale.checkpoints import checks, orbax_leak, storage
from rlscale.config.errors import ConfigError

CHECKSUMS = "_checksums"  # the meta key of the arrays' checksums; refused in a caller's meta
LAYOUT = "_layout"  # the meta key of the layout the arrays were saved on; refused likewise
RESERVED = (CHECKSUMS, LAYOUT)

orbax_leak.apply()


def layout_of(state: Any) -> dict[str, Any] | None:
  """The layout `state`'s arrays lie on: {"mesh": {axis: size}, "devices": n, "processes": p},
  the mesh of its first array on a mesh (None for a state on no mesh)."""
  for x in jax.tree.leaves(state):
    mesh = getattr(getattr(x, "sharding", None), "mesh", None)
    if mesh is not None and getattr(mesh, "shape", None):
      return mesh_layout(mesh)
  return None


def mesh_layout(mesh) -> dict[str, Any]:
  """A mesh's layout (see layout_of), in the run's devices and processes."""
  return {"mesh": {str(k): int(v) for k, v in dict(mesh.shape).items()},
          "devices": jax.device_count(), "processes": jax.process_count()}


def describe_layout(layout: dict[str, Any]) -> str:
  """'mesh data=8 fsdp=1 tensor=1 of 8 devices in 1 process'."""
  axes = " ".join(f"{k}={v}" for k, v in layout["mesh"].items())
  p = layout["processes"]
  return f"mesh {axes} of {layout['devices']} devices in {p} process{'es' if p != 1 else ''}"


def saved_layout(directory: str) -> dict[str, Any] | None:
  """The layout the newest readable step in `directory` was saved on (None: no step, or one
  saved before layouts were recorded). Reads its meta alone: no array, no collective."""
  if not os.path.isdir(directory):
    return None
  for step in sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True):
    path = ocp.step.find_step_path(directory, ocp.step.standard_name_format(), step=step)
    try:
      meta = ocp.JsonCheckpointHandler().restore(path / "meta", args=ocp.args.JsonRestore())
    except Exception:  # noqa: BLE001  (damaged or partial: the restore falls back past it too)
      continue
    return dict(meta).get(LAYOUT)
  return None


class CheckpointMismatch(ValueError):
  """A step that holds other arrays or shapes than the restore asks for: a changed model or
  config, not damage (the step is left where it is)."""


class StorageError(ConfigError):
  """A save that the disk refused (full, over quota, read-only, not writable): one line naming
  the directory, the bytes needed and free, and the last intact checkpoint."""


class CheckpointDamaged(Exception):
  """A saved step that cannot be used: an array is unreadable or fails its checksum."""

  def __init__(self, step: int, array: str, problem: str):
    self.step, self.array, self.problem = step, array, problem
    super().__init__(f"checkpoint step {step} is damaged: {array}: {problem}")


class Checkpointer:
  def __init__(self, directory: str, keep: int | None = 2, async_save: bool = True,
               keep_period: int = 0, create: bool = True):
    """`keep` newest checkpoints are kept, and with `keep_period` > 0 also every step that is a
    multiple of it; `create=False` reads a directory (another run's) without making it."""
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                           keep_period=keep_period or None,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._in_flight: tuple[int, int] | None = None  # (step, bytes) of the save being written
    self._refused: int | None = None  # the step whose save the disk refused
    # (saved, restored) layouts of the last restore, when they differ (orbax resharded it).
    self.layout_change: tuple[dict, dict] | None = None

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Start saving `state` (a pytree of arrays) and `meta` (JSON) as `step`.

    The checksums are computed before this returns (on several processes with one all-gather,
    so every process calls it, as orbax requires anyway); the files are written in the
    background when saves are asynchronous.
    """
    for key in RESERVED:
      if key in meta:
        raise ValueError(f"meta key {key!r} is reserved for the checkpoint's own records")
    meta = {**meta, CHECKSUMS: checks.checksums(state)}
    layout = layout_of(state)
    if layout is not None:
      meta[LAYOUT] = layout
    with self._storage_guard():  # the previous save, finishing, may fail here
      self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                       meta=ocp.args.JsonSave(meta)), force=True)
    self._in_flight = (step, sum(x.nbytes for x in jax.tree.leaves(state)))

  @contextlib.contextmanager
  def _storage_guard(self):
    """A save the disk refused becomes a StorageError naming it; its partial files are
    removed (the last intact checkpoint is untouched)."""
    try:
      yield
    except Exception as e:  # noqa: BLE001  (orbax and tensorstore wrap the OSError in anything)
      problem = storage.problem(e)
      if problem is None or self._in_flight is None:
        raise
      step, nbytes = self._in_flight
      self._in_flight, self._refused = None, step
      with contextlib.suppress(Exception):  # the failed save's other writers finish first
        self._manager.wait_until_finished()
      # Its partial folder goes in close(), once every writer has stopped: removed under a
      # writer still running, it comes back or the writer fails on a missing file.
      free = shutil.disk_usage(self.directory).free if os.path.isdir(self.directory) else 0
      self._manager.reload()
      last = self._manager.latest_step()
      raise StorageError(
          f"{self.directory}: {problem} while saving the checkpoint of step {step} (it needs "
          f"~{nbytes / 2**20:.3g} MiB; {free / 2**20:.3g} MiB are free there); "
          + (f"the last checkpoint, step {last}, is intact" if last is not None else
             "no checkpoint was saved before") + ": make room and run the same command again"
      ) from None

  def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
    """State with the shapes, dtypes and shardings of `like`, and the saved meta.

    Raises CheckpointDamaged (on every process alike) when a file of `step` is unreadable or an
    array does not match its checksum, and ValueError when `like` asks for other arrays or
    shapes than the step holds (a changed model or config, not damage).
    """
    if step not in self._manager.all_steps():
      raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}")
    path = ocp.step.find_step_path(self.directory, ocp.step.standard_name_format(), step=step)
    state, meta, saved, shards, saved_on = None, {}, None, [], None
    # Orbax's handlers directly, not CheckpointManager.restore: the manager ends its restore
    # with a barrier that a process whose read failed never reaches, so the others would wait
    # there instead of agreeing (in checks.agree) to fall back together.
    handler = ocp.StandardCheckpointHandler()
    verdict = checks.Verdict()
    try:
      with verdict.reading("meta"):
        meta = dict(ocp.JsonCheckpointHandler().restore(path / "meta", args=ocp.args.JsonRestore()))
        saved = meta.pop(CHECKSUMS, None)
        saved_on = meta.pop(LAYOUT, None)
      if verdict.ok:
        with verdict.reading("state metadata"):
          tree = handler.metadata(path / "state").tree
          leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
          held = {getattr(m, "name", None) or checks.array_name(p): tuple(getattr(m, "shape", ()))
                  for p, m in leaves}
      if verdict.ok:
        verdict.mismatch = checks.mismatch(held, like)
      if verdict.ok:
        with verdict.reading("state"):
          abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
          state = handler.restore(path / "state", args=ocp.args.StandardRestore(abstract))
      if verdict.ok and saved is not None:
        (verdict.array, verdict.problem), shards = checks.verify(state, saved)
    finally:
      handler.close()
    if verdict.read_failed:
      checks.quiet_late_reads()
    kind, array, problem = checks.agree(verdict)
    if kind == "mismatch":
      raise CheckpointMismatch(f"checkpoint step {step} in {self.directory} does not hold what the "
                       f"restore asks for: {problem}")
    if kind == "damaged":
      raise CheckpointDamaged(step, array, problem)
    unchecked = [] if saved is None else checks.unchecked(shards)
    if saved is None:
      logging.warning("checkpoint step %d in %s has no checksums (saved before they were "
                      "written); restored without verification", step, self.directory)
    elif unchecked:
      logging.warning("checkpoint step %d: %d saved shard(s) could not be verified in this "
                      "layout (%s)", step, len(unchecked), ", ".join(unchecked[:5]))
    now = layout_of(state)
    self.layout_change = (saved_on, now) if saved_on and now and saved_on != now else None
    if self.layout_change:
      logging.warning("checkpoint step %d in %s was saved on %s and is restored onto %s: "
                      "orbax resharded its arrays%s", step, self.directory,
                      describe_layout(saved_on), describe_layout(now),
                      ", each matching its checksum" if saved and not unchecked else "")
    return state, meta

  def restore_latest(self, like: Any,
                     at_most: int | None = None) -> tuple[int | None, Any, dict[str, Any]]:
    """The newest intact step (no later than `at_most`): (step, state, meta), or (None, None,
    {}) when there is none.

    A damaged step gets one warning line naming the array and the damage, and is moved to
    `<directory>/damaged/` (so the resumed run can save that step number again); the next
    older step is tried.
    """
    steps = sorted((s for s in self._manager.all_steps() if at_most is None or s <= at_most),
                   reverse=True)
    for i, step in enumerate(steps):
      try:
        state, meta = self.restore(step, like)
        return step, state, meta
      except CheckpointDamaged as e:
        moved = self._set_aside(step)
        then = f"trying step {steps[i + 1]}" if i + 1 < len(steps) else "no older step is left"
        logging.warning("%s; moved to %s; %s", e, moved, then)
    return None, None, {}

  def set_aside_after(self, step: int) -> list[int]:
    """Move the steps after `step` out of the manager's view, into `superseded/` (runs side
    by side resume from the newest step every run has; a run that saved past it saves those
    steps again). The steps moved."""
    later = sorted(s for s in self._manager.all_steps() if s > step)
    for s in later:
      self._set_aside(s, "superseded")
    return later

  def _set_aside(self, step: int, folder: str = "damaged") -> str:
    """Move a damaged step out of the manager's view; the files stay for inspection."""
    dest = os.path.join(self.directory, folder)  # what the other processes can name
    if jax.process_index() == 0:
      path = ocp.step.find_step_path(self.directory, ocp.step.standard_name_format(), step=step)
      base = os.path.join(dest, f"{step}-{time.strftime('%Y%m%dT%H%M%S')}")
      dest, n = base, 1
      while os.path.exists(dest):
        dest, n = f"{base}.{n}", n + 1
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      os.rename(path, dest)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"rlscale checkpoint set aside {step}")
    self._manager.reload()
    return dest

  def wait(self) -> None:
    with self._storage_guard():
      self._manager.wait_until_finished()
    self._in_flight = None

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._manager.close()
      self._remove_partial()

  def _remove_partial(self) -> None:
    """The refused save's partial folder, removed (process 0; the other processes' files lie
    in the same folder) after the manager's close, and again should a late tensorstore write
    of that save make it anew (a loaded machine): until it stays gone for a second."""
    if self._refused is None or jax.process_index() != 0:
      return
    pattern = os.path.join(self.directory, f"{self._refused}.orbax-checkpoint-tmp*")
    deadline, quiet_since = time.monotonic() + 15.0, None
    while time.monotonic() < deadline:
      partials = glob.glob(pattern)
      for partial in partials:  # a pass that meets a writer still adding files is retried
        shutil.rmtree(partial, ignore_errors=True)
      now = time.monotonic()
      quiet_since = None if partials else (quiet_since or now)
      if quiet_since is not None and now - quiet_since >= 1.0:
        return
      time.sleep(0.1)
