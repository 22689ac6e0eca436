"""The registered advantage estimators and policy-gradient losses that presets combine.

An advantage estimator is `fn(cfg, rewards [..., G]) -> advantages [..., G]`.
A policy loss is `fn(cfg, x: PolicyInputs) -> (loss, aux)` registered with
what its batch needs beyond the RL samples (`reference`: the reference
policy's log-probs; `log_z`: a learned log Z(x) head in the params) and
whether it is a mean over sequences and groups (`slice_exact`: gradient
accumulation over slices of whole groups then changes nothing). Adding one:

    @POLICY_LOSSES.register("my_loss", slice_exact=True)
    def _my_loss(cfg, x):
      ratio = jnp.exp(x.logprobs - x.old_logprobs)  # [..., G, T]
      return -common.aggregate(ratio * x.advantages[..., None], x.mask), {}

then `--config.rl.objective.policy_loss=my_loss` trains with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

from dmpo_jax.objectives import common, flowrl, grpo
from dmpo_jax.objectives.registry import Registry


@dataclasses.dataclass(frozen=True)
class PolicyInputs:
  """What a policy loss may read; per-token arrays [..., G, T], per-sample [..., G]."""
  logprobs: Any             # under the current params (differentiable)
  old_logprobs: Any         # from the sampler (pi_old)
  mask: Any                 # valid completion tokens
  advantages: Any           # [..., G], no gradient
  rewards: Any              # [..., G] after KL-in-reward shaping
  scores: Any               # [..., G] mean token log-prob (phi), differentiable
  ref_logprobs: Any = None  # reference policy (when the loss declares `reference`)
  log_z: Any = None         # [...] learned log Z(x) (when the loss declares `log_z`)


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
  fn: Callable
  reference: bool = False
  log_z: bool = False
  slice_exact: bool = False


ADVANTAGES = Registry("advantage estimator", "objective.advantage")
POLICY_LOSSES = Registry("policy loss", "objective.policy_loss", make=PolicyLoss)

# Estimators that are undefined on a group of one sample (a std or a leave-one-out).
NEEDS_GROUP = ("grpo", "rloo")


@ADVANTAGES.register("grpo")
def _grpo_advantages(cfg, rewards):
  return grpo.group_advantages(rewards, eps=cfg.adv_eps, unbiased_std=cfg.unbiased_std)


@ADVANTAGES.register("dr_grpo")
def _dr_grpo_advantages(cfg, rewards):
  return grpo.dr_grpo_advantages(rewards)


@ADVANTAGES.register("rloo")
def _rloo_advantages(cfg, rewards):
  return grpo.rloo_advantages(rewards)


@POLICY_LOSSES.register("ppo_clip", slice_exact=True)
def _ppo_clip(cfg, x: PolicyInputs):
  return grpo.policy_loss(x.logprobs, x.old_logprobs, x.mask, x.advantages, eps_low=cfg.eps_low,
                          eps_high=cfg.eps_high, agg=cfg.agg, dual_clip=cfg.dual_clip,
                          norm=cfg.agg_norm)


@POLICY_LOSSES.register("gspo", slice_exact=True)
def _gspo(cfg, x: PolicyInputs):
  return grpo.gspo_loss(x.logprobs, x.old_logprobs, x.mask, x.advantages, eps_low=cfg.eps_low,
                        eps_high=cfg.eps_high)


@POLICY_LOSSES.register("gpg")
def _gpg(cfg, x: PolicyInputs):
  return grpo.gpg_loss(x.logprobs, x.mask, x.rewards)


@POLICY_LOSSES.register("flowrl", reference=True, log_z=True)
def _flowrl(cfg, x: PolicyInputs):
  return flowrl.flowrl_loss(x.scores, common.sequence_scores(x.ref_logprobs, x.mask),
                            common.sequence_scores(x.old_logprobs, x.mask), x.rewards,
                            x.log_z, beta=cfg.flowrl_beta)


@POLICY_LOSSES.register("none", slice_exact=True)
def _none(cfg, x: PolicyInputs):
  """No policy-gradient term: only the other terms (DMPO's L_DM, a divergence) train."""
  return jnp.zeros((), jnp.float32), {}
