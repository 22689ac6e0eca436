#!/usr/bin/env bash
# The pre-registered strength-axis sweep of docs/COLLAPSE.md: tier 1 (20 labels) x seeds 0-4,
# seed by seed, at most MAX_RUNS runs per invocation (rerun the same command to go on; a run
# that finished is skipped). Tier 2 afterwards: TIER=tier2.
#
#   OUT=runs/frontier MAX_RUNS=40 studies/collapse_frontier/sweep.sh      # about 3 h per 40 runs (estimate)
#   python -m studies.collapse_frontier.sweep --out=runs/frontier --report_only   # report, frontier.md, CSVs
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/frontier}
python -m studies.collapse_frontier.sweep --config=configs/collapse.py --out="$OUT" --presets="${TIER:-tier1}" \
  --seeds="${SEEDS:-0-4}" --seed_major --max_runs="${MAX_RUNS:-40}" --no_progress "$@"
