"""Reward shaping: everything between a verifier's verdict and the reward the loss sees.

In the order a step applies them:

1. Format bonus and cap (`dmpo_jax.tasks.rewards.score`, config.rl.reward):
   r = format_bonus * [well-formed answer] + min(ratio, cap) * [feasible].
   With objective.reward="correct" (the binary methods), r is replaced by the
   verifier's correct flag instead: [optimal] or [feasible], objective.correct
   (host side, `shape_rewards`).
2. DAPO's soft overlong penalty (objective.overlong_cache > 0, host side):
   `overlong_penalty` added to r.
3. DAPO's dynamic sampling (objective.dynamic_sampling, host side):
   `dynamic_sampling_keep` marks the groups whose samples are neither all
   right nor all wrong; the trainer zeroes the completion mask of the other
   groups. Shapes stay fixed: dropped groups are masked, not resampled, so a
   step trains on fewer groups rather than waiting for more.
4. KL in the reward (objective.kl_in_reward with kl_coef > 0, inside the
   loss): `kl_in_reward` subtracts kl_coef * sum_t k1 per sample.
5. The registered reward-shaping term objective.shaping (`SHAPING`): a
   device term runs inside the loss on the batch (`device_shaping`), before
   the KL of 4 (the KL regulariser's reward hook, regularisers.py); a host
   term runs in `shape_rewards` with state that persists over training
   (saved in checkpoints with the train state's counters).

The settings of 1 to 3 and the choice of 5 are the `reward` section
(`RewardConfig`); the shaping terms' strengths are sections of their own.

`shape_rewards` applies 1 (correct), 2, 3 and a host term of 5 to a step's
scored rollouts.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dmpo_jax.objectives import exploration, kl, settings
from dmpo_jax.objectives.needs import Needs
from dmpo_jax.objectives.registry import Registry

CORRECT = ("optimal", "feasible")  # objective.correct: which verdicts count as correct
REWARDS = ("shaped", "correct")    # objective.reward: the shaped score, or the 0/1 correct flag


@dataclasses.dataclass(frozen=True)
class Shaping:
  """A reward-shaping term. Device: fn(cfg, rewards [..., G], batch) -> rewards, jitted in the
  loss, reading the batch keys in `needs`. Host (host=True): fn(cfg, rewards [P, G], info,
  state) -> rewards with info the step's host arrays ("prompt" [P] ids, "answer" [P, G]) and
  state a JSON-able dict the term owns (kept across steps and checkpoints). config: its own
  settings section."""
  fn: Callable
  host: bool = False
  needs: tuple = ()
  config: type | None = None

  def declared(self, cfg) -> Needs:
    return Needs(batch=tuple(self.needs), host_state=self.host)


SHAPING = Registry("reward shaping", "objective.shaping", make=Shaping)


@settings.section("reward")
@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """What the loss's reward is: steps 1 to 3 and the choice of 5 above."""
  dynamic_sampling: bool = False  # DAPO: keep groups with 0 < #correct < G
  overlong_cache: int = 0  # DAPO soft overlong band (tokens); 0 = off
  reward: str = "shaped"  # REWARDS: "correct" replaces r by the verifier's 0/1 flag
  correct: str = "optimal"  # CORRECT: optimal (where the optimum is proven) | feasible
  shaping: str = "none"  # SHAPING: none | unlikely | outcome_batch | outcome_ucb

  def __post_init__(self):
    SHAPING.get(self.shaping)  # unknown names list the choices
    settings.one_of(self, "reward", REWARDS)
    settings.one_of(self, "correct", CORRECT)


@settings.section("unlikely")
@dataclasses.dataclass(frozen=True)
class UnlikelyConfig:
  unlikely_penalty: float = 0.25  # the unlikeliness reward's rank penalty

  def __post_init__(self):
    if not 0.0 <= self.unlikely_penalty < 1.0:
      raise ValueError(f"objective.unlikely_penalty={self.unlikely_penalty} must be in [0, 1)")


@settings.section("explore")
@dataclasses.dataclass(frozen=True)
class ExploreConfig:
  explore_coef: float = 0.0  # outcome-based exploration's coefficient c

  def __post_init__(self):
    settings.at_least(self, 0, "explore_coef")


@SHAPING.register("none")
def _no_shaping(cfg, rewards, batch):
  return rewards


@SHAPING.register("unlikely", needs=("old_logprobs",), config=UnlikelyConfig)
def _unlikely(cfg, rewards, batch):
  return exploration.unlikeliness_rewards(rewards, batch["old_logprobs"], batch["mask"],
                                          cfg.unlikely_penalty)


@SHAPING.register("outcome_batch", needs=("answer",), config=ExploreConfig)
def _outcome_batch(cfg, rewards, batch):
  return exploration.batch_exploration_rewards(rewards, batch["answer"], cfg.explore_coef)


@SHAPING.register("outcome_ucb", host=True, config=ExploreConfig)
def _outcome_ucb(cfg, rewards, info, state):
  counts = exploration.UcbCounts(state.setdefault("outcome_ucb", {}))
  return rewards + counts.bonus(info["prompt"], info["answer"], cfg.explore_coef)


def device_shaping(cfg, rewards, batch):
  """objective.shaping on device (inside the loss); a host term was applied in rollout."""
  term = SHAPING.get(cfg.shaping)
  return rewards if term.host else term.fn(cfg, rewards, batch)


def overlong_penalty(lengths, max_len: int, cache_len: int):
  """Soft overlong punishment: 0 if |o| <= Lmax - Lcache, linear down to -1 at Lmax,
  -1 beyond. lengths [...] -> [...] float32."""
  if not 0 < cache_len <= max_len:
    raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, "
                     f"max_len={max_len}")
  lengths = jnp.asarray(lengths, jnp.float32)
  free = max_len - cache_len
  band = (free - lengths) / cache_len
  return jnp.where(lengths <= free, 0.0, jnp.where(lengths <= max_len, band, -1.0))


def dynamic_sampling_keep(correct) -> np.ndarray:
  """Groups to keep: 0 < #correct < G. correct [num_groups, G] bool -> [num_groups] bool.

  Host side (numpy). The trainer masks the other groups out of the loss (their
  completion mask becomes 0); it does not resample them.
  """
  correct = np.asarray(correct, bool)
  n = correct.sum(-1)
  return (n > 0) & (n < correct.shape[-1])


def kl_in_reward(rewards, old_logprobs, ref_logprobs, mask, coef: float):
  """r - coef * sum_t k1(pi_old, pi_ref) per sample, without gradient: rewards [..., G],
  log-probs and mask [..., G, T]."""
  k = jnp.sum(kl.k1(old_logprobs, ref_logprobs) * mask, axis=-1)
  return rewards - coef * jax.lax.stop_gradient(k)


def shape_rewards(cfg, rewards: np.ndarray, lengths: np.ndarray, feasible: np.ndarray,
                  max_len: int, *, correct: np.ndarray | None = None, info: dict | None = None,
                  state: dict | None = None) -> tuple[np.ndarray, np.ndarray | None]:
  """Steps 1 (correct), 2, 3 and a host term of 5 for one RL step: rewards, lengths, feasible,
  correct [P, G] -> (shaped rewards [P, G], groups to keep [P] bool, or None without dynamic
  sampling). cfg is the ObjectiveConfig; info and state as `Shaping` (host terms only)."""
  if cfg.reward == "correct":
    if correct is None:
      raise ValueError("objective.reward='correct' needs the verifier's correct flags")
    rewards = np.asarray(correct, np.float32)
  if cfg.overlong_cache:
    rewards = rewards + np.asarray(overlong_penalty(lengths, max_len, cfg.overlong_cache))
  term = SHAPING.get(cfg.shaping)
  if term.host:
    if info is None or state is None:
      raise ValueError(f"objective.shaping={cfg.shaping!r} needs the step's answers and its state")
    rewards = np.asarray(term.fn(cfg, rewards, info, state), np.float32)
  keep = dynamic_sampling_keep(feasible) if cfg.dynamic_sampling else None
  return rewards, keep
