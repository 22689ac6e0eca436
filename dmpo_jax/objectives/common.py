"""Pieces every objective shares: token log-probs, entropy, sequence scores, aggregation.

Shapes: per-token arrays are [..., G, T] with a 0/1 mask of the same shape
(1 on valid completion tokens: not padding, not after EOS); per-sequence
arrays are [..., G]. All functions are jit-able and differentiable.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


def token_logprobs(logits, tokens, *, temperature: float = 1.0, chunk: int | None = None):
  """log softmax(logits / temperature)[token] as gather minus logsumexp, float32.

  logits [..., T, V], tokens [..., T] -> [..., T]. Never materialises a float32
  [..., T, V] log-softmax; with `chunk`, the logsumexp runs over T in chunks
  under `jax.checkpoint`, so the backward pass keeps one chunk's float32
  logits alive at a time.
  """
  def piece(lg, tok):
    lg = lg.astype(jnp.float32) / temperature
    picked = jnp.take_along_axis(lg, tok[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(lg, axis=-1)

  t = logits.shape[-2]
  if chunk is None or chunk >= t:
    return piece(logits, tokens)
  if t % chunk:
    raise ValueError(f"chunk ({chunk}) must divide the sequence length T ({t})")
  lg = jnp.moveaxis(logits.reshape(*logits.shape[:-2], t // chunk, chunk, logits.shape[-1]),
                    -3, 0)
  tk = jnp.moveaxis(tokens.reshape(*tokens.shape[:-1], t // chunk, chunk), -2, 0)
  out = jax.lax.map(lambda a: jax.checkpoint(piece)(*a), (lg, tk))  # [T/c, ..., c]
  return jnp.moveaxis(out, 0, -2).reshape(tokens.shape)


def token_entropy(logits, *, temperature: float = 1.0):
  """Entropy of softmax(logits / temperature) per position: [..., T, V] -> [..., T]."""
  lg = logits.astype(jnp.float32) / temperature
  logp = jax.nn.log_softmax(lg, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def sequence_scores(token_logprobs, mask):
  """phi_i = mean log-prob over the valid tokens of o_i: [..., G, T] -> [..., G].

  A sequence with no valid token scores 0 (documented and tested; no NaN).
  """
  m = mask.astype(jnp.float32)
  return jnp.sum(token_logprobs * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def aggregate(values, mask, mode: str = "seq_mean_token_mean", *, norm: float | None = None):
  """Reduce per-token values [..., G, T] to a scalar (docs/METHODS.md, policy losses).

  seq_mean_token_mean: mean over each sequence's valid tokens, then over sequences.
  token_mean: sum over all valid tokens / their number (DAPO).
  seq_mean_token_sum_norm: sum over each sequence's tokens / `norm` (default T),
    then mean over sequences (Dr. GRPO).
  Empty sequences contribute 0 (they count in the sequence mean).
  """
  m = mask.astype(jnp.float32)
  v = values * m
  if mode == "seq_mean_token_mean":
    return jnp.mean(jnp.sum(v, -1) / jnp.maximum(jnp.sum(m, -1), 1.0))
  if mode == "token_mean":
    return jnp.sum(v) / jnp.maximum(jnp.sum(m), 1.0)
  if mode == "seq_mean_token_sum_norm":
    return jnp.mean(jnp.sum(v, -1) / (values.shape[-1] if norm is None else norm))
  raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}")


def masked_mean(values, mask):
  m = mask.astype(jnp.float32)
  return jnp.sum(values * m) / jnp.maximum(jnp.sum(m), 1.0)
