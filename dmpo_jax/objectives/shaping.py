"""Reward shaping: everything between a verifier's verdict and the reward the loss sees.

In the order a step applies them:

1. Format bonus and cap (`dmpo_jax.tasks.rewards.score`, config.rl.reward):
   r = format_bonus * [well-formed answer] + min(ratio, cap) * [feasible].
2. DAPO's soft overlong penalty (objective.overlong_cache > 0, host side):
   `overlong_penalty` added to r.
3. DAPO's dynamic sampling (objective.dynamic_sampling, host side):
   `dynamic_sampling_keep` marks the groups whose samples are neither all
   right nor all wrong; the trainer zeroes the completion mask of the other
   groups. Shapes stay fixed: dropped groups are masked, not resampled, so a
   step trains on fewer groups rather than waiting for more.
4. KL in the reward (objective.kl_in_reward with kl_coef > 0, inside the
   loss): `kl_in_reward` subtracts kl_coef * sum_t k1 per sample.

`shape_rewards` applies 2 and 3 to a step's scored rollouts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmpo_jax.objectives import kl


def overlong_penalty(lengths, max_len: int, cache_len: int):
  """Soft overlong punishment: 0 if |o| <= Lmax - Lcache, linear down to -1 at Lmax,
  -1 beyond. lengths [...] -> [...] float32."""
  if not 0 < cache_len <= max_len:
    raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, "
                     f"max_len={max_len}")
  lengths = jnp.asarray(lengths, jnp.float32)
  free = max_len - cache_len
  band = (free - lengths) / cache_len
  return jnp.where(lengths <= free, 0.0, jnp.where(lengths <= max_len, band, -1.0))


def dynamic_sampling_keep(correct) -> np.ndarray:
  """Groups to keep: 0 < #correct < G. correct [num_groups, G] bool -> [num_groups] bool.

  Host side (numpy). The trainer masks the other groups out of the loss (their
  completion mask becomes 0); it does not resample them.
  """
  correct = np.asarray(correct, bool)
  n = correct.sum(-1)
  return (n > 0) & (n < correct.shape[-1])


def kl_in_reward(rewards, old_logprobs, ref_logprobs, mask, coef: float):
  """r - coef * sum_t k1(pi_old, pi_ref) per sample, without gradient: rewards [..., G],
  log-probs and mask [..., G, T]."""
  k = jnp.sum(kl.k1(old_logprobs, ref_logprobs) * mask, axis=-1)
  return rewards - coef * jax.lax.stop_gradient(k)


def shape_rewards(cfg, rewards: np.ndarray, lengths: np.ndarray, feasible: np.ndarray,
                  max_len: int) -> tuple[np.ndarray, np.ndarray | None]:
  """Steps 2 and 3 for one RL step: rewards, lengths, feasible [P, G] ->
  (shaped rewards [P, G], groups to keep [P] bool, or None without dynamic sampling).
  cfg is the ObjectiveConfig."""
  if cfg.overlong_cache:
    rewards = rewards + np.asarray(overlong_penalty(lengths, max_len, cfg.overlong_cache))
  keep = dynamic_sampling_keep(feasible) if cfg.dynamic_sampling else None
  return rewards, keep
