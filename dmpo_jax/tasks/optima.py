"""Every optimal solution of an instance, in canonical form (the mode-collapse testbed).

    task = tasks.get("subset-sum")
    q = task.generate(seed=3, level="easy")
    opt = task.optimal_solutions(q, limit=64)   # Optima(solutions, complete, value, ...)
    text = task.format_solution(opt.solutions[0])
    task.verify_answer(q, text).solution == opt.solutions[0]   # True

A canonical form is exactly the ``Verdict.solution`` the strict verifier gives:
a sorted tuple of ids for the set tasks (subset-sum, knapsack, set-cover,
clique, independent set), the first-occurrence colour relabelling for GCP-D
(colours 0..k-1 in order of first use), and the cycle up to rotation and
direction (smallest vertex first, smaller neighbour second) for TSP and
hamiltonian-cycle. Two answers are "the same solution" iff their canonical
forms are equal, so counts of distinct optima are semantic, not textual.

Enumeration is exact search where it is cheap (subset-sum, knapsack: dynamic
programming plus a depth-first search that only enters branches that can
still reach the optimum) and CP-SAT elsewhere: solve for the optimum, fix the
objective at it, drop the objective, then enumerate every solution with one
worker. Every CP-SAT variable is either a decision the answer fixes or is
determined by it, and the remaining symmetries are broken in the model (colour
relabelling for GCP-D, cycle direction for the cycle tasks), so each
canonical form is found once; the result is still deduplicated as a guard.

Each task's enumerator is its `Task.enumerate_optima` method, in the task's own
module (graph.py, selection.py, planning.py); this module holds what they share
(CP-SAT plumbing, exhaustive subset search, the `Collector` of distinct forms)
and the checked entry points (`optimal_solutions`, `sample_optimal`,
`optima_in_range`, `instances_with_optima`). `dmpo_jax.tasks.with_optima()`
lists the tasks that have one.

``limit`` counts distinct canonical forms; ``complete`` is False when the
limit or the time limit cut the enumeration short or when the optimum was
not proven. Results are memoised on the parsed problem (instances are never
mutated), so the SFT loop can draw from them every step.
"""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
from typing import Callable, Iterator, Sequence

from dmpo_jax.tasks.common import cp_model


@dataclasses.dataclass(frozen=True)
class Optima:
  """All (or the first ``limit``) optimal solutions of one instance.

  solutions: distinct canonical forms, sorted; each equals the strict
    ``Verdict.solution`` of its answer.
  complete: True iff the optimum is proven and every optimal solution is listed.
  value: the optimal objective (as the verifier computes it), None if none found.
  seconds: wall time of the enumeration.
  reason: why the enumeration is incomplete ("" when complete).
  """
  solutions: tuple
  complete: bool
  value: float | None
  seconds: float = 0.0
  reason: str = ""

  def __len__(self):
    return len(self.solutions)


class Collector:
  """Collects distinct canonical forms up to a limit (one more than the limit means cut)."""

  def __init__(self, limit: int, deadline: float):
    self.limit, self.deadline = limit, deadline
    self.found: dict = {}
    self.cut = ""

  def add(self, canon) -> bool:
    """Record one solution; False when the search must stop."""
    self.found[canon] = None
    if len(self.found) > self.limit:
      self.cut = f"more than limit={self.limit} optimal solutions"
      return False
    if time.monotonic() > self.deadline:
      self.cut = "time limit"
      return False
    return True


# ---------------------------------------------------------------------------
# CP-SAT plumbing.

def cpsat_optimum(build: Callable, sense: str, deadline: float):
  """Solve build(model) -> (vars, objective expr) for its optimum: (value or None, proven)."""
  m = cp_model()
  model = m.CpModel()
  _, obj = build(model)
  (model.Minimize if sense == "min" else model.Maximize)(obj)
  solver = m.CpSolver()
  solver.parameters.max_time_in_seconds = max(0.01, deadline - time.monotonic())
  solver.parameters.num_workers = 1
  solver.parameters.random_seed = 0
  status = solver.Solve(model)
  if status == m.OPTIMAL:
    return round(solver.ObjectiveValue()), True
  if status == m.FEASIBLE:
    return round(solver.ObjectiveValue()), False
  return None, status == m.INFEASIBLE


def cpsat_enumerate(build: Callable, fix: Callable, read: Callable, acc: Collector) -> bool:
  """Enumerate every solution of build(model) with fix(model, vars) added; True if exhaustive.

  read(value_fn, vars) -> canonical form. One worker, no objective: CP-SAT then
  visits each assignment of the model's variables exactly once.
  """
  m = cp_model()
  model = m.CpModel()
  variables, _ = build(model)
  fix(model, variables)

  class _Cb(m.CpSolverSolutionCallback):
    def on_solution_callback(self):
      if not acc.add(read(self.Value, variables)):
        self.StopSearch()

  solver = m.CpSolver()
  solver.parameters.enumerate_all_solutions = True
  solver.parameters.num_workers = 1
  solver.parameters.random_seed = 0
  solver.parameters.max_time_in_seconds = max(0.01, acc.deadline - time.monotonic())
  status = solver.Solve(model, _Cb())
  if acc.cut:
    return False
  if status in (m.OPTIMAL, m.INFEASIBLE):
    return True
  acc.cut = "time limit"
  return False


def cpsat_task(build, sense, fix_obj, read, limit, deadline, value_of=float):
  """Optimum, then enumeration at it: (solutions, complete, value, reason)."""
  if cp_model() is None:
    return [], False, None, "OR-Tools is not installed"
  opt, proven = cpsat_optimum(build, sense, deadline)
  if opt is None:
    return [], proven, None, "" if proven else "no solution found in time"
  acc = Collector(limit, deadline)
  exhaustive = cpsat_enumerate(build, lambda model, v: fix_obj(model, v, opt), read, acc)
  reason = acc.cut if not exhaustive else ("" if proven else "optimum not proven in time")
  return list(acc.found), exhaustive and proven, value_of(opt), reason


def orient(model, lits: dict, n: int, present=None):
  """Break a cycle's direction: its smallest vertex's successor < its predecessor.

  lits: {(u, v): arc literal}. present[v]: a literal "v is on the cycle"; None means
  every vertex is (then only vertex 0 needs the constraint).
  """
  for v in range(n if present is not None else 1):
    succ = sum(u * lit for (a, u), lit in lits.items() if a == v)
    pred = sum(u * lit for (u, b), lit in lits.items() if b == v)
    c = model.Add(succ < pred)
    if present is not None:
      c.OnlyEnforceIf([present[v]] + [present[u].Not() for u in range(v)])


def successors(val, lits) -> dict:
  return {a: b for (a, b), lit in lits.items() if val(lit)}


# ---------------------------------------------------------------------------
# ---------------------------------------------------------------------------
# Exhaustive search for small instances: exact like CP-SAT, without its ~10 ms of set-up per
# call, which dominated the instance filter of the collapse testbed (tiny graphs have <= 7
# vertices). Larger instances go to CP-SAT. tests/tasks/test_optima.py checks both paths agree.
SEARCH_MAX = 14  # vertices (graph sets, colourings) or subsets (set cover) searched exhaustively


def best_masks(n: int, ok, score):
  """Over every subset mask of n elements: (best score, masks that reach it), the masks that
  ok(masks) keeps only; ok and score take a [2^n] int64 array."""
  masks = np.arange(1 << n, dtype=np.int64)
  masks = masks[ok(masks)]
  if not len(masks):
    return None, masks
  sc = score(masks)
  best = sc.max()
  return best, masks[sc == best]


def popcount(masks):
  return np.array([bin(int(m)).count("1") for m in masks], np.int64)


def members(mask: int, n: int) -> tuple:
  return tuple(i for i in range(n) if mask >> i & 1)


def cut_to_limit(forms: list, limit: int):
  """(forms, complete, reason) after applying the limit to a full list."""
  if len(forms) > limit:
    return forms[:limit], False, f"more than limit={limit} optimal solutions"
  return forms, True, ""


# ---------------------------------------------------------------------------
def as_set(canon):
  return "Impossible" if canon == ("Impossible",) else list(canon)


def as_cycle(canon):
  return list(canon) + list(canon[:1])


def as_colours(canon):
  return [c + 1 for c in canon]


def answer_solution(task, canonical):
  """The solution (a ``Task.format_answer`` input, e.g. an SFT target) of a canonical form."""
  if not isinstance(canonical, tuple):
    raise TypeError(f"{task.key}: a canonical solution is a tuple (a Verdict.solution), "
                    f"got {type(canonical).__name__} {canonical!r}")
  return task.solution_of(canonical)


def format_solution(task, canonical) -> str:
  """Answer text (the part after 'Answer:') whose strict Verdict.solution is `canonical`."""
  return task.format_answer(answer_solution(task, canonical))


def optimal_solutions(task, instance: dict, *, limit: int = 64, time_limit: float = 10.0) -> Optima:
  """Every optimal solution of `instance` up to `limit` distinct canonical forms (see Optima).

  Each form is checked against the strict verifier (its answer must give that form back,
  at the optimal value): a disagreement is a bug and raises AssertionError.
  """
  if not isinstance(limit, int) or limit < 1:
    raise ValueError(f"optimal_solutions: limit must be an int >= 1, got {limit!r}")
  if not time_limit > 0:
    raise ValueError(f"optimal_solutions: time_limit must be > 0 seconds, got {time_limit!r}")
  if not task.has_optima:
    task.enumerate_optima(None, limit, 0.0)  # raises NotImplementedError, naming the task
  problem = task.problem(instance)
  memo = problem.__dict__.setdefault("_optima", {})
  if (limit, time_limit) in memo:
    return memo[(limit, time_limit)]
  for hit in memo.values():  # a complete list serves every limit that it fits
    if hit.complete and len(hit.solutions) <= limit:
      return hit
  t0 = time.monotonic()
  sols, complete, value, reason = task.enumerate_optima(problem, limit, t0 + time_limit)
  sols = sorted(set(sols))
  if len(sols) > limit:
    sols, complete = sols[:limit], False
  for canon in sols:
    v = task.verify_answer(instance, format_solution(task, canon))
    if not v.feasible or v.solution != canon or abs(v.value - value) > 1e-6 * max(1.0, abs(value)):
      raise AssertionError(f"{task.key}: enumerated optimum {canon} (value {value}) verifies as "
                           f"{v.solution} value {v.value} ({v.reason})")
  out = Optima(tuple(sols), bool(complete), value, time.monotonic() - t0, "" if complete else reason)
  memo[(limit, time_limit)] = out
  return out


def sample_optimal(task, instance: dict, n: int, *, seed: int = 0, limit: int = 64,
                   time_limit: float = 10.0) -> list:
  """n optimal solutions (``format_answer`` inputs) drawn uniformly from the enumerated set.

  A uniform random order of the set, then uniform draws with replacement once it is
  used up: every slot is uniform over the set, and a batch repeats a form only when
  the instance has fewer than n optima. Empty when the instance has no solution.
  """
  sols = optimal_solutions(task, instance, limit=limit, time_limit=time_limit).solutions
  if not sols:
    return []
  rng = random.Random(f"{task.key}/optimal/{seed}")
  order = rng.sample(sols, len(sols))
  picks = order[:n] + [rng.choice(sols) for _ in range(n - len(order))]
  return [answer_solution(task, c) for c in picks]


def optima_in_range(task, instance: dict, min_count: int = 2, max_count: int | None = None, *,
                    limit: int = 64, time_limit: float = 10.0,
                    require_complete: bool = True) -> Optima | None:
  """The instance's Optima when it has min_count..max_count optima, else None.

  An incomplete enumeration (limit or time hit) proves only len(solutions) optima: it
  passes when that meets min_count and there is no max_count, unless require_complete.
  """
  opt = optimal_solutions(task, instance, limit=limit, time_limit=time_limit)
  n = len(opt.solutions)
  if require_complete and not opt.complete:
    return None
  if n < min_count or (max_count is not None and (n > max_count or not opt.complete)):
    return None
  return opt


def instances_with_optima(task, level: str, seeds: Sequence[int], *, min_count: int = 2,
                          max_count: int | None = None, limit: int = 64, time_limit: float = 10.0,
                          require_complete: bool = True) -> Iterator[tuple[int, dict, Optima]]:
  """(seed, instance, optima) for the seeds whose instance passes optima_in_range."""
  for seed in seeds:
    q = task.generate(seed, level)
    opt = optima_in_range(task, q, min_count, max_count, limit=limit, time_limit=time_limit,
                          require_complete=require_complete)
    if opt is not None:
      yield seed, q, opt
