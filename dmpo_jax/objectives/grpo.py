"""Advantages and policy-gradient losses of the GRPO family (docs/METHODS.md, policy losses).

All losses are to be minimised and return (loss, aux) with aux a dict of
scalars. Rewards and advantages are [..., G]; per-token arrays [..., G, T].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dmpo_jax.objectives import common


def _check_group(rewards, name: str):
  if rewards.shape[-1] < 2:
    raise ValueError(f"{name} needs a group of G >= 2 samples per prompt; rewards have "
                     f"shape {rewards.shape} (G = {rewards.shape[-1]})")


def group_advantages(rewards, *, std_normalize: bool = True, eps: float = 1e-6,
                     unbiased_std: bool = False):
  """GRPO (Shao et al. 2024): A_i = (r_i - mean r) / (std r + eps); Dr. GRPO without std.

  `unbiased_std` uses the (G - 1) estimate (as verl); default population std.
  A group whose rewards are all equal gets A = 0.
  """
  rewards = rewards.astype(jnp.float32)
  centred = rewards - jnp.mean(rewards, axis=-1, keepdims=True)
  if not std_normalize:
    return centred
  _check_group(rewards, "std-normalised advantages")
  std = jnp.std(rewards, axis=-1, keepdims=True, ddof=1 if unbiased_std else 0)
  return centred / (std + eps)


def dr_grpo_advantages(rewards):
  """Dr. GRPO (Liu et al. 2025): A_i = r_i - mean(r)."""
  return group_advantages(rewards, std_normalize=False)


def rloo_advantages(rewards):
  """RLOO (Ahmadian et al. 2024): A_i = r_i - mean of the other G - 1 rewards."""
  _check_group(rewards, "RLOO")
  g = rewards.shape[-1]
  total = jnp.sum(rewards, axis=-1, keepdims=True)
  return rewards - (total - rewards) / (g - 1)


def gpg_scale(rewards):
  """GPG (Chu et al. 2025): B / (B - M), M = samples in groups whose rewards are all equal.

  Rescales the batch so that groups carrying no signal do not dilute the gradient.
  """
  flat = rewards.reshape(-1, rewards.shape[-1])
  b = flat.size
  degenerate = jnp.all(flat == flat[:, :1], axis=-1)
  m = jnp.sum(degenerate) * flat.shape[-1]
  return b / jnp.maximum(b - m, 1)


def policy_loss(logprobs, old_logprobs, mask, advantages, *, eps_low: float = 0.2,
                eps_high: float = 0.2, agg: str = "seq_mean_token_mean",
                dual_clip: float | None = None, norm: float | None = None):
  """PPO-clip surrogate as used by GRPO/DAPO (docs/METHODS.md).

  s = min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) per token; with
  dual_clip c (> 1) tokens with A < 0 are further bounded below by c A.
  loss = -agg(s). aux: clip_frac (tokens where the clipped term is the one
  taken), ratio statistics, dual-clip fraction.
  """
  adv = advantages[..., None].astype(jnp.float32)
  log_ratio = logprobs - jax.lax.stop_gradient(old_logprobs)
  ratio = jnp.exp(log_ratio)
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
  surrogate = jnp.minimum(unclipped, clipped)
  is_clipped = clipped < unclipped
  aux = {}
  if dual_clip is not None:
    if dual_clip <= 1.0:
      raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    lower = dual_clip * adv
    dual = (adv < 0) & (surrogate < lower)
    surrogate = jnp.where(adv < 0, jnp.maximum(surrogate, lower), surrogate)
    aux["dual_clip_frac"] = common.masked_mean(dual.astype(jnp.float32), mask)
  loss = -common.aggregate(surrogate, mask, agg, norm=norm)
  aux["clip_frac"] = common.masked_mean(is_clipped.astype(jnp.float32), mask)
  aux["ratio_mean"] = common.masked_mean(ratio, mask)
  aux["approx_kl_old"] = common.masked_mean(-log_ratio, mask)
  return loss, aux


def gspo_loss(logprobs, old_logprobs, mask, advantages, *, eps_low: float = 3e-4,
              eps_high: float = 4e-4):
  """GSPO (Zheng et al. 2025): sequence ratio s_i = exp(mean_t (l - l_old)), clipped.

  loss = -(1/G) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i),
  averaged over groups.
  """
  log_s = common.sequence_scores(logprobs - jax.lax.stop_gradient(old_logprobs), mask)
  s = jnp.exp(log_s)
  adv = advantages.astype(jnp.float32)
  unclipped = s * adv
  clipped = jnp.clip(s, 1.0 - eps_low, 1.0 + eps_high) * adv
  loss = -jnp.mean(jnp.minimum(unclipped, clipped))
  return loss, {"clip_frac": jnp.mean((clipped < unclipped).astype(jnp.float32)),
                "ratio_mean": jnp.mean(s)}


def gpg_loss(logprobs, mask, rewards, *, std_normalize: bool = False):
  """GPG (Chu et al. 2025): -token_mean(A_i l_{i,t}) with A scaled by B / (B - M).

  No ratio, no clip, no reference. A is the group-centred reward (optionally
  std-normalised).
  """
  adv = group_advantages(rewards, std_normalize=std_normalize) * gpg_scale(rewards)
  loss = -common.aggregate(jax.lax.stop_gradient(adv)[..., None] * logprobs, mask, "token_mean")
  return loss, {"gpg_scale": gpg_scale(rewards)}
