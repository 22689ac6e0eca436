"""Mode-collapse metrics (tasks/diversity.py) against hand-computed cases and brute force."""

import itertools
import math

import numpy as np
import pytest

from dmpo_jax import tasks
from dmpo_jax.tasks import diversity, scoring

# A group of 8 samples: forms a, b are optimal (value 3), c is feasible but worse, None infeasible.
SOLS = ["a", "a", "a", "b", "c", None, "c", "a"]
VALS = [3.0, 3.0, 3.0, 3.0, 2.0, None, 2.0, 3.0]


def test_optimal_mask_and_group_metrics_hand_computed():
  opt = diversity.optimal_mask(VALS, 3.0)
  assert opt.tolist() == [True, True, True, True, False, False, False, True]
  assert not diversity.optimal_mask(VALS, None).any()
  m = diversity.group_metrics(SOLS, VALS, 3.0, optimal_set=["a", "b", "d"])
  # optimal samples: a x4, b x1 -> p = (0.8, 0.2)
  h = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))
  assert m == pytest.approx({"feasible_rate": 7 / 8, "optimal_rate": 5 / 8, "distinct_feasible": 3,
                             "distinct_optimal": 2, "entropy_optimal": h, "num_optima": 3,
                             "coverage": 2 / 3})


def test_entropy_over_optima_normalised():
  opt = [True] * 4
  assert diversity.optimal_entropy(["x", "y", "x", "y"], opt, num_optima=2) == pytest.approx(1.0)
  assert diversity.optimal_entropy(["x", "y", "x", "y"], opt, num_optima=4) == pytest.approx(0.5)
  assert diversity.optimal_entropy(["x"] * 4, opt) == 0.0
  assert diversity.optimal_entropy(["x"] * 4, [False] * 4) == 0.0
  assert math.isnan(diversity.optimal_entropy(["x"] * 4, opt, num_optima=1))


def test_distinct_and_coverage_ignore_non_optimal_forms():
  assert diversity.distinct_optimal(["a", "b", "c"], [True, False, True]) == 2
  assert diversity.coverage(["a", "b", None], ["b", "z"]) == 0.5
  assert math.isnan(diversity.coverage(["a"], []))
  with pytest.raises(ValueError, match="one optimality flag per solution"):
    diversity.distinct_optimal(["a", "b"], [True])


def _brute_pass(row, k):
  subsets = list(itertools.combinations(row, k))
  return sum(any(s) for s in subsets) / len(subsets)


def _brute_max(row, k):
  subsets = list(itertools.combinations(row, k))
  return sum(max(s) for s in subsets) / len(subsets)


def test_pass_at_k_curve_matches_brute_force_over_subsets():
  rng = np.random.default_rng(0)
  correct = rng.random((5, 9)) < np.array([[0.0], [0.1], [0.4], [0.8], [1.0]])
  ks = [1, 2, 3, 5, 9, 10]
  curve = diversity.pass_at_k_curve(correct, ks)
  for j, k in enumerate(ks[:-1]):
    assert curve[j] == pytest.approx(np.mean([_brute_pass(r, k) for r in correct]), abs=1e-12)
  assert math.isnan(curve[-1])  # k > n
  assert np.all(np.diff(curve[:-1]) >= -1e-12)  # pass@k never falls with k


def test_qr_at_k_matches_brute_force_and_reduces_to_pass_at_k():
  rng = np.random.default_rng(1)
  ratios = rng.random((4, 8)) * (rng.random((4, 8)) < 0.7)  # some infeasible (0)
  ratios[0, 3] = ratios[0, 5]  # ties
  ks = list(range(1, 9))
  curve = diversity.qr_at_k_curve(ratios, ks)
  for j, k in enumerate(ks):
    assert curve[j] == pytest.approx(np.mean([_brute_max(r, k) for r in ratios]), abs=1e-12)
  assert curve[0] == pytest.approx(ratios.mean())  # QR@1 = mean ratio
  binary = ratios > 0.5
  np.testing.assert_allclose(diversity.qr_at_k_curve(binary.astype(float), ks),
                             diversity.pass_at_k_curve(binary, ks), atol=1e-12)


def test_default_curve_is_k_1_to_64():
  correct = np.zeros((2, 64), bool)
  correct[0, 7] = True
  curve = diversity.pass_at_k_curve(correct)
  assert curve.shape == (64,)
  assert curve[0] == pytest.approx(0.5 / 64) and curve[-1] == pytest.approx(0.5)


def test_keep_and_exploration_hard_split_at_exactly_k_samples():
  # 4 problems, 8 samples each: base solves problems 0, 1 (some correct sample), fails 2, 3.
  base = np.zeros((4, 8), bool)
  base[0, 2] = base[1, :] = True
  trained = np.zeros((4, 8), bool)
  trained[1, 0] = trained[2, 5] = True  # keeps problem 1 (not 0), explores problem 2 (not 3)
  got = diversity.keep_and_exploration(base, trained, k=8)
  assert got == {"keep_rate": 0.5, "exploration_rate": 0.5, "base_solved": 2.0}
  old = scoring.keep_and_exploration(base.any(1), trained.any(1))  # the hard split, same numbers
  assert (got["keep_rate"], got["exploration_rate"]) == (old["keep_rate"], old["exploration_rate"])


def test_keep_and_exploration_soft_split_hand_computed():
  # n = 9 samples, k = 8: one correct sample gives pass@8 = 1 - C(8,8)/C(9,8) = 8/9.
  base = np.zeros((2, 9), bool)
  base[0, 0] = True          # pb = (8/9, 0)
  trained = np.ones((2, 9), bool)
  trained[1, :] = False      # pt = (1, 0)
  got = diversity.keep_and_exploration(base, trained, k=8)
  assert got["base_solved"] == pytest.approx(8 / 9)
  assert got["keep_rate"] == pytest.approx(1.0)
  # exploration = ((1/9) * 1 + 1 * 0) / (1/9 + 1) = 0.1
  assert got["exploration_rate"] == pytest.approx(0.1)
  with pytest.raises(ValueError, match="needs >= 8 samples"):
    diversity.keep_and_exploration(base[:, :4], trained, k=8)
  with pytest.raises(ValueError, match="different problem counts"):
    diversity.keep_and_exploration(base, trained[:1], k=8)


def test_metrics_on_real_verdicts_with_enumerated_optima():
  """End to end: verdicts of optimal and worse answers of a real instance."""
  task = tasks.get("maximum-set")
  q = next(q for q in (task.generate(s, "easy") for s in range(50))
           if len(task.optimal_solutions(q)) >= 3)
  opt = task.optimal_solutions(q)
  texts = [task.format_solution(opt.solutions[0])] * 3 + [task.format_solution(opt.solutions[1])]
  texts += ["[0, 0]", task.format_solution(opt.solutions[0][:1])]  # infeasible, feasible non-optimal
  verdicts = [task.verify_answer(q, t) for t in texts]
  m = diversity.group_metrics([v.solution for v in verdicts], [v.value for v in verdicts],
                              opt.value, opt.solutions)
  assert m["distinct_optimal"] == 2 and m["distinct_feasible"] == 3
  assert m["optimal_rate"] == pytest.approx(4 / 6) and m["feasible_rate"] == pytest.approx(5 / 6)
  assert m["coverage"] == pytest.approx(2 / len(opt))
