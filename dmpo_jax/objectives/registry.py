"""Name -> implementation tables: one per kind of loss term, filled by a decorator.

    ADVANTAGES = Registry("advantage estimator", "objective.advantage")

    @ADVANTAGES.register("dr_grpo")
    def _dr_grpo(cfg, rewards): ...

`get` refuses an unknown name with the list of choices, naming the config
field that selects it. `items()` keeps registration order; `unregister` removes
an entry that a test or a plugin added.
"""

from __future__ import annotations

from typing import Any, Callable


class Registry:
  """Entries by name; `register(name, **attrs)` decorates a function and stores the value
  `make(fn, **attrs)` builds from it (the function itself by default)."""

  def __init__(self, kind: str, field: str | None = None, make: Callable[..., Any] | None = None):
    self.kind, self.field, self._make = kind, field, make
    self._entries: dict[str, Any] = {}

  def register(self, name: str, **attrs) -> Callable:
    def add(fn):
      if name in self._entries:
        raise ValueError(f"{self.kind} {name!r} is already registered")
      self._entries[name] = self._make(fn, **attrs) if self._make else fn
      return fn
    return add

  def unregister(self, name: str) -> None:
    """Remove `name` (a test's or plugin's entry, when done)."""
    self.get(name)
    del self._entries[name]

  def names(self) -> list[str]:
    return sorted(self._entries)

  def items(self) -> list[tuple[str, Any]]:
    """(name, entry) in registration order (the order in which `build_loss` sums regularisers)."""
    return list(self._entries.items())

  def __contains__(self, name) -> bool:
    return name in self._entries

  def get(self, name: str):
    if name not in self._entries:
      where = f"{self.field}={name!r}" if self.field else repr(name)
      raise ValueError(f"unknown {self.kind} {where}; choose one of {self.names()}")
    return self._entries[name]
