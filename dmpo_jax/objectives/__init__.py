"""Loss functions as small pure functions, registered by name (formulas: docs/METHODS.md).

common: token log-probs, entropy, sequence scores, aggregation.
grpo: advantages (GRPO, Dr. GRPO, RLOO, GPG scaling) and policy losses
      (PPO-clip, GSPO, GPG). kl: k1/k2/k3. dmpo: distribution matching.
divergences: the DPH-RL f-divergence registry. dapo, flowrl: their pieces.
passk (Pass@k Training, PKPO), exploration (unlikeliness reward, outcome-based
exploration), covariance (KL-Cov, Clip-Cov): the baselines against diversity collapse.
terms: the registries of advantage estimators and policy losses.
regularisers: the registry of regularisers build_loss adds (KL, DM, divergence).
shaping: reward shaping (correct flag, overlong penalty, dynamic sampling, KL in
reward) and the registry of reward-shaping terms.
settings: each term's settings section (its fields, defaults, checks).
needs: what a term declares it needs from the trainer (Needs).
presets: algorithm presets, `needs(cfg)` and the loss builder.
"""

from dmpo_jax.objectives import (common, covariance, dapo, divergences, dmpo, exploration,
                                 flowrl, grpo, kl, needs, passk, presets, registry, regularisers,
                                 settings, shaping, terms)
from dmpo_jax.objectives.presets import (PRESETS, ObjectiveConfig, build_loss, objective_config,
                                         preset_names)

__all__ = ["common", "covariance", "dapo", "divergences", "dmpo", "exploration", "flowrl", "grpo",
           "kl", "needs", "passk", "presets", "registry", "regularisers", "settings", "shaping",
           "terms",
           "PRESETS", "ObjectiveConfig", "build_loss", "objective_config", "preset_names"]
