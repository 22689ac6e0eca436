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

``limit`` counts distinct canonical forms; ``complete`` is False when the
limit or the time limit cut the enumeration short or when the optimum was
not proven. Results are memoised on the parsed problem (instances are never
mutated), so the SFT loop can draw from them every step.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time

import numpy as np
from typing import Callable, Iterator, Sequence

from dmpo_jax.tasks.common import cp_model
from dmpo_jax.tasks.planning import canonical_cycle
from dmpo_jax.tasks.selection import _best_count_subset


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


class _Enum:
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

def _cpsat_optimum(build: Callable, sense: str, deadline: float):
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


def _cpsat_enumerate(build: Callable, fix: Callable, read: Callable, acc: _Enum) -> bool:
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


def _cpsat_task(build, sense, fix_obj, read, limit, deadline, value_of=float):
  """Optimum, then enumeration at it: (solutions, complete, value, reason)."""
  if cp_model() is None:
    return [], False, None, "OR-Tools is not installed"
  opt, proven = _cpsat_optimum(build, sense, deadline)
  if opt is None:
    return [], proven, None, "" if proven else "no solution found in time"
  acc = _Enum(limit, deadline)
  exhaustive = _cpsat_enumerate(build, lambda model, v: fix_obj(model, v, opt), read, acc)
  reason = acc.cut if not exhaustive else ("" if proven else "optimum not proven in time")
  return list(acc.found), exhaustive and proven, value_of(opt), reason


def _cycle_canon(succ: dict) -> tuple:
  """Canonical cycle (as the verifier's) from a successor map of one cycle."""
  start = min(succ)
  path = [start]
  while succ[path[-1]] != start:
    path.append(succ[path[-1]])
  return canonical_cycle(path)


def _orient(model, lits: dict, n: int, present=None):
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


def _successors(val, lits) -> dict:
  return {a: b for (a, b), lit in lits.items() if val(lit)}


# ---------------------------------------------------------------------------
# Per-task enumerators: (task, problem, limit, deadline) -> (solutions, complete, value, reason).

def _subset_sum(task, p, limit, deadline):
  if any(v < 0 for v in p.values.values()):
    return [], False, None, "negative numbers (the DP assumes values >= 0)"
  best = _best_count_subset(p.values, p.target)
  if best is None:
    return [], True, None, ""
  k = len(best)
  ids = sorted(p.values)
  vals = [p.values[i] for i in ids]

  @functools.lru_cache(maxsize=None)
  def can(i, s, c):  # some c items of ids[i:] sum to s
    if c == 0:
      return s == 0
    if s < 0 or c > len(ids) - i:
      return False
    return can(i + 1, s - vals[i], c - 1) or can(i + 1, s, c)

  acc = _Enum(limit, deadline)

  def walk(i, s, c, chosen) -> bool:  # only enters branches that can still finish
    if c == 0:
      return acc.add(tuple(chosen))
    if can(i + 1, s - vals[i], c - 1) and not walk(i + 1, s - vals[i], c - 1, chosen + [ids[i]]):
      return False
    return not can(i + 1, s, c) or walk(i + 1, s, c, chosen)

  done = walk(0, p.target, k, [])
  return list(acc.found), done, float(k), acc.cut


def _knapsack(task, p, limit, deadline):
  ids = sorted(p.items)
  n, cap = len(ids), p.capacity
  if cap < 0:
    return [], True, None, ""
  # best[i][c]: the largest value of items ids[i:] within capacity c.
  best = [[0] * (cap + 1) for _ in range(n + 1)]
  for i in range(n - 1, -1, -1):
    w, v = p.items[ids[i]]
    for c in range(cap + 1):
      best[i][c] = max(best[i + 1][c], best[i + 1][c - w] + v if w <= c else 0)
  acc = _Enum(limit, deadline)

  def walk(i, c, need, chosen) -> bool:
    if i == n:
      return acc.add(tuple(chosen))
    w, v = p.items[ids[i]]
    if w <= c and best[i + 1][c - w] >= need - v:
      if not walk(i + 1, c - w, need - v, chosen + [ids[i]]):
        return False
    return not best[i + 1][c] >= need or walk(i + 1, c, need, chosen)

  done = walk(0, cap, best[0][cap], [])
  return list(acc.found), done, float(best[0][cap]), acc.cut


# ---------------------------------------------------------------------------
# Exhaustive search for small instances: exact like CP-SAT, without its ~10 ms of set-up per
# call, which dominated the instance filter of the collapse testbed (tiny graphs have <= 7
# vertices). Larger instances go to CP-SAT. tests/test_optima.py checks both paths agree.
SEARCH_MAX = 14  # vertices (graph sets, colourings) or subsets (set cover) searched exhaustively


def _best_masks(n: int, ok, score):
  """Over every subset mask of n elements: (best score, masks that reach it), the masks that
  ok(masks) keeps only; ok and score take a [2^n] int64 array."""
  masks = np.arange(1 << n, dtype=np.int64)
  masks = masks[ok(masks)]
  if not len(masks):
    return None, masks
  sc = score(masks)
  best = sc.max()
  return best, masks[sc == best]


def _popcount(masks):
  return np.array([bin(int(m)).count("1") for m in masks], np.int64)


def _members(mask: int, n: int) -> tuple:
  return tuple(i for i in range(n) if mask >> i & 1)


def _cut(forms: list, limit: int):
  """(forms, complete, reason) after applying the limit to a full list."""
  if len(forms) > limit:
    return forms[:limit], False, f"more than limit={limit} optimal solutions"
  return forms, True, ""


def _set_in_graph_search(task, p, limit):
  bad = [sum(1 << v for v in range(p.n) if v != u and not task._ok(p, u, v)) for u in range(p.n)]

  def ok(masks):  # no member conflicts with another member
    keep = np.ones(len(masks), bool)
    for u in range(p.n):
      keep &= ((masks >> u) & 1 == 0) | (masks & bad[u] == 0)
    return keep

  best, masks = _best_masks(p.n, ok, _popcount)
  forms, complete, reason = _cut(sorted(_members(int(m), p.n) for m in masks), limit)
  return forms, complete, float(best), reason


def _colouring_search(task, p, limit):
  """Every proper colouring labelled in order of first use (restricted growth strings) with
  the fewest colours: depth-first, colour by colour, pruned at the best count found so far."""
  adj = [[] for _ in range(p.n)]
  for u, v in p.edges:
    adj[max(u, v)].append(min(u, v))
  best, found, x = [p.n + 1], [], [0] * p.n

  def walk(v, top):  # top = colours used by 0..v-1
    if top > best[0]:
      return
    if v == p.n:
      if top < best[0]:
        best[0], found[:] = top, []
      found.append(tuple(x))
      return
    for c in range(min(top + 1, best[0])):
      if all(x[u] != c for u in adj[v]):
        x[v] = c
        walk(v + 1, max(top, c + 1))

  walk(0, 0)
  forms, complete, reason = _cut(sorted(found), limit)
  return forms, complete, float(best[0]), reason


def _set_cover_search(task, p, limit):
  ids = sorted(p.sets)
  cover = [sum(1 << i for i, e in enumerate(sorted(p.universe)) if e in p.sets[s]) for s in ids]
  full = (1 << len(p.universe)) - 1

  def ok(masks):
    got = np.zeros(len(masks), np.int64)
    for j, c in enumerate(cover):
      got |= np.where((masks >> j) & 1 == 1, c, 0)
    return got == full

  best, masks = _best_masks(len(ids), ok, lambda m: -_popcount(m))
  forms, complete, reason = _cut(sorted(tuple(ids[j] for j in _members(int(m), len(ids)))
                                        for m in masks), limit)
  return forms, complete, float(-best), reason


def _set_cover(task, p, limit, deadline):
  if not p.coverable:
    return [("Impossible",)], True, 0.0, ""
  ids = sorted(p.sets)
  if len(ids) <= SEARCH_MAX:
    return _set_cover_search(task, p, limit)

  def build(model):
    x = {i: model.NewBoolVar(f"s{i}") for i in ids}
    for e in p.universe:
      model.AddBoolOr([x[i] for i in ids if e in p.sets[i]])
    return x, sum(x.values())

  return _cpsat_task(build, "min", lambda model, x, k: model.Add(sum(x.values()) == k),
                     lambda val, x: tuple(i for i in ids if val(x[i])), limit, deadline)


def _set_in_graph(task, p, limit, deadline):
  if p.n == 0:
    return [], True, None, ""
  if p.n <= SEARCH_MAX:
    return _set_in_graph_search(task, p, limit)

  def build(model):
    x = [model.NewBoolVar(f"x{v}") for v in range(p.n)]
    for u in range(p.n):
      for v in range(u + 1, p.n):
        if not task._ok(p, u, v):
          model.AddBoolOr([x[u].Not(), x[v].Not()])
    return x, sum(x)

  return _cpsat_task(build, "max", lambda model, x, k: model.Add(sum(x) == k),
                     lambda val, x: tuple(v for v in range(p.n) if val(x[v])), limit, deadline)


def _colouring(task, p, limit, deadline):
  """Colours 0..k-1 in order of first use: top[v] is the largest colour among vertices
  0..v and x[v] <= top[v-1] + 1, so each partition into colour classes appears once,
  labelled exactly as the verifier's canonical form."""
  if p.n == 0:
    return [()], True, 0.0, ""
  if p.n <= SEARCH_MAX // 2:  # restricted growth strings: Bell(7) = 877 at most
    return _colouring_search(task, p, limit)

  def build(model):
    x = [model.NewIntVar(0, p.n - 1, f"c{v}") for v in range(p.n)]
    top = [model.NewIntVar(0, p.n - 1, f"top{v}") for v in range(p.n)]
    model.Add(x[0] == 0)
    model.Add(top[0] == 0)
    for v in range(1, p.n):
      model.Add(x[v] <= top[v - 1] + 1)
      model.AddMaxEquality(top[v], [top[v - 1], x[v]])
    for u, v in p.edges:
      model.Add(x[u] != x[v])
    return x, top[-1]

  def fix(model, x, k):  # colours 0..k only: top (determined by x) is then k
    for c in x:
      model.Add(c <= k)

  return _cpsat_task(build, "min", fix, lambda val, x: tuple(val(c) for c in x), limit, deadline,
                     value_of=lambda top: float(top + 1))


def _tsp(task, p, limit, deadline):
  if p.n < 3:
    return [tuple(range(p.n))], True, float(sum(p.d[i][(i + 1) % p.n] for i in range(p.n))), ""
  if any(d != int(d) for row in p.d for d in row):
    return [], False, None, "non-integral distances (CP-SAT needs integers)"

  def build(model):
    lits = {(i, j): model.NewBoolVar(f"a{i}_{j}") for i in range(p.n) for j in range(p.n) if i != j}
    model.AddCircuit([(i, j, lit) for (i, j), lit in lits.items()])
    _orient(model, lits, p.n)
    return lits, sum(int(p.d[i][j]) * lit for (i, j), lit in lits.items())

  def fix(model, lits, length):
    model.Add(sum(int(p.d[i][j]) * lit for (i, j), lit in lits.items()) == length)

  return _cpsat_task(build, "min", fix, lambda val, lits: _cycle_canon(_successors(val, lits)),
                     limit, deadline)


def _longest_cycle(task, p, limit, deadline):
  """Arcs of both directions plus a skip loop per vertex (AddCircuit), one cycle of
  >= 3 vertices, oriented at its smallest vertex; value = cycle vertices + 1 (path length)."""
  if not any(p.adj):
    return [], True, None, ""

  def build(model):
    skip = [model.NewBoolVar(f"skip{v}") for v in range(p.n)]
    lits = {(v, u): model.NewBoolVar(f"a{v}_{u}") for v in range(p.n) for u in sorted(p.adj[v])}
    model.AddCircuit([(v, v, skip[v]) for v in range(p.n)]
                     + [(v, u, lit) for (v, u), lit in lits.items()])
    model.Add(sum(skip) <= p.n - 3)
    _orient(model, lits, p.n, present=[s.Not() for s in skip])
    return (skip, lits), sum(s.Not() for s in skip)

  def fix(model, v, length):
    model.Add(sum(v[0]) == p.n - length)

  sols, complete, value, reason = _cpsat_task(
      build, "max", fix, lambda val, v: _cycle_canon(_successors(val, v[1])), limit, deadline)
  return sols, complete, None if value is None else value + 1, reason


# ---------------------------------------------------------------------------
def _as_set(canon):
  return "Impossible" if canon == ("Impossible",) else list(canon)


def _as_cycle(canon):
  return list(canon) + list(canon[:1])


def _as_colours(canon):
  return [c + 1 for c in canon]


# task key -> (enumerator, canonical form -> solution for Task.format_answer)
_ENUMERATORS = {
    "subset-sum": (_subset_sum, _as_set),
    "knapsack": (_knapsack, _as_set),
    "set-cover": (_set_cover, _as_set),
    "maximum-set": (_set_in_graph, _as_set),
    "maximum_clique_problem": (_set_in_graph, _as_set),
    "GCP-D": (_colouring, _as_colours),
    "TSP": (_tsp, _as_cycle),
    "hamiltonian-cycle": (_longest_cycle, _as_cycle),
}


def supported() -> list[str]:
  """Task keys with optimal-solution enumeration."""
  return list(_ENUMERATORS)


def _entry(task):
  if task.key not in _ENUMERATORS:
    raise NotImplementedError(f"{task.key}: optimal-solution enumeration is not implemented; "
                              f"supported tasks: {supported()}")
  return _ENUMERATORS[task.key]


def answer_solution(task, canonical):
  """The solution (a ``Task.format_answer`` input, e.g. an SFT target) of a canonical form."""
  if not isinstance(canonical, tuple):
    raise TypeError(f"{task.key}: a canonical solution is a tuple (a Verdict.solution), "
                    f"got {type(canonical).__name__} {canonical!r}")
  return _entry(task)[1](canonical)


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
  enumerate_fn, _ = _entry(task)
  problem = task.problem(instance)
  memo = problem.__dict__.setdefault("_optima", {})
  if (limit, time_limit) in memo:
    return memo[(limit, time_limit)]
  for hit in memo.values():  # a complete list serves every limit that it fits
    if hit.complete and len(hit.solutions) <= limit:
      return hit
  t0 = time.monotonic()
  sols, complete, value, reason = enumerate_fn(task, problem, limit, t0 + time_limit)
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
