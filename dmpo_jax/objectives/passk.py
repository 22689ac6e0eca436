"""Advantages that optimise pass@k instead of pass@1 (docs/METHODS.md, pass@k objectives).

Two papers, one quantity: for a group of G samples with binary rewards
r_i in {0, 1} (the verifier's correct flag, objective.reward="correct"),
pass@k is the chance that at least one of k samples is correct.

- Pass@k Training (Chen et al., "Pass@k Training for Adaptively Balancing
  Exploration and Exploitation of Large Reasoning Models", arXiv 2508.10751):
  the group's reward is averaged over all its k-subsets, a subset scoring
  max_{j in S} r_j; each sample's advantage is the mean, over the subsets
  holding it, of the subset's z-scored reward. `passk_advantages` is the
  closed form of that mean.
- PKPO (Walder and Karkhanis, "Pass@K Policy Optimization: Solving Harder
  Reinforcement Learning Problems", arXiv 2505.15201): per-sample weights s_i
  with sum_i s_i grad log pi(o_i) an unbiased estimate of grad max@k (pass@k for
  binary rewards), and the k-1 leave-one-out baseline (their s^(loo-1)).
  `pkpo_weights` computes them for real-valued rewards in O(G^2).

Shapes: rewards [..., G] -> advantages [..., G]; k a Python int <= G.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _check_k(k: int, g: int, what: str):
  if not (isinstance(k, int) and 1 <= k <= g):
    raise ValueError(f"{what}: need an integer 1 <= k <= G, got k={k!r} with a group of G={g} "
                     "(raise config.rl.group_size or lower the k knob)")


def comb(n, k):
  """C(n, k) elementwise as float32, 0 where k < 0 or k > n (n, k >= -1 integers as arrays)."""
  n, k = jnp.asarray(n, jnp.float32), jnp.asarray(k, jnp.float32)
  ok = (k >= 0) & (k <= n) & (n >= 0)
  n_, k_ = jnp.where(ok, n, 1.0), jnp.where(ok, k, 0.0)
  lg = jax.scipy.special.gammaln
  return jnp.where(ok, jnp.round(jnp.exp(lg(n_ + 1) - lg(k_ + 1) - lg(n_ - k_ + 1))), 0.0)


def passk_advantages(rewards, k: int, eps: float = 1e-6):
  """Pass@k Training's analytic advantage (binary rewards [..., G]).

  With N = G samples, N_neg of them wrong:
    mean  = 1 - C(N_neg, k) / C(N, k)          the group's pass@k over its k-subsets
    sigma = sqrt(mean (1 - mean))               their std (a subset scores 0 or 1)
    A_pos = (1 - mean) / sigma
    A_neg = (1 - mean - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / sigma
  A group that is all right or all wrong gets A = 0 (sigma = 0).
  """
  g = rewards.shape[-1]
  _check_k(k, g, "Pass@k Training advantage (objective.passk_k)")
  r = (rewards > 0.5).astype(jnp.float32)  # rewards are the 0/1 verdict (checked in the config)
  n_neg = g - jnp.sum(r, axis=-1, keepdims=True)
  mean = 1.0 - comb(n_neg, k) / comb(g, k)
  sigma = jnp.sqrt(jnp.maximum(mean * (1.0 - mean), 0.0))
  neg_fail = comb(n_neg - 1, k - 1) / comb(g - 1, k - 1)  # share of a wrong one's subsets all wrong
  adv = jnp.where(r > 0, 1.0 - mean, 1.0 - mean - neg_fail)
  return jnp.where(sigma > 0, adv / (sigma + eps), 0.0)


def _ranks(rewards):
  """Ascending ranks 0..G-1 along the last axis (ties broken by position, stably)."""
  return jnp.argsort(jnp.argsort(rewards, axis=-1, stable=True), axis=-1, stable=True)


def pkpo_weights(rewards, k: int, baseline: bool = True):
  """PKPO's per-sample weights s_i for max@k (pass@k on binary rewards), [..., G] -> [..., G].

  With ranks rk (ascending, 0-based) and n = G:
    s_i = [C(rk_i, k-1) r_i + sum_{j: rk_j > rk_i} C(rk_j - 1, k-2) r_j] / C(n, k)
        = (1 / C(n, k)) sum over k-subsets S holding i of max_{j in S} r_j,
  so sum_i s_i = k rho, rho the unbiased max@k estimate of the group, and
  E[sum_i s_i grad log pi(o_i)] = grad max@k. baseline=True subtracts the k-1
  leave-one-out baseline, (1 / C(n, k)) sum_{S holding i} max_{j in S \\ i} r_j
  = (k / n) rho_{k-1}(the other n - 1 rewards), which does not depend on o_i
  (PKPO's s^(loo-1)); for k = 1 it is 0.
  """
  n = rewards.shape[-1]
  _check_k(k, n, "PKPO (objective.pkpo_k)")
  r = rewards.astype(jnp.float32)
  rk = _ranks(r).astype(jnp.float32)
  rk_i, rk_j = rk[..., :, None], rk[..., None, :]  # [..., i, j]
  above = rk_j > rk_i
  w = jnp.where(above, comb(rk_j - 1, k - 2), 0.0)
  s = (comb(rk, k - 1) * r + jnp.sum(w * r[..., None, :], axis=-1)) / comb(n, k)
  if not baseline or k == 1:
    return s
  # rank of j among the others (i left out): one lower when j ranks above i
  rk_other = rk_j - above.astype(jnp.float32)
  others = 1.0 - jnp.eye(n, dtype=jnp.float32)
  rho_others = jnp.sum(others * comb(rk_other, k - 2) * r[..., None, :], axis=-1) / comb(n - 1, k - 1)
  return s - (k / n) * rho_others


def pkpo_advantages(rewards, k: int):
  """A_i = G s_i^(loo-1): the loss's mean over the group, (1/G) sum_i A_i grad log pi(o_i), is
  then an unbiased estimate of grad pass@k (max@k) itself. At k = 1, A_i = r_i."""
  return rewards.shape[-1] * pkpo_weights(rewards, k, baseline=True)
