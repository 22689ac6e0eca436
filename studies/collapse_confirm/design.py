"""The confirmatory collapse experiment's design, as data (docs/COLLAPSE.md, "Confirmatory
pre-registration"; this folder's README.md has the commands).

Stage 1 (exploratory, seeds 0-4): every remedy family along its strength axis, four labels
each; `choose_strength` picks one label per family by the rule below. Stage 2 (confirmatory,
fresh seeds 100-119): that label per remedy, the "less RL" reference and full GRPO, matched
per seed at start + DELTA, Holm over the 13 remedies against the reference.
"""

from __future__ import annotations

import math

from dmpo_jax.experiments import confirm

DELTA = 0.03            # the per-seed gain in optimal pass@1 on A+B at which runs are matched
RL_STEPS = 100
EVAL_POINTS = 11        # RL steps 0, 10, ..., 100
POINTS_SAMPLES = "A:32,B:64,C:0"
MATCH = ("AB", "pass_optimal@1")                 # x: where the gain is measured
PRIMARY = ("A", "coverage")                      # y of the primary family
SECONDARY = ("B", "pass_optimal@64")             # y of the secondary family
REFERENCE = "grpo-lr0.0001"                      # "less RL": GRPO at lr 1e-4
FULL_GRPO = "grpo"                               # lr 3e-4, reported beside
EXPLORE_SEEDS = tuple(range(5))                  # stage 1: the tier-1 seeds
CONFIRM_SEEDS = tuple(range(100, 120))           # stage 2: never used before
MIN_CONFIRM_SEEDS = 15                           # the cut rule's floor (whole seeds dropped from the top)
SETTINGS = ("--set=eval.points=%d" % EVAL_POINTS, "--set=eval.points_samples=%s" % POINTS_SAMPLES,
            "--set=rl.steps=%d" % RL_STEPS)

# Stage 1: four labels per family (the same count for every family: best-of-labels favours
# families with more), from about GRPO to over-regularised.
CANDIDATES = {
    "dmpo": ["dmpo-5-a1_15", "dmpo-20-a1_15", "dmpo-80-a1_15", "dmpo-320-a1_15"],
    "dm_only": ["dm_only-lr3e-05", "dm_only-lr0.0001", "dm_only-2-a1_15", "dm_only-lr0.001"],
    "rkl": ["rkl-0.01", "rkl-0.05", "rkl-0.25", "rkl-1.25"],
    "dph_f": ["dph_f-eta0.5", "dph_f-eta2.5", "dph_f-eta12.5", "dph_f-eta62.5"],
    "dph_js": ["dph_js-eta0.5", "dph_js-eta2.5", "dph_js-eta12.5", "dph_js-eta62.5"],
    "passk": ["passk-passk_k1", "passk-passk_k2", "passk-passk_k4", "passk-passk_k8"],
    "pkpo": ["pkpo-pkpo_k1", "pkpo-pkpo_k2", "pkpo-pkpo_k4", "pkpo-pkpo_k8"],
    "unlikely": ["unlikely-unlikely_penalty0.05", "unlikely-unlikely_penalty0.25",
                 "unlikely-unlikely_penalty0.5", "unlikely-unlikely_penalty0.9"],
    "w_reinforce": ["w_reinforce-psr_weight1", "w_reinforce-psr_weight0.3", "w_reinforce-psr_weight0.1",
                    "w_reinforce-psr_weight0"],
    "kl_cov": ["kl_cov-kl_cov_frac0.005", "kl_cov-kl_cov_frac0.02", "kl_cov-kl_cov_frac0.08",
               "kl_cov-kl_cov_frac0.3"],
    "clip_cov": ["clip_cov-clip_cov_frac0.005", "clip_cov-clip_cov_frac0.02", "clip_cov-clip_cov_frac0.08",
                 "clip_cov-clip_cov_frac0.3"],
    "outcome_batch": ["outcome_batch-explore_coef0.1", "outcome_batch-explore_coef0.5",
                      "outcome_batch-explore_coef2", "outcome_batch-explore_coef8"],
    "outcome_ucb": ["outcome_ucb-explore_coef0.1", "outcome_ucb-explore_coef0.5", "outcome_ucb-explore_coef2",
                    "outcome_ucb-explore_coef8"],
}
REMEDIES = list(CANDIDATES)  # the primary family: m = 13
MIN_EXPLORE_REACH = 4        # of the 5 exploration seeds


def choose_strength(runs_points: dict, family: str) -> tuple[str, dict]:
  """Stage 1's rule for one family: among its labels that reach the seed's target (start +
  DELTA on A+B) on at least MIN_EXPLORE_REACH of the exploration seeds, the one whose mean
  matched coverage of A is highest (ties: the weaker, earlier label). When none reaches often
  enough: the label that reaches on the most seeds, then the highest mean. Returns (label,
  {label: (seeds reached, mean matched coverage)})."""
  targets = confirm.seed_targets({l: runs_points.get(l, {}) for l in CANDIDATES[family]}, DELTA, *MATCH)
  table = {}
  for label in CANDIDATES[family]:
    vals = confirm.matched_values(runs_points.get(label, {}), targets, *MATCH, *PRIMARY)
    hit = [v for v in vals.values() if math.isfinite(v)]
    table[label] = (len(hit), sum(hit) / len(hit) if hit else -math.inf)
  eligible = [l for l in CANDIDATES[family] if table[l][0] >= MIN_EXPLORE_REACH]
  key = (lambda l: table[l][1]) if eligible else (lambda l: (table[l][0], table[l][1]))
  pool = eligible or CANDIDATES[family]
  best = max(pool, key=key)  # max keeps the first (weakest) of equal keys
  return best, table


# Stage 1's choice (`choose_strength` on seeds 0-4, all 200 stage-1 runs and tier 1's DMPO,
# DM-only and rkl points: studies/collapse_confirm/stage1/), committed on 2026-12-06 before any
# stage-2 run (docs/COLLAPSE.md, "Stage 1's choice"). Clip-Cov: no label reached on 4 of 5
# seeds, so the rule's fallback (most seeds reached, then the highest mean) chose it.
CHOSEN = {
    "dmpo": "dmpo-320-a1_15",
    "dm_only": "dm_only-lr0.0001",
    "rkl": "rkl-1.25",
    "dph_f": "dph_f-eta12.5",
    "dph_js": "dph_js-eta62.5",
    "passk": "passk-passk_k4",
    "pkpo": "pkpo-pkpo_k2",
    "unlikely": "unlikely-unlikely_penalty0.9",
    "w_reinforce": "w_reinforce-psr_weight1",
    "kl_cov": "kl_cov-kl_cov_frac0.005",
    "clip_cov": "clip_cov-clip_cov_frac0.005",
    "outcome_batch": "outcome_batch-explore_coef2",
    "outcome_ucb": "outcome_ucb-explore_coef0.1",
}


def confirm_labels(chosen: dict) -> list[str]:
  """Stage 2's labels: one per remedy (chosen[family]), the reference and full GRPO."""
  missing = [f for f in REMEDIES if f not in chosen]
  if missing:
    raise ValueError(f"no strength chosen for {missing}")
  return [REFERENCE, FULL_GRPO] + [chosen[f] for f in REMEDIES]


# Labels whose evaluation points on seeds 0-4 are kept from tier 1 (docs/frontier_sweep/
# points.csv); stage 1 runs the others. A family's labels must share each seed's SFT start
# (`confirm.seed_targets` refuses otherwise), so a family is taken from tier 1 whole or run
# whole: DPH-F's eta 12.5 and 62.5 points were not kept, and its eta 0.5 and 2.5 tier-1 runs
# start elsewhere than stage 1's (seed 0, A+B optimal pass@1: 0.306 in tier 1 on the Xeon,
# 0.359 at 0f9d454 on the AMD EPYC), so all four run in stage 1 (addendum, 2026-12-06, before
# any strength was chosen; docs/COLLAPSE.md).
RAN_IN_TIER1 = tuple(l for f in ("dmpo", "dm_only", "rkl") for l in CANDIDATES[f])


def stage1_labels() -> list[str]:
  return [l for f in REMEDIES for l in CANDIDATES[f] if l not in RAN_IN_TIER1]


if __name__ == "__main__":  # `python -m studies.collapse_confirm.design stage1|stage2`: the --presets value
  import sys
  if sys.argv[1:] not in (["stage1"], ["stage2"]):
    sys.exit("usage: python -m studies.collapse_confirm.design stage1|stage2")
  print(",".join(stage1_labels() if sys.argv[1] == "stage1" else confirm_labels(CHOSEN)))
