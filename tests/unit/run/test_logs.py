"""The console's unraisable-exception filter drops only a failed save's late orbax noise."""

import types

from rlscale.run import logs


def _coroutine(filename):
  code = compile("async def f(): pass", filename, "exec").co_consts[0]
  return types.SimpleNamespace(cr_code=code)


def _seen(exc, obj):
  shown = []
  hook = logs._quiet_unraisable(shown.append)
  hook(types.SimpleNamespace(exc_value=exc, object=obj))
  return bool(shown)


def test_a_failed_saves_late_writes_are_dropped_and_nothing_else():
  orbax = _coroutine("/venv/site-packages/orbax/checkpoint/_src/serialization/serialization.py")
  ours = _coroutine("/repo/rlscale/trainer/loop.py")
  shutting = ImportError("sys.meta_path is None, Python is likely shutting down")
  assert not _seen(RuntimeError("Event loop is closed"), None)
  assert not _seen(shutting, orbax)
  assert _seen(shutting, ours)  # not orbax's: shown
  assert _seen(ImportError("No module named humanize"), orbax)  # not at exit: shown
  assert _seen(ValueError("boom"), orbax)
