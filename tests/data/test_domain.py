"""A new task domain, written here through dmpo_jax.data.domain alone, trains end to end (SFT,
RL, evaluation, the evaluation points along RL) with the trainer the NP-Bench tasks use."""

import random
import types

import numpy as np
import pytest

from dmpo_jax.data import domain
from dmpo_jax.training import stages
from tests.helpers import smoke


class BoundedDigits(domain.Task):
  """Write `length` digits, each at most `bound`: (bound + 1) ** length correct answers."""
  key, title, category, direction = "bounded-digits", "Bounded digits", "toy", "max"
  fields = {"length": (int,), "bound": (int,)}

  def _generate(self, rng, level):
    q = {"length": rng.randint(2, 4), "bound": rng.randint(1, 8)}
    return q, self._sample(self._load(q), rng)

  def _load(self, q):
    return types.SimpleNamespace(**q)

  def _check(self, p, digits):
    if len(digits) != p.length:
      raise domain.Infeasible(f"{len(digits)} digits, not {p.length}")
    if not all(0 <= d <= p.bound for d in digits):
      raise domain.Infeasible(f"a digit outside 0..{p.bound}")
    return 1.0, tuple(digits)

  def _sample(self, p, rng):
    return [rng.randint(0, p.bound) for _ in range(p.length)]

  def _reference(self, p, rng, deadline):
    return self._sample(p, rng)

  def _compact(self, p):
    return f"n {p.length} cap {p.bound}"


@pytest.fixture
def task():
  task = domain.register(BoundedDigits())
  yield task
  domain.unregister(task.key)


def test_the_domain_checks_answers(task):
  q = task.generate(0, "tiny")
  good = task.sample_solutions(q, 4, seed=1)
  assert good and all(task.verify_solution(q, s).feasible for s in good)
  assert len({tuple(s) for s in good}) > 1
  assert not task.verify(q, f"Answer: {[q['bound'] + 1] * q['length']}").feasible
  assert not task.verify(q, "Answer: [0]" if q["length"] > 1 else "Answer: [0, 0]").feasible
  assert not task.verify(q, "Answer: 1 + 2").feasible  # not a list: malformed
  with pytest.raises(ValueError, match="taken"):
    domain.register(BoundedDigits())
  with pytest.raises(ValueError, match="cannot be removed"):
    domain.unregister("TSP")


@pytest.mark.slow
def test_the_domain_trains_end_to_end(task, tmp_path):
  """SFT, RL with evaluation points, and the held-out evaluation, through stages.train; the
  domain is reported under its own key and category."""
  cfg = smoke(tasks="bounded-digits", **{
      "model.hidden_size": 64, "model.intermediate_size": 128, "model.num_layers": 2,
      "sft.steps": 150, "sft.lr": 3e-3, "rl.steps": 4, "eval.points": 2, "eval.points_samples": "4",
      "eval.num_per_task": 4, "checkpoint.every": 1000})
  res = stages.train(cfg, str(tmp_path))
  after = res["after"]
  assert set(after["per_task"]) == {"bounded-digits"} and set(after["categories"]) == {"toy"}
  # SFT learnt the domain: 0.44 here (a trial with 60 SFT steps scored 0); a policy that
  # writes the right number of uniform digits but ignores the bound scores 0.27 on average.
  assert res["before"]["overall"]["SR_mean"] > 0.3
  assert np.isfinite(after["overall"]["SR_mean"]) and np.isfinite(after["overall"]["QR@3"])
  assert (tmp_path / "points" / "rl4.json").exists()
