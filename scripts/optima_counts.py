"""How many optimal solutions the generators give: the table of docs/COLLAPSE.md.

    python scripts/optima_counts.py --num=50 --levels=tiny,easy

Per task and level: median number of distinct optima over instances (seeds 10000...),
the share with >= 2 and with 2..16, how many enumerations the limit cut, and the mean time.
"""

import argparse
import time

import numpy as np

from dmpo_jax import tasks


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--num", type=int, default=50)
  ap.add_argument("--levels", default="tiny,easy")
  ap.add_argument("--limit", type=int, default=64)
  ap.add_argument("--time_limit", type=float, default=30.0)
  args = ap.parse_args()
  print("| task | level | median | share >= 2 | share 2..16 | cut | mean time |")
  print("|---|---|---|---|---|---|---|")
  for key in tasks.with_optima():
    task = tasks.get(key)
    for level in args.levels.split(","):
      counts, cut, secs = [], 0, []
      for seed in range(10000, 10000 + args.num):
        q = task.generate(seed, level)
        t0 = time.perf_counter()
        opt = task.optimal_solutions(q, limit=args.limit, time_limit=args.time_limit)
        secs.append(time.perf_counter() - t0)
        counts.append(len(opt.solutions))
        cut += not opt.complete
      c = np.asarray(counts)
      med = np.median(c)
      print(f"| {key} | {level} | {med:g}{' (cut)' if med >= args.limit else ''} | "
            f"{np.mean(c >= 2):.0%} | {np.mean((c >= 2) & (c <= 16)):.0%} | {cut} | "
            f"{1e3 * np.mean(secs):.1f} ms |", flush=True)


if __name__ == "__main__":
  main()
