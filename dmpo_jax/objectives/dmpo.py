"""DMPO: group-level distribution matching (docs/METHODS.md, DMPO).

From "Beyond Mode Collapse: Distribution Matching for Diverse Reasoning".

For a group of G completions of one prompt:
  p_i = softmax_i(r_i / alpha)            Boltzmann target over RAW rewards, no gradient
  phi_i = mean_t log pi_theta(o_i,t | .)  length-normalised score, with gradient
  q_i = softmax_i(phi_i)                  the policy's distribution over the group
  L_DM = (1/G) sum_i (p_i - q_i)^2        averaged over groups
L_DMPO = L_GRPO + lambda L_DM; the scores reuse the GRPO forward's log-probs.

The MSE (not a KL) keeps the gradient bounded: |dL_DM/dphi_j| <= 4 q_j / G.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _check_alpha(alpha):
  if isinstance(alpha, (int, float)) and not alpha > 0:
    raise ValueError(f"DMPO temperature alpha must be > 0, got {alpha}")


def boltzmann_target(rewards, alpha):
  """p = softmax(r / alpha) over the last (group) axis; stop-gradient. [..., G] -> [..., G]."""
  _check_alpha(alpha)
  return jax.lax.stop_gradient(jax.nn.softmax(rewards.astype(jnp.float32) / alpha, axis=-1))


def group_policy_distribution(scores):
  """q = softmax(phi) over the group axis. [..., G] -> [..., G]."""
  return jax.nn.softmax(scores, axis=-1)


def dm_loss(scores, rewards, alpha):
  """Mean over groups of (1/G) sum_i (p_i - q_i)^2. scores phi [..., G], rewards [..., G]."""
  p = boltzmann_target(rewards, alpha)
  q = group_policy_distribution(scores)
  return jnp.mean(jnp.mean(jnp.square(p - q), axis=-1))


def dm_metrics(scores, rewards, alpha):
  """Diagnostics: p-q agreement (does q rank the group as p does) and the max gap."""
  p = boltzmann_target(rewards, alpha)
  q = jax.lax.stop_gradient(group_policy_distribution(scores))
  return {
      "dm_pq_l1": jnp.mean(jnp.sum(jnp.abs(p - q), axis=-1)),
      "dm_pq_argmax_agree": jnp.mean(
          (jnp.argmax(p, -1) == jnp.argmax(q, -1)).astype(jnp.float32)),
      "dm_q_max": jnp.mean(jnp.max(q, -1)),
  }
