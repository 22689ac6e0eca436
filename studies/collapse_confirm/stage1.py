"""Stage 1 of the confirmatory design (exploratory): one strength per remedy family, by the
rule fixed in docs/COLLAPSE.md (`design.choose_strength`), printed as a table.

    python -m studies.collapse_confirm.stage1 tier1:docs/frontier_sweep/points.csv \
        studies/collapse_confirm/stage1/*/points.csv runs/confirm_explore

Each source is a sweep folder or a points.csv written by a sweep report (`sources.py`: the
finished runs only). A source prefixed `tier1:` contributes only the labels stage 1 takes from
tier 1 (`design.RAN_IN_TIER1`). Only the exploration seeds (`design.EXPLORE_SEEDS`) are read.
Labels found in several sources are refused (one run per label and seed), and so is a family
whose labels do not share a seed's start.
"""

from __future__ import annotations

import math
import sys

from studies.collapse_confirm import design, sources


def load(args) -> dict:
  """{label: {seed: {rl_step: point}}} on the exploration seeds, from the sources in `args`."""
  return sources.load(args, design.EXPLORE_SEEDS, tier1_labels=design.RAN_IN_TIER1)[0]


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
