"""The SmolLM2 collapse study's sweep: the generic runner (dmpo_jax.experiments.sweep, the same
flags) with this study's labels (design.DESIGN).

    python -m studies.smollm2_collapse.sweep --config=configs/smollm2_nphard.py:collapse,lora \
        --out=runs/smollm2_regime --presets=regime --seeds=0
"""

from __future__ import annotations

import sys

from dmpo_jax.experiments import sweep
from studies.smollm2_collapse import design

PROG = "python -m studies.smollm2_collapse.sweep"


def main(argv=None) -> int:
  return sweep.main(argv, design=design.DESIGN, prog=PROG)


if __name__ == "__main__":
  sys.exit(main())
