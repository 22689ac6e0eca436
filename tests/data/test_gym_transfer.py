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
    evaluate.FLAGS(["evaluate", "--gym=spiral_matrix", "--out=unused"])
    with pytest.raises(app.UsageError, match="spiral_matrix"):
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


# ---------------------------------------------------------------------------
# Transfer tasks of a training config (config.eval.transfer; training/transfer.py) and the
# collapse metrics of gym tasks (no enumerated optima: no coverage, never NaN).
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

from dmpo_jax.tasks import scoring  # noqa: E402
from dmpo_jax.training import transfer  # noqa: E402
from tests import helpers  # noqa: E402


def reference_policy(items, tok, enc, right=True, width=64):
  """A sample_fn that writes each gym instance's own answer (right) or nothing."""
  answers = {tuple(enc.encode(k, q)): q.get("answer", "") if isinstance(q, dict) else ""
             for k, q in items}

  def sample_fn(pt, pm, rng):
    rows = []
    for row, m in zip(np.asarray(pt), np.asarray(pm)):
      ids = [int(i) for i, v in zip(row, m) if v]
      text = "Answer: " + (answers.get(tuple(ids), "") if right else "")
      rows += [tok.encode(text)[:width] + [1] * (width - len(text))] * 2
    toks = np.asarray(rows)
    return toks, toks != 1
  return sample_fn, max(len(a) for a in answers)


def finite_everywhere(tree, where=""):
  """The paths of NaN or infinite numbers in a nested dict of scores."""
  if isinstance(tree, dict):
    return [p for k, v in tree.items() for p in finite_everywhere(v, f"{where}/{k}")]
  if isinstance(tree, (int, float)) and not isinstance(tree, bool):
    return [] if math.isfinite(tree) else [where]
  return []


def test_gym_collapse_metrics_leave_coverage_out_and_count_full_scores():
  """With the collapse metrics on, a gym task (no enumerated optima) reports the full-score
  metrics (optimal rate, pass_optimal@k, distinct correct answers) and no coverage, not NaN;
  an enumerated NP task beside it keeps its coverage in its task and category, and no mean
  (category, overall) averages a missing or NaN coverage in."""
  gym.register_keys(["gym-countdown"])
  items = pipeline.TaskSet(["gym-countdown", "subset-sum"], "tiny", 0).held_out(2, "tiny")
  tok = CharTokenizer()
  enc = pipeline.PromptEncoder(tok, "compact", 10**4, False)
  sample_fn, plen = reference_policy(items, tok, enc)
  res = evaluation.evaluate(sample_fn, enc, items, samples=2, k=2, pass_ks=(1, 2),
                            rng=jax.random.key(0), batch_prompts=4, prompt_len=plen,
                            reward_cfg=rewards.RewardConfig(), collapse=pipeline.Collapse(min_optima=0))
  g = res["per_task"]["gym-countdown"]
  assert "coverage" not in g
  assert g["optimal_rate"] == 1.0 and g["pass_optimal@1"] == 1.0 and g["pass_optimal@2"] == 1.0
  assert g["distinct_optimal"] == 1.0  # both samples write the same correct answer
  assert "coverage" in res["per_task"]["subset-sum"] and "coverage" in res["categories"]["selection"]
  assert "coverage" not in res["categories"]["gym"] and "coverage" not in res["overall"]
  assert finite_everywhere({k: res[k] for k in ("per_task", "categories", "overall")}) == []
  assert res["correct"]["optimal"]["gym-countdown"] == [[True, True], [True, True]]


def test_aggregate_keeps_a_metric_only_where_every_problem_has_it():
  agg = scoring.aggregate([{"a": 1.0, "c": 1.0}, {"a": 0.0}, {"a": 1.0, "c": 0.5}], ["x", "x", "y"])
  assert agg["categories"] == {"x": {"a": 0.5}, "y": {"a": 1.0, "c": 0.5}}
  assert agg["overall"] == {"a": 0.75}


def test_transfer_score_summarises_full_scores():
  """transfer.score (what a training run's transfer tasks and `evaluate --gym` use): the
  reference policy scores 1 everywhere, an empty one 0; NP tasks are refused."""
  gym.register_keys(["gym-countdown", "gym-graph_color"])
  items, gts = transfer.held_out(["gym-countdown", "gym-graph_color"], 2)
  assert gts == [1.0] * 4
  tok = CharTokenizer()
  enc = pipeline.PromptEncoder(tok, "compact", 10**4, False)
  for right, want in ((True, 1.0), (False, 0.0)):
    sample_fn, plen = reference_policy(items, tok, enc, right, width=128)
    res = transfer.score(sample_fn, enc, items, samples=2, k=2, pass_ks=(1, 2, 8),
                         rng=jax.random.key(0), batch_prompts=4, prompt_len=plen,
                         reward_cfg=rewards.RewardConfig(), ground_truths=gts)
    for task in ("gym-countdown", "gym-graph_color"):
      s = res["transfer"][task]
      assert set(s) == {"score_mean", "full_rate", "any_credit", "distinct_correct", "length",
                        "pass_full@1", "pass_full@2"}, s
      assert s["score_mean"] == s["full_rate"] == s["pass_full@1"] == s["pass_full@2"] == want
      assert s["distinct_correct"] == want
  with pytest.raises(ValueError, match="subset-sum"):
    transfer.score(sample_fn, enc, [("subset-sum", {})], samples=2, k=2, rng=jax.random.key(0),
                   batch_prompts=4, prompt_len=plen, reward_cfg=rewards.RewardConfig())


def test_transfer_field_is_checked_before_anything_is_written(tmp_path):
  """config.eval.transfer: an unknown or NP task, a task named twice or one trained on is
  refused in one line naming the field, before the workdir is written."""
  from dmpo_jax.training import run as run_lib
  for value, words in (("gym-countdown,gym-spiral_matrix", "gym-spiral_matrix"),
                       ("TSP", "TSP"), ("countdown", "gym-countdown"),
                       ("gym-countdown+gym-countdown", "more than once")):
    cfg = helpers.smoke(**{"eval.transfer": value})
    with pytest.raises(config_lib.ConfigError, match=r"config\.eval\.transfer") as e:
      run_lib.setup(cfg, str(tmp_path / "w"))
    assert words in str(e.value)
  cfg = helpers.smoke(**{"eval.transfer": "gym-countdown", "tasks": "gym-countdown,TSP"})
  with pytest.raises(config_lib.ConfigError, match=r"config\.eval\.transfer.*trained on"):
    run_lib.setup(cfg, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")
  assert transfer.config_error("gym-countdown,gym-graph_color", ["TSP"]) is None
  assert transfer.config_error("") is None
  cfg = helpers.smoke()  # a workdir saved before the fields existed resumes unchanged
  saved = config_lib.config_json(cfg)
  for f in [f for f in saved["eval"] if f.startswith("transfer")]:
    del saved["eval"][f]
  assert config_lib.config_changes(saved, cfg) == {}
  for name in ("nphard", "smollm2_nphard"):  # declared, empty by default
    if name == "smollm2_nphard":
      cfg = helpers.config_module(name).get_config("gguf=" + str(tmp_path))
    else:
      cfg = helpers.config_module(name).get_config()
    assert cfg.eval.transfer == ""


@pytest.mark.slow
def test_smoke_run_scores_transfer_tasks_before_and_after_rl(tmp_path):
  """A smoke training run with two transfer tasks writes their zero-shot, before-RL and
  after-RL scores into results.json and eval_transfer_*.json, beside NP-Bench's."""
  from dmpo_jax.training import stages
  cfg = helpers.smoke(**{"tasks": "subset-sum", "eval.transfer": "gym-countdown,gym-graph_color",
                         "eval.zero_shot": True, "eval.transfer_num_per_task": 2,
                         "eval.transfer_samples": 3, "log.plots": False,
                         "checkpoint.export_hf": False})
  workdir = str(tmp_path / "run")
  res = stages.train(cfg, workdir)
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  t = saved["transfer"]
  assert t["tasks"] == ["gym-countdown", "gym-graph_color"]
  assert t["settings"]["num_per_task"] == 2 and t["settings"]["samples"] == 3
  for name in ("zero_shot", "before", "after"):
    assert set(t[name]) == {"gym-countdown", "gym-graph_color"}
    for s in t[name].values():
      assert {"score_mean", "full_rate", "pass_full@1", "pass_full@3", "distinct_correct"} <= set(s)
      assert 0.0 <= s["score_mean"] <= 1.0
    assert os.path.exists(os.path.join(workdir, f"eval_transfer_{name}.json"))
  assert finite_everywhere({n: t[n] for n in ("zero_shot", "before", "after")}) == []
  assert "gym-countdown" not in saved["after"]["per_task"]  # beside NP-Bench, not in it
  assert res["transfer"] == t


def test_candidates_study_commands_and_table(tmp_path):
  """studies/gym_transfer/candidates.py: a .gguf is scored through --hf in the chat template, a
  workdir through --workdir in its own format; the table orders tasks by their best full-score
  rate and marks the ones a policy partly solves."""
  from studies.gym_transfer import candidates
  args = candidates.argparse.Namespace(tasks="countdown", num=2, samples=2, temperature=0.7,
                                       level="medium", max_new_tokens=8, batch_prompts=2,
                                       style="compact", seed=0, chat="auto")
  gguf = candidates.evaluate_command("m.gguf", args, "out")
  assert "--hf=m.gguf" in gguf and "--chat" in gguf and "--gym=countdown" in gguf and "--k=2" in gguf
  wd = tmp_path / "wd"
  (wd / "checkpoints").mkdir(parents=True)
  (wd / "config.json").write_text("{}")
  cmd = candidates.evaluate_command(str(wd), args, "out")
  assert f"--workdir={wd}" in cmd and "--chat" not in cmd
  summary = {"score_mean": 0.5, "full_rate": 0.25, "pass_full@1": 0.25, "pass_full@2": 0.5,
             "any_credit": 1.0, "distinct_correct": 1.0, "length": 9.0}
  none = dict(summary, score_mean=0.0, full_rate=0.0, **{"pass_full@1": 0.0, "pass_full@2": 0.0})
  results = {"p": {"tasks": {"a": candidates.row(none), "b": candidates.row(summary)}}}
  lines = candidates.table(results, ["a", "b"]).splitlines()
  assert lines[2].startswith("| b | p | 0.500 | 0.250 | 0.250 | 0.500 |") and lines[2].endswith("yes |")
  assert lines[3].startswith("| a | p |") and not lines[3].endswith("yes |")
