"""Selection category: set cover, subset sum, 0/1 knapsack."""

from __future__ import annotations

import functools
import math
import random
import time

import numpy as np

from dmpo_jax.tasks import checks, optima, parsing, render
from dmpo_jax.tasks.base import Exact, Infeasible, Task
from dmpo_jax.tasks.common import Problem, cp_model, solve, uniform


def _distinct_ids(ids, valid, what):
  for i in ids:
    if i not in valid:
      raise Infeasible(f"{what} {i} does not exist")
  if len(set(ids)) != len(ids):
    dup = next(i for i in ids if ids.count(i) > 1)
    raise Infeasible(f"{what} {dup} repeated")


def _union(p, ids) -> frozenset:
  """Elements covered by the subsets `ids` (empty for no subsets)."""
  return frozenset().union(*(p.sets[i] for i in ids))


# ---------------------------------------------------------------------------
class SetCover(Task):
  key = "set-cover"
  fields = {"U": (list,), "S": (dict,)}
  title = "Set cover"
  category = "selection"
  direction = "min"
  description = ("Choose as few of the given subsets as possible so that their union is the "
                 "universe U. If U cannot be covered, answer Impossible.")
  answer_format = "a list of subset ids, e.g. Answer: [0, 4, 7], or Answer: Impossible"
  TINY = ((4, 6), (3, 5))  # (universe, subsets); ours, tiny never changes
  # NP-Bench's levels: (universe, subsets). Each subset is 1 to 40% of U, drawn at random;
  # elements left uncovered are added to random subsets, so all subsets together cover U.
  SIZES = {"easy": ((10, 20), (5, 10)), "medium": ((20, 25), (10, 15)), "hard": ((25, 30), (15, 25)),
           "bench": ((30, 40), (20, 30))}

  def _generate_npbench(self, rng, level):
    nu, ns = self.SIZES[level]
    u, m = uniform(rng, nu), uniform(rng, ns)
    most = max(1, int(u * 0.4))
    sets = [set(rng.sample(range(u), rng.randint(1, most))) for _ in range(m)]
    for e in sorted(set(range(u)).difference(*sets)):
      rng.choice(sets).add(e)
    q = {"U": list(range(u)), "S": {str(i): sorted(x) for i, x in enumerate(sets)}}
    return q, list(range(m))

  def _generate(self, rng, level):
    if level != "tiny":
      return self._generate_npbench(rng, level)
    nu, ns = self.TINY
    u, m = uniform(rng, nu), uniform(rng, ns)
    k = max(2, min(m - 1, rng.randint(max(2, m // 4), max(2, m // 2))))
    elems = list(range(u))
    rng.shuffle(elems)
    cuts = sorted(rng.sample(range(1, u), min(k - 1, u - 1)))
    planted = [sorted(elems[a:b]) for a, b in zip([0] + cuts, cuts + [u])]
    others = [sorted(rng.sample(range(u), rng.randint(1, max(1, u // 3)))) for _ in range(m - len(planted))]
    sets = planted + others
    order = list(range(len(sets)))
    rng.shuffle(order)
    q = {"U": list(range(u)), "S": {str(i): sets[j] for i, j in enumerate(order)}}
    solution = sorted(i for i, j in enumerate(order) if j < len(planted))
    return q, solution

  def _validate(self, q):
    universe = q["U"]
    for e in universe:
      if not checks.is_int(e):
        checks.fail(self.key, "U", f"element {e!r} is not an integer")
    if len(set(universe)) != len(universe):
      checks.fail(self.key, "U", f"element {next(e for e in universe if universe.count(e) > 1)} "
                                 "is listed twice")
    checks.id_map(self.key, "S", q["S"], "subset")
    members = set(universe)
    for i, s in q["S"].items():
      if not isinstance(s, list):
        checks.fail(self.key, "S", f"subset {i} is {type(s).__name__}, expected a list of elements of U")
      for e in s:  # NP-Bench's check compares the union with U: an outsider fails every cover
        if not checks.is_int(e) or e not in members:
          checks.fail(self.key, "S", f"subset {i} holds {e!r}, which is not an element of U")

  def _load(self, q):
    sets = {int(k): frozenset(v) for k, v in q["S"].items()}
    universe = frozenset(q["U"])
    coverable = universe <= frozenset().union(*sets.values())
    return Problem(universe=universe, sets=sets, coverable=coverable)

  def _parse(self, answer):
    s = parsing.clean(answer)
    if s.split(None, 1) and s.split(None, 1)[0].strip(".,;:'\"[]").lower() == "impossible":
      return "Impossible"
    return parsing.parse_int_list(answer)

  def format_answer(self, solution):
    return "Impossible" if solution == "Impossible" else super().format_answer(solution)

  def _check(self, p, ids):
    if ids == "Impossible":
      if p.coverable:
        raise Infeasible("answered Impossible, but the subsets cover U")
      return 0, ("Impossible",)
    _distinct_ids(ids, p.sets, "subset")
    missing = p.universe - _union(p, ids)
    if missing:
      raise Infeasible(f"elements {sorted(missing)[:8]} are not covered")
    return len(ids), tuple(sorted(ids))

  def _greedy(self, p, rng, noise=0.0):
    left, chosen = set(p.universe), []
    while left:
      i = max(p.sets, key=lambda s: (len(p.sets[s] & left) * (1 + noise * rng.random()), -s))
      if not p.sets[i] & left:
        break
      chosen.append(i)
      left -= p.sets[i]
    return chosen

  def _prune(self, p, chosen, rng):
    chosen = list(chosen)
    rng.shuffle(chosen)
    for i in list(chosen):
      rest = [j for j in chosen if j != i]
      if p.universe <= _union(p, rest):
        chosen = rest
    return sorted(chosen)

  def _reference(self, p, rng, deadline):
    """Greedy, then simulated annealing over subsets (penalised uncovered elements)."""
    if not p.coverable:
      return "Impossible"
    best = self._prune(p, self._greedy(p, rng), rng)
    ids = sorted(p.sets)
    cur = set(best)
    def cost(sel):
      return len(sel) + 2.0 * len(p.universe - _union(p, sel))
    cur_cost, temp = cost(cur), 1.0
    for it in range(300 * len(ids)):
      if it % 256 == 0 and time.monotonic() > deadline:
        break
      i = rng.choice(ids)
      nxt = cur ^ {i}
      c = cost(nxt)
      if c <= cur_cost or rng.random() < math.exp(-(c - cur_cost) / temp):
        cur, cur_cost = nxt, c
        if c < len(best) and cost(cur) == len(cur):
          best = self._prune(p, cur, rng)
      temp = max(0.05, temp * 0.999)
    return best

  def _sample(self, p, rng):
    if not p.coverable:
      return "Impossible"
    chosen = self._greedy(p, rng, noise=2.0)
    if rng.random() < 0.5:
      chosen = self._prune(p, chosen, rng)
    rng.shuffle(chosen)
    return chosen

  def _exact(self, p, time_limit):
    if not p.coverable:
      return Exact(0.0, "OPTIMAL", "Impossible")
    m = cp_model()
    if m is None:
      return Exact(None, "UNAVAILABLE")
    model = m.CpModel()
    x = {i: model.NewBoolVar(f"s{i}") for i in p.sets}
    for e in p.universe:
      model.AddBoolOr([x[i] for i, s in p.sets.items() if e in s])
    model.Minimize(sum(x.values()))
    solver, status = solve(model, time_limit)
    if status not in ("OPTIMAL", "FEASIBLE"):
      return Exact(None, status)
    sol = sorted(i for i in x if solver.Value(x[i]))
    return Exact(float(len(sol)), status, sol)

  def _npbench_instance(self, p):
    return (f"U = {sorted(p.universe)}\nSubsets:\n"
            + "\n".join(f"{i}: {sorted(s)}" for i, s in sorted(p.sets.items())))

  def _compact(self, p):
    return (f"cover n {len(p.universe)} sets "
            + " ; ".join(" ".join(map(str, sorted(s))) for _, s in sorted(p.sets.items())))

  def _render(self, p, size):
    rows = [(i, ", ".join(map(str, sorted(s)))) for i, s in sorted(p.sets.items())]
    return render.table(size, f"Set cover: U = 0..{len(p.universe) - 1}", ("subset", "elements"), rows)

  def enumerate_optima(self, problem, limit: int, deadline: float):
    return _set_cover(self, problem, limit, deadline)

  def solution_of(self, canonical):
    return optima.as_set(canonical)


# ---------------------------------------------------------------------------
def _best_count_subset(values: dict, target: int, allowed=None):
  """Max-cardinality subset of ids with values summing exactly to target (DP); None if none."""
  ids = sorted(values) if allowed is None else sorted(allowed)
  if target < 0 or any(values[i] < 0 for i in ids):
    return None
  NEG = -1
  rows = [[NEG] * (target + 1)]  # rows[k][s]: most items among ids[:k] summing to s
  rows[0][0] = 0
  for i in ids:
    prev, w = rows[-1], values[i]
    row = list(prev)
    for s in range(w, target + 1):
      if prev[s - w] != NEG and prev[s - w] + 1 > row[s]:
        row[s] = prev[s - w] + 1
    rows.append(row)
  if rows[-1][target] == NEG:
    return None
  s, sol = target, []
  for k in range(len(ids), 0, -1):
    if rows[k][s] != rows[k - 1][s]:
      sol.append(ids[k - 1])
      s -= values[ids[k - 1]]
  return sorted(sol)


class SubsetSum(Task):
  key = "subset-sum"
  fields = {"target": (int,), "numbers": (dict,)}
  title = "Subset sum"
  category = "selection"
  direction = "max"
  description = ("Choose indices of the given numbers whose values sum exactly to the target, "
                 "using as many numbers as possible.")
  answer_format = "a list of distinct indices, e.g. Answer: [0, 2, 5]"
  TINY = ((4, 5), (2, 3), 9)  # (numbers, planted size, largest value); ours, tiny never changes
  # NP-Bench's levels: (numbers, planted size, value range, planted solutions). Several
  # planted solutions of the same size share the target (the numbers grow to hold them all);
  # the rest are distractors.
  SIZES = {"easy": ((5, 10), (4, 8), (1, 5), (2, 3)), "medium": ((8, 12), (4, 8), (1, 10), (3, 4)),
           "hard": ((12, 15), (8, 12), (1, 15), (4, 5)), "bench": ((15, 20), (10, 15), (1, 15), (5, 6))}

  @staticmethod
  def _values_with_sum(rng, size: int, total: int, lo: int, hi: int) -> list[int]:
    """``size`` values in [lo, hi] summing to ``total`` (which must be reachable): random
    values, then unit steps at random positions until the sum is right."""
    vals = [rng.randint(lo, hi) for _ in range(size)]
    diff = total - sum(vals)
    while diff:
      step = 1 if diff > 0 else -1
      i = rng.choice([j for j, v in enumerate(vals) if lo <= v + step <= hi])
      vals[i] += step
      diff -= step
    return vals

  def _generate_npbench(self, rng, level):
    nn, nk, (lo, hi), nv = self.SIZES[level]
    n, k = uniform(rng, nn), uniform(rng, nk)
    variants = min(uniform(rng, nv), max(1, n // k))
    first = [rng.randint(lo, hi) for _ in range(k)]
    target = sum(first)
    sols, seen = [first], {tuple(sorted(first))}
    for _ in range(variants - 1):
      for _ in range(200):  # a different multiset with the same sum, if one turns up
        cand = self._values_with_sum(rng, k, target, lo, hi)
        if tuple(sorted(cand)) not in seen:
          seen.add(tuple(sorted(cand)))
          sols.append(cand)
          break
    tagged = [(v, j) for j, sol in enumerate(sols) for v in sol]
    tagged += [(rng.randint(lo, hi), -1) for _ in range(max(0, n - len(tagged)))]
    rng.shuffle(tagged)
    planted = [i for i, (_, j) in enumerate(tagged) if j == 0]
    return {"target": target, "numbers": {str(i): v for i, (v, _) in enumerate(tagged)}}, planted

  def _generate(self, rng, level):
    if level != "tiny":
      return self._generate_npbench(rng, level)
    nn, nk, hi = self.TINY
    n = uniform(rng, nn)
    k = min(uniform(rng, nk), n)
    nums = [rng.randint(1, hi) for _ in range(n)]
    planted = sorted(rng.sample(range(n), k))
    target = sum(nums[i] for i in planted)
    return {"target": target, "numbers": {str(i): v for i, v in enumerate(nums)}}, planted

  def _validate(self, q):
    # a target of 0 has no non-empty answer; a negative number has no exact DP
    checks.int_at_least(self.key, "target", q["target"], 1, "the target")
    checks.id_map(self.key, "numbers", q["numbers"], "number")
    for i, v in q["numbers"].items():
      checks.int_at_least(self.key, "numbers", v, 0, f"number {i}")

  def _load(self, q):
    return Problem(target=int(q["target"]), values={int(k): int(v) for k, v in q["numbers"].items()})

  def _check(self, p, ids):
    _distinct_ids(ids, p.values, "index")
    if not ids:
      raise Infeasible("empty selection")
    total = sum(p.values[i] for i in ids)
    if total != p.target:
      raise Infeasible(f"sum is {total}, target is {p.target}")
    return len(ids), tuple(sorted(ids))

  def _reference(self, p, rng, deadline):
    sol = _best_count_subset(p.values, p.target)  # NP-Bench's reference is exact here too
    if sol is None:
      raise RuntimeError("no subset reaches the target")
    return sol

  def _sample(self, p, rng):
    # Exact best subset among a random half of the numbers: varied, often smaller.
    ids = [i for i in p.values if rng.random() < 0.6]
    sol = _best_count_subset(p.values, p.target, ids) or self._reference(p, rng, 0)
    rng.shuffle(sol)
    return sol

  def _exact(self, p, time_limit):
    sol = _best_count_subset(p.values, p.target)
    return Exact(None, "INFEASIBLE") if sol is None else Exact(float(len(sol)), "OPTIMAL", sol)

  def _npbench_instance(self, p):
    return (f"Target: {p.target}\nNumbers (index: value): "
            + ", ".join(f"{i}: {v}" for i, v in sorted(p.values.items())))

  def _compact(self, p):
    return f"subset target {p.target} items " + " ".join(str(v) for _, v in sorted(p.values.items()))

  def _render(self, p, size):
    rows = [(i, v) for i, v in sorted(p.values.items())]
    return render.table(size, f"Subset sum: target {p.target}", ("index", "value"), rows)

  def enumerate_optima(self, problem, limit: int, deadline: float):
    return _subset_sum(self, problem, limit, deadline)

  def solution_of(self, canonical):
    return optima.as_set(canonical)


# ---------------------------------------------------------------------------
def _knapsack_dp(items: dict, capacity: int, allowed=None):
  """Exact 0/1 knapsack over the ids ``allowed`` (default all): a DP over capacities,
  vectorised per item (NP-Bench's weights reach the thousands), or, when that table is
  large (over 2M cells) and a table over total values is smaller, a DP over values. Ties go to the same solution as the plain DP over capacities."""
  ids = sorted(items) if allowed is None else sorted(allowed)
  total_value = sum(items[i][1] for i in ids)
  if len(ids) * (capacity + 1) > 2_000_000 and total_value < capacity and \
      all(items[i][1] >= 0 for i in ids):
    return _knapsack_by_value(items, capacity, ids)
  best = np.zeros(capacity + 1, np.int64)
  take = np.zeros((len(ids), capacity + 1), bool)  # [items, capacity + 1]
  for k, i in enumerate(ids):
    w, v = items[i]
    if w > capacity:
      continue
    cand = best[:capacity + 1 - w] + v
    better = cand > best[w:]
    take[k, w:] = better
    best[w:] = np.where(better, cand, best[w:])
  c, sol = capacity, []
  for k in range(len(ids) - 1, -1, -1):
    if take[k, c]:
      sol.append(ids[k])
      c -= items[ids[k]][0]
  return sorted(sol)


def _knapsack_by_value(items: dict, capacity: int, ids: list):
  """Exact 0/1 knapsack by a DP over values: least weight reaching each total value."""
  total = sum(items[i][1] for i in ids)
  inf = np.iinfo(np.int64).max // 4
  least = np.full(total + 1, inf, np.int64)
  least[0] = 0
  take = np.zeros((len(ids), total + 1), bool)  # [items, total value + 1]
  for k, i in enumerate(ids):
    w, v = items[i]
    cand = least[:total + 1 - v] + w
    better = cand < least[v:]
    take[k, v:] = better
    least[v:] = np.where(better, cand, least[v:])
  c = int(np.flatnonzero(least <= capacity).max())
  sol = []
  for k in range(len(ids) - 1, -1, -1):
    if take[k, c]:
      sol.append(ids[k])
      c -= items[ids[k]][1]
  return sorted(sol)


class Knapsack(Task):
  key = "knapsack"
  fields = {"capacity": (int, float), "items": (dict,)}
  title = "0/1 knapsack"
  category = "selection"
  direction = "max"
  description = ("Choose distinct items whose total weight is at most the capacity, "
                 "maximising their total value.")
  answer_format = "a list of distinct item ids, e.g. Answer: [1, 4, 6]"
  TINY = ((2, 3), (2, 3))  # (planted items, distractors); ours, tiny never changes
  # NP-Bench's levels: planted items, distractors, planted weights, planted value per weight,
  # heavy and cheap distractor weights, their value per weight, capacity / planted weight.
  # Distractors are heavy (40%), cheap (40%) or traps (20%: half to 0.9 of the planted
  # weight, valued like planted items).
  SIZES = {
      "easy": ((6, 10), (8, 15), (5, 25), (1.8, 2.5), (30, 50), (2, 10), (0.3, 0.8), (1.1, 1.4)),
      "medium": ((8, 12), (15, 25), (20, 80), (1.5, 2.0), (100, 200), (10, 40), (0.6, 1.0),
                 (1.05, 1.25)),
      "hard": ((15, 25), (20, 35), (50, 200), (1.2, 1.6), (300, 600), (30, 100), (0.8, 1.1),
               (1.02, 1.15)),
      "bench": ((25, 35), (30, 45), (50, 200), (1.2, 1.6), (300, 600), (30, 100), (0.8, 1.1),
                (1.02, 1.15)),
  }

  def _generate_npbench(self, rng, level):
    npl, nd, w_sol, r_sol, w_heavy, w_cheap, r_cheap, r_cap = self.SIZES[level]
    priced = lambda w, r: (w, int(w * rng.uniform(*r)))
    planted = [priced(rng.randint(*w_sol), r_sol) for _ in range(uniform(rng, npl))]
    total = sum(w for w, _ in planted)
    distract = []
    for _ in range(uniform(rng, nd)):
      kind = rng.random()
      if kind < 0.4:
        distract.append(priced(rng.randint(*w_heavy), r_cheap))
      elif kind < 0.8:
        distract.append(priced(rng.randint(*w_cheap), r_cheap))
      else:
        distract.append(priced(rng.randint(int(total * 0.5), int(total * 0.9)), r_sol))
    return int(total * rng.uniform(*r_cap)), planted, distract

  def _generate(self, rng, level):
    if level == "tiny":
      npl, nd = self.TINY
      planted = [(w, int(w * rng.uniform(1.3, 2.0))) for w in (rng.randint(3, 30) for _ in range(uniform(rng, npl)))]
      capacity = sum(w for w, _ in planted)
      distract = [(w, max(1, int(w * rng.uniform(0.3, 1.2)))) for w in
                  (rng.randint(3, 45) for _ in range(uniform(rng, nd)))]
    else:
      capacity, planted, distract = self._generate_npbench(rng, level)
    allitems = planted + distract
    order = list(range(len(allitems)))
    rng.shuffle(order)
    q = {"capacity": capacity,
         "items": {str(i): {"weight": allitems[j][0], "value": allitems[j][1]} for i, j in enumerate(order)}}
    return q, sorted(i for i, j in enumerate(order) if j < len(planted))

  def _validate(self, q):
    checks.integral(self.key, "capacity", q["capacity"], "the capacity")
    checks.id_map(self.key, "items", q["items"], "item")
    for i, item in q["items"].items():
      if not isinstance(item, dict) or not {"weight", "value"} <= set(item):
        checks.fail(self.key, "items", f"item {i} is {item!r}, expected {{\"weight\": w, \"value\": v}}")
      for f in ("weight", "value"):
        checks.int_at_least(self.key, "items", item[f], 0, f"item {i}'s {f}")

  def _load(self, q):
    items = {int(k): (int(v["weight"]), int(v["value"])) for k, v in q["items"].items()}
    if any(w < 0 for w, _ in items.values()):
      raise ValueError("negative weight")
    return Problem(capacity=int(q["capacity"]), items=items)

  def _check(self, p, ids):
    if not ids:  # NP-Bench refuses it too: choosing nothing is not a solution
      raise Infeasible("no item chosen")
    _distinct_ids(ids, p.items, "item")
    weight = sum(p.items[i][0] for i in ids)
    if weight > p.capacity:
      raise Infeasible(f"total weight {weight} exceeds capacity {p.capacity}")
    return sum(p.items[i][1] for i in ids), tuple(sorted(ids))

  def _reference(self, p, rng, deadline):
    return _knapsack_dp(p.items, p.capacity)  # exact DP, as NP-Bench's reference

  def _sample(self, p, rng):
    ids = [i for i in p.items if rng.random() < 0.7]
    sol = _knapsack_dp(p.items, p.capacity, ids)
    rng.shuffle(sol)
    return sol

  def _exact(self, p, time_limit):
    sol = _knapsack_dp(p.items, p.capacity)
    return Exact(float(sum(p.items[i][1] for i in sol)), "OPTIMAL", sol)

  def _npbench_instance(self, p):
    return (f"Capacity: {p.capacity}\nItems (id: weight, value):\n"
            + "\n".join(f"{i}: weight {w}, value {v}" for i, (w, v) in sorted(p.items.items())))

  def _compact(self, p):
    return (f"knap cap {p.capacity} items "
            + " ".join(f"{w}/{v}" for _, (w, v) in sorted(p.items.items())))

  def _render(self, p, size):
    rows = [(i, w, v) for i, (w, v) in sorted(p.items.items())]
    return render.table(size, f"Knapsack: capacity {p.capacity}", ("item", "weight", "value"), rows)

  def enumerate_optima(self, problem, limit: int, deadline: float):
    return _knapsack(self, problem, limit, deadline)

  def solution_of(self, canonical):
    return optima.as_set(canonical)


# ---- every optimum (the machinery and canonical forms: tasks/optima.py) ----

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

  acc = optima.Collector(limit, deadline)

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
  acc = optima.Collector(limit, deadline)

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


def _set_cover_search(task, p, limit):
  ids = sorted(p.sets)
  cover = [sum(1 << i for i, e in enumerate(sorted(p.universe)) if e in p.sets[s]) for s in ids]
  full = (1 << len(p.universe)) - 1

  def ok(masks):
    got = np.zeros(len(masks), np.int64)
    for j, c in enumerate(cover):
      got |= np.where((masks >> j) & 1 == 1, c, 0)
    return got == full

  best, masks = optima.best_masks(len(ids), ok, lambda m: -optima.popcount(m))
  forms, complete, reason = optima.cut_to_limit(sorted(tuple(ids[j] for j in optima.members(int(m), len(ids)))
                                        for m in masks), limit)
  return forms, complete, float(-best), reason


def _set_cover(task, p, limit, deadline):
  if not p.coverable:
    return [("Impossible",)], True, 0.0, ""
  ids = sorted(p.sets)
  if len(ids) <= optima.SEARCH_MAX:
    return _set_cover_search(task, p, limit)

  def build(model):
    x = {i: model.NewBoolVar(f"s{i}") for i in ids}
    for e in p.universe:
      model.AddBoolOr([x[i] for i in ids if e in p.sets[i]])
    return x, sum(x.values())

  return optima.cpsat_task(build, "min", lambda model, x, k: model.Add(sum(x.values()) == k),
                     lambda val, x: tuple(i for i in ids if val(x[i])), limit, deadline)
