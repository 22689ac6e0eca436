"""FlowRL's trajectory-balance objective (Zhu et al. 2025; METHODS.md, FlowRL).

loss = mean_i w_i (log Z(x) + phi_i - beta r_hat_i - phi_ref_i)^2
with phi the mean token log-prob under the policy, phi_ref under the
reference, r_hat the group z-scored reward, beta = 15, w_i a stop-gradient
sequence importance weight exp(phi_i - phi_old_i) clipped to [1 - eps, 1 + eps],
and log Z(x) a learned scalar per prompt (a small head on the prompt's
representation, supplied by the caller as `log_z` [...]).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dmpo_jax.objectives import grpo


def flowrl_loss(phi, phi_ref, phi_old, rewards, log_z, *, beta: float = 15.0,
                clip_eps: float = 0.2):
  """phi, phi_ref, phi_old, rewards: [..., G]; log_z: [...]. Returns (loss, aux)."""
  r_hat = grpo.group_advantages(rewards)
  w = jax.lax.stop_gradient(jnp.clip(jnp.exp(phi - phi_old), 1 - clip_eps, 1 + clip_eps))
  residual = log_z[..., None] + phi - beta * r_hat - phi_ref
  loss = jnp.mean(w * jnp.square(residual))
  return loss, {"tb_residual_abs": jnp.mean(jnp.abs(residual)), "log_z": jnp.mean(log_z)}
