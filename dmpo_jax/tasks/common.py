"""Helpers shared by the task modules: graph loading, level sizes, CP-SAT."""

from __future__ import annotations

import random
import types

Problem = types.SimpleNamespace


def uniform(rng: random.Random, lo_hi) -> int:
  lo, hi = lo_hi
  return rng.randint(lo, hi)


def load_graph(question: dict) -> Problem:
  """Adjacency as {"u": [v, ...]} or {"u": {"v": w}}; ids may be str or int.

  Nodes must be 0..n-1. Returns Problem(n, adj: list[set], w: dict[(u,v)] -> weight).
  Zero weights (min-cut matrices list every pair) are not edges.
  """
  nodes = {int(k) for k in question}
  for nbrs in question.values():
    nodes.update(int(v) for v in nbrs)
  n = len(question)
  if nodes != set(range(n)):
    raise ValueError(f"graph nodes must be 0..{n - 1}")
  adj = [set() for _ in range(n)]
  w = {}
  for k, nbrs in question.items():
    u = int(k)
    items = nbrs.items() if isinstance(nbrs, dict) else ((v, 1) for v in nbrs)
    for v, wt in items:
      v = int(v)
      wt = float(wt)
      if v == u or wt == 0:
        continue
      adj[u].add(v)
      adj[v].add(u)
      w[(min(u, v), max(u, v))] = wt
  edges = sorted(w)
  return Problem(n=n, adj=adj, w=w, edges=edges)


def adjacency_text(p: Problem) -> str:
  """NP-Bench-style text of an unweighted graph instance."""
  return (f"The graph has {p.n} vertices (0..{p.n - 1}). Adjacency list: "
          + "; ".join(f"{u}: {sorted(p.adj[u])}" for u in range(p.n)))


def adjacency_lists(n: int, edges) -> dict:
  adj = {str(i): [] for i in range(n)}
  for u, v in sorted({(min(a, b), max(a, b)) for a, b in edges}):
    adj[str(u)].append(v)
    adj[str(v)].append(u)
  return {k: sorted(v) for k, v in adj.items()}


def cp_model():
  """(cp_model module) or None when OR-Tools is not installed."""
  try:
    from ortools.sat.python import cp_model as m
  except ImportError:
    return None
  return m


def solve(model, time_limit: float, workers: int = 1):
  """Solve a CP-SAT model; returns (solver, status name)."""
  m = cp_model()
  solver = m.CpSolver()
  solver.parameters.max_time_in_seconds = float(time_limit)
  solver.parameters.num_workers = workers
  solver.parameters.random_seed = 0
  status = solver.Solve(model)
  name = {m.OPTIMAL: "OPTIMAL", m.FEASIBLE: "FEASIBLE", m.INFEASIBLE: "INFEASIBLE"}.get(status, "UNKNOWN")
  return solver, name
