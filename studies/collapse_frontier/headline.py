"""The headline tables of docs/RESULTS.md from a sweep's report.json.

    python -m studies.collapse_frontier.headline runs/collapse_sweep/report.json

Mean [95% interval] over seeds after RL, the SFT start's row first; then paired
differences against grpo on the same seeds, and the gradient norms of the RL terms.
"""

import json
import sys

COLS = [("optimal_rate", "optimal share"), ("SR_mean", "feasible share"), ("QR_mean", "QR"),
        ("distinct_optimal", "distinct optima"), ("coverage", "coverage"),
        ("pass_optimal@1", "pass@1"), ("pass_optimal@8", "pass@8"), ("pass_optimal@64", "pass@64"),
        ("pass@64", "pass@64 feasible"), ("length", "length")]
DIFFS = ["optimal_rate", "QR_mean", "distinct_optimal", "coverage", "pass_optimal@8", "pass_optimal@64",
         "length"]


def cell(v, digits=3):
  if not isinstance(v, dict) or v.get("mean") is None:
    return "—"
  m = f"{v['mean']:.{digits}f}"
  if v.get("low") is None or v.get("n", 0) < 2:
    return m
  return f"{m} [{v['low']:.{digits}f}, {v['high']:.{digits}f}]"


def main(path):
  r = json.load(open(path))
  print("| preset | n | " + " | ".join(n for _, n in COLS) + " |")
  print("|---|---|" + "---|" * len(COLS))
  rows = [("SFT start (before RL)", r["before"])] + [(f"`{l}`", v) for l, v in r["final"].items()]
  for name, v in rows:
    n = next((x.get("n") for x in v.values() if isinstance(x, dict) and x.get("n")), "")
    print(f"| {name} | {n} | " + " | ".join(cell(v.get(k)) for k, _ in COLS) + " |")
  print()
  print("| preset (minus grpo, same seeds) | " + " | ".join(DIFFS) + " |")
  print("|---|" + "---|" * len(DIFFS))
  for l, v in r["paired"].items():
    print(f"| `{l}` | " + " | ".join(cell(v.get(k)) for k in DIFFS) + " |")
  print()
  print("| preset | policy-gradient term | regulariser | ratio |")
  print("|---|---|---|---|")
  for l, v in r["gradients"].items():
    print(f"| `{l}` | " + " | ".join(cell(v.get(k), 4) for k in ("pg_grad_norm", "reg_grad_norm", "grad_ratio"))
          + " |")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "runs/collapse_sweep/report.json")
