"""Scoring: NP-Bench's ratio rule, SR/QR, pass@k, keep/exploration, diversity.

Conventions (docs/TASKS.md):

* ratio of a feasible answer: min tasks ground_truth / value, max tasks
  value / ground_truth; 0/0 = 1; infeasible = 0; NOT clipped, so beating
  the reference scores above 1 (a nonzero over zero is +inf).
* Per problem with samples r_1..r_n (ratios) and feasibility f_1..f_n:
  SR@k = any(f_1..f_k), QR@k = max(r_1..r_k) (NP-Bench: k = 3 samples);
  SR_mean = mean(f), QR_mean = mean(r).
* Category score = mean over that category's problems; overall = unweighted
  mean of the five category means (over the categories present).

Memoised (exact: same inputs, the same float result): verdicts per (task, instance, rules,
response text) in `VerdictMemo` (a policy's samples repeat a handful of answers), and
`pass_at_k` per (n, c, k).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import math
from typing import Hashable, Iterable, Sequence

import numpy as np


def ratio(value: float | None, ground_truth: float, direction: str) -> float:
  """NP-Bench's quality ratio; None (infeasible) gives 0."""
  if value is None:
    return 0.0
  if direction not in ("min", "max"):
    raise ValueError(f"direction must be 'min' or 'max', got {direction!r}")
  num, den = (ground_truth, value) if direction == "min" else (value, ground_truth)
  if den == 0:
    return 1.0 if num == 0 else math.inf
  return float(num) / float(den)


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) for one problem (n samples, c correct)."""
  if not (0 <= c <= n) or k < 1 or k > n:
    raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
  return _pass_at_k(int(n), int(c), int(k))


@functools.lru_cache(maxsize=1 << 16)
def _pass_at_k(n: int, c: int, k: int) -> float:
  # An evaluation point asks for every k = 1..64 of every problem: the same few (n, c, k).
  if n - c < k:
    return 1.0
  # Product form: C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i).
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def instance_fingerprint(task_key: str, instance) -> str:
  """A content key of an instance of a task: equal instances (rebuilt alike), equal keys."""
  return hashlib.sha256(f"{task_key}/{instance!r}".encode()).hexdigest()


class VerdictMemo:
  """`task.verify(instance, text, compat=...)` memoised per (task, instance, rules, response
  text): verification is a pure function of the four, and a group of samples holds a handful
  of distinct responses. The key holds the task object itself (a task registered again under
  its key is another task) and the instance by content (`instance_fingerprint`; instances are
  JSON-like, their repr is their content): the same answer text is another verdict on another
  instance. Least recently used entries go beyond `size`; hits and misses are counted."""

  def __init__(self, size: int = 1 << 16):
    self.size, self.hits, self.misses = size, 0, 0
    self._store: collections.OrderedDict = collections.OrderedDict()

  def key(self, task, instance_id: str, compat: str, text: str) -> tuple:
    return (task, instance_id, compat, text)

  def verify_group(self, task, instance, texts, compat: str) -> list:
    """The verdicts of `texts` (responses to one instance), in order."""
    iid = instance_fingerprint(task.key, instance)
    out = []
    for text in texts:
      k = self.key(task, iid, compat, text)
      v = self._store.get(k)
      if v is None:
        self.misses += 1
        v = self._store[k] = task.verify(instance, text, compat=compat)
        if len(self._store) > self.size:
          self._store.popitem(last=False)
      else:
        self.hits += 1
        self._store.move_to_end(k)
      out.append(v)
    return out

  def __len__(self) -> int:
    return len(self._store)

  def clear(self) -> None:
    self._store.clear()
    self.hits = self.misses = 0


VERDICTS = VerdictMemo()  # the process's memo (rewards.score, pipeline.collapse_stats)


def mean_at_k(correct: Sequence[bool], k: int) -> float:
  """mean@k: mean accuracy over the first k samples."""
  if k < 1 or k > len(correct):
    raise ValueError(f"mean_at_k needs 1 <= k <= {len(correct)}, got {k}")
  return float(np.mean(np.asarray(correct[:k], dtype=float)))


def distinct_solutions(solutions: Iterable[Hashable | None]) -> int:
  """Number of distinct canonical feasible solutions (None = infeasible, skipped)."""
  return len({s for s in solutions if s is not None})


def solution_entropy(solutions: Iterable[Hashable | None]) -> float:
  """Entropy (nats) of the empirical distribution over canonical feasible solutions."""
  counts = collections.Counter(s for s in solutions if s is not None)
  total = sum(counts.values())
  if total == 0:
    return 0.0
  p = np.asarray(list(counts.values()), dtype=float) / total
  return float(-(p * np.log(p)).sum())


def problem_scores(ratios: Sequence[float], feasible: Sequence[bool], k: int = 3,
                   pass_ks: Sequence[int] = (1,)) -> dict:
  """Scores of one problem from its n samples (in sampling order)."""
  n = len(ratios)
  if n == 0 or len(feasible) != n:
    raise ValueError(f"need n >= 1 ratios and as many feasibility flags, got {n} and {len(feasible)}")
  k = min(k, n)
  c = int(sum(bool(f) for f in feasible))
  out = {
      f"SR@{k}": float(any(feasible[:k])),
      f"QR@{k}": float(max(ratios[:k])),
      "SR_mean": c / n,
      "QR_mean": float(np.mean(ratios)),
  }
  for kk in pass_ks:
    if kk <= n:
      out[f"pass@{kk}"] = pass_at_k(n, c, kk)
  return out


def aggregate(per_problem: Sequence[dict], categories: Sequence[str]) -> dict:
  """Per-category means and the overall mean of category means.

  per_problem: dicts of scores; categories: the category of each.
  Returns {"categories": {cat: {metric: mean}}, "overall": {metric: mean of cat means}}.
  A metric some problems lack (coverage, for a task without an enumeration of its optima) is
  left out of every mean over them, never averaged over the rest: a category's mean has the
  metrics all its problems have, the overall mean those all categories have.
  """
  if len(per_problem) != len(categories):
    raise ValueError("aggregate: one category per problem")
  by_cat: dict[str, list[dict]] = collections.defaultdict(list)
  for s, c in zip(per_problem, categories):
    by_cat[c].append(s)
  cat_means = {c: {m: float(np.mean([s[m] for s in rows])) for m in rows[0]
                   if all(m in s for s in rows)}
               for c, rows in by_cat.items()}
  metrics = set.intersection(*(set(v) for v in cat_means.values())) if cat_means else set()
  overall = {m: float(np.mean([v[m] for v in cat_means.values()])) for m in sorted(metrics)}
  return {"categories": cat_means, "overall": overall}


def keep_and_exploration(base_solved: Sequence[bool], trained_solved: Sequence[bool]) -> dict:
  """Keep rate: of the problems the base model solves, the fraction still solved.
  Exploration rate: of those the base model fails, the fraction now solved.
  A rate with an empty denominator is NaN."""
  b = np.asarray(base_solved, dtype=bool)
  t = np.asarray(trained_solved, dtype=bool)
  if b.shape != t.shape:
    raise ValueError(f"base and trained results differ in length: {b.shape} vs {t.shape}")
  keep = float(t[b].mean()) if b.any() else math.nan
  explore = float(t[~b].mean()) if (~b).any() else math.nan
  return {"keep_rate": keep, "exploration_rate": explore}
