"""Algorithm presets as combinations of loss terms, and the one loss builder.

A preset is a set of ObjectiveConfig fields (the papers' defaults); any
field can be overridden. `build_loss(cfg, logprob_fn)` returns
`loss_fn(params, batch) -> (loss, metrics)`:

  batch["seqs"]          whatever logprob_fn needs for the RL samples
  batch["mask"]          [..., G, T] valid completion tokens
  batch["old_logprobs"]  [..., G, T] from the sampler (pi_old)
  batch["rewards"]       [..., G] raw rewards
  batch["ref_logprobs"]  [..., G, T] reference policy (kl_coef > 0, flowrl)
  batch["answer"], batch["key"], batch["rl_step"], ...
                         what the objective's terms declare (`batch_needs`)
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

CORRECT = ("optimal", "feasible")  # objective.correct: which verdicts count as correct
REWARDS = ("shaped", "correct")    # objective.reward: the shaped score, or the 0/1 correct flag


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
  # The baselines against diversity collapse (docs/METHODS.md): what "correct" means for the
  # binary ones, the reward-shaping term, and each method's strength knob.
  reward: str = "shaped"  # REWARDS: "correct" replaces r by the verifier's 0/1 flag
  correct: str = "optimal"  # CORRECT: optimal (where the optimum is proven) | feasible
  shaping: str = "none"  # shaping.SHAPING: none | unlikely | outcome_batch | outcome_ucb
  passk_k: int = 4  # Pass@k Training's k
  pkpo_k: int = 4  # PKPO's k
  pkpo_anneal_step: int = 0  # PKPO: k = 1 from this RL step on (0: never)
  unlikely_penalty: float = 0.25  # unlikeliness reward's rank penalty
  psr_weight: float = 0.1  # W-REINFORCE's lambda on correct samples (0: NSR)
  kl_cov_frac: float = 0.02  # KL-Cov: share of valid tokens penalised
  kl_cov_coef: float = 1.0
  clip_cov_frac: float = 0.02  # Clip-Cov: share of valid tokens detached
  clip_cov_lb: float = 1.0
  clip_cov_ub: float = 5.0
  explore_coef: float = 0.0  # outcome-based exploration's coefficient c

  def __post_init__(self):
    terms.ADVANTAGES.get(self.advantage)  # unknown names list the choices
    terms.POLICY_LOSSES.get(self.policy_loss)
    shaping.SHAPING.get(self.shaping)
    kl.get(self.kl_estimator)
    if self.reward not in REWARDS:
      raise ValueError(f"objective.reward={self.reward!r} is not one of {REWARDS}")
    if self.correct not in CORRECT:
      raise ValueError(f"objective.correct={self.correct!r} is not one of {CORRECT}")
    if self.advantage in terms.BINARY and self.reward != "correct":
      raise ValueError(f"objective.advantage={self.advantage!r} is defined on 0/1 rewards: set "
                       "objective.reward='correct' (the verifier's flag, not a threshold)")
    for field in ("passk_k", "pkpo_k"):
      if not (isinstance(getattr(self, field), int) and getattr(self, field) >= 1):
        raise ValueError(f"objective.{field} must be an integer >= 1, got {getattr(self, field)!r}")
    for field in ("pkpo_anneal_step", "psr_weight", "kl_cov_coef", "explore_coef"):
      if getattr(self, field) < 0:
        raise ValueError(f"objective.{field} must be >= 0, got {getattr(self, field)}")
    if not 0.0 <= self.unlikely_penalty < 1.0:
      raise ValueError(f"objective.unlikely_penalty={self.unlikely_penalty} must be in [0, 1)")
    for field in ("kl_cov_frac", "clip_cov_frac"):
      if not 0.0 < getattr(self, field) <= 1.0:
        raise ValueError(f"objective.{field}={getattr(self, field)} must be in (0, 1]")
    if not self.clip_cov_lb < self.clip_cov_ub:
      raise ValueError(f"objective.clip_cov_lb={self.clip_cov_lb} must be < clip_cov_ub={self.clip_cov_ub}")
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
    # The published answers to diversity collapse (docs/METHODS.md, baselines). The binary
    # ones train on the verifier's correct flag (objective.correct, default optimal).
    # Chen et al. 2025 (arXiv 2508.10751): Pass@k Training's analytic advantage, k = 4.
    "passk": {"advantage": "passk", "reward": "correct", "passk_k": 4},
    # Walder and Karkhanis 2025 (arXiv 2505.15201): PKPO's s^(loo-1) weights, k = 4.
    "pkpo": {"advantage": "pkpo", "reward": "correct", "pkpo_k": 4},
    # He et al. 2025 (arXiv 2506.02355): GRPO on rank-penalised rewards, penalty 0.25 and the
    # G - 1 std as the authors' code.
    "unlikely": {"reward": "correct", "shaping": "unlikely", "unlikely_penalty": 0.25,
                 "unbiased_std": True},
    # Zhu et al. 2025 (arXiv 2506.01347): +lambda / -1 without baseline, lambda = 0.1; NSR: 0.
    "w_reinforce": {"advantage": "psr_nsr", "reward": "correct", "psr_weight": 0.1},
    "nsr": {"advantage": "psr_nsr", "reward": "correct", "psr_weight": 0.0},
    # Cui et al. 2025 (arXiv 2505.22617) on GRPO advantages; the shares are 10x and 100x the
    # papers' (0.002, 0.0002), which here would select one token per step.
    "kl_cov": {"policy_loss": "kl_cov", "agg": "token_mean", "kl_cov_frac": 0.02},
    "clip_cov": {"policy_loss": "clip_cov", "agg": "token_mean", "clip_cov_frac": 0.02},
    # Song, Kempe and Munos 2025 (arXiv 2509.06941): penalise an answer's repeats in the group /
    # pay a UCB bonus c / sqrt(N(x, a)) for rarely seen answers, on the correct flag.
    "outcome_batch": {"reward": "correct", "shaping": "outcome_batch", "explore_coef": 0.5},
    "outcome_ucb": {"reward": "correct", "shaping": "outcome_ucb", "explore_coef": 0.5},
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


def batch_needs(cfg: ObjectiveConfig) -> tuple[str, ...]:
  """Batch keys beyond the RL samples that the objective's terms declare (sorted): "answer"
  (final-answer ids [P, G]), "key" (PRNG key data [P, 2]), "rl_step" ([P], the RL step), ...
  The trainer supplies exactly these, so other objectives see the batch they always did."""
  needs = set(getattr(terms.ADVANTAGES.get(cfg.advantage), "needs", ()))
  needs |= set(terms.POLICY_LOSSES.get(cfg.policy_loss).needs)
  needs |= set(shaping.SHAPING.get(cfg.shaping).needs)
  return tuple(sorted(needs - {"old_logprobs", "mask", "rewards", "seqs"}))


def needs_correct(cfg: ObjectiveConfig) -> bool:
  """Whether the rollouts must flag correct samples (objective.reward="correct")."""
  return cfg.reward == "correct"


def needs_host_state(cfg: ObjectiveConfig) -> bool:
  """Whether a host reward-shaping term keeps state over training (saved in checkpoints)."""
  return shaping.SHAPING.get(cfg.shaping).host


def check_group_size(cfg: ObjectiveConfig, group_size: int) -> None:
  """Refuse a group smaller than a k the objective needs (Pass@k Training, PKPO)."""
  for field, adv in (("passk_k", "passk"), ("pkpo_k", "pkpo")):
    if cfg.advantage == adv and getattr(cfg, field) > group_size:
      raise ValueError(f"objective.{field}={getattr(cfg, field)} exceeds the group size "
                       f"config.rl.group_size={group_size}: {adv} needs k <= G")


def needs_group(cfg: ObjectiveConfig) -> bool:
  """Whether the objective is undefined on a group of one sample (G < 2)."""
  return cfg.advantage in terms.NEEDS_GROUP or cfg.dm_coef > 0


def advantages(cfg: ObjectiveConfig, rewards, batch=None):
  """Advantages [..., G] of rewards [..., G] by the registered estimator cfg.advantage (one
  that declares `needs` reads them from `batch`)."""
  fn = terms.ADVANTAGES.get(cfg.advantage)
  return fn(cfg, rewards, batch) if getattr(fn, "needs", ()) else fn(cfg, rewards)


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
    if cfg.shaping != "none":
      rewards = shaping.device_shaping(cfg, rewards, batch)
    rewards = kl_penalised_rewards(cfg, rewards, old, ref, mask) if ref is not None else rewards
    adv = jax.lax.stop_gradient(advantages(cfg, rewards, batch))
    scores = common.sequence_scores(logp, mask)  # phi, reused by DMPO and GSPO-like terms
    metrics = {}
    reg = jnp.zeros((), jnp.float32)

    if policy.log_z and "log_z" not in out:
      raise ValueError(f"policy_loss={cfg.policy_loss!r} needs logprob_fn to return 'log_z'")
    loss, aux = policy.fn(cfg, terms.PolicyInputs(
        logprobs=logp, old_logprobs=old, mask=mask, advantages=adv, rewards=rewards,
        scores=scores, ref_logprobs=ref, log_z=out.get("log_z"), batch=batch))
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
