"""f-divergences for DPH-RL (DPH-RL, arXiv 2509.07430; docs/METHODS.md), registered by name.

A divergence is a convex generator f with f(1) = 0 and
    D_f(P || Q) = sum_y Q(y) f(P(y) / Q(y)),
P the policy, Q the reference. So `forward_kl` is KL(Q || P) (mass-covering),
`reverse_kl` KL(P || Q), `js` the Jensen-Shannon divergence in nats.

Each Divergence gives
  .f(u)                              the generator,
  .between(log_p, log_q)             D_f exactly on categoricals (last axis),
  .sample_loss(logp, logp_ref, mask) DPH-RL's loss on samples y ~ Q stored with
                                     their reference log-probs: token-mean of
                                     f(u), u = pi_theta / pi_ref per token.
Generators are written in terms of log u, which keeps them finite where
u = exp(log u) would under- or overflow. In `sample_loss`, log u is clamped
to +-20 (past that exp(20) ~ 5e8 and a single token would dominate the
batch); the forward-KL (k3) value is also clamped to +-10 as verl does.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp

from dmpo_jax.objectives import common

LOG_U_CLAMP = 20.0


@dataclasses.dataclass(frozen=True)
class Divergence:
  name: str
  f_log: Callable  # f as a function of log u
  value_clamp: float | None = None
  params: tuple = ()

  def f(self, u):
    return self.f_log(jnp.log(u))

  def between(self, log_p, log_q):
    """D_f(P || Q) = sum_y Q f(P/Q) over the last axis, from log-probabilities."""
    return jnp.sum(jnp.exp(log_q) * self.f_log(log_p - log_q), axis=-1)

  def sample_loss(self, logp, logp_ref, mask):
    """Token-mean of f(pi_theta / pi_ref) on stored reference samples (DPH-RL)."""
    log_u = jnp.clip(logp - logp_ref, -LOG_U_CLAMP, LOG_U_CLAMP)
    value = self.f_log(log_u)
    if self.value_clamp is not None:
      value = jnp.clip(value, -self.value_clamp, self.value_clamp)
    return common.aggregate(value, mask, "token_mean")


def _forward_kl(lu):  # u - log u - 1  ->  KL(Q || P)
  return jnp.exp(lu) - lu - 1.0


def _reverse_kl(lu):  # u log u - u + 1  ->  KL(P || Q)
  u = jnp.exp(lu)
  return u * lu - u + 1.0


def _js(lu):  # 1/2 [u log u - (u + 1) log((u + 1) / 2)]  ->  JSD(P, Q)
  u = jnp.exp(lu)
  log_mid = jnp.logaddexp(lu, 0.0) - jnp.log(2.0)  # log((u + 1) / 2), stable
  return 0.5 * (u * lu - (u + 1.0) * log_mid)


def _alpha(alpha):
  def f_log(lu):  # (u^(1-a) - (1-a) u - a) / (a (a - 1))
    return (jnp.exp((1.0 - alpha) * lu) - (1.0 - alpha) * jnp.exp(lu) - alpha) / (
        alpha * (alpha - 1.0))
  return f_log


def _tv(lu):  # |u - 1| / 2  ->  total variation
  return 0.5 * jnp.abs(jnp.exp(lu) - 1.0)


def _hellinger(lu):  # (sqrt u - 1)^2  ->  sum (sqrt P - sqrt Q)^2
  return jnp.square(jnp.exp(0.5 * lu) - 1.0)


def _pearson(lu):  # (u - 1)^2  ->  sum (P - Q)^2 / Q
  return jnp.square(jnp.exp(lu) - 1.0)


def _make_alpha(alpha: float = 0.2) -> Divergence:
  if not 0.0 < alpha < 1.0:
    raise ValueError(f"alpha-divergence needs 0 < alpha < 1, got alpha={alpha} "
                     "(alpha -> 1 is forward_kl, alpha -> 0 is reverse_kl)")
  return Divergence("alpha", _alpha(float(alpha)), params=(("alpha", float(alpha)),))


REGISTRY: dict[str, Callable[..., Divergence]] = {
    "forward_kl": lambda: Divergence("forward_kl", _forward_kl, value_clamp=10.0),
    "reverse_kl": lambda: Divergence("reverse_kl", _reverse_kl),
    "js": lambda: Divergence("js", _js),
    "alpha": _make_alpha,
    "total_variation": lambda: Divergence("total_variation", _tv),
    "hellinger": lambda: Divergence("hellinger", _hellinger),
    "pearson": lambda: Divergence("pearson", _pearson),
}


def names() -> list[str]:
  return sorted(REGISTRY)


def get(name: str, **params) -> Divergence:
  """A divergence by name (`alpha` takes alpha=..., default 0.2)."""
  if name not in REGISTRY:
    raise ValueError(f"unknown divergence {name!r}; choose one of {names()}")
  try:
    return REGISTRY[name](**params)
  except TypeError as e:
    raise ValueError(f"divergence {name!r} does not take parameters {sorted(params)}") from e


def register(name: str, factory: Callable[..., Divergence]) -> None:
  """Add a divergence: `factory(**params) -> Divergence`."""
  if name in REGISTRY:
    raise ValueError(f"divergence {name!r} is already registered")
  REGISTRY[name] = factory
