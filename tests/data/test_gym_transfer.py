"""Transfer evaluation on reasoning-gym tasks: `python -m dmpo_jax.evaluate --gym=...` and
config.tasks="gym-<name>" (the default config of the task, registered on first use)."""

import jax
import numpy as np
import pytest
from absl import app
from absl.testing import flagsaver

pytest.importorskip("reasoning_gym")

from dmpo_jax import evaluate  # noqa: E402
from dmpo_jax.data import domain, gym, pipeline  # noqa: E402
from dmpo_jax.tasks import rewards  # noqa: E402
from dmpo_jax.training import config as config_lib, evaluation  # noqa: E402


@pytest.fixture(autouse=True)
def only_this_tests_domains():
  """The gym domains a test registers are removed after it (the task registry is global)."""
  before = set(domain.names())
  yield
  for key in set(domain.names()) - before:
    domain.unregister(key)


class CharTokenizer:
  pad_token_id, eos_token_id = 0, 1

  def encode(self, text, add_special_tokens=False):
    return [min(ord(c), 5000) + 2 for c in text]

  def decode(self, ids, skip_special_tokens=True):
    return "".join(chr(i - 2) for i in ids if i > 1)


def test_gym_flag_selects_and_registers_the_tasks():
  with flagsaver.flagsaver():
    evaluate.FLAGS(["evaluate", "--gym=countdown,graph_color", "--out=unused"])
    assert evaluate.eval_task_keys() == ["gym-countdown", "gym-graph_color"]
    assert {"gym-countdown", "gym-graph_color"} <= set(domain.names())
  with flagsaver.flagsaver():
    evaluate.FLAGS(["evaluate", "--gym=countdown", "--tasks=TSP", "--out=unused"])
    assert evaluate.eval_task_keys() == ["TSP", "gym-countdown"]
  with flagsaver.flagsaver():
    evaluate.FLAGS(["evaluate", "--gym=basic_arithmetic", "--out=unused"])
    with pytest.raises(app.UsageError, match="basic_arithmetic"):
      evaluate.check_flags()


def test_config_tasks_register_gym_keys():
  from ml_collections import config_dict
  keys = config_lib.task_keys(config_dict.ConfigDict({"tasks": "gym-n_queens+TSP"}))
  assert keys == ["gym-n_queens", "TSP"] and isinstance(domain.get("gym-n_queens"), gym.GymTask)


def test_held_out_gym_instances_score_their_reference():
  """A 'policy' that writes each instance's own answer scores 1 on every held-out instance,
  one that writes nothing scores 0: the evaluation path reads gym tasks end to end."""
  gym.register_keys(["gym-countdown"])
  items = pipeline.TaskSet(["gym-countdown"], "tiny", 0).held_out(3, "tiny")
  tok = CharTokenizer()
  enc = pipeline.PromptEncoder(tok, "compact", 10**4, False)
  answers = {tuple(enc.encode(k, q)): q["answer"] for k, q in items}

  def policy(right):
    def sample_fn(pt, pm, rng):
      rows = []
      for row, m in zip(np.asarray(pt), np.asarray(pm)):
        ids = [int(i) for i, v in zip(row, m) if v]
        text = "Answer: " + (answers[tuple(ids)] if right else "")
        rows += [tok.encode(text) + [1] * (64 - len(text))] * 2
      toks = np.asarray(rows)
      return toks, toks != 1
    return sample_fn

  for right, want in ((True, 1.0), (False, 0.0)):
    res = evaluation.evaluate(policy(right), enc, items, samples=2, k=2, rng=jax.random.key(0),
                              batch_prompts=3, prompt_len=max(len(a) for a in answers),
                              reward_cfg=rewards.RewardConfig())
    s = res["per_task"]["gym-countdown"]
    assert s["QR@2"] == pytest.approx(want) and s["SR@2"] == pytest.approx(want)
