"""Instance validation shared by the task classes (`Task.validate`): ids, numbers and graphs.

Every check here is one a verifier relies on: our strict verifier and NP-Bench's rules
(npbench_rules.py) read the same question, and a question on which they would read different
things (a one-sided edge, a self-loop, an id written `"01"`, a float where an int is summed)
is refused before any work, never found after sampling. Each failure raises InvalidInstance
naming the task and the question field.
"""

from __future__ import annotations

import math

from dmpo_jax.tasks.base import InvalidInstance


def fail(key: str, field, what: str):
  raise InvalidInstance(f"{key}: question field {field!r}: {what}")


def is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
  return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def is_id(k) -> bool:
  """A JSON object key that is a non-negative integer written plainly ("0", "17"; not "01")."""
  return isinstance(k, str) and k.isascii() and k.isdigit() and str(int(k)) == k


def int_at_least(key: str, field, v, lo: int, what: str) -> int:
  if not is_int(v) or v < lo:
    fail(key, field, f"{what} is {v!r}, expected an integer >= {lo}")
  return v


def id_map(key: str, field: str, m: dict, what: str) -> None:
  """The keys of `m` (question field `field`) are ids; `what` names its entries."""
  for k in m:
    if not is_id(k):
      fail(key, field, f"{what} id {k!r} is not a non-negative integer written plainly")


def neighbour(key: str, u: str, v, n: int) -> int:
  """A neighbour id of vertex u: an int, or a digit string (NP-Bench's in-memory graphs)."""
  if is_int(v) or is_id(v):
    if 0 <= int(v) < n:
      if int(v) == int(u):
        fail(key, u, f"vertex {u} lists itself (a self-loop; the graph is simple)")
      return int(v)
  fail(key, u, f"neighbour {v!r} is not a vertex id 0..{n - 1}")


def symmetric(key: str, adj: dict) -> None:
  """Every edge listed from both ends (the graph is undirected)."""
  for u, nbrs in adj.items():
    for v in nbrs:
      if u not in adj[v]:
        fail(key, str(u), f"lists {v} but vertex {v} does not list {u} (the graph is undirected: "
                          "an edge is listed from both ends)")


def adjacency_lists(key: str, q: dict) -> None:
  """{"u": [v, ...]}: neighbours in range, no self-loop, none repeated, symmetric."""
  n, adj = len(q), {}
  for u, row in q.items():
    ids = [neighbour(key, u, v, n) for v in row]
    if len(set(ids)) != len(ids):
      fail(key, u, f"neighbour {next(v for v in ids if ids.count(v) > 1)} is listed twice")
    adj[int(u)] = set(ids)
  symmetric(key, adj)


def adjacency_dicts(key: str, q: dict) -> None:
  """{"u": {"v": 1}}: the maximum independent set's graph; a listed pair is an edge (NP-Bench
  reads presence), so its value must be a positive number (strict mode reads 0 as no edge)."""
  n, adj = len(q), {}
  for u, row in q.items():
    for v, w in row.items():
      neighbour(key, u, v, n)
      if not is_number(w) or w <= 0:
        fail(key, u, f"edge {u}-{v} has value {w!r}; a listed pair is an edge, with a positive value")
    adj[int(u)] = {int(v) for v in row}
  symmetric(key, adj)


def matrix(key: str, q: dict, what: str, *, full: bool) -> None:
  """{"u": {"v": x}} of non-negative numbers, symmetric, 0 on the diagonal; `full`: every pair
  given (TSP's distances), else a missing pair is 0 (a min-cut weight)."""
  n = len(q)
  names = {str(i) for i in range(n)}
  for u, row in q.items():
    for v, x in row.items():
      if v not in names:
        fail(key, u, f"column {v!r} is not a node id 0..{n - 1}")
      if not is_number(x) or x < 0:
        fail(key, u, f"{what} to {v} is {x!r}, expected a finite number >= 0")
    if full and len(row) != n:
      fail(key, u, f"has {len(row)} {what}s, expected {n} (one per node, itself included)")
    if row.get(u, 0) != 0:
      fail(key, u, f"{what} of node {u} to itself is {row[u]!r}, expected 0 (no self-loop)")
  for u, row in q.items():
    for v, x in row.items():
      if q[v].get(u, 0) != x:
        fail(key, u, f"{what} {u}-{v} is {x!r} but {v}-{u} is {q[v].get(u, 0)!r} (it must be symmetric)")


def integral(key: str, field, v, what: str) -> int:
  """A non-negative integer, possibly written as a float (100.0)."""
  if not is_number(v) or v < 0 or float(v) != int(v):
    fail(key, field, f"{what} is {v!r}, expected a non-negative integer")
  return int(v)
