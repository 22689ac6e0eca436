"""Stage 2's Pareto figure (descriptive, beside the registered tables): per label, the mean
over seeds of coverage of A against the gain in optimal pass@1 on A+B from the seed's own
start, along the 11 evaluation points; a dotted line at the registered gain (Δ = 0.03).

    python -m studies.collapse_confirm.pareto <sources as stage2.py> --out=<png>
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from dmpo_jax.experiments import files
from dmpo_jax.experiments import frontier
from studies.collapse_confirm import design, sources, stage2


def curves(points: dict, labels) -> dict:
  """{label: (mean gain per RL step, mean coverage of A per RL step, n seeds)} over the seeds
  every label finished; the gain is A+B optimal pass@1 minus the seed's RL-step-0 value."""
  seeds = sorted(set.intersection(*(set(points.get(l, {})) for l in labels)))
  if not seeds:
    raise SystemExit("error: no seed on which every label finished")
  out = {}
  for label in labels:
    gains, covs = [], []
    for s in seeds:
      pts = points[label][s]
      steps = sorted(pts)
      xs, ys = frontier.trajectory({t: pts[t] for t in steps}, "AB", "pass_optimal@1", "coverage", y_split="A")
      if len(xs) != len(steps):
        raise SystemExit(f"error: {label} seed {s}: a point lacks A+B pass@1 or A coverage")
      gains.append(np.asarray(xs) - xs[0])
      covs.append(ys)
    n = min(map(len, gains))
    out[label] = (np.mean([g[:n] for g in gains], 0), np.mean([c[:n] for c in covs], 0), len(seeds))
  return out


def plot(cur: dict, families: dict, path: str, delta: float) -> None:
  from matplotlib.figure import Figure
  fig = Figure(figsize=(8.0, 5.6))
  ax = fig.subplots()
  for i, (fam, label) in enumerate(families.items()):
    gx, cy, n = cur[label]
    style = dict(color=f"C{i % 10}", ls="-" if i < 10 else "--", lw=2.2 if fam in ("reference", "full GRPO") else 1.2)
    ax.plot(gx, cy, marker="o", ms=2.5, label=f"{fam} ({label})", **style)
  ax.axvline(delta, color="black", ls=":", lw=1)
  ax.set_xlabel("gain in optimal pass@1 on A+B from the seed's start (RL steps 0, 10, ..., 100)")
  ax.set_ylabel("coverage of A's optimal sets")
  ax.set_title(f"Stage 2: mean over {n} seeds per label (descriptive); dotted: the registered gain {delta}", fontsize=9)
  ax.legend(fontsize=6.5, ncol=2, loc="lower left")
  fig.tight_layout()
  files.save_figure(fig, path)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m studies.collapse_confirm.pareto", description=__doc__.split("\n\n")[0])
  p.add_argument("sources", nargs="+", help="sweep folders or points.csv files, as stage2.py reads them")
  p.add_argument("--out", required=True, help="the PNG to write")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  chosen = stage2.resolve_chosen(None, getattr(design, "CHOSEN", None))
  fams = {"reference": design.REFERENCE, "full GRPO": "grpo", **chosen}
  points, _, _ = sources.load(args.sources, design.CONFIRM_SEEDS, metrics=stage2.METRICS)
  plot(curves(points, list(fams.values())), fams, args.out, design.DELTA)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
