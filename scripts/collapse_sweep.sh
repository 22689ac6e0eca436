#!/usr/bin/env bash
# The mode-collapse sweep of docs/RESULTS.md, from scratch:
#   1. the start policy: SFT on optimal answers (configs/collapse.py, seed 0), exported to hf/;
#   2. every label of dmpo_jax/experiments/sweep.py's SETTINGS x seeds 0-4 from that start, in two
#      processes (the 2-core CPU runs two small models at once faster than one after the other);
#   3. the report (runs/collapse_sweep/report.md, report.json, curves.png, pass_at_k.png).
# Rerun to resume: finished runs are skipped, interrupted ones resume from their checkpoints.
# The fixed-pool regime (docs/RESULTS.md):
#   ARGS=pool=12 START=runs/collapse_pool_start OUT=runs/collapse_pool_sweep scripts/collapse_sweep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
START=${START:-runs/collapse_start}
OUT=${OUT:-runs/collapse_sweep}
ARGS=${ARGS:-}  # configs/collapse.py's arguments, e.g. pool=12
if [ ! -f "$START/hf/model.safetensors" ]; then
  python -m dmpo_jax.train --config="configs/collapse.py:algo=grpo${ARGS:+,$ARGS}" --config.rl.steps=0 \
    --workdir="$START"
fi
mkdir -p "$OUT"
COMMON=(--config="configs/collapse.py${ARGS:+:$ARGS}" --out="$OUT" --seeds=0-4 --set=model.init="$START/hf" --set=sft.steps=0 --set=log.progress=False
        --no_progress)
python -m dmpo_jax.experiments.sweep "${COMMON[@]}" \
  --presets=grpo,dmpo,dmpo-2-a1_15,dmpo-20-a1_15,dm_only-2-a1_15,grpo-g16,dph_f-sep > "$OUT/sweep_a.log" 2>&1 &
sleep 30  # let the first process create the sweep folder and its compilation cache
python -m dmpo_jax.experiments.sweep "${COMMON[@]}" \
  --presets=rkl-0.01,rkl-0.1,dph_f,dph_js,dmpo-2-a1_15-g16,dph_js-sep > "$OUT/sweep_b.log" 2>&1 &
wait
python -m dmpo_jax.experiments.sweep --out="$OUT" --report_only
