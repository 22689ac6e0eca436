"""Summary statistics of generated instances, to compare our generators with NP-Bench's.

``instance_stats(key, question, planted)`` reads only the NP-Bench ``question``
dict (and the planted solution's size where the task has one), so the same
function measures instances from any generator. ``level_stats`` averages it
over seeds; docs/TASKS.md tabulates it for 200 instances per level, ours
beside NP-Bench's, and the tests hold our generators to that table.

    python -m dmpo_jax.tasks.instance_stats --num=200   # prints the table rows
"""

from __future__ import annotations

import statistics

from dmpo_jax import tasks as tasks_lib


def _density(adj: dict) -> tuple[int, float]:
  """(vertices, edge density) of an adjacency list or dict (nonzero weights are edges)."""
  n = len(adj)
  edges = set()
  for u, nbrs in adj.items():
    pairs = nbrs.items() if isinstance(nbrs, dict) else ((v, 1) for v in nbrs)
    for v, w in pairs:
      if w and int(u) != int(v):
        edges.add((min(int(u), int(v)), max(int(u), int(v))))
  return n, len(edges) / max(1, n * (n - 1) // 2)


def instance_stats(key: str, q: dict, planted_size: int | None = None) -> dict:
  """The statistics of one instance of task ``key`` (names in docs/TASKS.md's table)."""
  if key == "TSP":
    d = [q[i][j] for i in q for j in q[i] if int(i) < int(j)]
    return {"n": len(q), "dist_mean": statistics.fmean(d)}
  if key in ("GCP-D", "hamiltonian-cycle", "maximum_clique_problem", "maximum-set"):
    n, dens = _density(q)
    out = {"n": n, "density": dens}
    if key in ("maximum_clique_problem", "maximum-set") and planted_size is not None:
      out["planted"] = planted_size
    return out
  if key == "minimum-cut":
    n, dens = _density(q)
    w = [x for u in q for v, x in q[u].items() if x and int(u) < int(v)]
    return {"n": n, "density": dens, "weight_mean": statistics.fmean(w) if w else 0.0}
  if key == "knapsack":
    items = list(q["items"].values())
    w, v = [it["weight"] for it in items], [it["value"] for it in items]
    return {"items": len(items), "weight_mean": statistics.fmean(w), "weight_max": max(w),
            "value_mean": statistics.fmean(v), "capacity": q["capacity"]}
  if key == "subset-sum":
    nums = list(q["numbers"].values())
    out = {"numbers": len(nums), "value_mean": statistics.fmean(nums), "target": q["target"]}
    if planted_size is not None:
      out["planted"] = planted_size
    return out
  if key == "set-cover":
    return {"U": len(q["U"]), "S": len(q["S"]),
            "subset_size": statistics.fmean(len(s) for s in q["S"].values())}
  if key == "meeting-schedule":
    m = q["meetings"].values()
    return {"meetings": len(q["meetings"]), "attendees": len(q["attendee_availability"]),
            "rooms": len(q["rooms"]), "room_capacity": statistics.fmean(q["rooms"].values()),
            "meeting_size": statistics.fmean(len(x["attendees"]) for x in m),
            "duration": statistics.fmean(x["duration"] for x in m)}
  raise KeyError(f"unknown task {key!r}")


def planted_size(key: str, planted) -> int | None:
  """The size the table reports for a planted solution (clique, independent set, subset)."""
  return len(planted) if key in ("maximum_clique_problem", "maximum-set", "subset-sum") else None


def mean_stats(rows: list[dict]) -> dict:
  return {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}


def level_stats(key: str, level: str, num: int = 200, seed0: int = 0) -> dict:
  """Mean statistics of our generator over seeds seed0..seed0+num-1."""
  t = tasks_lib.get(key)
  rows = []
  for s in range(seed0, seed0 + num):
    q, sol = t.generate_with_solution(s, level)
    rows.append(instance_stats(key, q, planted_size(key, sol)))
  return mean_stats(rows)


def main(argv=None):
  import argparse
  ap = argparse.ArgumentParser(description="Mean statistics of generated instances per task and level.")
  ap.add_argument("--num", type=int, default=200)
  ap.add_argument("--tasks", default="all")
  ap.add_argument("--levels", default="easy,medium,hard,bench")
  args = ap.parse_args(argv)
  keys = tasks_lib.names() if args.tasks == "all" else args.tasks.split(",")
  for key in keys:
    for level in args.levels.split(","):
      st = level_stats(key, level, args.num)
      print(f"{key} {level} " + " ".join(f"{k}={v:.3g}" for k, v in st.items()), flush=True)


if __name__ == "__main__":
  main()
