"""The registered advantage estimators and policy-gradient losses that presets combine.

An advantage estimator is `fn(cfg, rewards [..., G]) -> advantages [..., G]`; one registered
with `needs=(batch keys)` is called `fn(cfg, rewards, batch)` and gets those keys in the
batch (`presets.batch_needs`: the trainer then supplies them, e.g. "rl_step").
A policy loss is `fn(cfg, x: PolicyInputs) -> (loss, aux)` registered with
what its batch needs beyond the RL samples (`reference`: the reference
policy's log-probs; `log_z`: a learned log Z(x) head in the params; `needs`:
other batch keys, read from `x.batch`, e.g. "key", one PRNG key per prompt) and
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

import jax
import jax.numpy as jnp

from dmpo_jax.objectives import common, covariance, flowrl, grpo, passk
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
  batch: Any = None         # the batch dict (keys the loss declares in `needs`)


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
  fn: Callable
  reference: bool = False
  log_z: bool = False
  slice_exact: bool = False
  needs: tuple = ()


def _advantage(fn, needs: tuple = ()):
  fn.needs = tuple(needs)
  return fn


ADVANTAGES = Registry("advantage estimator", "objective.advantage", make=_advantage)
POLICY_LOSSES = Registry("policy loss", "objective.policy_loss", make=PolicyLoss)

# Estimators that are undefined on a group of one sample (a std or a leave-one-out, a subset).
NEEDS_GROUP = ("grpo", "rloo", "passk", "pkpo")
# Estimators defined on 0/1 rewards only: they need objective.reward="correct".
BINARY = ("passk", "pkpo", "psr_nsr")


@ADVANTAGES.register("grpo")
def _grpo_advantages(cfg, rewards):
  return grpo.group_advantages(rewards, eps=cfg.adv_eps, unbiased_std=cfg.unbiased_std)


@ADVANTAGES.register("dr_grpo")
def _dr_grpo_advantages(cfg, rewards):
  return grpo.dr_grpo_advantages(rewards)


@ADVANTAGES.register("rloo")
def _rloo_advantages(cfg, rewards):
  return grpo.rloo_advantages(rewards)


@ADVANTAGES.register("passk")
def _passk_advantages(cfg, rewards):
  return passk.passk_advantages(rewards, cfg.passk_k, eps=cfg.adv_eps)


@ADVANTAGES.register("pkpo", needs=("rl_step",))
def _pkpo_advantages(cfg, rewards, batch):
  """PKPO at k = pkpo_k; with pkpo_anneal_step > 0, k = 1 from that RL step on (the paper's
  annealing: pass@k first, then pass@1), per prompt from batch["rl_step"] [...]."""
  adv = passk.pkpo_advantages(rewards, cfg.pkpo_k)
  if not cfg.pkpo_anneal_step:
    return adv
  late = (batch["rl_step"] >= cfg.pkpo_anneal_step)[..., None]
  return jnp.where(late, passk.pkpo_advantages(rewards, 1), adv)


@ADVANTAGES.register("psr_nsr")
def _psr_nsr_advantages(cfg, rewards):
  """W-REINFORCE (Zhu et al., arXiv 2506.01347): A = psr_weight for a correct sample, -1 for a
  wrong one, no baseline; psr_weight = 0 is negative-sample reinforcement (NSR) alone."""
  r = rewards.astype(jnp.float32)
  return cfg.psr_weight * r - (1.0 - r)


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


@POLICY_LOSSES.register("kl_cov")
def _kl_cov(cfg, x: PolicyInputs):
  return covariance.kl_cov_loss(x.logprobs, x.old_logprobs, x.mask, x.advantages,
                                frac=cfg.kl_cov_frac, coef=cfg.kl_cov_coef)


@POLICY_LOSSES.register("clip_cov", needs=("key",))
def _clip_cov(cfg, x: PolicyInputs):
  # one key for the batch: the first prompt's (each micro-batch slice has its own first prompt)
  data = x.batch["key"]
  key = jax.random.wrap_key_data(data.reshape((-1,) + data.shape[-1:])[0])
  return covariance.clip_cov_loss(x.logprobs, x.old_logprobs, x.mask, x.advantages, key,
                                  frac=cfg.clip_cov_frac, lb=cfg.clip_cov_lb, ub=cfg.clip_cov_ub,
                                  eps_low=cfg.eps_low, eps_high=cfg.eps_high)


@POLICY_LOSSES.register("none", slice_exact=True)
def _none(cfg, x: PolicyInputs):
  """No policy-gradient term: only the other terms (DMPO's L_DM, a divergence) train."""
  return jnp.zeros((), jnp.float32), {}
