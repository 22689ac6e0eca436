"""The registered advantage estimators and policy-gradient losses that presets combine.

Each term declares its settings (a `settings.section` dataclass: its fields, defaults and
checks) and what it needs from the trainer (`needs.Needs`, from its registration):

An advantage estimator is `fn(cfg, rewards [..., G]) -> advantages [..., G]`; one registered
with `needs=(batch keys)` is called `fn(cfg, rewards, batch)` and gets those keys in the
batch (the trainer supplies them, e.g. "rl_step"). `binary=True`: defined on 0/1 rewards
(objective.reward must be "correct"); `min_group`: undefined on smaller groups; `k_field`:
a setting k that must not exceed the group size.
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

then `--config.rl.objective.policy_loss=my_loss` trains with it. `cfg` reads as the flat
objective fields (`cfg.eps_low`); a term with settings of its own registers a section and
names it (`config=`). Regularisers (KL, DM, divergences) are in regularisers.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from dmpo_jax.objectives import common, covariance, flowrl, grpo, passk, settings
from dmpo_jax.objectives.needs import Needs
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
class Advantage:
  fn: Callable
  needs: tuple = ()                # batch keys: then called fn(cfg, rewards, batch)
  binary: bool = False             # defined on 0/1 rewards only
  min_group: int = 1               # undefined on a smaller group (a std, a leave-one-out)
  k_field: str | None = None       # a setting k <= G (Pass@k's, PKPO's k)
  config: type | None = None       # its own settings section

  def __call__(self, cfg, rewards, batch=None):
    return self.fn(cfg, rewards, batch) if self.needs else self.fn(cfg, rewards)

  def declared(self, cfg) -> Needs:
    groups = []
    if self.min_group > 1:
      groups.append((self.min_group, f"{cfg.advantage} advantages need a group of at least "
                     f"{self.min_group} (a std or leave-one-out over one sample is undefined)"))
    if self.k_field is not None:
      k = getattr(cfg, self.k_field)
      groups.append((k, f"objective.{self.k_field}={k} exceeds the group size ({cfg.advantage} "
                     "needs k <= G)"))
    return Needs(batch=tuple(self.needs), min_group=tuple(groups))


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
  fn: Callable
  reference: bool = False
  log_z: bool = False
  slice_exact: bool = False
  needs: tuple = ()
  config: type | None = None       # its own settings section

  def declared(self, cfg) -> Needs:
    # A global token mean (agg="token_mean") is not a mean over groups, whatever the loss.
    return Needs(batch=tuple(self.needs), reference=self.reference, log_z=self.log_z,
                 slice_exact=self.slice_exact and cfg.agg != "token_mean")


ADVANTAGES = Registry("advantage estimator", "objective.advantage", make=Advantage)
POLICY_LOSSES = Registry("policy loss", "objective.policy_loss", make=PolicyLoss)


# ------------------------------------------------------------------ settings sections

@settings.section("advantage")
@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  advantage: str = "grpo"  # ADVANTAGES: grpo | dr_grpo | rloo | passk | pkpo | psr_nsr
  unbiased_std: bool = False  # GRPO std over G - 1 (verl) instead of G
  adv_eps: float = 1e-6

  def __post_init__(self):
    ADVANTAGES.get(self.advantage)  # unknown names list the choices


@settings.section("policy")
@dataclasses.dataclass(frozen=True)
class PolicyConfig:
  policy_loss: str = "ppo_clip"  # POLICY_LOSSES: ppo_clip | gspo | gpg | flowrl | ... | none
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None
  agg: str = "seq_mean_token_mean"  # common.AGGREGATIONS
  agg_norm: float | None = None  # seq_mean_token_sum_norm constant (default T)

  def __post_init__(self):
    POLICY_LOSSES.get(self.policy_loss)
    settings.one_of(self, "agg", common.AGGREGATIONS)


@settings.section("flowrl")
@dataclasses.dataclass(frozen=True)
class FlowRLConfig:
  flowrl_beta: float = 15.0  # reward scale of FlowRL's trajectory balance


@settings.section("passk")
@dataclasses.dataclass(frozen=True)
class PasskConfig:
  passk_k: int = 4  # Pass@k Training's k

  def __post_init__(self):
    settings.positive_int(self, "passk_k")


@settings.section("pkpo")
@dataclasses.dataclass(frozen=True)
class PkpoConfig:
  pkpo_k: int = 4  # PKPO's k
  pkpo_anneal_step: int = 0  # k = 1 from this RL step on (0: never)

  def __post_init__(self):
    settings.positive_int(self, "pkpo_k")
    settings.at_least(self, 0, "pkpo_anneal_step")


@settings.section("psr")
@dataclasses.dataclass(frozen=True)
class PsrConfig:
  psr_weight: float = 0.1  # W-REINFORCE's lambda on correct samples (0: NSR)

  def __post_init__(self):
    settings.at_least(self, 0, "psr_weight")


@settings.section("kl_cov")
@dataclasses.dataclass(frozen=True)
class KLCovConfig:
  kl_cov_frac: float = 0.02  # share of valid tokens penalised
  kl_cov_coef: float = 1.0

  def __post_init__(self):
    settings.share(self, "kl_cov_frac")
    settings.at_least(self, 0, "kl_cov_coef")


@settings.section("clip_cov")
@dataclasses.dataclass(frozen=True)
class ClipCovConfig:
  clip_cov_frac: float = 0.02  # share of valid tokens detached
  clip_cov_lb: float = 1.0
  clip_cov_ub: float = 5.0

  def __post_init__(self):
    settings.share(self, "clip_cov_frac")
    if not self.clip_cov_lb < self.clip_cov_ub:
      raise ValueError(f"objective.clip_cov_lb={self.clip_cov_lb} must be < "
                       f"clip_cov_ub={self.clip_cov_ub}")


# ------------------------------------------------------------------ advantage estimators

@ADVANTAGES.register("grpo", min_group=2)
def _grpo_advantages(cfg, rewards):
  return grpo.group_advantages(rewards, eps=cfg.adv_eps, unbiased_std=cfg.unbiased_std)


@ADVANTAGES.register("dr_grpo")
def _dr_grpo_advantages(cfg, rewards):
  return grpo.dr_grpo_advantages(rewards)


@ADVANTAGES.register("rloo", min_group=2)
def _rloo_advantages(cfg, rewards):
  return grpo.rloo_advantages(rewards)


@ADVANTAGES.register("passk", binary=True, min_group=2, k_field="passk_k",
                       config=PasskConfig)
def _passk_advantages(cfg, rewards):
  return passk.passk_advantages(rewards, cfg.passk_k, eps=cfg.adv_eps)


@ADVANTAGES.register("pkpo", needs=("rl_step",), binary=True, min_group=2, k_field="pkpo_k",
                       config=PkpoConfig)
def _pkpo_advantages(cfg, rewards, batch):
  """PKPO at k = pkpo_k; with pkpo_anneal_step > 0, k = 1 from that RL step on (the paper's
  annealing: pass@k first, then pass@1), per prompt from batch["rl_step"] [...]."""
  adv = passk.pkpo_advantages(rewards, cfg.pkpo_k)
  if not cfg.pkpo_anneal_step:
    return adv
  late = (batch["rl_step"] >= cfg.pkpo_anneal_step)[..., None]
  return jnp.where(late, passk.pkpo_advantages(rewards, 1), adv)


@ADVANTAGES.register("psr_nsr", binary=True, config=PsrConfig)
def _psr_nsr_advantages(cfg, rewards):
  """W-REINFORCE (Zhu et al., arXiv 2506.01347): A = psr_weight for a correct sample, -1 for a
  wrong one, no baseline; psr_weight = 0 is negative-sample reinforcement (NSR) alone."""
  r = rewards.astype(jnp.float32)
  return cfg.psr_weight * r - (1.0 - r)


# ------------------------------------------------------------------ policy losses

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


@POLICY_LOSSES.register("flowrl", reference=True, log_z=True, config=FlowRLConfig)
def _flowrl(cfg, x: PolicyInputs):
  return flowrl.flowrl_loss(x.scores, common.sequence_scores(x.ref_logprobs, x.mask),
                            common.sequence_scores(x.old_logprobs, x.mask), x.rewards,
                            x.log_z, beta=cfg.flowrl_beta)


@POLICY_LOSSES.register("kl_cov", config=KLCovConfig)
def _kl_cov(cfg, x: PolicyInputs):
  return covariance.kl_cov_loss(x.logprobs, x.old_logprobs, x.mask, x.advantages,
                                frac=cfg.kl_cov_frac, coef=cfg.kl_cov_coef)


@POLICY_LOSSES.register("clip_cov", needs=("key",), config=ClipCovConfig)
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
