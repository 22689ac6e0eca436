"""The transfer demonstration (issue 43): `grpo` and `dmpo` on SmolLM2 (`configs/smollm2_nphard.py`,
which scores two reasoning-gym transfer tasks at each evaluation), one seed, sharing one SFT
stage and one evaluation before RL. A demonstration, not a test: one seed, 6 instances x 4
samples per transfer task.

    python -m studies.gym_transfer.demo --config=configs/smollm2_nphard.py --out=runs/gym_demo \
        --presets=grpo,dmpo-20 --seeds=0 --set=rl.log_term_grads=4

The generic runner (dmpo_jax.experiments.sweep, the same flags) with these labels. `dmpo` is
asked for at a strength where its DM term is at least a tenth of the policy gradient's norm:
`rl.log_term_grads` logs both norms (metrics.jsonl: `pg_grad_norm`, `reg_grad_norm`, `grad_ratio`), and
`python -m studies.gym_transfer.demo_table <out>` prints their ratio beside the transfer scores.
The preset's own strength (lambda 0.5, alpha 1) put the term at 0.4-0.9% of the policy
gradient's norm on SmolLM2 (docs/RESULTS.md 4.1), so the labels scale lambda only.
"""

from __future__ import annotations

import sys

from dmpo_jax.experiments import sweep

PROG = "python -m studies.gym_transfer.demo"
DMPO_LAMBDAS = (0.5, 5.0, 20.0, 50.0)

SETTINGS = {"grpo": {"rl.algo": "grpo"}}
SETTINGS.update({f"dmpo-{lam:g}": {"rl.algo": "dmpo", "rl.objective.dm_coef": lam}
                 for lam in DMPO_LAMBDAS})
DESIGN = sweep.Design(settings=SETTINGS, baseline="grpo")


def main(argv=None) -> int:
  return sweep.main(argv, design=DESIGN, prog=PROG)


if __name__ == "__main__":
  sys.exit(main())
