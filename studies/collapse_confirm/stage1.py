"""Stage 1 of the confirmatory design (exploratory): one strength per remedy family, by the
rule fixed in docs/COLLAPSE.md (`design.choose_strength`), printed as a table.

    python -m studies.collapse_confirm.stage1 tier1:docs/frontier_sweep/points.csv \
        studies/collapse_confirm/stage1/*/points.csv runs/confirm_explore

Each source is a sweep folder (its runs' points/rl<step>.json) or a points.csv written by a
sweep report (`frontier.point_rows`: one row per label, seed, RL step and set, with the mean
over instances). A source prefixed `tier1:` contributes only the labels stage 1 takes from
tier 1 (`design.RAN_IN_TIER1`). Labels found in several sources are refused (one run per label
and seed), and so is a family whose labels do not share a seed's start.
"""

from __future__ import annotations

import csv
import math
import os
import sys

from dmpo_jax.experiments import frontier, report
from studies.collapse_confirm import design

METRICS = ("pass_optimal@1", "coverage")


def points_from_csv(path: str) -> dict:
  """{label: {seed: {rl_step: point}}} from a points.csv (the sets' instance means only)."""
  out: dict = {}
  with open(path, newline="") as f:
    for row in csv.DictReader(f):
      vals = {m: float(row[m]) for m in METRICS if row.get(m) not in (None, "")}
      pt = out.setdefault(row["label"], {}).setdefault(int(row["seed"]), {}).setdefault(
          int(row["rl_step"]), {"sets": {}})
      pt["sets"][row["set"]] = {"overall_instance": vals}
  return out


def points_from_sweep(out_dir: str) -> dict:
  """{label: {seed: {rl_step: point}}} of a sweep folder's finished runs (report's check)."""
  runs, _ = report.collect(out_dir)
  return {l: {s: frontier.read_points(os.path.join(out_dir, l, f"seed{s}"))
              for s, r in by_seed.items() if r["status"] == "finished"} for l, by_seed in runs.items()}


def load(sources) -> dict:
  merged: dict = {}
  for src in sources:
    only = design.RAN_IN_TIER1 if src.startswith("tier1:") else None
    src = src[len("tier1:"):] if only else src
    pts = points_from_csv(src) if src.endswith(".csv") else points_from_sweep(src)
    for label, by_seed in pts.items():
      if only is not None and label not in only:
        continue
      by_seed = {s: p for s, p in by_seed.items() if s in design.EXPLORE_SEEDS}
      clash = set(by_seed) & set(merged.get(label, {}))
      if clash:
        raise SystemExit(f"error: {label} seeds {sorted(clash)} appear in more than one source")
      merged.setdefault(label, {}).update(by_seed)
  return merged


def table(points: dict) -> list[str]:
  lines = ["| family | chosen | " + " | ".join(f"label {i + 1}: reached / mean matched coverage A" for i in range(4))
           + " |", "|" + "---|" * 6]
  for fam in design.REMEDIES:
    if not any(points.get(l) for l in design.CANDIDATES[fam]):
      lines.append(f"| {fam} | (not run) |" + " — |" * 4)
      continue
    best, tab = design.choose_strength(points, fam)
    cells = [f"`{l}` {n}/{len(points.get(l, {}))}, " + ("—" if not math.isfinite(v) else f"{v:.3f}")
             for l, (n, v) in tab.items()]
    lines.append(f"| {fam} | `{best}` | " + " | ".join(cells) + " |")
  return lines


def main(argv=None) -> int:
  args = sys.argv[1:] if argv is None else argv
  if not args:
    print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
    return 2
  print("\n".join(table(load(args))))
  return 0


if __name__ == "__main__":
  sys.exit(main())
