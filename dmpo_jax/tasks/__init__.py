"""The ten NP-Bench tasks (docs/TASKS.md): generators, verifiers, solvers, scoring.

    from dmpo_jax import tasks
    task = tasks.get("TSP")
    q = task.generate(seed=0, level="easy")      # NP-Bench `question` dict
    task.verify(q, "... Answer: [0, 3, 1, 2, 0]") # Verdict(feasible, value, reason)
"""

from dmpo_jax.tasks import scoring
from dmpo_jax.tasks.base import (CATEGORIES, COMPAT, IMAGE, IMAGE_STYLES, LEVELS, PROMPT_STYLES, Exact,
                                 Task, Verdict)
from dmpo_jax.tasks.graph import GraphColoring, MaximumClique, MaximumIndependentSet
from dmpo_jax.tasks.partition import MinimumBisection
from dmpo_jax.tasks.planning import TSP, LongestCycle
from dmpo_jax.tasks.schedule import MeetingSchedule
from dmpo_jax.tasks.selection import Knapsack, SetCover, SubsetSum

_TASKS = {t.key: t for t in (
    GraphColoring(), MaximumClique(), MaximumIndependentSet(), MeetingSchedule(),
    MinimumBisection(), SetCover(), SubsetSum(), Knapsack(), TSP(), LongestCycle())}
_BUILTIN = frozenset(_TASKS)


def names() -> list[str]:
  """The task keys: the ten NP-Bench tasks in docs/TASKS.md's order, then any `register`ed."""
  return list(_TASKS)


def with_optima() -> list[str]:
  """Task keys whose every optimum is enumerated (`Task.optimal_solutions`)."""
  return [k for k, t in _TASKS.items() if t.has_optima]


def get(key: str) -> Task:
  if key not in _TASKS:
    raise KeyError(f"unknown task {key!r}; choose from {names()}")
  return _TASKS[key]


def register(task: Task) -> Task:
  """Add a task of a new domain under `task.key` (after the ten NP-Bench tasks in `names()`);
  a key already taken is refused. Returns the task (docs/ARCHITECTURE.md, "A new domain")."""
  if not isinstance(task, Task) or not task.key:
    raise TypeError(f"register takes a Task instance with a key, got {task!r}")
  if task.key in _TASKS:
    raise ValueError(f"task key {task.key!r} is taken; choose another")
  for attr, allowed in (("direction", ("min", "max")), ("category", None)):
    if not getattr(task, attr) or (allowed and getattr(task, attr) not in allowed):
      raise ValueError(f"task {task.key!r}: {attr}={getattr(task, attr)!r}; "
                       f"{'choose from ' + str(allowed) if allowed else 'set it'}")
  _TASKS[task.key] = task
  return task


def unregister(key: str) -> None:
  """Remove a task added by `register` (the ten NP-Bench tasks stay)."""
  if key in _BUILTIN:
    raise ValueError(f"{key!r} is one of the NP-Bench tasks and cannot be removed")
  _TASKS.pop(key, None)


__all__ = ["CATEGORIES", "COMPAT", "IMAGE", "IMAGE_STYLES", "LEVELS", "PROMPT_STYLES", "Exact",
           "Task", "Verdict", "get", "names", "register", "scoring", "unregister", "with_optima"]
