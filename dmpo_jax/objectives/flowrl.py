"""FlowRL's trajectory-balance objective (Zhu et al. 2025; docs/METHODS.md, FlowRL).

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


def init_log_z_head(key, hidden_size: int, hidden: int = 64):
  """Params of the log Z(x) head: a 2-layer MLP on the prompt's mean hidden state."""
  k1, _ = jax.random.split(key)
  return {"w1": jax.random.normal(k1, (hidden_size, hidden)) * hidden_size ** -0.5,
          "b1": jnp.zeros((hidden,)), "w2": jnp.zeros((hidden, 1)), "b2": jnp.zeros((1,))}


def log_z_head(head, prompt_hidden, prompt_mask):
  """log Z(x) from the prompt's hidden states [..., P, D] (mean over valid tokens) -> [...].

  The hidden states are detached: the head learns log Z, it does not steer the policy.
  """
  h = jax.lax.stop_gradient(prompt_hidden).astype(jnp.float32)
  m = prompt_mask.astype(jnp.float32)[..., None]
  pooled = jnp.sum(h * m, axis=-2) / jnp.maximum(jnp.sum(m, axis=-2), 1.0)
  return (jax.nn.gelu(pooled @ head["w1"] + head["b1"]) @ head["w2"] + head["b2"])[..., 0]
