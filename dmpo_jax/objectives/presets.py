"""Algorithm presets as combinations of loss terms, and the one loss builder.

A preset is a set of ObjectiveConfig fields (the papers' defaults); any
field can be overridden. `build_loss(cfg, logprob_fn)` returns
`loss_fn(params, batch) -> (loss, metrics)`:

  batch["seqs"]          whatever logprob_fn needs for the RL samples
  batch["mask"]          [..., G, T] valid completion tokens
  batch["old_logprobs"]  [..., G, T] from the sampler (pi_old)
  batch["rewards"]       [..., G] raw rewards
  batch["ref_logprobs"]  [..., G, T] reference policy (kl_coef > 0, flowrl)
  batch["dph_seqs"], batch["dph_ref_logprobs"], batch["dph_mask"]
                         stored reference samples (dph_* presets)

`logprob_fn(params, seqs) -> {"logprobs": [..., G, T], "entropy"?: [..., G, T],
"log_z"?: [...]}` is the trainer's: the objectives never reach into the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from dmpo_jax.objectives import common, divergences, dmpo, kl, shaping, terms


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  advantage: str = "grpo"  # terms.ADVANTAGES: grpo | dr_grpo | rloo
  unbiased_std: bool = False  # GRPO std over G - 1 (verl) instead of G
  adv_eps: float = 1e-6
  policy_loss: str = "ppo_clip"  # terms.POLICY_LOSSES: ppo_clip | gspo | gpg | flowrl | none
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None
  agg: str = "seq_mean_token_mean"
  agg_norm: float | None = None  # seq_mean_token_sum_norm constant (default T)
  kl_coef: float = 0.0  # reverse-KL penalty to a reference on RL samples
  kl_estimator: str = "k3"  # kl.ESTIMATORS: k1 | k2 | k3
  kl_in_reward: bool = False  # subtract kl_coef * sum k1 from rewards instead
  dm_coef: float = 0.0  # DMPO lambda
  dm_alpha: float = 1.0  # DMPO Boltzmann temperature
  divergence: str | None = None  # DPH-RL f-divergence on stored reference samples
  div_coef: float = 0.0  # DPH-RL eta
  div_alpha: float = 0.2  # alpha of the alpha-divergence
  flowrl_beta: float = 15.0
  dynamic_sampling: bool = False  # DAPO: keep groups with 0 < #correct < G
  overlong_cache: int = 0  # DAPO soft overlong band (tokens); 0 = off

  def __post_init__(self):
    terms.ADVANTAGES.get(self.advantage)  # unknown names list the choices
    terms.POLICY_LOSSES.get(self.policy_loss)
    kl.get(self.kl_estimator)
    if self.agg not in common.AGGREGATIONS:
      raise ValueError(f"objective.agg={self.agg!r} is not one of {common.AGGREGATIONS}")
    for field in ("kl_coef", "dm_coef", "div_coef"):
      if getattr(self, field) < 0:
        raise ValueError(f"objective.{field} must be >= 0, got {getattr(self, field)}")
    if not self.dm_alpha > 0:
      raise ValueError(f"objective.dm_alpha must be > 0, got {self.dm_alpha}")
    if self.divergence is not None:
      self.make_divergence()  # validates the name and its parameters

  def make_divergence(self):
    params = {"alpha": self.div_alpha} if self.divergence == "alpha" else {}
    return divergences.get(self.divergence, **params)


PRESETS: dict[str, dict[str, Any]] = {
    # Shao et al. 2024 (DeepSeekMath): PPO-clip on group-normalised advantages.
    "grpo": {},
    # Liu et al. 2025 (Understanding R1-Zero): no std, no length normalisation.
    "dr_grpo": {"advantage": "dr_grpo", "agg": "seq_mean_token_sum_norm"},
    # Yu et al. 2025: clip-higher, token-mean, dynamic sampling, overlong shaping.
    "dapo": {"eps_high": 0.28, "agg": "token_mean", "dynamic_sampling": True,
             "overlong_cache": 16},
    # Zheng et al. 2025: sequence-level ratio with a tight clip.
    "gspo": {"policy_loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4},
    # Chu et al. 2025: plain policy gradient, B/(B-M) rescaling.
    "gpg": {"policy_loss": "gpg", "advantage": "dr_grpo"},
    # Zhu et al. 2025: trajectory balance with a learned log Z.
    "flowrl": {"policy_loss": "flowrl"},
    # DMPO: GRPO + lambda * L_DM (group-level distribution matching).
    "dmpo": {"dm_coef": 0.5, "dm_alpha": 1.0},
    # DPH-RL (arXiv 2509.07430): GRPO on D_exp + eta * D_f on stored D_pef samples.
    "dph_f": {"divergence": "forward_kl", "div_coef": 0.05},
    "dph_js": {"divergence": "js", "div_coef": 0.2},
    "dph_alpha": {"divergence": "alpha", "div_alpha": 0.2, "div_coef": 0.05},
    # Reverse-KL baseline of DPH-RL: k3 to an online reference, coefficient 0.01.
    "rkl": {"kl_coef": 0.01, "kl_estimator": "k3"},
}


def preset_names() -> list[str]:
  return sorted(PRESETS)


def objective_config(preset: str = "dmpo", **overrides) -> ObjectiveConfig:
  """The preset's ObjectiveConfig with `overrides` applied; unknown names list the choices."""
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {preset_names()}")
  fields = {f.name for f in dataclasses.fields(ObjectiveConfig)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"unknown objective field(s) {unknown}; valid fields: {sorted(fields)}")
  return ObjectiveConfig(**{**PRESETS[preset], **overrides})


def slice_exact(cfg: ObjectiveConfig) -> bool:
  """Whether the loss is a mean over sequences and prompt groups, so that the mean of its
  values (and gradients) over equal slices of whole groups equals the whole batch's
  (steps.accumulate). Not so for a global token mean: agg="token_mean", GPG, a KL term
  in the loss, DPH divergences (token means), and FlowRL (not checked)."""
  return (terms.POLICY_LOSSES.get(cfg.policy_loss).slice_exact and cfg.agg != "token_mean"
          and not (cfg.kl_coef > 0 and not cfg.kl_in_reward) and cfg.divergence is None)


def needs_reference(cfg: ObjectiveConfig) -> bool:
  """Whether the batch carries the reference policy's log-probs (a KL term, or a policy
  loss that declares `reference`); the trainer then keeps the RL start policy."""
  return cfg.kl_coef > 0 or terms.POLICY_LOSSES.get(cfg.policy_loss).reference


def needs_log_z(cfg: ObjectiveConfig) -> bool:
  """Whether the params carry a learned log Z(x) head (`params["log_z"]`)."""
  return terms.POLICY_LOSSES.get(cfg.policy_loss).log_z


def needs_dph_store(cfg: ObjectiveConfig) -> bool:
  """Whether the batch carries stored reference samples (DPH-RL's D_pef, `dph_*` keys)."""
  return cfg.divergence is not None


def needs_group(cfg: ObjectiveConfig) -> bool:
  """Whether the objective is undefined on a group of one sample (G < 2)."""
  return cfg.advantage in terms.NEEDS_GROUP or cfg.dm_coef > 0


def advantages(cfg: ObjectiveConfig, rewards):
  """Advantages [..., G] of rewards [..., G] by the registered estimator cfg.advantage."""
  return terms.ADVANTAGES.get(cfg.advantage)(cfg, rewards)


def kl_penalised_rewards(cfg: ObjectiveConfig, rewards, old_logprobs, ref_logprobs, mask):
  """With kl_in_reward: r - kl_coef * sum_t k1 (the sampled sequence's log-ratio)."""
  if not (cfg.kl_in_reward and cfg.kl_coef > 0):
    return rewards
  return shaping.kl_in_reward(rewards, old_logprobs, ref_logprobs, mask, cfg.kl_coef)


def build_loss(cfg: ObjectiveConfig, logprob_fn: Callable, *, reg_loss: bool = False) -> Callable:
  """cfg -> loss_fn(params, batch) -> (loss, metrics). See the module docstring.

  reg_loss: also return metrics["reg_loss"], the regulariser as it enters the loss (the sum
  of kl_coef x KL, dm_coef x DM and div_coef x divergence; 0 when there is none), so that
  its gradient can be taken apart from the policy-gradient term's ("pg_loss")."""
  div = cfg.make_divergence() if cfg.divergence is not None else None
  policy = terms.POLICY_LOSSES.get(cfg.policy_loss)
  reference = needs_reference(cfg)

  def loss_fn(params, batch):
    out = logprob_fn(params, batch["seqs"])
    logp, mask = out["logprobs"], batch["mask"]
    old = batch["old_logprobs"]
    ref = batch.get("ref_logprobs")
    if reference and ref is None:
      raise ValueError(f"batch['ref_logprobs'] is required for kl_coef={cfg.kl_coef}, "
                       f"policy_loss={cfg.policy_loss!r}")
    rewards = batch["rewards"].astype(jnp.float32)
    rewards = kl_penalised_rewards(cfg, rewards, old, ref, mask) if ref is not None else rewards
    adv = jax.lax.stop_gradient(advantages(cfg, rewards))
    scores = common.sequence_scores(logp, mask)  # phi, reused by DMPO and GSPO-like terms
    metrics = {}
    reg = jnp.zeros((), jnp.float32)

    if policy.log_z and "log_z" not in out:
      raise ValueError(f"policy_loss={cfg.policy_loss!r} needs logprob_fn to return 'log_z'")
    loss, aux = policy.fn(cfg, terms.PolicyInputs(
        logprobs=logp, old_logprobs=old, mask=mask, advantages=adv, rewards=rewards,
        scores=scores, ref_logprobs=ref, log_z=out.get("log_z")))
    metrics.update({f"pg_{k}" if k != "clip_frac" else k: v for k, v in aux.items()})
    metrics["pg_loss"] = loss

    if ref is not None:
      metrics.update(kl.kl_metrics(logp, ref, mask))
      if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        kl_term = common.masked_mean(kl.get(cfg.kl_estimator)(logp, ref), mask)
        loss = loss + cfg.kl_coef * kl_term
        reg = reg + cfg.kl_coef * kl_term

    dm = dmpo.dm_loss(scores, rewards, cfg.dm_alpha)
    metrics["dm_loss"] = dm
    metrics.update(dmpo.dm_metrics(scores, rewards, cfg.dm_alpha))
    if cfg.dm_coef > 0:
      loss = loss + cfg.dm_coef * dm
      reg = reg + cfg.dm_coef * dm

    if div is not None and "dph_seqs" in batch:
      dph_logp = logprob_fn(params, batch["dph_seqs"])["logprobs"]
      d = div.sample_loss(dph_logp, batch["dph_ref_logprobs"], batch["dph_mask"])
      metrics["divergence"] = d
      loss = loss + cfg.div_coef * d
      reg = reg + cfg.div_coef * d

    if "entropy" in out:
      metrics["entropy"] = common.masked_mean(out["entropy"], mask)
    metrics["reward_mean"] = jnp.mean(rewards)
    metrics["adv_abs_mean"] = jnp.mean(jnp.abs(adv))
    metrics["loss"] = loss
    if reg_loss:
      metrics["reg_loss"] = reg
    return loss, metrics

  return loss_fn
