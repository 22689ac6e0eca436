"""DAPO's reusable helpers (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale", arXiv 2503.14476).

The loss itself is `grpo.policy_loss` with eps_low=0.2, eps_high=0.28 and
agg='token_mean'; the soft overlong penalty and the dynamic-sampling filter
live with the rest of reward shaping in `shaping` (names kept here).
"""

from dmpo_jax.objectives.shaping import dynamic_sampling_keep, overlong_penalty

__all__ = ["dynamic_sampling_keep", "overlong_penalty"]
