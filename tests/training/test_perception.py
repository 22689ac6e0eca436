"""The perception stage (training/perception.py): the first SFT steps of an image policy
transcribe its instances; checked refusals, its own learning rate, its evaluation file, and
an exact resume inside it."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from dmpo_jax.training import config as config_lib
from dmpo_jax.training import perception, stages
from dmpo_jax.training.steps import make_optimizer
from tests.helpers import REPO, config_module, metric_rows, override, production_xla_env, saved_state

mm_nphard = config_module("mm_nphard")
# Two perception steps, one task-SFT step, one RL step; two tasks, a checkpoint every step.
DRILL = {"perception.steps": 2, "sft.steps": 3, "rl.steps": 1, "checkpoint.every": 1,
         "checkpoint.export_hf": False, "log.plots": False, "log.tensorboard": False,
         "eval.num_per_task": 2, "eval.modalities": ("image",)}


def cfg_of(**over):
  return override(mm_nphard.get_config("smoke,tasks=subset-sum+GCP-D"), **over)


def test_the_schedule_opens_with_the_stage_rate():
  """lead=(steps, lr, warmup): warmup to the stage's rate, constant to its end, then SFT's own
  warmup from 0."""
  opt = make_optimizer(1e-3, 10, 2, 1.0, lead=(4, 5e-2, 2))
  params = {"w": np.ones(3, np.float32)}
  state = opt.init(params)
  moves = []
  for _ in range(7):  # a constant gradient: Adam's step size is the rate
    upd, state = opt.update({"w": np.ones(3, np.float32)}, state, params)
    moves.append(float(-upd["w"][0]))
  np.testing.assert_allclose(moves[:4], [0.0, 2.5e-2, 5e-2, 5e-2], rtol=1e-4)
  np.testing.assert_allclose(moves[4:6], [0.0, 5e-4], rtol=1e-3)  # SFT's warmup restarts at 0


@pytest.mark.parametrize("over, match", [
    ({"perception.steps": 5, "sft.steps": 3}, "exceeds config.sft.steps"),
    ({"prompt_style": "compact", "perception.steps": 2}, "needs image prompts"),
])
def test_bad_perception_configs_are_refused(over, match):
  from dmpo_jax.training.run import objective_from_config
  from dmpo_jax.parallel import sharding
  c = cfg_of(**over)
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.check_config(c, objective_from_config(c), sharding.make_mesh(dict(c.mesh)))


@pytest.mark.slow
def test_resume_inside_the_stage_is_exact(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  stages.train(cfg_of(**DRILL), str(a))
  assert stages.train(cfg_of(**DRILL, stop_at_step=1), str(b)) == {"stopped": True, "step": 1}
  stages.train(cfg_of(**DRILL), str(b))
  for x, y in zip(jax.tree.leaves(saved_state(a, 4)), jax.tree.leaves(saved_state(b, 4))):
    np.testing.assert_array_equal(x, y)
  ra, rb = metric_rows(a), metric_rows(b)
  assert [r["stage"] for r in ra] == ["perception", "perception", "sft", "rl"]
  assert ra == rb
  pa, pb = (json.load(open(w / "perception.json")) for w in (a, b))
  assert pa == pb and pa["steps"] == 2 and set(pa["per_task"]) == {"subset-sum", "GCP-D"}
  for mod in ("image", "blank"):
    assert 0.0 <= pa["overall"][mod]["token_accuracy"] <= 1.0 and pa["overall"][mod]["n"] == 4
  # a stop at the stage's last step still writes its evaluation (the stop comes after it)
  c = tmp_path / "c"
  assert stages.train(cfg_of(**DRILL, stop_at_step=2), str(c)) == {"stopped": True, "step": 2}
  assert json.load(open(c / "perception.json")) == pa


def test_blind_bound_is_the_best_fixed_transcription():
  """No transcription that is the same for every instance beats the bound, and one reaches it."""
  targets = [[1, 2, 9], [1, 3, 9, 9], [4, 2]]
  assert perception.blind_bound(targets) == pytest.approx((1 / 3 + 1 / 4 + 1 / 3 + 1 / 2 + 1 / 3 + 1 / 4
                                                           + 1 / 4) / 3)
  rng = np.random.default_rng(0)
  targets = [list(rng.integers(0, 4, rng.integers(2, 7))) for _ in range(12)]
  bound = perception.blind_bound(targets)
  best = 0.0
  for _ in range(3000):
    fixed = list(rng.integers(0, 4, 6))
    best = max(best, np.mean([perception.score("subset-sum", {}, t, fixed, "")[0] for t in targets]))
  assert best <= bound + 1e-12 and best > 0.8 * bound
  with pytest.raises(ValueError, match="at least one target"):
    perception.blind_bound([])


@pytest.mark.slow
def test_the_stage_reads_the_image_past_the_blind_bound(tmp_path):
  """A smoke setting (maximum clique alone, the default tower and language model, 400 steps
  of 16): the transcriptions from the image beat the best that any transcription ignoring
  the image can score on the same held-out instances (`blind_bound`, which a blank-image
  policy cannot pass: its greedy transcription is the same for every instance). A tower
  that does not read fails this (with the CLIP pixel statistics: 0.54 against 0.54 on the
  ten tasks, docs/MULTIMODAL.md). On the 2-core CPU: 0.928 against 0.801 (seed 0). Trained in a
  subprocess at XLA's default optimisation (`production_xla_env`): at the suite's -O0 the same
  seed ends at 0.847, inside the margin, since a trained policy depends on the rounding."""
  over = {"perception.steps": 400, "sft.steps": 401, "rl.steps": 0, "stop_at_step": 400,
          "sft.batch_size": 16, "eval.num_per_task": 16, "perception.max_new_tokens": 48,
          "checkpoint.export_hf": False, "log.plots": False, "log.tensorboard": False,
          "log.progress": False}
  code = ("import json, sys\n"
          "from tests.helpers import config_module, override\n"
          "from dmpo_jax.training import stages\n"
          "c = override(config_module('mm_nphard').get_config('tasks=maximum_clique_problem'), **json.loads(sys.argv[1]))\n"
          "print(json.dumps(stages.train(c, sys.argv[2])))\n")
  r = subprocess.run([sys.executable, "-c", code, json.dumps(over), str(tmp_path)], cwd=REPO,
                     env=production_xla_env(), capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.loads(r.stdout.strip().splitlines()[-1]) == {"stopped": True, "step": 400}
  res = json.load(open(tmp_path / "perception.json"))
  o = res["overall"]
  assert o["image"]["n"] == 16
  assert o["blank"]["token_accuracy"] <= o["blind_bound"] + 1e-9  # the bound holds for the blank
  assert o["image"]["token_accuracy"] > o["blind_bound"] + 0.05, o
  assert o["image"]["exact"] > 0 and o["blank"]["exact"] == 0


def test_with_bounds_fills_an_older_file_from_the_runs_config(tmp_path):
  """A perception.json written before the bound existed gets the bound of the run's own
  held-out instances (from its config.json), equal to what evaluate would have written."""
  from dmpo_jax.data import images
  from dmpo_jax.models import build
  from dmpo_jax.training import specs
  c = cfg_of(**{"eval.num_per_task": 3})
  (tmp_path / "config.json").write_text(json.dumps(c.to_dict()))
  old = {"steps": 2, "overall": {"image": {}}, "per_task": {"subset-sum": {}, "GCP-D": {}}}
  got = config_lib.with_bounds(old, str(tmp_path))
  _, processor = build.vlm_config(specs.model_spec(c))
  items = specs.taskset(c, ["subset-sum", "GCP-D"]).held_out(3)
  want = perception.bounds(images.make_encoder(specs.encoder_spec(c), processor), items,
                           int(c.perception.max_new_tokens))
  assert got["overall"]["blind_bound"] == pytest.approx(want["overall"])
  assert {k: v["blind_bound"] for k, v in got["per_task"].items()} == pytest.approx(want["per_task"])
  assert 0 < want["overall"] < 1
