"""KL-Cov and Clip-Cov: entropy control through the covariance of log-prob and advantage.

From Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models" (arXiv 2505.22617; docs/METHODS.md, covariance terms). Per
valid token of the batch,
    cov_{i,t} = (l_{i,t} - mean l) (A_i - mean A),
means over all valid tokens of the batch. Tokens with a large positive term
are the ones whose update lowers entropy most.

- KL-Cov: the `kl_cov_frac` share of valid tokens with the largest cov get
  |l - l_old| * kl_cov_coef added to their policy-gradient loss (no ratio clip).
- Clip-Cov: among tokens with clip_cov_lb < cov < clip_cov_ub (and not already
  clipped by PPO), a random `clip_cov_frac` share of the valid tokens (at least
  one) get no gradient.

Both aggregate by token mean (the authors' setting). The selection is a
global ranking of the batch, so these losses are not exact under gradient
accumulation over slices (slice_exact is False).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dmpo_jax.objectives import common


def token_covariance(logprobs, advantages, mask):
  """cov [..., G, T] of (l - mean l)(A - mean A) over the valid tokens; 0 elsewhere."""
  m = mask.astype(jnp.float32)
  a = jnp.broadcast_to(advantages[..., None], logprobs.shape)
  l = jax.lax.stop_gradient(logprobs)
  cov = (l - common.masked_mean(l, m)) * (a - common.masked_mean(a, m))
  return cov * m


def _count(frac, mask):
  """max(1, floor(frac * #valid tokens)) as float32."""
  return jnp.maximum(1.0, jnp.floor(frac * jnp.sum(mask.astype(jnp.float32))))


def _lowest_ranks(score, eligible, n):
  """The n eligible entries with the smallest score (ties by position) -> bool mask."""
  flat = jnp.where(eligible, score, jnp.inf).reshape(-1)
  rank = jnp.argsort(jnp.argsort(flat, stable=True), stable=True).reshape(score.shape)
  return eligible & (rank < n)


def kl_cov_loss(logprobs, old_logprobs, mask, advantages, *, frac: float, coef: float = 1.0):
  """KL-Cov. Returns (loss, aux) with aux["cov_frac"] the share of valid tokens penalised."""
  m = mask.astype(jnp.float32) > 0
  cov = token_covariance(logprobs, advantages, mask)
  chosen = _lowest_ranks(-cov, m, _count(frac, mask))
  log_ratio = logprobs - jax.lax.stop_gradient(old_logprobs)
  pg = -advantages[..., None] * jnp.exp(log_ratio)
  per_token = pg + jnp.where(chosen, coef * jnp.abs(log_ratio), 0.0)
  loss = common.aggregate(per_token, mask, "token_mean")
  return loss, {"cov_frac": common.masked_mean(chosen.astype(jnp.float32), mask),
                "cov_mean": common.masked_mean(cov, mask)}


def clip_cov_loss(logprobs, old_logprobs, mask, advantages, key, *, frac: float,
                  lb: float = 1.0, ub: float = 5.0, eps_low: float = 0.2, eps_high: float = 0.2):
  """Clip-Cov with the PPO-clip surrogate; key: one PRNG key (the random choice of tokens)."""
  m = mask.astype(jnp.float32) > 0
  adv = advantages[..., None]
  ratio = jnp.exp(logprobs - jax.lax.stop_gradient(old_logprobs))
  loss1 = -adv * ratio
  loss2 = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  clipped = (loss2 > loss1) & m
  cov = token_covariance(logprobs, advantages, mask)
  band = m & ~clipped & (cov > lb) & (cov < ub)
  chosen = _lowest_ranks(jax.random.uniform(key, cov.shape), band, _count(frac, mask))
  per_token = jnp.where(chosen, 0.0, jnp.maximum(loss1, loss2))
  loss = common.aggregate(per_token, mask, "token_mean")
  return loss, {"cov_frac": common.masked_mean(chosen.astype(jnp.float32), mask),
                "cov_mean": common.masked_mean(cov, mask),
                "clip_frac": common.masked_mean(clipped.astype(jnp.float32), mask)}
