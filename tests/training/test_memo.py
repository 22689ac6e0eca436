"""Memoised scoring (issue 38) is exact: `scoring.VerdictMemo` gives the verdict `task.verify`
gives for every (task, instance, rules, response), a key without the instance is caught, and the
memoised pass@k and max@k weights give the same floats as the formulas computed afresh."""

import math

import numpy as np
import pytest

from dmpo_jax import tasks
from dmpo_jax.tasks import diversity, rewards, scoring

KEYS = ("GCP-D", "maximum-set", "maximum_clique_problem", "subset-sum", "TSP")


def responses(task, q, seed: int) -> list[str]:
  """Responses to one instance: its optimal and sampled solutions, malformed and empty
  answers, with repeats (as a policy's samples have them)."""
  sols = task.sample_solutions(q, 4, seed=seed)
  texts = [f"Answer: {task.format_answer(s)}" for s in sols]
  if task.has_optima:
    texts += [f"Answer: {task.format_solution(c)}"
              for c in task.optimal_solutions(q, limit=4, time_limit=2.0).solutions]
  texts += ["Answer: [0, 1", "no answer here", "Answer: []", "Answer: [0]", "Answer: [1, 2]"]
  return texts + texts[::2]


def cases():
  """(task, instance, texts) for several instances of each task; every instance's texts also
  hold the other instances' answers, so that one text meets many instances."""
  out = []
  for key in KEYS:
    task = tasks.get(key)
    qs = [task.generate(seed, "tiny") for seed in range(4)]
    pool = [t for i, q in enumerate(qs) for t in responses(task, q, i)]
    out += [(task, q, pool) for q in qs]
  return out


def mismatches(memo, groups=None) -> int:
  """Verdicts of `memo` that differ from a fresh `task.verify`, over `groups` (default: `cases`)
  and both rules."""
  bad = 0
  for compat in ("strict", "npbench"):
    for task, q, texts in groups or cases():
      got = memo.verify_group(task, q, texts, compat)
      bad += sum(g != task.verify(q, t, compat=compat) for g, t in zip(got, texts))
  return bad


def test_memoised_verdicts_equal_fresh_ones():
  memo = scoring.VerdictMemo()
  groups = cases()  # once: the optima's enumeration has a time limit, so a loaded machine
  assert mismatches(memo, groups) == 0  # could list fewer texts on a second call
  assert memo.hits > memo.misses > 0  # repeats were served from the memo
  n = memo.misses
  assert mismatches(memo, groups) == 0 and memo.misses == n  # a second pass: every verdict a hit


def test_a_key_without_the_instance_is_caught():
  """The check above discriminates: one text's verdict differs across instances, so a memo
  keyed by the text alone (or without the rules) fails it."""

  class TextOnly(scoring.VerdictMemo):
    def key(self, task, instance_id, compat, text):
      return (task, compat, text)

  class NoRules(scoring.VerdictMemo):
    def key(self, task, instance_id, compat, text):
      return (task, instance_id, text)

  assert mismatches(TextOnly()) > 0
  assert mismatches(NoRules()) > 0


def test_the_memo_stays_bounded_and_rewards_use_it():
  memo = scoring.VerdictMemo(size=5)
  task, q, texts = cases()[0]
  assert memo.verify_group(task, q, texts, "strict") == [task.verify(q, t) for t in texts]
  assert memo.misses > 5 and len(memo.verify_group(task, q, texts[:1], "strict")) == 1
  assert len(memo) == 5
  before = scoring.VERDICTS.hits
  r1, v1 = rewards.score(task, q, texts)
  r2, v2 = rewards.score(task, q, texts)
  assert scoring.VERDICTS.hits >= before + len(texts)  # the second call: all hits
  assert np.array_equal(r1, r2) and v1 == v2


def fresh_pass_at_k(n, c, k):
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def fresh_max_at_k(scores, k):
  x = np.sort(np.asarray(scores, dtype=float))
  n = len(x)
  total = math.comb(n, k)
  return float(sum(math.comb(i - 1, k - 1) / total * x[i - 1] for i in range(k, n + 1)))


@pytest.mark.parametrize("n", [1, 8, 32, 64])
def test_memoised_pass_at_k_and_max_at_k_are_the_same_floats(n):
  rs = np.random.RandomState(n)
  for c in range(n + 1):
    for k in range(1, n + 1):
      assert scoring.pass_at_k(n, c, k) == fresh_pass_at_k(n, c, k)
  for _ in range(3):
    scores = rs.choice([0.0, 0.5, 0.75, 1.0, 1.25], n) * rs.uniform(0.9, 1.1, n)
    for k in range(1, n + 1):
      assert diversity.max_at_k(scores, k) == fresh_max_at_k(scores, k)
  with pytest.raises(ValueError, match="pass_at_k"):
    scoring.pass_at_k(n, n + 1, 1)
