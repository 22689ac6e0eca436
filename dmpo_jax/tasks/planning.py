"""Planning category: TSP and the longest simple cycle (`hamiltonian-cycle`)."""

from __future__ import annotations

import math
import random
import time

from dmpo_jax.tasks import checks, optima, render
from dmpo_jax.tasks.base import Exact, Infeasible, Task
from dmpo_jax.tasks.common import adjacency_text, Problem, adjacency_lists, cp_model, load_graph, solve, uniform


def canonical_cycle(nodes) -> tuple:
  """A cycle (closing node dropped) up to rotation and direction."""
  nodes = list(nodes)
  i = nodes.index(min(nodes))
  fwd = nodes[i:] + nodes[:i]
  rev = [fwd[0]] + fwd[1:][::-1]
  return tuple(min(fwd, rev))


def _check_closed(p_n, path, what):
  for v in path:
    if not 0 <= v < p_n:
      raise Infeasible(f"{what} {v} does not exist (0..{p_n - 1})")
  if path[0] != path[-1]:
    raise Infeasible(f"path does not return to its start ({path[0]} ... {path[-1]})")
  body = path[:-1]
  if len(set(body)) != len(body):
    dup = next(v for v in body if body.count(v) > 1)
    raise Infeasible(f"{what} {dup} visited twice")


class TSP(Task):
  key = "TSP"
  vertex_values = (dict,)  # a distance matrix: {"u": {"v": d}}
  title = "Travelling salesman"
  category = "planning"
  direction = "min"
  description = ("Find a shortest closed tour that visits every city exactly once and returns "
                 "to its start, given the symmetric distance matrix.")
  answer_format = ("the closed tour as a list of n+1 city ids starting and ending at the same "
                   "city, e.g. Answer: [0, 2, 1, 3, 0]")
  SIZES = {"tiny": (4, 6), "easy": (10, 20), "medium": (20, 30), "hard": (35, 45),
           "bench": (45, 55)}

  def _generate(self, rng, level):
    n = uniform(rng, self.SIZES[level])
    d = [[0] * n for _ in range(n)]
    for i in range(n):
      for j in range(i + 1, n):
        d[i][j] = d[j][i] = rng.randint(10, 100)
    tour = list(range(n))
    rng.shuffle(tour)
    q = {str(i): {str(j): d[i][j] for j in range(n)} for i in range(n)}
    return q, tour + tour[:1]

  def _validate(self, q):
    checks.matrix(self.key, q, "distance", full=True)

  def _load(self, q):
    n = len(q)
    d = [[float(q[str(i)][str(j)]) if str(i) in q else None for j in range(n)] for i in range(n)]
    return Problem(n=n, d=d)

  def _length(self, p, tour):
    return sum(p.d[tour[i]][tour[i + 1]] for i in range(len(tour) - 1))

  def _check(self, p, tour):
    if len(tour) != p.n + 1:
      raise Infeasible(f"a closed tour has {p.n + 1} entries, got {len(tour)}")
    _check_closed(p.n, tour, "city")
    return self._length(p, tour), canonical_cycle(tour[:-1])

  def _two_opt(self, p, t, deadline):
    d, n = p.d, len(t)
    improved = True
    while improved and time.monotonic() < deadline:
      improved = False
      for i in range(n - 1):
        for j in range(i + 2, n if i else n - 1):
          a, b, c, e = t[i], t[i + 1], t[j], t[(j + 1) % n]
          if d[a][c] + d[b][e] < d[a][b] + d[c][e] - 1e-9:
            t[i + 1:j + 1] = t[i + 1:j + 1][::-1]
            improved = True
    return t

  def _nearest(self, p, start):
    t, left = [start], set(range(p.n)) - {start}
    while left:
      nxt = min(left, key=lambda j: (p.d[t[-1]][j], j))
      t.append(nxt)
      left.remove(nxt)
    return t

  def _reference(self, p, rng, deadline):
    """Nearest neighbour from every start + 2-opt, then simulated annealing with 2-opt moves."""
    best, best_len = None, math.inf
    for s in range(p.n):
      t = self._two_opt(p, self._nearest(p, s), deadline)
      length = self._length(p, t + t[:1])
      if length < best_len:
        best, best_len = t, length
    if p.n >= 5:
      cur, cur_len = list(best), best_len
      temp = 0.05 * best_len / p.n
      for it in range(3000 * p.n):
        if it % 512 == 0 and time.monotonic() > deadline:
          break
        i, j = sorted(rng.sample(range(p.n), 2))
        if j - i < 2 or (i == 0 and j == p.n - 1):
          continue
        a, b, c, e = cur[i], cur[i + 1], cur[j], cur[(j + 1) % p.n]
        delta = p.d[a][c] + p.d[b][e] - p.d[a][b] - p.d[c][e]
        if delta < 0 or rng.random() < math.exp(-delta / max(temp, 1e-9)):
          cur[i + 1:j + 1] = cur[i + 1:j + 1][::-1]
          cur_len += delta
          if cur_len < best_len - 1e-9:
            best, best_len = list(cur), cur_len
        temp *= 0.9995
      best = self._two_opt(p, best, deadline)
    return best + best[:1]

  def _sample(self, p, rng):
    t = self._nearest(p, rng.randrange(p.n))
    for _ in range(rng.randint(0, 2)):  # perturb: a random 2-opt move
      if p.n >= 4:
        i, j = sorted(rng.sample(range(1, p.n), 2))
        t[i:j + 1] = t[i:j + 1][::-1]
    return t + t[:1]

  def _exact(self, p, time_limit):
    m = cp_model()
    if m is None:
      return Exact(None, "UNAVAILABLE")
    if p.n < 3:
      t = list(range(p.n))
      return Exact(self._length(p, t + t[:1]), "OPTIMAL", t + t[:1])
    model = m.CpModel()
    arcs, lits = [], {}
    for i in range(p.n):
      for j in range(p.n):
        if i != j:
          lits[(i, j)] = model.NewBoolVar(f"a{i}_{j}")
          arcs.append((i, j, lits[(i, j)]))
    model.AddCircuit(arcs)
    model.Minimize(sum(int(p.d[i][j]) * lit for (i, j), lit in lits.items()))
    solver, status = solve(model, time_limit, workers=2)
    if status not in ("OPTIMAL", "FEASIBLE"):
      return Exact(None, status)
    nxt = {i: j for (i, j), lit in lits.items() if solver.Value(lit)}
    t = [0]
    while len(t) < p.n:
      t.append(nxt[t[-1]])
    t.append(0)
    return Exact(self._length(p, t), status, t)

  def _npbench_instance(self, p):
    rows = [f"City {i}: " + ", ".join(f"{j}:{p.d[i][j]:g}" for j in range(p.n) if j != i)
            for i in range(p.n)]
    return f"There are {p.n} cities (0..{p.n - 1}). Distances:\n" + "\n".join(rows)

  def _compact(self, p):
    rows = [" ".join(f"{p.d[i][j]:g}" for j in range(i + 1, p.n)) for i in range(p.n - 1)]
    return f"TSP n {p.n} dist " + " ; ".join(rows)

  def _render(self, p, size):
    return render.matrix(size, f"TSP: distances between {p.n} cities", p.d)

  def enumerate_optima(self, problem, limit: int, deadline: float):
    return _tsp(self, problem, limit, deadline)

  def solution_of(self, canonical):
    return optima.as_cycle(canonical)


class LongestCycle(Task):
  key = "hamiltonian-cycle"
  vertex_values = (list,)  # adjacency lists {"u": [v, ...]}
  title = "Longest simple cycle (Hamiltonian cycle)"
  category = "planning"
  direction = "max"
  description = ("Find a longest simple cycle in the undirected graph: consecutive vertices "
                 "adjacent, no vertex repeated except the closing one. A Hamiltonian cycle "
                 "visits every vertex.")
  answer_format = ("the closed path as a list of vertex ids whose last entry equals the first, "
                   "e.g. Answer: [0, 1, 2, 3, 0]")
  SIZES = {"tiny": ((4, 6), 0.2), "easy": ((15, 20), 0.2), "medium": ((20, 30), 0.3),
           "hard": ((30, 40), 0.4), "bench": ((40, 50), 0.5)}

  def _generate(self, rng, level):
    nv, p = self.SIZES[level]
    n = uniform(rng, nv)
    cyc = list(range(n))
    rng.shuffle(cyc)
    edges = {(min(cyc[i], cyc[(i + 1) % n]), max(cyc[i], cyc[(i + 1) % n])) for i in range(n)}
    # NP-Bench: extra edges with probability p on top of the planted cycle.
    edges |= {(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < p}
    return adjacency_lists(n, edges), cyc + cyc[:1]

  def _load(self, q):
    return load_graph(q)

  def _validate(self, q):
    checks.adjacency_lists(self.key, q)

  def _check(self, p, path):
    if not path:
      raise Infeasible("empty path")
    if len(path) < 4:
      raise Infeasible(f"a cycle needs at least 3 distinct vertices; got {path}")
    _check_closed(p.n, path, "vertex")
    for a, b in zip(path, path[1:]):
      if b not in p.adj[a]:
        raise Infeasible(f"vertices {a} and {b} are not adjacent")
    canon = canonical_cycle(path[:-1]) if len(path) > 1 else (path[0],)
    return len(path), canon

  def _dfs(self, p, rng, start, budget, deadline):
    """Randomised DFS (Warnsdorff order) recording the longest closed cycle through start."""
    best = None
    path, on = [start], {start}
    stack = [iter(self._order(p, rng, start, on))]
    steps = 0
    while stack and steps < budget:
      steps += 1
      if steps % 1024 == 0 and time.monotonic() > deadline:
        break
      v = next(stack[-1], None)
      if v is None:
        stack.pop()
        on.discard(path.pop())
        continue
      path.append(v)
      on.add(v)
      if len(path) >= 3 and start in p.adj[v] and (best is None or len(path) + 1 > len(best)):
        best = path + [start]
        if len(path) == p.n:
          return best
      stack.append(iter(self._order(p, rng, v, on)))
    return best

  def _order(self, p, rng, v, on):
    nb = [u for u in p.adj[v] if u not in on]
    nb.sort(key=lambda u: (sum(1 for w in p.adj[u] if w not in on), rng.random()))
    return nb

  def _reference(self, p, rng, deadline):
    best = None
    starts = list(range(p.n))
    rng.shuffle(starts)
    for s in starts[:8]:
      c = self._dfs(p, rng, s, budget=20000, deadline=deadline)
      if c is not None and (best is None or len(c) > len(best)):
        best = c
      if best is not None and len(best) == p.n + 1:
        break
    if best is None:
      raise RuntimeError("no cycle found")  # every instance has a planted cycle
    return best

  def _sample(self, p, rng):
    c = self._dfs(p, rng, rng.randrange(p.n), budget=rng.choice([50, 500, 5000]),
                  deadline=time.monotonic() + 0.05)
    return c if c is not None else self._reference(p, rng, time.monotonic() + 0.05)

  def _exact(self, p, time_limit):
    m = cp_model()
    if m is None:
      return Exact(None, "UNAVAILABLE")
    model = m.CpModel()
    arcs, lits = [], {}
    skip = [model.NewBoolVar(f"skip{v}") for v in range(p.n)]
    for v in range(p.n):
      arcs.append((v, v, skip[v]))
      for u in p.adj[v]:
        lits[(v, u)] = model.NewBoolVar(f"a{v}_{u}")
        arcs.append((v, u, lits[(v, u)]))
    model.AddCircuit(arcs)
    for (v, u), lit in lits.items():  # no 2-cycles: a cycle needs 3 distinct vertices
      if v < u:
        model.AddBoolOr([lit.Not(), lits[(u, v)].Not()])
    model.Add(sum(skip) <= p.n - 3)
    model.Maximize(sum(s.Not() for s in skip))
    solver, status = solve(model, time_limit, workers=2)
    if status not in ("OPTIMAL", "FEASIBLE"):
      return Exact(None, status)
    nxt = {v: u for (v, u), lit in lits.items() if solver.Value(lit)}
    start = min(nxt)
    path = [start]
    while nxt[path[-1]] != start:
      path.append(nxt[path[-1]])
    path.append(start)
    return Exact(float(len(path)), status, path)

  def _npbench_instance(self, p):
    return adjacency_text(p)

  def _compact(self, p):
    return f"ham n {p.n} edges " + " ".join(f"{u}-{v}" for u, v in p.edges)

  def _render(self, p, size):
    return render.graph(size, f"Longest cycle: {p.n} vertices", p.n, p.edges)

  def enumerate_optima(self, problem, limit: int, deadline: float):
    return _longest_cycle(self, problem, limit, deadline)

  def solution_of(self, canonical):
    return optima.as_cycle(canonical)


# ---- every optimum (the machinery and canonical forms: tasks/optima.py) ----

def cycle_from_successors(succ: dict) -> tuple:
  """Canonical cycle (as the verifier's) from a successor map of one cycle."""
  start = min(succ)
  path = [start]
  while succ[path[-1]] != start:
    path.append(succ[path[-1]])
  return canonical_cycle(path)


def _tsp(task, p, limit, deadline):
  if p.n < 3:
    return [tuple(range(p.n))], True, float(sum(p.d[i][(i + 1) % p.n] for i in range(p.n))), ""
  if any(d != int(d) for row in p.d for d in row):
    return [], False, None, "non-integral distances (CP-SAT needs integers)"

  def build(model):
    lits = {(i, j): model.NewBoolVar(f"a{i}_{j}") for i in range(p.n) for j in range(p.n) if i != j}
    model.AddCircuit([(i, j, lit) for (i, j), lit in lits.items()])
    optima.orient(model, lits, p.n)
    return lits, sum(int(p.d[i][j]) * lit for (i, j), lit in lits.items())

  def fix(model, lits, length):
    model.Add(sum(int(p.d[i][j]) * lit for (i, j), lit in lits.items()) == length)

  return optima.cpsat_task(build, "min", fix, lambda val, lits: cycle_from_successors(optima.successors(val, lits)),
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
    optima.orient(model, lits, p.n, present=[s.Not() for s in skip])
    return (skip, lits), sum(s.Not() for s in skip)

  def fix(model, v, length):
    model.Add(sum(v[0]) == p.n - length)

  sols, complete, value, reason = optima.cpsat_task(
      build, "max", fix, lambda val, v: cycle_from_successors(optima.successors(val, v[1])), limit, deadline)
  return sols, complete, None if value is None else value + 1, reason
