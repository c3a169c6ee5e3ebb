"""Name -> function tables, so configs pick algorithms by name."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(dict):
  def __init__(self, kind: str):
    super().__init__()
    self.kind = kind

  def register(self, name: str) -> Callable[[F], F]:
    def add(fn: F) -> F:
      if name in self:
        raise ValueError(f"{self.kind} {name!r} is registered twice")
      self[name] = fn
      return fn
    return add

  def get(self, name: str):  # type: ignore[override]
    if name not in self:
      raise ValueError(f"unknown {self.kind} {name!r}; known: {sorted(self)}")
    return self[name]
