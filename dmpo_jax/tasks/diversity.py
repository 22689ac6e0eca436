"""Metrics that show mode collapse: how many optima a policy still finds, and pass@k / QR@k curves.

Inputs are per-sample results of the strict verifier: ``Verdict.solution``
(a canonical form, None when infeasible) and ``Verdict.value``, plus an
instance's enumerated optimal set (``Task.optimal_solutions``). "Correct"
is either feasible or optimal; every curve takes a boolean matrix so the
caller picks which.

* distinct optima of a group: how many different optimal solutions its samples hold;
* coverage: the share of the instance's optimal set that the samples hit;
* entropy over optima: of the empirical distribution of the optimal samples over
  the optima (nats; optionally divided by log |optimal set|, its maximum);
* pass@k for k = 1..64 with the unbiased estimator 1 - C(n-c, k) / C(n, k), and
  QR@k, the unbiased estimate of the expected best quality ratio of k samples
  drawn without replacement from the n: sum_i C(i-1, k-1) / C(n, k) x_(i) over
  the ratios sorted ascending (the same estimator as pass@k when x is 0/1);
* keep and exploration as in "The Choice of Divergence: A Neglected Key to
  Mitigating Diversity Collapse in Reinforcement Learning with Verifiable
  Reward" (arXiv:2509.07430): split the problems by the base model's pass@8;
  keep = share of the base-solved ones the trained model still solves (its
  pass@8), exploration = share of the base-failed ones it now solves. With
  more than 8 samples per problem the split is soft: each problem counts as
  base-solved with weight pass@8 (the probability that 8 of its samples hold a
  correct one), which is the paper's hard split when there are exactly 8.
"""

from __future__ import annotations

import collections
import functools
import math
from typing import Hashable, Iterable, Sequence

import numpy as np

from dmpo_jax.tasks.scoring import pass_at_k

DEFAULT_KS = tuple(range(1, 65))


def optimal_mask(values: Sequence[float | None], optimum: float | None, *,
                 rel_tol: float = 1e-9) -> np.ndarray:
  """Which samples reach the optimum (value None = infeasible; optimum None = unknown -> none)."""
  out = np.zeros(len(values), dtype=bool)
  if optimum is None:
    return out
  for i, v in enumerate(values):
    out[i] = v is not None and math.isclose(v, optimum, rel_tol=rel_tol, abs_tol=rel_tol)
  return out


def _optimal_forms(solutions: Sequence[Hashable | None], optimal: Sequence[bool]) -> list:
  if len(solutions) != len(optimal):
    raise ValueError(f"one optimality flag per solution: {len(solutions)} solutions, {len(optimal)} flags")
  return [s for s, o in zip(solutions, optimal) if o and s is not None]


def distinct_optimal(solutions: Sequence[Hashable | None], optimal: Sequence[bool]) -> int:
  """Number of distinct canonical solutions among the optimal samples of a group."""
  return len(set(_optimal_forms(solutions, optimal)))


def coverage(solutions: Iterable[Hashable | None], optimal_set: Sequence[Hashable]) -> float:
  """Share of the instance's optimal set hit by the samples; NaN for an empty set.

  Meaningful when the enumeration was complete (``Optima.complete``); otherwise it
  is the share of the listed optima."""
  target = set(optimal_set)
  if not target:
    return math.nan
  return len(target & set(solutions)) / len(target)


def optimal_entropy(solutions: Sequence[Hashable | None], optimal: Sequence[bool], *,
                    num_optima: int | None = None) -> float:
  """Entropy (nats) of the optimal samples over the optima; 0 with no optimal sample.

  num_optima: divide by log(num_optima), the entropy of the uniform distribution
  over the optimal set, so 1 = spread evenly over every optimum (NaN when < 2)."""
  counts = collections.Counter(_optimal_forms(solutions, optimal))
  total = sum(counts.values())
  h = 0.0
  if total:
    p = np.asarray(list(counts.values()), dtype=float) / total
    h = float(-(p * np.log(p)).sum())
  if num_optima is None:
    return h
  return h / math.log(num_optima) if num_optima >= 2 else math.nan


def group_metrics(solutions: Sequence[Hashable | None], values: Sequence[float | None],
                  optimum: float | None, optimal_set: Sequence[Hashable] | None = None) -> dict:
  """Collapse metrics of one group of samples of one instance (for per-step logs)."""
  opt = optimal_mask(values, optimum)
  out = {
      "feasible_rate": float(np.mean([s is not None for s in solutions])) if solutions else math.nan,
      "optimal_rate": float(opt.mean()) if len(opt) else math.nan,
      "distinct_feasible": len({s for s in solutions if s is not None}),
      "distinct_optimal": distinct_optimal(solutions, opt),
      "entropy_optimal": optimal_entropy(solutions, opt),
  }
  if optimal_set is not None:
    out["num_optima"] = len(optimal_set)
    out["coverage"] = coverage(solutions, optimal_set)
  return out


def _matrix(x, name: str, dtype) -> np.ndarray:
  a = np.asarray(x, dtype=dtype)
  if a.ndim != 2 or a.shape[1] == 0:
    raise ValueError(f"{name} must be [problems, samples] with >= 1 sample, got shape {a.shape}")
  return a


def pass_at_k_curve(correct, ks: Sequence[int] = DEFAULT_KS) -> np.ndarray:
  """Mean unbiased pass@k over problems for each k; correct: bool [P, n]. NaN where k > n."""
  c = _matrix(correct, "correct", bool)
  n = c.shape[1]
  hits = c.sum(1)
  return np.asarray([np.mean([pass_at_k(n, int(h), k) for h in hits]) if k <= n else math.nan
                     for k in ks])


def max_at_k(scores: Sequence[float], k: int) -> float:
  """Unbiased expected max of k of the n scores drawn without replacement."""
  x = np.sort(np.asarray(scores, dtype=float))
  n = len(x)
  if not 1 <= k <= n:
    raise ValueError(f"max_at_k needs 1 <= k <= n={n}, got k={k}")
  # x_(i) (1-based, ascending) is the max of C(i-1, k-1) of the C(n, k) subsets; the
  # weights are the same floats for every problem of n samples (memoised), summed in order.
  return float(sum(w * x[i] for i, w in max_at_k_weights(n, k)))


@functools.lru_cache(maxsize=1 << 14)
def max_at_k_weights(n: int, k: int) -> tuple:
  """((i - 1, C(i-1, k-1) / C(n, k)) for i = k..n): `max_at_k`'s weight of the i-th smallest."""
  total = math.comb(n, k)
  return tuple((i - 1, math.comb(i - 1, k - 1) / total) for i in range(k, n + 1))


def qr_at_k_curve(ratios, ks: Sequence[int] = DEFAULT_KS) -> np.ndarray:
  """Mean over problems of QR@k (max_at_k of the ratios) for each k; ratios: [P, n]. NaN where k > n."""
  r = _matrix(ratios, "ratios", float)
  n = r.shape[1]
  return np.asarray([np.mean([max_at_k(row, k) for row in r]) if k <= n else math.nan for k in ks])


def keep_and_exploration(base_correct, trained_correct, k: int = 8) -> dict:
  """DPH-RL's keep / exploration rates from the pass@k split of the base model (see module doc).

  base_correct, trained_correct: bool [P, n_base] and [P, n_trained] (same problems),
  each with >= k samples. Returns keep_rate, exploration_rate (NaN with an empty
  side) and base_solved, the (soft) number of base-solved problems.
  """
  b = _matrix(base_correct, "base_correct", bool)
  t = _matrix(trained_correct, "trained_correct", bool)
  if b.shape[0] != t.shape[0]:
    raise ValueError(f"base and trained results cover different problem counts: {b.shape[0]} vs {t.shape[0]}")
  if min(b.shape[1], t.shape[1]) < k:
    raise ValueError(f"keep/exploration at k={k} needs >= {k} samples per problem, got "
                     f"{b.shape[1]} (base) and {t.shape[1]} (trained)")
  pb = np.asarray([pass_at_k(b.shape[1], int(h), k) for h in b.sum(1)])
  pt = np.asarray([pass_at_k(t.shape[1], int(h), k) for h in t.sum(1)])
  solved, failed = pb.sum(), (1 - pb).sum()
  return {
      "keep_rate": float((pb * pt).sum() / solved) if solved > 0 else math.nan,
      "exploration_rate": float(((1 - pb) * pt).sum() / failed) if failed > 0 else math.nan,
      "base_solved": float(solved),
  }
