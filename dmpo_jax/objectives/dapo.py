"""DAPO's reusable helpers (Yu et al. 2025; METHODS.md, DAPO).

The loss itself is `grpo.policy_loss` with eps_low=0.2, eps_high=0.28 and
agg='token_mean'; here are the soft overlong penalty and the dynamic-sampling
filter.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


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

  Host-side (numpy): the trainer resamples until it has enough kept groups.
  """
  correct = np.asarray(correct, bool)
  n = correct.sum(-1)
  return (n > 0) & (n < correct.shape[-1])
