"""Per-token KL estimators to a reference policy (Schulman's k1, k2, k3; docs/METHODS.md).

With l = log pi_theta, l_ref = log pi_ref on tokens sampled from pi_theta:
k1 = l - l_ref, k2 = (l - l_ref)^2 / 2, k3 = exp(l_ref - l) - (l_ref - l) - 1.
k3 clamps the log-ratio to +-20 (exp overflows past ~88 in float32, and
beyond 20 the estimate is noise anyway) and the value to +-10, as verl's
low_var_kl.
"""

from __future__ import annotations

import jax.numpy as jnp

from dmpo_jax.objectives import common

LOG_RATIO_CLAMP = 20.0
VALUE_CLAMP = 10.0


def k1(logprobs, ref_logprobs):
  return logprobs - ref_logprobs


def k2(logprobs, ref_logprobs):
  return 0.5 * jnp.square(logprobs - ref_logprobs)


def k3(logprobs, ref_logprobs):
  log_ratio = jnp.clip(ref_logprobs - logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -VALUE_CLAMP, VALUE_CLAMP)


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}  # the registry: add an estimator here


def get(name: str):
  """The estimator `fn(logprobs, ref_logprobs) -> [..., T]` named `name`."""
  if name not in ESTIMATORS:
    raise ValueError(f"unknown KL estimator objective.kl_estimator={name!r}; "
                     f"choose one of {sorted(ESTIMATORS)}")
  return ESTIMATORS[name]


def kl_metrics(logprobs, ref_logprobs, mask):
  """All three estimators, token-mean over valid tokens (logged whichever is used)."""
  return {f"kl_{n}": common.masked_mean(f(logprobs, ref_logprobs), mask)
          for n, f in ESTIMATORS.items()}
