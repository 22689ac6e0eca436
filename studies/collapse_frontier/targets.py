"""Exploratory: the pre-registered contrasts of a strength-axis sweep at other pass@1 targets
on A+B than the registered rule's (docs/RESULTS.md section 6), Holm over the 12 of each target
(`frontier.analyse` with the targets given, this study's `design.ANALYSIS`).

    python -m studies.collapse_frontier.targets runs/frontier 0.42,0.44
"""

import json
import math
import os
import sys

from dmpo_jax.experiments import frontier
from studies.collapse_frontier import design


def main(out: str, targets: str) -> None:
  man = json.load(open(os.path.join(out, "sweep.json")))
  pts = {l: {s: frontier.read_points(os.path.join(out, l, f"seed{s}")) for s in man["seeds"]}
         for l in man["labels"]}
  fams = {f: [l for l in ls if l in pts] for f, ls in man["families"].items()}
  pairs = [tuple(p) for p in man["contrasts"]]
  for target in map(float, targets.split(",")):
    res = frontier.analyse(pts, fams, pairs, man.get("baseline", design.BASELINE), design.ANALYSIS,
                           given_targets={("AB", "pass_optimal@1"): target})
    for _, _, ys, y in design.ANALYSIS.primary:
      vals = res["matched"][f"{ys}/{y}@AB/pass_optimal@1"]
      means = {f: [v for v in d.values() if math.isfinite(v)] for f, d in vals.items()}
      print(f"target {target} {ys}/{y} matched mean (n seeds):",
            {f: (round(sum(v) / len(v), 3) if v else None, len(v)) for f, v in means.items()})
    for r in res["primary"]:
      print(f"  {target} {r['contrast']:24s} {r['set']} {r['y']:16s} n={r['n']} mean={r['mean']:.3f} "
            f"[{r['low']:.3f},{r['high']:.3f}] p={r['p']:.4f} holm={r['p_holm']:.4f}")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "0.42,0.44")
