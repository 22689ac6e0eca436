"""The loss terms' gradient norms of stage-2 runs (exploratory; the runs log them every 4th RL
step, `rl.log_term_grads` in configs/collapse.py): per label, the mean over its runs of the
policy-gradient term's norm, the regulariser's, their ratio and the mean per-step ratio.

    python -m studies.collapse_confirm.term_grads <sweep folder> [...] > term_grads.md
"""

from __future__ import annotations

import collections
import glob
import json
import math
import os
import sys


def mean(xs):
  xs = [x for x in xs if x is not None and not math.isnan(x)]
  return sum(xs) / len(xs) if xs else float("nan")


def run_means(path: str) -> tuple[float, float, float] | None:
  """(mean PG norm, mean regulariser norm, mean per-step ratio) of one metrics.jsonl, or None
  where no step logged the terms."""
  pg, reg, ratio = [], [], []
  with open(path) as f:
    for line_no, line in enumerate(f, start=1):
      try:
        d = json.loads(line)
      except json.JSONDecodeError as e:
        raise SystemExit(f"error: {path}, line {line_no}: not JSON ({e})")
      if d.get("pg_grad_norm") is not None:
        pg.append(d["pg_grad_norm"])
        reg.append(d.get("reg_grad_norm"))
        ratio.append(d.get("grad_ratio"))
  return (mean(pg), mean(reg), mean(ratio)) if pg else None


def table(folders) -> str:
  rows = collections.defaultdict(list)
  for folder in folders:
    for path in sorted(glob.glob(os.path.join(folder, "*", "seed*", "metrics.jsonl"))):
      got = run_means(path)
      if got is not None:
        rows[path.split(os.sep)[-3]].append(got)
  if not rows:
    raise SystemExit(f"error: no run in {list(folders)} logged its terms' gradient norms")
  out = ["| label | runs | policy-gradient term | regulariser | ratio of mean norms | mean per-step ratio |",
         "|---|---|---|---|---|---|"]
  for label in sorted(rows):
    pg, reg, ratio = (mean(r[i] for r in rows[label]) for i in range(3))
    out.append(f"| `{label}` | {len(rows[label])} | {pg:.3g} | {reg:.3g} | "
               f"{reg / pg if pg else float('nan'):.3g} | {ratio:.3g} |")
  return "\n".join(out)


if __name__ == "__main__":
  if len(sys.argv) < 2:
    raise SystemExit(__doc__)
  print(table(sys.argv[1:]))
