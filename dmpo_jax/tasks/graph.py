"""Graph category: graph colouring (GCP-D), maximum clique, maximum independent set."""

from __future__ import annotations

import random
import time

import numpy as np

from dmpo_jax.tasks import checks, optima, render
from dmpo_jax.tasks.base import Exact, Infeasible, Task
from dmpo_jax.tasks.common import adjacency_text, adjacency_lists, cp_model, load_graph, solve, uniform


def _edges_text(p) -> str:
  return " ".join(f"{u}-{v}" for u, v in p.edges)


def _check_vertices(p, verts):
  for v in verts:
    if not 0 <= v < p.n:
      raise Infeasible(f"vertex {v} does not exist (nodes are 0..{p.n - 1})")
  if len(set(verts)) != len(verts):
    dup = next(v for v in verts if verts.count(v) > 1)
    raise Infeasible(f"vertex {dup} repeated")


# ---------------------------------------------------------------------------
class GraphColoring(Task):
  key = "GCP-D"
  vertex_values = (list,)  # adjacency lists {"u": [v, ...]}
  title = "Graph colouring"
  category = "graph"
  direction = "min"
  description = ("Colour the vertices of the undirected graph with positive integers so that "
                 "adjacent vertices get different colours, using as few colours as possible.")
  answer_format = ("a list of n positive integers, the colour of vertex i at position i, "
                   "e.g. Answer: [1, 2, 1, 3]")
  SIZES = {"tiny": ((4, 6), (2, 3), 0.5), "easy": ((8, 12), (3, 4), 0.2),
           "medium": ((15, 22), (4, 6), 0.35), "hard": ((25, 32), (6, 8), 0.5),
           "bench": ((32, 40), (6, 8), 0.5)}

  def _generate(self, rng, level):
    nv, nk, p = self.SIZES[level]
    n, k = uniform(rng, nv), uniform(rng, nk)
    if level == "tiny":  # balanced colour classes (ours; tiny never changes)
      colour = [i % k for i in range(n)]
      rng.shuffle(colour)
    else:  # NP-Bench: each vertex's planted colour drawn independently
      colour = [rng.randrange(k) for _ in range(n)]
    edges = [(u, v) for u in range(n) for v in range(u + 1, n)
             if colour[u] != colour[v] and rng.random() < p]
    return adjacency_lists(n, edges), [c + 1 for c in colour]

  def _load(self, q):
    return load_graph(q)

  def _validate(self, q):
    checks.adjacency_lists(self.key, q)

  def _check(self, p, col):
    if len(col) != p.n:
      raise Infeasible(f"expected {p.n} colours (one per vertex), got {len(col)}")
    for i, c in enumerate(col):
      if c < 1:
        raise Infeasible(f"colour of vertex {i} is {c}; colours must be positive integers")
    for u, v in p.edges:
      if col[u] == col[v]:
        raise Infeasible(f"adjacent vertices {u} and {v} share colour {col[u]}")
    first = {}
    canon = tuple(first.setdefault(c, len(first)) for c in col)
    return len(set(col)), canon

  def _dsatur(self, p, rng):
    col = [0] * p.n
    order_key = [rng.random() for _ in range(p.n)]
    for _ in range(p.n):
      best = max((v for v in range(p.n) if not col[v]),
                 key=lambda v: (len({col[u] for u in p.adj[v] if col[u]}), len(p.adj[v]),
                                order_key[v]))
      used = {col[u] for u in p.adj[best]}
      col[best] = next(c for c in range(1, p.n + 2) if c not in used)
    return col

  def _tabucol(self, p, k, start, rng, max_iters, deadline):
    """Tabu search for a proper k-colouring; None if not found within the budget."""
    col = [min(c, k) - 1 for c in start]
    n = p.n
    # conf[v][c] = neighbours of v with colour c.
    conf = [[0] * k for _ in range(n)]
    for u, v in p.edges:
      conf[u][col[v]] += 1
      conf[v][col[u]] += 1
    total = sum(conf[v][col[v]] for v in range(n)) // 2
    tabu = {}
    for it in range(max_iters):
      if total == 0:
        return [c + 1 for c in col]
      if it % 256 == 0 and time.monotonic() > deadline:
        return None
      best, best_delta = None, None
      for v in range(n):
        cv = conf[v][col[v]]
        if cv == 0:
          continue
        for c in range(k):
          if c == col[v]:
            continue
          delta = conf[v][c] - cv
          if tabu.get((v, c), -1) > it and total + delta > 0:
            continue
          if best_delta is None or delta < best_delta or (delta == best_delta and rng.random() < 0.3):
            best, best_delta = (v, c), delta
      if best is None:
        continue
      v, c = best
      old = col[v]
      for u in p.adj[v]:
        conf[u][old] -= 1
        conf[u][c] += 1
      col[v] = c
      total += best_delta
      tabu[(v, old)] = it + 7 + rng.randrange(10)
    return None

  def _reference(self, p, rng, deadline):
    best = self._dsatur(p, rng)
    k = len(set(best))
    while k > 1:
      found = self._tabucol(p, k - 1, best, rng, max_iters=2000, deadline=deadline)
      if found is None:
        break
      best, k = found, len(set(found))
    return best

  def _sample(self, p, rng):
    col = self._dsatur(p, rng)
    if rng.random() < 0.5:  # a worse but valid colouring: recolour a vertex with a fresh colour
      v = rng.randrange(p.n)
      col[v] = max(col) + 1
    return col

  def _exact(self, p, time_limit):
    m = cp_model()
    if m is None:
      return Exact(None, "UNAVAILABLE")
    ub = len(set(self._dsatur(p, random.Random(0))))
    model = m.CpModel()
    x = [model.NewIntVar(0, ub - 1, f"c{v}") for v in range(p.n)]
    for u, v in p.edges:
      model.Add(x[u] != x[v])
    top = model.NewIntVar(0, ub - 1, "max")
    model.AddMaxEquality(top, x)
    if p.n:
      model.Add(x[0] == 0)
    model.Minimize(top)
    solver, status = solve(model, time_limit)
    if status not in ("OPTIMAL", "FEASIBLE"):
      return Exact(None, status)
    col = [solver.Value(v) + 1 for v in x]
    return Exact(float(len(set(col))), status, col)

  def _npbench_instance(self, p):
    return adjacency_text(p)

  def _compact(self, p):
    return f"GCP n {p.n} edges {_edges_text(p)}"

  def _render(self, p, size):
    return render.graph(size, f"Graph colouring: {p.n} vertices", p.n, p.edges)

  def enumerate_optima(self, problem, limit: int, deadline: float):
    return _colouring(self, problem, limit, deadline)

  def solution_of(self, canonical):
    return optima.as_colours(canonical)


def _planted_independent(rng, n: int, size: int, p_out: float, p_cross: float):
  """NP-Bench's planted-set graph: a random independent set of ``size`` vertices; pairs of
  other vertices are edges with probability p_out; each other vertex is joined to one set
  vertex chosen at random and to each remaining set vertex with probability p_cross.
  Returns (sorted set, edge set of (u, v) with u < v)."""
  order = list(range(n))
  rng.shuffle(order)
  inside, outside = sorted(order[:size]), order[size:]
  edges = {(min(a, b), max(a, b)) for i, a in enumerate(outside) for b in outside[i + 1:]
           if rng.random() < p_out}
  for o in outside:
    if not inside:
      break
    anchor = rng.choice(inside)
    edges.add((min(o, anchor), max(o, anchor)))
    edges |= {(min(o, v), max(o, v)) for v in inside if v != anchor and rng.random() < p_cross}
  return inside, edges


# ---------------------------------------------------------------------------
class _SetInGraph(Task):
  """Shared code of clique and independent set: a set of distinct vertices."""
  category = "graph"
  direction = "max"
  answer_format = "a list of distinct vertex ids, e.g. Answer: [0, 3, 5]"
  independent = False

  def _ok(self, p, u, v) -> bool:
    return (v not in p.adj[u]) if self.independent else (v in p.adj[u])

  def _check(self, p, verts):
    _check_vertices(p, verts)
    distinct = sorted(set(verts))
    for i, u in enumerate(distinct):
      for v in distinct[i + 1:]:
        if not self._ok(p, u, v):
          what = "adjacent" if self.independent else "not adjacent"
          raise Infeasible(f"vertices {u} and {v} are {what}")
    if not verts:
      raise Infeasible("empty set")
    return len(verts), tuple(distinct)

  def _greedy(self, p, rng, start):
    chosen = [start]
    cand = [v for v in range(p.n) if v != start and self._ok(p, start, v)]
    while cand:
      # add one vertex at a time (never all candidates at once)
      v = max(cand, key=lambda c: (sum(self._ok(p, c, o) for o in cand), rng.random()))
      chosen.append(v)
      cand = [c for c in cand if c != v and self._ok(p, v, c)]
    return chosen

  def _local_search(self, p, rng, sol, iters):
    """(1,2)-swaps: drop one vertex, add two compatible ones; plateau moves allowed."""
    best = list(sol)
    cur = set(sol)
    for _ in range(iters):
      out = [v for v in range(p.n) if v not in cur]
      # vertices compatible with all but exactly one member
      addable = [v for v in out if all(self._ok(p, v, u) for u in cur)]
      if addable:
        cur.add(rng.choice(addable))
      else:
        one_off = [(v, [u for u in cur if not self._ok(p, v, u)]) for v in out]
        one_off = [(v, bad[0]) for v, bad in one_off if len(bad) == 1]
        if not one_off:
          break
        v, u = rng.choice(one_off)
        cur.discard(u)
        cur.add(v)
      if len(cur) > len(best):
        best = sorted(cur)
    return best

  def _reference(self, p, rng, deadline):
    if p.n == 0:
      return []
    best = []
    starts = list(range(p.n))
    rng.shuffle(starts)
    for s in starts:
      sol = self._local_search(p, rng, self._greedy(p, rng, s), iters=4 * p.n)
      if len(sol) > len(best):
        best = sorted(sol)
      if time.monotonic() > deadline:
        break
    return best

  def _sample(self, p, rng):
    sol = self._greedy(p, rng, rng.randrange(p.n))
    rng.shuffle(sol)
    if len(sol) > 1 and rng.random() < 0.4:
      sol = sol[:rng.randint(1, len(sol))]
    return sol

  def _exact(self, p, time_limit):
    m = cp_model()
    if m is None:
      return Exact(None, "UNAVAILABLE")
    model = m.CpModel()
    x = [model.NewBoolVar(f"x{v}") for v in range(p.n)]
    for u in range(p.n):
      for v in range(u + 1, p.n):
        if not self._ok(p, u, v):
          model.AddBoolOr([x[u].Not(), x[v].Not()])
    model.Maximize(sum(x))
    solver, status = solve(model, time_limit)
    if status not in ("OPTIMAL", "FEASIBLE"):
      return Exact(None, status)
    sol = [v for v in range(p.n) if solver.Value(x[v])]
    return Exact(float(len(sol)), status, sol)

  def _npbench_instance(self, p):
    return adjacency_text(p)

  def _load(self, q):
    return load_graph(q)

  def _validate(self, q):
    (checks.adjacency_dicts if self.independent else checks.adjacency_lists)(self.key, q)

  def enumerate_optima(self, problem, limit: int, deadline: float):
    return _set_in_graph(self, problem, limit, deadline)

  def solution_of(self, canonical):
    return optima.as_set(canonical)


class MaximumClique(_SetInGraph):
  key = "maximum_clique_problem"
  vertex_values = (list,)  # adjacency lists {"u": [v, ...]}
  title = "Maximum clique"
  description = "Find a largest set of vertices that are pairwise adjacent in the undirected graph."
  # tiny: (vertices, clique size, edge probability); ours, kept so tiny instances never change.
  TINY = ((4, 6), (2, 3), 0.3)
  # NP-Bench's levels: (vertices, clique size); the clique is an independent set planted in
  # a graph of outside-outside edge probability 0.6 and outside-inside 0.3, complemented.
  SIZES = {"easy": ((4, 8), (2, 4)), "medium": ((8, 12), (2, 4)), "hard": ((12, 16), (2, 6)),
           "bench": ((16, 20), (4, 8))}

  def _generate(self, rng, level):
    if level == "tiny":
      nv, nc, p = self.TINY
      n = uniform(rng, nv)
      c = min(uniform(rng, nc), n)
      clique = sorted(rng.sample(range(n), c))
      edges = {(u, v) for i, u in enumerate(clique) for v in clique[i + 1:]}
      edges |= {(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < p}
      return adjacency_lists(n, edges), clique
    nv, nc = self.SIZES[level]
    n = uniform(rng, nv)
    clique, g = _planted_independent(rng, n, min(uniform(rng, nc), n), 0.6, 0.3)
    edges = {(u, v) for u in range(n) for v in range(u + 1, n) if (u, v) not in g}
    return adjacency_lists(n, edges), clique

  def _compact(self, p):
    return f"clique n {p.n} edges {_edges_text(p)}"

  def _render(self, p, size):
    return render.graph(size, f"Maximum clique: {p.n} vertices", p.n, p.edges)


class MaximumIndependentSet(_SetInGraph):
  key = "maximum-set"
  vertex_values = (dict,)  # adjacency dicts {"u": {"v": 1}}
  title = "Maximum independent set"
  description = "Find a largest set of vertices no two of which are adjacent in the undirected graph."
  independent = True
  TINY = ((5, 7), (2, 3), 0.4)  # ours, kept so tiny instances never change
  # NP-Bench's levels: (vertices, set size); outside-outside and outside-inside edge
  # probability 0.4, and every outside vertex adjacent to at least one set vertex.
  SIZES = {"easy": ((12, 20), (4, 8)), "medium": ((20, 30), (8, 12)), "hard": ((30, 40), (12, 16)),
           "bench": ((40, 50), (16, 20))}

  def _generate(self, rng, level):
    if level == "tiny":
      nv, ns, p = self.TINY
      n = uniform(rng, nv)
      s = min(uniform(rng, ns), n)
      ind = set(rng.sample(range(n), s))
      edges = [(u, v) for u in range(n) for v in range(u + 1, n)
               if not (u in ind and v in ind) and rng.random() < p]
    else:
      nv, ns = self.SIZES[level]
      n = uniform(rng, nv)
      ind, edges = _planted_independent(rng, n, min(uniform(rng, ns), n), 0.4, 0.4)
    adj = {str(i): {} for i in range(n)}
    for u, v in sorted(edges):
      adj[str(u)][str(v)] = 1
      adj[str(v)][str(u)] = 1
    return adj, sorted(ind)

  def _compact(self, p):
    return f"mis n {p.n} edges {_edges_text(p)}"

  def _render(self, p, size):
    return render.graph(size, f"Maximum independent set: {p.n} vertices", p.n, p.edges)


# ---- every optimum (the machinery and canonical forms: tasks/optima.py) ----

def _set_in_graph_search(task, p, limit):
  bad = [sum(1 << v for v in range(p.n) if v != u and not task._ok(p, u, v)) for u in range(p.n)]

  def ok(masks):  # no member conflicts with another member
    keep = np.ones(len(masks), bool)
    for u in range(p.n):
      keep &= ((masks >> u) & 1 == 0) | (masks & bad[u] == 0)
    return keep

  best, masks = optima.best_masks(p.n, ok, optima.popcount)
  forms, complete, reason = optima.cut_to_limit(sorted(optima.members(int(m), p.n) for m in masks), limit)
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
  forms, complete, reason = optima.cut_to_limit(sorted(found), limit)
  return forms, complete, float(best[0]), reason


def _set_in_graph(task, p, limit, deadline):
  if p.n == 0:
    return [], True, None, ""
  if p.n <= optima.SEARCH_MAX:
    return _set_in_graph_search(task, p, limit)

  def build(model):
    x = [model.NewBoolVar(f"x{v}") for v in range(p.n)]
    for u in range(p.n):
      for v in range(u + 1, p.n):
        if not task._ok(p, u, v):
          model.AddBoolOr([x[u].Not(), x[v].Not()])
    return x, sum(x)

  return optima.cpsat_task(build, "max", lambda model, x, k: model.Add(sum(x) == k),
                     lambda val, x: tuple(v for v in range(p.n) if val(x[v])), limit, deadline)


def _colouring(task, p, limit, deadline):
  """Colours 0..k-1 in order of first use: top[v] is the largest colour among vertices
  0..v and x[v] <= top[v-1] + 1, so each partition into colour classes appears once,
  labelled exactly as the verifier's canonical form."""
  if p.n == 0:
    return [()], True, 0.0, ""
  if p.n <= optima.SEARCH_MAX // 2:  # restricted growth strings: Bell(7) = 877 at most
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

  return optima.cpsat_task(build, "min", fix, lambda val, x: tuple(val(c) for c in x), limit, deadline,
                     value_of=lambda top: float(top + 1))
