"""Preemption-safe checkpoints with orbax: state, RNG, data position and counters.

A run saves periodically and at the end; re-running the same command in the same workdir
resumes from the latest complete checkpoint. Saves are asynchronous (the next step runs while
the files are written); a step is saved only after its metrics were checked finite, so a NaN
never reaches a checkpoint.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  def __init__(self, directory: str, keep: int = 2, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Start saving `state` (a pytree of arrays) and `meta` (JSON) as `step`."""
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
    """State with the shapes, dtypes and shardings of `like`, and the saved meta."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    out = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return out["state"], dict(out["meta"])

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
