"""Algorithm presets as lists of terms with their settings, what an objective needs, and the loss.

An objective is a set of registered terms, each with its own settings section
(`settings.py`): an advantage estimator and a policy loss (terms.py), the
regularisers (regularisers.py: KL, DM, the DPH-RL divergence, ...) and a
reward-shaping term (shaping.py). A preset names sections and their values
(the papers' defaults); any field can be overridden (`objective_config`).
`needs(cfg)` is what the objective needs from the trainer, as its terms
declare it (needs.Needs). `build_loss(cfg, logprob_fn)` returns
`loss_fn(params, batch) -> (loss, metrics)`:

  batch["seqs"]          whatever logprob_fn needs for the RL samples
  batch["mask"]          [..., G, T] valid completion tokens
  batch["old_logprobs"]  [..., G, T] from the sampler (pi_old)
  batch["rewards"]       [..., G] raw rewards
  batch["ref_logprobs"]  [..., G, T] reference policy (needs(cfg).reference)
  batch["answer"], batch["key"], batch["rl_step"], ...
                         what the objective's terms declare (needs(cfg).batch)
  batch["dph_seqs"], batch["dph_ref_logprobs"], batch["dph_mask"]
                         stored reference samples (needs(cfg).dph_store)

`logprob_fn(params, seqs) -> {"logprobs": [..., G, T], "entropy"?: [..., G, T],
"log_z"?: [...]}` is the trainer's: the objectives never reach into the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from dmpo_jax.objectives import common, regularisers, settings, shaping, terms
from dmpo_jax.objectives.needs import Needs

RL_SAMPLES = ("mask", "old_logprobs", "rewards", "seqs")  # every batch has these


class ObjectiveConfig:
  """An objective: every settings section (`settings.SECTIONS`) made from one flat set of
  fields, each checked by its section; the rest keep their defaults. Frozen. It reads as the
  flat fields (`cfg.dm_coef`, `cfg.policy_loss`); `cfg.part(regularisers.DMConfig)` is one
  section, `cfg.replace(**fields)` a changed copy, `cfg.as_dict()` the flat fields."""

  def __init__(self, **fields):
    object.__setattr__(self, "parts", settings.build(fields))
    if terms.ADVANTAGES.get(self.advantage).binary and self.reward != "correct":
      raise ValueError(f"objective.advantage={self.advantage!r} is defined on 0/1 rewards: set "
                       "objective.reward='correct' (the verifier's flag, not a threshold)")

  def __getattr__(self, name):
    parts = self.__dict__.get("parts")
    owner = settings.OWNERS.get(name)
    if parts is None or owner not in parts:
      raise AttributeError(f"ObjectiveConfig has no field {name!r}")
    return getattr(parts[owner], name)

  def __setattr__(self, name, value):
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

  def part(self, cls: type):
    """The section of class `cls` (a term's own settings)."""
    for p in self.parts.values():
      if type(p) is cls:
        return p
    raise ValueError(f"{cls.__name__} is not a settings section of this objective (sections: "
                     f"{sorted(self.parts)}; one registered after it was built is not in it)")

  def as_dict(self) -> dict[str, Any]:
    return {k: v for p in self.parts.values() for k, v in dataclasses.asdict(p).items()}

  def replace(self, **fields) -> ObjectiveConfig:
    return ObjectiveConfig(**{**self.as_dict(), **fields})

  def __eq__(self, other):
    return isinstance(other, ObjectiveConfig) and self.as_dict() == other.as_dict()

  def __hash__(self):
    return hash(tuple(self.as_dict().items()))

  def __repr__(self):
    return f"ObjectiveConfig({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"


def field_names() -> list[str]:
  """Every objective field (`rl.objective.<field>`), the registered sections'."""
  return settings.field_names()


# A preset is its terms with their settings: {section: {field: value}}; the sections' other
# fields keep their defaults, and any field can be overridden (`objective_config`).
PRESETS: dict[str, dict[str, dict[str, Any]]] = {}


def register_preset(name: str, terms_settings: dict[str, dict[str, Any]]) -> None:
  """Add a preset: each section named must be registered and own the fields given for it."""
  if name in PRESETS:
    raise ValueError(f"preset {name!r} is already registered")
  for section, fields in terms_settings.items():
    if section not in settings.SECTIONS:
      raise ValueError(f"preset {name!r}: unknown section {section!r}; choose one of "
                       f"{sorted(settings.SECTIONS)}")
    stray = sorted(f for f in fields if settings.OWNERS.get(f) != section)
    if stray:
      raise ValueError(f"preset {name!r}: section {section!r} has no field(s) {stray}")
  PRESETS[name] = terms_settings


for _name, _terms in {
    # Shao et al. 2024 (DeepSeekMath): PPO-clip on group-normalised advantages.
    "grpo": {},
    # Liu et al. 2025 (Understanding R1-Zero): no std, no length normalisation.
    "dr_grpo": {"advantage": {"advantage": "dr_grpo"},
                "policy": {"agg": "seq_mean_token_sum_norm"}},
    # Yu et al. 2025: clip-higher, token-mean, dynamic sampling, overlong shaping.
    "dapo": {"policy": {"eps_high": 0.28, "agg": "token_mean"},
             "reward": {"dynamic_sampling": True, "overlong_cache": 16}},
    # Zheng et al. 2025: sequence-level ratio with a tight clip.
    "gspo": {"policy": {"policy_loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4}},
    # Chu et al. 2025: plain policy gradient, B/(B-M) rescaling.
    "gpg": {"policy": {"policy_loss": "gpg"}, "advantage": {"advantage": "dr_grpo"}},
    # Zhu et al. 2025: trajectory balance with a learned log Z.
    "flowrl": {"policy": {"policy_loss": "flowrl"}},
    # DMPO: GRPO + lambda * L_DM (group-level distribution matching).
    "dmpo": {"dm": {"dm_coef": 0.5, "dm_alpha": 1.0}},
    # DPH-RL (arXiv 2509.07430): GRPO on D_exp + eta * D_f on stored D_pef samples.
    "dph_f": {"divergence": {"divergence": "forward_kl", "div_coef": 0.05}},
    "dph_js": {"divergence": {"divergence": "js", "div_coef": 0.2}},
    "dph_alpha": {"divergence": {"divergence": "alpha", "div_alpha": 0.2, "div_coef": 0.05}},
    # Reverse-KL baseline of DPH-RL: k3 to an online reference, coefficient 0.01.
    "rkl": {"kl": {"kl_coef": 0.01, "kl_estimator": "k3"}},
    # The published answers to diversity collapse (docs/METHODS.md, baselines). The binary
    # ones train on the verifier's correct flag (objective.correct, default optimal).
    # Chen et al. 2025 (arXiv 2508.10751): Pass@k Training's analytic advantage, k = 4.
    "passk": {"advantage": {"advantage": "passk"}, "reward": {"reward": "correct"},
              "passk": {"passk_k": 4}},
    # Walder and Karkhanis 2025 (arXiv 2505.15201): PKPO's s^(loo-1) weights, k = 4.
    "pkpo": {"advantage": {"advantage": "pkpo"}, "reward": {"reward": "correct"},
             "pkpo": {"pkpo_k": 4}},
    # He et al. 2025 (arXiv 2506.02355): GRPO on rank-penalised rewards, penalty 0.25 and the
    # G - 1 std as the authors' code.
    "unlikely": {"reward": {"reward": "correct", "shaping": "unlikely"},
                 "unlikely": {"unlikely_penalty": 0.25}, "advantage": {"unbiased_std": True}},
    # Zhu et al. 2025 (arXiv 2506.01347): +lambda / -1 without baseline, lambda = 0.1; NSR: 0.
    "w_reinforce": {"advantage": {"advantage": "psr_nsr"}, "reward": {"reward": "correct"},
                    "psr": {"psr_weight": 0.1}},
    "nsr": {"advantage": {"advantage": "psr_nsr"}, "reward": {"reward": "correct"},
            "psr": {"psr_weight": 0.0}},
    # Cui et al. 2025 (arXiv 2505.22617) on GRPO advantages; the shares are 10x and 100x the
    # papers' (0.002, 0.0002), which here would select one token per step.
    "kl_cov": {"policy": {"policy_loss": "kl_cov", "agg": "token_mean"},
               "kl_cov": {"kl_cov_frac": 0.02}},
    "clip_cov": {"policy": {"policy_loss": "clip_cov", "agg": "token_mean"},
                 "clip_cov": {"clip_cov_frac": 0.02}},
    # Song, Kempe and Munos 2025 (arXiv 2509.06941): penalise an answer's repeats in the group /
    # pay a UCB bonus c / sqrt(N(x, a)) for rarely seen answers, on the correct flag.
    "outcome_batch": {"reward": {"reward": "correct", "shaping": "outcome_batch"},
                      "explore": {"explore_coef": 0.5}},
    "outcome_ucb": {"reward": {"reward": "correct", "shaping": "outcome_ucb"},
                    "explore": {"explore_coef": 0.5}},
}.items():
  register_preset(_name, _terms)


def preset_names() -> list[str]:
  return sorted(PRESETS)


def preset_fields(preset: str) -> dict[str, Any]:
  """The preset's settings as flat objective fields."""
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {preset_names()}")
  return {k: v for fields in PRESETS[preset].values() for k, v in fields.items()}


def objective_config(preset: str = "dmpo", **overrides) -> ObjectiveConfig:
  """The preset's ObjectiveConfig with `overrides` applied; unknown names list the choices."""
  return ObjectiveConfig(**{**preset_fields(preset), **overrides})


# ------------------------------------------------------------------ what an objective needs

def term_needs(cfg: ObjectiveConfig) -> dict[str, Needs]:
  """What each of the objective's terms declares (needs.Needs), by term."""
  out = {f"advantage {cfg.advantage!r}": terms.ADVANTAGES.get(cfg.advantage).declared(cfg),
         f"policy_loss {cfg.policy_loss!r}": terms.POLICY_LOSSES.get(cfg.policy_loss).declared(cfg)}
  for name, reg in regularisers.REGULARISERS.items():
    out[f"regulariser {name!r}"] = reg.needs(cfg.part(reg.config))
  out[f"shaping {cfg.shaping!r}"] = shaping.SHAPING.get(cfg.shaping).declared(cfg)
  out["reward"] = Needs(correct=cfg.reward == "correct")
  return out


def needs(cfg: ObjectiveConfig) -> Needs:
  """What the objective needs from the trainer: its terms' needs together (needs.Needs), with
  `batch` the keys beyond the RL samples (sorted). The one question the trainer asks."""
  total = Needs()
  for n in term_needs(cfg).values():
    total = total | n
  return dataclasses.replace(total, batch=tuple(sorted(set(total.batch) - set(RL_SAMPLES))))


# Thin views of `needs` (the trainer asks `needs` itself).
def slice_exact(cfg: ObjectiveConfig) -> bool:
  return needs(cfg).slice_exact


def needs_reference(cfg: ObjectiveConfig) -> bool:
  return needs(cfg).reference


def needs_log_z(cfg: ObjectiveConfig) -> bool:
  return needs(cfg).log_z


def needs_dph_store(cfg: ObjectiveConfig) -> bool:
  return needs(cfg).dph_store


def needs_host_state(cfg: ObjectiveConfig) -> bool:
  return needs(cfg).host_state


def batch_needs(cfg: ObjectiveConfig) -> tuple[str, ...]:
  return needs(cfg).batch


def check_group_size(cfg: ObjectiveConfig, group_size: int) -> None:
  """Refuse a group smaller than a term needs (a std, L_DM, Pass@k's and PKPO's k <= G)."""
  error = needs(cfg).group_error(group_size)
  if error:
    raise ValueError(error)


# ------------------------------------------------------------------ the loss

def advantages(cfg: ObjectiveConfig, rewards, batch=None):
  """Advantages [..., G] of rewards [..., G] by the registered estimator cfg.advantage (one
  that declares `needs` reads them from `batch`)."""
  return terms.ADVANTAGES.get(cfg.advantage)(cfg, rewards, batch)


def kl_penalised_rewards(cfg: ObjectiveConfig, rewards, old_logprobs, ref_logprobs, mask):
  """With kl_in_reward: r - kl_coef * sum_t k1 (the sampled sequence's log-ratio)."""
  batch = {"old_logprobs": old_logprobs, "ref_logprobs": ref_logprobs, "mask": mask}
  return regularisers.kl_in_reward(cfg.part(regularisers.KLConfig), rewards, batch)


def shaped_rewards(cfg: ObjectiveConfig, regs, batch):
  """The rewards the advantages see: the device shaping term, then the regularisers' hooks
  (KL in the reward)."""
  rewards = batch["rewards"].astype(jnp.float32)
  if cfg.shaping != "none":
    rewards = shaping.device_shaping(cfg, rewards, batch)
  for reg, s in regs:
    if reg.rewards is not None:
      rewards = reg.rewards(s, rewards, batch)
  return rewards


def check_batch(by_term: dict[str, Needs], out: dict, batch: dict) -> None:
  """Refuse a batch or a logprob_fn output that lacks what a term declared, naming the terms."""
  lacking = [(f"batch[{k!r}]", lambda n, k=k: k in n.batch) for k in sorted(
      {k for n in by_term.values() for k in n.batch} - set(RL_SAMPLES) - set(batch))]
  if batch.get("ref_logprobs") is None:
    lacking.append(("batch['ref_logprobs']", lambda n: n.reference))
  if "log_z" not in out:
    lacking.append(("logprob_fn's 'log_z'", lambda n: n.log_z))
  for what, needed in lacking:
    who = [t for t, n in by_term.items() if needed(n)]
    if who:
      raise ValueError(f"{what} is required by the objective's terms {who}")


def build_loss(cfg: ObjectiveConfig, logprob_fn: Callable, *, reg_loss: bool = False) -> Callable:
  """cfg -> loss_fn(params, batch) -> (loss, metrics). See the module docstring.

  The loss is the policy-gradient term plus each registered regulariser's value, summed in
  registration order (regularisers.REGULARISERS: KL, DM, divergence, ...).
  reg_loss: also return metrics["reg_loss"], the regularisers' sum as it enters the loss (0
  when there is none), so that its gradient can be taken apart from the policy-gradient
  term's ("pg_loss")."""
  policy = terms.POLICY_LOSSES.get(cfg.policy_loss)
  regs = [(reg, cfg.part(reg.config)) for _, reg in regularisers.REGULARISERS.items()]
  by_term = term_needs(cfg)

  def loss_fn(params, batch):
    out = logprob_fn(params, batch["seqs"])
    logp, mask = out["logprobs"], batch["mask"]
    old = batch["old_logprobs"]
    ref = batch.get("ref_logprobs")
    check_batch(by_term, out, batch)
    rewards = shaped_rewards(cfg, regs, batch)
    adv = jax.lax.stop_gradient(advantages(cfg, rewards, batch))
    scores = common.sequence_scores(logp, mask)  # phi, reused by DMPO and GSPO-like terms
    metrics = {}
    reg = jnp.zeros((), jnp.float32)

    loss, aux = policy.fn(cfg, terms.PolicyInputs(
        logprobs=logp, old_logprobs=old, mask=mask, advantages=adv, rewards=rewards,
        scores=scores, ref_logprobs=ref, log_z=out.get("log_z"), batch=batch))
    metrics.update({f"pg_{k}" if k != "clip_frac" else k: v for k, v in aux.items()})
    metrics["pg_loss"] = loss

    x = regularisers.RegInputs(logprobs=logp, old_logprobs=old, mask=mask, scores=scores,
                               rewards=rewards, ref_logprobs=ref, batch=batch, params=params,
                               logprob_fn=logprob_fn)
    for r, s in regs:
      value, m = r.fn(s, x)
      metrics.update(m)
      if value is not None:
        loss = loss + value
        reg = reg + value

    if "entropy" in out:
      metrics["entropy"] = common.masked_mean(out["entropy"], mask)
    metrics["reward_mean"] = jnp.mean(rewards)
    metrics["adv_abs_mean"] = jnp.mean(jnp.abs(adv))
    metrics["loss"] = loss
    if reg_loss:
      metrics["reg_loss"] = reg
    return loss, metrics

  return loss_fn
