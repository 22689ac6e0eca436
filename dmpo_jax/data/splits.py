"""Instance splits that hold: sets A (SFT and RL), B (RL only) and C (evaluation only).

An instance is identified by its content, `instance_id(key, q)`: the task key and the
instance's canonical JSON (sorted keys, no spaces). Two seeds that generate the same
graph are one instance; at the `tiny` level that happens constantly (GCP-D gives about
1,600 distinct instances in 4,000 draws), so sets drawn from disjoint seeds are not
disjoint, and disjointness has to be checked on content.

Per task, three disjoint sets of distinct instances (docs/COLLAPSE.md, "Splits"):

* A (default 16): SFT trains on them, and RL trains on them;
* B (default 16): RL trains on them, SFT never sees them, so that pass@k there can
  fall as well as rise;
* C (default 8): evaluation only.

Fixed lists (a split file, or any lists passed to `check_disjoint`) that repeat an
instance are refused with the instances named. A random stream (a stage that draws
fresh instances instead of a set) redraws every instance that falls in C, and for
SFT also in B (`TaskSet.train`), since a stream collides too often to refuse.
"""

from __future__ import annotations

import dataclasses
import json
import os

DEFAULT_SIZES = (16, 16, 8)  # A, B, C per task
NAMES = ("A", "B", "C")


class SplitError(ValueError):
  """Sets that overlap or repeat an instance, or a malformed split file; the message names it."""


def canonical(q) -> str:
  """The instance's canonical JSON: sorted keys, no whitespace (tuples read as lists)."""
  return json.dumps(q, sort_keys=True, separators=(",", ":"))


def instance_id(key: str, q) -> str:
  """An instance's identity: task key and canonical JSON."""
  return f"{key}:{canonical(q)}"


def _short(ident: str, width: int = 90) -> str:
  return ident if len(ident) <= width else ident[:width - 3] + "..."


def check_disjoint(sets: dict[str, list]) -> None:
  """Refuse named lists of (key, instance) that repeat an instance within a list or share one
  across lists; the message names every such instance and where it occurs."""
  seen: dict[str, list[str]] = {}
  for name, items in sets.items():
    for j, (key, q) in enumerate(items):
      seen.setdefault(instance_id(key, q), []).append(f"{name}[{j}]")
  bad = {i: where for i, where in seen.items() if len(where) > 1}
  if bad:
    lines = [f"  {_short(i)} at {', '.join(where)}" for i, where in list(bad.items())[:20]]
    more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
    raise SplitError(f"instance sets {list(sets)} must be disjoint and free of repeats; "
                     f"{len(bad)} instance(s) occur more than once:\n" + "\n".join(lines) + more)


@dataclasses.dataclass(frozen=True)
class Splits:
  """The three sets, each a list of (task key, instance), task-major within a set."""
  A: list
  B: list
  C: list

  def __post_init__(self):
    check_disjoint({"A": self.A, "B": self.B, "C": self.C})

  def by_task(self, name: str, key: str) -> list:
    return [q for k, q in getattr(self, name) if k == key]

  def ids(self, *names: str) -> set[str]:
    return {instance_id(k, q) for n in names for k, q in getattr(self, n)}

  def to_json(self) -> dict:
    return {n: [[k, q] for k, q in getattr(self, n)] for n in NAMES}


def parse_sizes(value) -> tuple[int, int, int]:
  """config.collapse.splits: (A, B, C) per task, or "" / () / None for no splits."""
  if value in (None, "", (), []):
    return ()
  if isinstance(value, str):
    value = [v for v in value.replace("+", ",").split(",") if v.strip()]
  try:
    sizes = tuple(int(v) for v in value)
  except (TypeError, ValueError):
    raise SplitError(f"config.collapse.splits={value!r}: expected three sizes (A, B, C) per task") from None
  if len(sizes) != 3 or sizes[0] < 1 or sizes[2] < 1 or sizes[1] < 0:
    raise SplitError(f"config.collapse.splits={value!r}: expected (A >= 1, B >= 0, C >= 1) per task")
  return sizes


def draw(keys, sizes, draw_fn, seeds_of) -> Splits:
  """Per task, the first A + B + C distinct instances that `draw_fn(key, seeds)` returns
  (-> (seed, instance)), taken in the order C, A, B; `seeds_of(start)` is the seed range
  tried from `start`. C comes first so that growing A or B leaves C as it is."""
  a, b, c = sizes
  out = {"A": [], "B": [], "C": []}
  for key in keys:
    got, seen, start = [], set(), None
    while len(got) < a + b + c:
      seed, q = draw_fn(key, seeds_of(start))
      start = seed + 1
      i = instance_id(key, q)
      if i not in seen:
        seen.add(i)
        got.append(q)
    out["C"] += [(key, q) for q in got[:c]]
    out["A"] += [(key, q) for q in got[c:c + a]]
    out["B"] += [(key, q) for q in got[c + a:]]
  return Splits(**out)


def load(path: str, keys) -> Splits:
  """A split file: {"A": [[key, instance], ...], "B": [...], "C": [...]} (checked disjoint;
  its task keys must be among the config's)."""
  if not os.path.isfile(path):
    raise SplitError(f"config.collapse.split_file={path!r}: no such file")
  with open(path) as f:
    raw = json.load(f)
  if not isinstance(raw, dict) or set(raw) != set(NAMES):
    raise SplitError(f"{path}: expected an object with keys {list(NAMES)}, got "
                     f"{sorted(raw) if isinstance(raw, dict) else type(raw).__name__}")
  sets = {}
  for n in NAMES:
    rows = raw[n]
    if not all(isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) for r in rows):
      raise SplitError(f"{path}: set {n} must be a list of [task key, instance] pairs")
    unknown = sorted({r[0] for r in rows} - set(keys))
    if unknown:
      raise SplitError(f"{path}: set {n} holds tasks {unknown} that config.tasks {list(keys)} lacks")
    sets[n] = [(k, q) for k, q in rows]
  check_disjoint(sets)
  return Splits(**sets)
