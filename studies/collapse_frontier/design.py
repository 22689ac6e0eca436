"""The collapse frontier's design, as data (docs/COLLAPSE.md, "Pre-registration"; this folder's
README.md has the commands): the run labels with their settings, the strength axes, the
methods (families of labels), the pre-registered contrasts, the tiers that --presets accepts,
and the pre-registered matched analysis (`ANALYSIS`). `DESIGN` is what the sweep runner takes
(`python -m studies.collapse_frontier.sweep`).
"""

from __future__ import annotations

from dmpo_jax.experiments import frontier, sweep

# Each setting: a run label -> overrides of config fields (applied after the config file and
# --smoke; --set overrides apply to every run). The DM-only ablation needs a registered `none`
# policy loss; where the installed objectives refuse it, the sweep skips that label and says so.
SETTINGS: dict[str, dict] = {
    "grpo": {"rl.algo": "grpo"},
    "dmpo": {"rl.algo": "dmpo", "rl.objective.dm_coef": 0.5, "rl.objective.dm_alpha": 1.0},
    "dmpo-2-a1_15": {"rl.algo": "dmpo", "rl.objective.dm_coef": 2.0, "rl.objective.dm_alpha": 1 / 15},
    "dmpo-20-a1_15": {"rl.algo": "dmpo", "rl.objective.dm_coef": 20.0, "rl.objective.dm_alpha": 1 / 15},
    "dm_only-2-a1_15": {"rl.algo": "dmpo", "rl.objective.dm_coef": 2.0, "rl.objective.dm_alpha": 1 / 15,
                        "rl.objective.policy_loss": "none"},
    "dph_f": {"rl.algo": "dph_f"},
    "dph_js": {"rl.algo": "dph_js"},
    # The same with the two terms as separate means (eta x the whole D_pef batch's mean).
    "dph_f-sep": {"rl.algo": "dph_f", "dph.weighting": "separate"},
    "dph_js-sep": {"rl.algo": "dph_js", "dph.weighting": "separate"},
    "rkl-0.01": {"rl.algo": "rkl", "rl.objective.kl_coef": 0.01},
    "rkl-0.1": {"rl.algo": "rkl", "rl.objective.kl_coef": 0.1},
    "grpo-g16": {"rl.algo": "grpo", "rl.group_size": 16},
    "dmpo-2-a1_15-g16": {"rl.algo": "dmpo", "rl.objective.dm_coef": 2.0, "rl.objective.dm_alpha": 1 / 15,
                         "rl.group_size": 16},
}

# Strength axes (docs/COLLAPSE.md, "Pre-registration"): each remedy at 4 strengths from about
# GRPO to over-regularised, geometric steps; GRPO at lower learning rates as "less RL" (its
# evaluation points at 1/3 and 2/3 of the run are GRPO with fewer steps as well).
def _fmt(x: float) -> str:
  return f"{x:g}"


DMPO_LAMBDAS = (5.0, 20.0, 80.0, 320.0)       # at alpha = 1/15 (dmpo-20: gradient share ~0.17)
DM_ONLY_LRS = (3e-5, 1e-4, 3e-4, 1e-3)        # Adam ignores a loss scale: the LR is the strength
RKL_BETAS = (0.01, 0.05, 0.25, 1.25)          # rkl-0.1: gradient share ~0.165
DPH_ETAS = (0.02, 0.1, 0.5, 2.5)              # per-sample eta (the authors' weighting; default 0.05)
GRPO_LRS = (1e-4, 3e-5)                       # "less RL" beside grpo's 3e-4
for lam in DMPO_LAMBDAS:
  SETTINGS[f"dmpo-{_fmt(lam)}-a1_15"] = {"rl.algo": "dmpo", "rl.objective.dm_coef": lam,
                                         "rl.objective.dm_alpha": 1 / 15}
DM_ONLY_LABELS = [f"dm_only-lr{_fmt(lr)}" if lr != 3e-4 else "dm_only-2-a1_15" for lr in DM_ONLY_LRS]
for lr, label in zip(DM_ONLY_LRS, DM_ONLY_LABELS):
  SETTINGS[label] = {"rl.algo": "dmpo", "rl.objective.dm_coef": 2.0,
                                       "rl.objective.dm_alpha": 1 / 15, "rl.objective.policy_loss": "none",
                                       "rl.lr": lr}
for beta in RKL_BETAS:
  SETTINGS[f"rkl-{_fmt(beta)}"] = {"rl.algo": "rkl", "rl.objective.kl_coef": beta}
for eta in DPH_ETAS:
  SETTINGS[f"dph_f-eta{_fmt(eta)}"] = {"rl.algo": "dph_f", "rl.objective.div_coef": eta}
  SETTINGS[f"dph_js-eta{_fmt(eta)}"] = {"rl.algo": "dph_js", "rl.objective.div_coef": eta}
for lr in GRPO_LRS:
  SETTINGS[f"grpo-lr{_fmt(lr)}"] = {"rl.algo": "grpo", "rl.lr": lr}
# GRPO on D_exp alone (DPH's data split without its divergence): the control for that split.
SETTINGS["dph_f-eta0"] = {"rl.algo": "dph_f", "rl.objective.div_coef": 0.0}
# Exploratory, added after tier 1 (docs/RESULTS.md section 6): at eta <= 2.5 the DPH-F term
# stayed at 0.016-0.25 of the policy gradient's norm; these reach over-regularised.
DPH_ETAS_STRONG = (12.5, 62.5)
for eta in DPH_ETAS_STRONG:
  SETTINGS[f"dph_f-eta{_fmt(eta)}"] = {"rl.algo": "dph_f", "rl.objective.div_coef": eta}
  # The confirmatory design's DPH-JS axis (studies/collapse_confirm) matches DPH-F's.
  SETTINGS[f"dph_js-eta{_fmt(eta)}"] = {"rl.algo": "dph_js", "rl.objective.div_coef": eta}
# G = 16 matched on samples (4 prompts x 16 = 8 x 8 = 64 samples a step); "grpo-g16" is
# matched on prompts (8 x 16 = 128 samples).
SETTINGS["grpo-g16-samples"] = {"rl.algo": "grpo", "rl.group_size": 16, "rl.prompts_per_step": 4}

# The other published answers to collapse (docs/METHODS.md), each along its declared knob, from
# weakest (at or near GRPO) to strongest: exploratory labels of the frontier sweep (tier 2).
BASELINE_AXES = {
    "passk": ("passk_k", (1, 2, 4, 8)),             # k = 1 is GRPO on the correct flag
    "pkpo": ("pkpo_k", (1, 2, 4, 8)),
    "unlikely": ("unlikely_penalty", (0.05, 0.25, 0.5, 0.9)),
    "w_reinforce": ("psr_weight", (1.0, 0.3, 0.1, 0.0)),  # 0: NSR
    "kl_cov": ("kl_cov_frac", (0.005, 0.02, 0.08, 0.3)),
    "clip_cov": ("clip_cov_frac", (0.005, 0.02, 0.08, 0.3)),
    "outcome_batch": ("explore_coef", (0.1, 0.5, 2.0, 8.0)),
    "outcome_ucb": ("explore_coef", (0.1, 0.5, 2.0, 8.0)),
}
for _algo, (_knob, _values) in BASELINE_AXES.items():
  for _v in _values:
    SETTINGS[f"{_algo}-{_knob}{_fmt(_v)}"] = {"rl.algo": _algo, f"rl.objective.{_knob}": _v}

# Methods (families of labels along one strength axis) of the matched comparison.
FAMILIES: dict[str, list[str]] = {
    "grpo-less-rl": ["grpo"] + [f"grpo-lr{_fmt(x)}" for x in GRPO_LRS],
    "dmpo": [f"dmpo-{_fmt(x)}-a1_15" for x in DMPO_LAMBDAS],
    "dm_only": DM_ONLY_LABELS,  # 3e-4 (the config's RL rate) is the earlier dm_only-2-a1_15
    "rkl": [f"rkl-{_fmt(x)}" for x in RKL_BETAS],
    "dph_f": [f"dph_f-eta{_fmt(x)}" for x in DPH_ETAS],
    "dph_f-eta0": ["dph_f-eta0"],
    "dph_f-strong": [f"dph_f-eta{_fmt(x)}" for x in DPH_ETAS_STRONG],
    "dph_js": [f"dph_js-eta{_fmt(x)}" for x in DPH_ETAS],
    "grpo-g16-samples": ["grpo-g16-samples"],
    **{algo: [f"{algo}-{knob}{_fmt(v)}" for v in values]
       for algo, (knob, values) in BASELINE_AXES.items()},
}
# The pre-registered contrasts (docs/COLLAPSE.md), all at matched pass@1, Holm-corrected together.
CONTRASTS = [("dmpo", "rkl"), ("dph_f", "rkl"), ("dm_only", "rkl"),
             ("dmpo", "grpo-less-rl"), ("dph_f", "grpo-less-rl"), ("dm_only", "grpo-less-rl")]
# Tier 1 (pre-registered): 20 labels. Tier 2 (exploratory, if the budget allows).
TIER1 = (FAMILIES["grpo-less-rl"] + FAMILIES["dph_f-eta0"] + FAMILIES["dmpo"] + FAMILIES["dm_only"]
         + FAMILIES["rkl"] + FAMILIES["dph_f"])
TIER2 = (FAMILIES["dph_js"] + ["grpo-g16", "grpo-g16-samples"]
         + [label for algo in BASELINE_AXES for label in FAMILIES[algo]])
BASELINE = "grpo"  # paired differences in the report are against this label

# The pre-registered comparisons (docs/COLLAPSE.md): (set of x, x, set of y, y). The gain is
# optimal pass@1 on the RL prompts, A and B together ("AB"): what RL maximises.
PRIMARY = (("AB", "pass_optimal@1", "A", "coverage"), ("AB", "pass_optimal@1", "B", "pass_optimal@64"))
EXPLORATORY = (("AB", "kl_k1", "A", "coverage"), ("AB", "kl_k1", "B", "pass_optimal@64"),
               ("A", "pass_optimal@1", "A", "coverage"), ("B", "pass_optimal@1", "B", "pass_optimal@64"),
               ("AB", "pass_optimal@1", "A", "distinct_optimal"), ("AB", "pass_optimal@1", "C", "coverage"))
TARGET_FRACTION = 0.5  # matched at the start's value + this share of the reference's gain
ANALYSIS = frontier.Analysis(PRIMARY, EXPLORATORY, TARGET_FRACTION)

DESIGN = sweep.Design(settings=SETTINGS, families=FAMILIES, contrasts=CONTRASTS,
                      tiers={"tier1": TIER1, "tier2": TIER2}, baseline=BASELINE, analysis=ANALYSIS)
