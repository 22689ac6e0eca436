"""Each term's own settings: a small frozen dataclass of objective fields, and who owns which field.

A user sets an objective as one flat set of fields (`--config.rl.objective.dm_coef=2.0`,
`presets.objective_config("dmpo", dm_coef=2.0)`). Every field belongs to exactly one
section: a frozen dataclass registered here that holds the fields' defaults and checks
their values together (in `__post_init__`, with the helpers below, whose errors name the
field):

    @settings.section("dm")
    @dataclasses.dataclass(frozen=True)
    class DMConfig:
      dm_coef: float = 0.0   # lambda; 0 = off
      dm_alpha: float = 1.0

      def __post_init__(self):
        settings.at_least(self, 0, "dm_coef")

`build(fields)` makes every section from a flat dict (unknown names are refused with the
list of fields); `presets.ObjectiveConfig` is those sections read as one flat config, and a
term reads its own section (`cfg.part(DMConfig)`). A section registered by a test or a plugin
adds its fields to `field_names()`, which the configs offer as `rl.objective.<field>`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

SECTIONS: dict[str, type] = {}  # name -> frozen dataclass
OWNERS: dict[str, str] = {}     # field -> the name of the section that owns it


def section(name: str) -> Callable[[type], type]:
  """Class decorator: register a frozen dataclass as the section `name`, owning its fields."""
  def add(cls: type) -> type:
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):
      raise TypeError(f"objective section {name!r}: {cls.__name__} must be a frozen dataclass")
    if name in SECTIONS:
      raise ValueError(f"objective section {name!r} is already registered")
    taken = [f.name for f in dataclasses.fields(cls) if f.name in OWNERS]
    if taken:
      raise ValueError(f"objective section {name!r}: field(s) {taken} already belong to section "
                       f"{OWNERS[taken[0]]!r}")
    SECTIONS[name] = cls
    OWNERS.update({f.name: name for f in dataclasses.fields(cls)})
    return cls
  return add


def release(name: str) -> None:
  """Unregister the section `name` and its fields (a test's or plugin's section, when done)."""
  cls = SECTIONS.pop(name)
  for f in dataclasses.fields(cls):
    del OWNERS[f.name]


def ordered() -> list[tuple[str, type]]:
  """The sections by name: one order whichever module registered first."""
  return sorted(SECTIONS.items())


def field_names() -> list[str]:
  """Every objective field, section by section (by name), each in its declared order."""
  return [f.name for _, cls in ordered() for f in dataclasses.fields(cls)]


def build(fields: dict[str, Any]) -> dict[str, Any]:
  """{section name: its dataclass made from `fields`' values (defaults for the others)}."""
  unknown = sorted(set(fields) - set(OWNERS))
  if unknown:
    raise ValueError(f"unknown objective field(s) {unknown}; valid fields: {sorted(OWNERS)}")
  return {name: cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls) if f.name in fields})
          for name, cls in ordered()}


# ------------------------------------------------------------------ checks (errors name the field)

def at_least(obj, lo, *names: str) -> None:
  """Each field >= lo (0 for a coefficient)."""
  for n in names:
    if getattr(obj, n) < lo:
      raise ValueError(f"objective.{n} must be >= {lo}, got {getattr(obj, n)}")


def positive_int(obj, *names: str) -> None:
  for n in names:
    v = getattr(obj, n)
    if not (isinstance(v, int) and v >= 1):
      raise ValueError(f"objective.{n} must be an integer >= 1, got {v!r}")


def share(obj, *names: str) -> None:
  """Each field in (0, 1]: a share of tokens."""
  for n in names:
    if not 0.0 < getattr(obj, n) <= 1.0:
      raise ValueError(f"objective.{n}={getattr(obj, n)} must be in (0, 1]")


def one_of(obj, name: str, choices) -> None:
  if getattr(obj, name) not in choices:
    raise ValueError(f"objective.{name}={getattr(obj, name)!r} is not one of {tuple(choices)}")
