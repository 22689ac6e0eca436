r"""The start's competence and headroom at several SFT lengths (one seed): docs/COLLAPSE.md.

    python scripts/collapse_pilot.py --out=/tmp/pilot --sft_steps=200,400,600 --seed=0

For each SFT length: the SFT stage of configs/collapse.py (splits regime) alone, then the
evaluation point of the start (training/points.py: A, B and C at the RL temperature,
config.eval.points_samples samples), and one line per length with optimal pass@1 on A
and pass@64 (optimal) on B, the two numbers the start is chosen by. Writes
<out>/pilot.json.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs"))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--sft_steps", default="200,400,600")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--config_args", default="", help="extra configs/collapse.py arguments")
  args = ap.parse_args()
  import collapse
  from absl import logging
  from dmpo_jax.training import run as run_lib, stages
  from dmpo_jax.training import points
  logging.set_verbosity(logging.WARNING)
  rows = []
  for n in [int(s) for s in args.sft_steps.split(",")]:
    cfg = collapse.get_config(",".join(filter(None, [f"seed={args.seed},sft_steps={n}", args.config_args])))
    cfg.log.progress = False
    wd = os.path.join(args.out, f"sft{n}")
    t0 = time.time()
    cfg.stop_at_step = n
    stages.train(cfg, wd)
    t_sft = time.time() - t0
    run, state = run_lib.setup(cfg, wd)
    res = points.Points(run, state.params).evaluate(state, 0)
    run.ckpt.close()
    row = {"sft_steps": n, "sft_s": t_sft, "eval_s": time.time() - t0 - t_sft}
    for name, r in res["sets"].items():
      o = r["overall_instance"]
      row[name] = {m: o.get(m) for m in ("pass_optimal@1", "pass_optimal@8", "pass_optimal@64",
                                          "coverage", "distinct_optimal", "optimal_rate")}
    rows.append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "pilot.json"), "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
