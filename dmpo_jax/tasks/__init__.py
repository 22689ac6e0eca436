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


def names() -> list[str]:
  """The ten NP-Bench task keys, in docs/TASKS.md's order."""
  return list(_TASKS)


def with_optima() -> list[str]:
  """Task keys whose every optimum is enumerated (`Task.optimal_solutions`)."""
  return [k for k, t in _TASKS.items() if t.has_optima]


def get(key: str) -> Task:
  if key not in _TASKS:
    raise KeyError(f"unknown task {key!r}; choose from {names()}")
  return _TASKS[key]


__all__ = ["CATEGORIES", "COMPAT", "IMAGE", "IMAGE_STYLES", "LEVELS", "PROMPT_STYLES", "Exact",
           "Task", "Verdict", "get", "names", "scoring", "with_optima"]
