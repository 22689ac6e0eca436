"""Rewards for RL on the NP tasks: a format bonus plus the quality ratio.

reward = format_bonus * [a well-formed 'Answer:' list]  +  min(ratio, cap) * [feasible]

The ratio is NP-Bench's (scoring.ratio) against the ground truth chosen by
`ground_truth`: "reference" (the heuristic value, NP-Bench's protocol) or
"optimal" (the proven optimum; the reference where none is proven in time).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dmpo_jax.tasks import scoring
from dmpo_jax.tasks.base import COMPAT, Task, Verdict


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  format_bonus: float = 0.1
  ground_truth: str = "reference"   # "reference" | "optimal"
  cap: float = 2.0                  # ratios above this (or +inf) are clipped in the reward
  compat: str = "strict"            # verification rules ("strict" | "npbench")
  exact_time_limit: float = 5.0

  def __post_init__(self):
    if self.ground_truth not in ("reference", "optimal"):
      raise ValueError(f"RewardConfig.ground_truth must be 'reference' or 'optimal', got {self.ground_truth!r}")
    if self.compat not in COMPAT:
      raise ValueError(f"RewardConfig.compat must be one of {COMPAT}, got {self.compat!r}")
    if not self.cap > 0:
      raise ValueError(f"RewardConfig.cap must be > 0, got {self.cap}")


def ground_truth(task: Task, instance: dict, cfg: RewardConfig) -> float:
  if cfg.ground_truth == "optimal":
    opt = task.optimal_value(instance, time_limit=cfg.exact_time_limit)
    if opt is not None:
      return opt
  return task.reference_value(instance)


def score(task: Task, instance: dict, texts, cfg: RewardConfig = RewardConfig(),
          gt: float | None = None) -> tuple[np.ndarray, list[Verdict]]:
  """Rewards (float32 [len(texts)]) and verdicts for a group of responses to one instance."""
  gt = ground_truth(task, instance, cfg) if gt is None else gt
  rewards, verdicts = [], []
  for v in scoring.VERDICTS.verify_group(task, instance, texts, cfg.compat):  # memoised, exact
    r = cfg.format_bonus if v.well_formed else 0.0
    if v.feasible:
      r += min(scoring.ratio(v.value, gt, task.direction), cfg.cap)
    rewards.append(r)
    verdicts.append(v)
  return np.asarray(rewards, np.float32), verdicts
