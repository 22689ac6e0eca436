"""The collapse frontier's sweep: the generic runner (dmpo_jax.experiments.sweep, the same
flags) with this study's design (design.DESIGN: its labels, tiers, families, contrasts and
pre-registered analysis).

    python -m studies.collapse_frontier.sweep --config=configs/collapse.py --out=runs/frontier \
        --presets=tier1 --seeds=0-4 --seed_major --max_runs=40
    python -m studies.collapse_frontier.sweep --out=runs/frontier --report_only   # report, frontier.md, CSVs
"""

from __future__ import annotations

import sys

from dmpo_jax.experiments import sweep
from studies.collapse_frontier import design

PROG = "python -m studies.collapse_frontier.sweep"


def main(argv=None) -> int:
  return sweep.main(argv, design=design.DESIGN, prog=PROG)


if __name__ == "__main__":
  sys.exit(main())
