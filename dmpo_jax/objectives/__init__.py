"""Loss functions as small pure functions, registered by name (formulas: docs/METHODS.md).

common: token log-probs, entropy, sequence scores, aggregation.
grpo: advantages (GRPO, Dr. GRPO, RLOO, GPG scaling) and policy losses
      (PPO-clip, GSPO, GPG). kl: k1/k2/k3. dmpo: distribution matching.
divergences: the DPH-RL f-divergence registry. dapo, flowrl: their pieces.
terms: the registries of advantage estimators and policy losses.
shaping: reward shaping (overlong penalty, dynamic sampling, KL in reward).
presets: algorithm presets and the loss builder.
"""

from dmpo_jax.objectives import (common, dapo, divergences, dmpo, flowrl, grpo, kl, presets,
                                 registry, shaping, terms)
from dmpo_jax.objectives.presets import (PRESETS, ObjectiveConfig, build_loss, objective_config,
                                         preset_names)

__all__ = ["common", "dapo", "divergences", "dmpo", "flowrl", "grpo", "kl", "presets",
           "registry", "shaping", "terms",
           "PRESETS", "ObjectiveConfig", "build_loss", "objective_config", "preset_names"]
