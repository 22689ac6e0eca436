"""The registered regularisers that `build_loss` adds to the policy-gradient term, in order.

A regulariser is `fn(s, x: RegInputs) -> (value or None, metrics)` with `s` its own
settings (a `settings.section` dataclass: its fields, defaults and checks) and `value` the
term as it enters the loss (its coefficient applied; None: nothing to add this time). It is
registered with its settings class, what it needs from the trainer (`needs(s) -> Needs`) and,
optionally, a reward hook `rewards(s, rewards, batch) -> rewards` applied before the
advantages. `build_loss` sums the registered regularisers in registration order: KL, DM,
divergence, then any registered later. A new one is one decorated function and its section:

    @settings.section("my_term")
    @dataclasses.dataclass(frozen=True)
    class MyConfig:
      my_coef: float = 0.0

    @REGULARISERS.register("my_term", config=MyConfig,
                           needs=lambda s: Needs(batch=("answer",) if s.my_coef else ()))
    def _my_term(s, x):
      if s.my_coef == 0:
        return None, {}
      v = ...  # from x.scores, x.batch["answer"], ...
      return s.my_coef * v, {"my_term": v}

then `--config.rl.objective.my_coef=0.1` (or a preset naming {"my_term": {"my_coef": 0.1}})
trains with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from dmpo_jax.objectives import common, divergences, dmpo, kl, settings, shaping
from dmpo_jax.objectives.needs import Needs
from dmpo_jax.objectives.registry import Registry


@dataclasses.dataclass(frozen=True)
class RegInputs:
  """What a regulariser may read; per-token arrays [..., G, T], per-sample [..., G]."""
  logprobs: Any             # under the current params (differentiable)
  old_logprobs: Any         # from the sampler (pi_old)
  mask: Any                 # valid completion tokens
  scores: Any               # [..., G] mean token log-prob (phi), differentiable
  rewards: Any              # [..., G] after shaping (what the advantages see)
  ref_logprobs: Any         # reference policy, or None (declare `reference`)
  batch: Any                # the batch dict (keys declared in `batch`, "dph_*" with `dph_store`)
  params: Any               # for a term that runs the policy on other sequences ...
  logprob_fn: Callable      # ... logprob_fn(params, seqs) (DPH-RL's stored samples)


def no_needs(s) -> Needs:
  return Needs()


@dataclasses.dataclass(frozen=True)
class Regulariser:
  fn: Callable
  config: type                    # its settings section
  needs: Callable = no_needs      # needs(s) -> Needs
  rewards: Callable | None = None  # rewards(s, rewards, batch) -> rewards, before the advantages

  def __post_init__(self):
    if self.config not in settings.SECTIONS.values():
      raise ValueError(f"regulariser {self.fn.__name__}: its config {self.config.__name__} is not "
                       "a registered settings section (decorate it with settings.section(name))")


REGULARISERS = Registry("regulariser", make=Regulariser)


# ------------------------------------------------------------------ KL to a reference

@settings.section("kl")
@dataclasses.dataclass(frozen=True)
class KLConfig:
  kl_coef: float = 0.0  # reverse-KL penalty to a reference on RL samples
  kl_estimator: str = "k3"  # kl.ESTIMATORS: k1 | k2 | k3
  kl_in_reward: bool = False  # subtract kl_coef * sum k1 from rewards instead

  def __post_init__(self):
    kl.get(self.kl_estimator)  # unknown names list the choices
    settings.at_least(self, 0, "kl_coef")


def kl_needs(s: KLConfig) -> Needs:
  on = s.kl_coef > 0
  return Needs(reference=on, slice_exact=not (on and not s.kl_in_reward))  # a token mean


def kl_in_reward(s: KLConfig, rewards, batch):
  """With kl_in_reward: r - kl_coef * sum_t k1 (the sampled sequence's log-ratio)."""
  ref = batch.get("ref_logprobs")
  if ref is None or not (s.kl_in_reward and s.kl_coef > 0):
    return rewards
  return shaping.kl_in_reward(rewards, batch["old_logprobs"], ref, batch["mask"], s.kl_coef)


@REGULARISERS.register("kl", config=KLConfig, needs=kl_needs, rewards=kl_in_reward)
def _kl(s: KLConfig, x: RegInputs):
  """kl_coef x the estimator's token mean; the three estimators are logged whenever the batch
  has a reference (FlowRL's too)."""
  if x.ref_logprobs is None:
    return None, {}
  metrics = kl.kl_metrics(x.logprobs, x.ref_logprobs, x.mask)
  if not (s.kl_coef > 0 and not s.kl_in_reward):
    return None, metrics
  term = common.masked_mean(kl.get(s.kl_estimator)(x.logprobs, x.ref_logprobs), x.mask)
  return s.kl_coef * term, metrics


# ------------------------------------------------------------------ DMPO's distribution matching

@settings.section("dm")
@dataclasses.dataclass(frozen=True)
class DMConfig:
  dm_coef: float = 0.0  # DMPO lambda
  dm_alpha: float = 1.0  # DMPO Boltzmann temperature

  def __post_init__(self):
    settings.at_least(self, 0, "dm_coef")
    if not self.dm_alpha > 0:
      raise ValueError(f"objective.dm_alpha must be > 0, got {self.dm_alpha}")


def dm_needs(s: DMConfig) -> Needs:
  return Needs(min_group=((2, "DMPO's group distribution needs G >= 2"),) if s.dm_coef > 0 else ())


@REGULARISERS.register("dm", config=DMConfig, needs=dm_needs)
def _dm(s: DMConfig, x: RegInputs):
  """dm_coef x L_DM; L_DM and the p-q diagnostics are logged for every objective."""
  dm = dmpo.dm_loss(x.scores, x.rewards, s.dm_alpha)
  metrics = {"dm_loss": dm, **dmpo.dm_metrics(x.scores, x.rewards, s.dm_alpha)}
  return (s.dm_coef * dm if s.dm_coef > 0 else None), metrics


# ------------------------------------------------------------------ DPH-RL's f-divergence

@settings.section("divergence")
@dataclasses.dataclass(frozen=True)
class DivergenceConfig:
  divergence: str | None = None  # DPH-RL f-divergence on stored reference samples
  div_coef: float = 0.0  # DPH-RL eta
  div_alpha: float = 0.2  # alpha of the alpha-divergence

  def __post_init__(self):
    settings.at_least(self, 0, "div_coef")
    if self.divergence is not None:
      self.make()  # validates the name and its parameters

  def make(self) -> divergences.Divergence:
    params = {"alpha": self.div_alpha} if self.divergence == "alpha" else {}
    return divergences.get(self.divergence, **params)


def divergence_needs(s: DivergenceConfig) -> Needs:
  # The stored samples' token mean is not a mean over the RL groups.
  return Needs(dph_store=True, slice_exact=False) if s.divergence is not None else Needs()


@REGULARISERS.register("divergence", config=DivergenceConfig, needs=divergence_needs)
def _divergence(s: DivergenceConfig, x: RegInputs):
  """div_coef x D_f on the stored D_pef samples (batch["dph_*"], when the step has them)."""
  if s.divergence is None or "dph_seqs" not in x.batch:
    return None, {}
  dph_logp = x.logprob_fn(x.params, x.batch["dph_seqs"])["logprobs"]
  d = s.make().sample_loss(dph_logp, x.batch["dph_ref_logprobs"], x.batch["dph_mask"])
  return s.div_coef * d, {"divergence": d}
