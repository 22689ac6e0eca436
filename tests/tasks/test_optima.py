"""Enumeration of every optimal solution (tasks/optima.py) against brute force."""

import itertools
import math

import pytest

from dmpo_jax import tasks
from dmpo_jax.tasks import optima

SET_TASKS = ("subset-sum", "knapsack", "set-cover", "maximum-set", "maximum_clique_problem")
CYCLE_TASKS = ("TSP", "hamiltonian-cycle")


def _ids(task, q):
  p = task.problem(q)
  if task.key == "subset-sum":
    return sorted(p.values)
  if task.key == "knapsack":
    return sorted(p.items)
  if task.key == "set-cover":
    return sorted(p.sets)
  return list(range(p.n))


def _candidates(task, q, ordered=False):
  """Every answer worth checking: raw lists (all orders when `ordered`), not canonical forms."""
  p = task.problem(q)
  if task.key in SET_TASKS:
    ids = _ids(task, q)
    if task.key == "set-cover":
      yield "Impossible"
    for r in range(len(ids) + 1):
      for sub in itertools.combinations(ids, r):
        yield from (map(list, itertools.permutations(sub)) if ordered else [list(sub)])
  elif task.key == "GCP-D":  # colours 1..4: every colouring with <= 4 colours, all labellings
    yield from map(list, itertools.product(range(1, 5), repeat=p.n))
  else:
    sizes = [p.n] if task.key == "TSP" else range(3, p.n + 1)
    for r in sizes:
      for perm in itertools.permutations(range(p.n), r):
        yield list(perm) + [perm[0]]


def brute_force(task, q, ordered=False):
  """(optimal value, {canonical forms}, number of raw optimal answers) by checking every answer."""
  best, forms, raw = None, set(), 0
  sign = 1 if task.direction == "max" else -1
  for sol in _candidates(task, q, ordered):
    v = task.verify_answer(q, task.format_answer(sol))
    if not v.feasible:
      continue
    if best is None or sign * (v.value - best) > 1e-9:
      best, forms, raw = v.value, set(), 0
    if abs(v.value - best) <= 1e-9:
      forms.add(v.solution)
      raw += 1
  return best, forms, raw


def _check_against_brute_force(key, level, seeds):
  task = tasks.get(key)
  multi = 0
  for seed in seeds:
    q = task.generate(seed, level)
    best, forms, _ = brute_force(task, q)
    opt = task.optimal_solutions(q, limit=1000, time_limit=30.0)
    assert opt.complete, (key, seed, opt.reason)
    assert opt.value == pytest.approx(best), (key, seed)
    assert set(opt.solutions) == forms, (key, seed)          # every optimum, none extra
    assert len(set(opt.solutions)) == len(opt.solutions)     # no duplicates
    multi += len(forms) >= 2
  return multi


@pytest.mark.parametrize("key", tasks.with_optima())
def test_tiny_matches_brute_force(key):
  multi = _check_against_brute_force(key, "tiny", range(6))
  if key not in ("knapsack", "TSP"):  # these rarely have two optima; the rest must show some
    assert multi >= 1, f"{key}: no tiny instance with >= 2 optima among the seeds checked"


@pytest.mark.parametrize("key", ["subset-sum", "set-cover", "maximum_clique_problem"])
def test_easy_matches_brute_force(key):
  _check_against_brute_force(key, "easy", range(5))


def _symmetry_count(key, canon, n_colours=4):
  """How many raw answers one canonical form stands for (the task's symmetry group)."""
  if key in SET_TASKS:
    return 1 if canon == ("Impossible",) else math.factorial(len(canon))
  if key == "GCP-D":
    k = len(set(canon))
    return math.perm(n_colours, k)
  return 2 * len(canon)  # rotations x directions of a cycle with >= 3 vertices


@pytest.mark.parametrize("key", ["maximum-set", "maximum_clique_problem", "subset-sum", "GCP-D",
                                 "TSP", "hamiltonian-cycle"])
def test_canonical_forms_merge_exactly_the_symmetric_duplicates(key):
  task = tasks.get(key)
  for seed in range(4):
    q = task.generate(seed, "tiny")
    _, forms, raw = brute_force(task, q, ordered=True)
    opt = task.optimal_solutions(q)
    assert set(opt.solutions) == forms
    assert raw == sum(_symmetry_count(key, c) for c in opt.solutions), (key, seed)


@pytest.mark.parametrize("key", tasks.with_optima())
def test_format_solution_round_trips(key):
  task = tasks.get(key)
  for seed in range(4):
    for level in ("tiny", "easy"):
      q = task.generate(seed, level)
      for canon in task.optimal_solutions(q, limit=16).solutions:
        text = task.format_solution(canon)
        v = task.verify(q, "Reasoning... Answer: " + text)
        assert v.feasible and v.solution == canon, (key, canon, text, v.reason)


def _instance_with(key, level, at_least):
  task = tasks.get(key)
  for seed in range(200):
    q = task.generate(seed, level)
    opt = task.optimal_solutions(q, limit=64)
    if opt.complete and len(opt) >= at_least:
      return task, q, opt
  raise AssertionError(f"no {key}/{level} instance with {at_least} optima")


def test_limit_counts_distinct_forms_and_marks_incomplete():
  task, q, full = _instance_with("maximum-set", "easy", 4)
  cut = task.optimal_solutions(q, limit=2)
  assert len(cut) == 2 and not cut.complete and "limit" in cut.reason
  assert set(cut.solutions) <= set(full.solutions)
  exact = task.optimal_solutions(q, limit=len(full))
  assert exact.complete and exact.solutions == full.solutions


def test_time_limit_marks_incomplete():
  task = tasks.get("hamiltonian-cycle")
  q = task.generate(1, "easy")  # 4,906 Hamiltonian cycles, about 20 s to list them all
  opt = task.optimal_solutions(q, limit=10**6, time_limit=0.3)
  assert not opt.complete and opt.reason


def test_colour_symmetry_broken_in_the_model():
  """GCP-D: a 4-cycle has exactly one optimal 2-colouring up to relabelling."""
  task = tasks.get("GCP-D")
  q = {"0": [1, 3], "1": [0, 2], "2": [1, 3], "3": [0, 2]}
  opt = task.optimal_solutions(q)
  assert opt.complete and opt.value == 2 and opt.solutions == ((0, 1, 0, 1),)
  assert task.format_solution((0, 1, 0, 1)) == "[1, 2, 1, 2]"


def test_cycle_direction_broken_in_the_model():
  """K4 has three Hamiltonian cycles (each found once, not once per direction)."""
  task = tasks.get("hamiltonian-cycle")
  q = {str(i): [j for j in range(4) if j != i] for i in range(4)}
  opt = task.optimal_solutions(q)
  assert opt.complete and opt.value == 5
  assert opt.solutions == ((0, 1, 2, 3), (0, 1, 3, 2), (0, 2, 1, 3))


def test_set_cover_impossible_is_its_only_optimum():
  task = tasks.get("set-cover")
  q = {"U": [0, 1, 2], "S": {"0": [0], "1": [1]}}
  opt = task.optimal_solutions(q)
  assert opt.solutions == (("Impossible",),) and opt.complete
  assert task.verify_answer(q, task.format_solution(("Impossible",))).solution == ("Impossible",)


def test_sample_optimal_solutions_is_uniform_over_the_set():
  task, q, opt = _instance_with("subset-sum", "easy", 3)
  k = len(opt)
  got = task.sample_optimal_solutions(q, k, seed=1)
  forms = [task.verify_solution(q, s).solution for s in got]
  assert sorted(forms) == list(opt.solutions)  # n = |set|: every optimum exactly once
  more = task.sample_optimal_solutions(q, 3 * k, seed=2)
  assert {task.verify_solution(q, s).solution for s in more} == set(opt.solutions)
  assert task.sample_optimal_solutions(q, k, seed=1) == got  # deterministic in the seed
  orders = {tuple(tuple(s) for s in task.sample_optimal_solutions(q, k, seed=s)) for s in range(20)}
  assert len(orders) > 1


def test_instances_with_optima_filters_by_count():
  task = tasks.get("maximum_clique_problem")
  rows = list(optima.instances_with_optima(task, "tiny", range(12), min_count=2, max_count=3))
  assert rows
  for seed, q, opt in rows:
    assert 2 <= len(opt) <= 3 and opt.complete
    assert q == task.generate(seed, "tiny")
  kept = {seed for seed, _, _ in rows}
  for seed in set(range(12)) - kept:
    n = len(task.optimal_solutions(task.generate(seed, "tiny"), limit=64))
    assert not 2 <= n <= 3


def test_bad_input_is_refused_clearly(monkeypatch):
  task = tasks.get("subset-sum")
  q = task.generate(0, "tiny")
  with pytest.raises(ValueError, match="limit must be an int >= 1"):
    task.optimal_solutions(q, limit=0)
  with pytest.raises(TypeError, match="canonical solution is a tuple"):
    task.format_solution([0, 1])
  with pytest.raises(NotImplementedError, match="meeting-schedule.*supported tasks"):
    tasks.get("meeting-schedule").optimal_solutions(tasks.get("meeting-schedule").generate(0, "tiny"))
  # An enumerator whose forms disagree with the verifier's is caught, not returned.
  task2, q2, _ = _instance_with("subset-sum", "easy", 1)
  assert any(len(c) > 1 for c in task2.optimal_solutions(q2).solutions)
  enum = type(task2).enumerate_optima
  def bad(self, *a):
    sols, complete, value, reason = enum(self, *a)
    return [tuple(reversed(x)) for x in sols], complete, value, reason
  monkeypatch.setattr(type(task2), "enumerate_optima", bad)
  task.problem(q2)._optima.clear()
  with pytest.raises(AssertionError, match="verifies as"):
    task.optimal_solutions(q2)


def test_optima_in_range_with_a_cut_enumeration():
  task = tasks.get("hamiltonian-cycle")
  q = task.generate(0, "easy")  # 212 Hamiltonian cycles
  assert optima.optima_in_range(task, q, 2, limit=8) is None  # incomplete: refused by default
  opt = optima.optima_in_range(task, q, 2, limit=8, require_complete=False)
  assert opt is not None and len(opt) == 8 and not opt.complete
  assert optima.optima_in_range(task, q, 2, 16, limit=8, require_complete=False) is None  # may exceed 16
  assert optima.optima_in_range(task, q, 9, limit=8, require_complete=False) is None


def test_optimal_sft_targets_survive_the_task_tokenizer():
  """What the SFT hook would train on decodes to an optimal answer of the instance."""
  import numpy as np
  from dmpo_jax.data import pipeline
  from dmpo_jax.models import tokenizer as tok_lib
  enc = pipeline.PromptEncoder(tok_lib.build(), "compact", 160)
  for key in tasks.with_optima():
    task = tasks.get(key)
    for seed in range(3):
      q = task.generate(seed, "tiny")
      opt = task.optimal_solutions(q)
      for sol in task.sample_optimal_solutions(q, 4, seed=seed):
        ids = enc.answer_ids(key, sol)
        text = enc.texts(np.array([ids]), np.ones((1, len(ids)), bool))[0]
        v = task.verify(q, text)
        assert v.feasible and v.solution in opt.solutions and v.value == opt.value, (key, text)


def test_a_complete_result_is_reused_for_larger_limits(monkeypatch):
  task, q, full = _instance_with("maximum-set", "easy", 2)
  monkeypatch.setattr(type(task), "enumerate_optima", None)  # would fail if called
  assert task.optimal_solutions(q, limit=10**4, time_limit=1.0) is full


@pytest.mark.parametrize("key", ["maximum-set", "maximum_clique_problem", "GCP-D", "set-cover"])
def test_exhaustive_search_equals_cpsat(key, monkeypatch):
  """Small instances skip CP-SAT (optima.SEARCH_MAX); both paths give the same optima."""
  task = tasks.get(key)
  for level, seeds in (("tiny", range(8)), ("easy", range(3))):
    for seed in seeds:
      fast = task.optimal_solutions(task.generate(seed, level), limit=1000, time_limit=30.0)
      monkeypatch.setattr(optima, "SEARCH_MAX", 0)
      slow = task.optimal_solutions(task.generate(seed, level), limit=1000, time_limit=30.0)
      monkeypatch.undo()
      assert (fast.solutions, fast.complete, fast.value) == (slow.solutions, slow.complete, slow.value), \
          (key, level, seed)
  cut = task.optimal_solutions(task.generate(0, "easy"), limit=1)  # the limit cuts the search too
  assert len(cut.solutions) <= 1
