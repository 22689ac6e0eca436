"""Transfer evaluation on reasoning-gym tasks: `python -m dmpo_jax.evaluate --gym=...` and
config.tasks="gym-<name>" (the default config of the task, registered on first use)."""

import jax
import numpy as np
import pytest
from absl import app
from absl.testing import flagsaver

pytest.importorskip("reasoning_gym")

from dmpo_jax import evaluate  # noqa: E402
from dmpo_jax.data import domain, gym, pipeline, splits  # noqa: E402
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
    res = evaluation.evaluate(policy(right), enc, items, rng=jax.random.key(0),
                              spec=evaluation.ScoreSpec(
                                  samples=2, batch_prompts=3, prompt_len=max(len(a) for a in answers),
                                  reward_cfg=rewards.RewardConfig(), k=2))
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
  res = evaluation.evaluate(sample_fn, enc, items, rng=jax.random.key(0),
                            spec=evaluation.ScoreSpec(
                                samples=2, batch_prompts=4, prompt_len=plen,
                                reward_cfg=rewards.RewardConfig(), k=2, pass_ks=(1, 2),
                                collapse=pipeline.Collapse(min_optima=0)))
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
    res = transfer.score(sample_fn, enc, items, rng=jax.random.key(0), ground_truths=gts,
                         spec=evaluation.ScoreSpec(samples=2, batch_prompts=4, prompt_len=plen,
                                                   reward_cfg=rewards.RewardConfig(), k=2,
                                                   pass_ks=(1, 2, 8)))
    for task in ("gym-countdown", "gym-graph_color"):
      s = res["transfer"][task]
      assert set(s) == {"score_mean", "full_rate", "any_credit", "distinct_correct", "length",
                        "pass_full@1", "pass_full@2"}, s
      assert s["score_mean"] == s["full_rate"] == s["pass_full@1"] == s["pass_full@2"] == want
      assert s["distinct_correct"] == want
  with pytest.raises(ValueError, match="subset-sum"):
    transfer.score(sample_fn, enc, [("subset-sum", {})], rng=jax.random.key(0),
                   spec=evaluation.ScoreSpec(samples=2, batch_prompts=4, prompt_len=plen,
                                             reward_cfg=rewards.RewardConfig(), k=2))


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
  assert helpers.config_module("nphard").get_config().eval.transfer == ""  # declared, empty
  smollm2 = helpers.config_module("smollm2_nphard")
  cfg = smollm2.get_config("gguf=" + str(tmp_path))  # the measured pair (studies/gym_transfer)
  assert cfg.eval.transfer.split(",") == [smollm2.GYM_CHAIN_SUM, smollm2.GYM_ARITHMETIC]
  assert set(cfg.eval.transfer.split(",")) <= set(cfg.sft.gym_tasks.split(","))
  assert transfer.config_error(cfg.eval.transfer, cfg.tasks.split(","), cfg.prompt_style,
                               cfg.sft.gym_tasks.split(",")) is None
  for variant in ("smoke", "demo"):  # NP tasks only, as their tests and records are
    cfg = smollm2.get_config(f"gguf={tmp_path},{variant}")
    assert cfg.eval.transfer == cfg.sft.gym_tasks == ""


@pytest.mark.slow
def test_smoke_run_scores_transfer_tasks_before_and_after_rl(tmp_path):
  """A smoke training run with two transfer tasks (one with config fields in its key, one also
  trained in SFT through config.sft.gym_tasks) writes their zero-shot, before-RL and after-RL
  scores and configs into results.json and eval_transfer_*.json, beside NP-Bench's."""
  from dmpo_jax.training import stages
  color = "gym-graph_color:min_num_vertices=4:max_num_vertices=5"
  cfg = helpers.smoke(**{"tasks": "subset-sum", "eval.transfer": f"gym-countdown,{color}",
                         "sft.gym_tasks": "gym-countdown",
                         "eval.zero_shot": True, "eval.transfer_num_per_task": 2,
                         "eval.transfer_samples": 3, "log.plots": False,
                         "checkpoint.export_hf": False})
  workdir = str(tmp_path / "run")
  res = stages.train(cfg, workdir)
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  t = saved["transfer"]
  assert t["tasks"] == ["gym-countdown", color]
  assert t["settings"]["num_per_task"] == 2 and t["settings"]["samples"] == 3
  configs = t["settings"]["task_configs"]
  assert (configs[color]["min_num_vertices"], configs[color]["max_num_vertices"]) == (4, 5)
  assert configs["gym-countdown"]["task"] == "countdown"
  for name in ("zero_shot", "before", "after"):
    assert set(t[name]) == {"gym-countdown", color}
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


# ---------------------------------------------------------------------------
# A task's config in its key: "gym-<name>:<field>=<value>:..." (gym.parse_key), in
# config.eval.transfer, evaluate --gym and studies/gym_transfer/candidates.py.
EASY_SUM = "gym-basic_arithmetic:min_terms=2:max_terms=2:max_digits=1"


def test_a_key_spells_a_task_config_and_bad_fields_are_named():
  assert gym.parse_key("gym-chain_sum") == ("chain_sum", {})
  name, fields = gym.parse_key("gym-basic_arithmetic:max_terms=2:allow_negation=False:"
                               "format_style=natural")
  assert name == "basic_arithmetic" and fields == {"max_terms": 2, "allow_negation": False,
                                                   "format_style": "natural"}
  assert type(fields["max_terms"]) is int and fields["allow_negation"] is False
  assert gym.parse_key("gym-number_sorting:min_value=-5:max_value=5.5")[1] == {"min_value": -5.0,
                                                                              "max_value": 5.5}
  for key, words in (("gym-chain_sum:max_termz=2", "chain_sum field 'max_termz' is unknown"),
                     ("gym-chain_sum:max_terms=two", "chain_sum field max_terms='two': expected an int"),
                     ("gym-chain_sum:max_terms=2.0", "max_terms='2.0': expected an int"),
                     ("gym-chain_sum:allow_negation=yes", "allow_negation='yes': expected true or false"),
                     ("gym-number_sorting:max_value=inf", "max_value='inf': expected a finite number"),
                     ("gym-basic_arithmetic:format_style=fancy", "format_style='fancy': choose one of"),
                     ("gym-basic_arithmetic:operators=-", "field operators (list) cannot be set"),
                     ("gym-chain_sum:size=5", "field 'size' is gym.domain's argument"),
                     ("gym-chain_sum:max_terms=2:max_terms=3", "field 'max_terms' is given twice"),
                     ("gym-chain_sum:max_terms", "'max_terms' is not <field>=<value>"),
                     ("gym-spiral_matrix:n=2", "'spiral_matrix' is not wrapped")):
    with pytest.raises(ValueError) as e:
      gym.parse_key(key)
    assert words in str(e.value) and repr(key) in str(e.value), (key, str(e.value))
  # config.eval.transfer and --gym name themselves, the task and the field; the dataset's own
  # validate() (max_terms < min_terms) is refused up front too
  for value, words in (("gym-countdown,gym-chain_sum:max_termz=2", "chain_sum field 'max_termz'"),
                       ("gym-chain_sum:min_terms=3:max_terms=2", "max_terms must be >= min_terms")):
    why = transfer.config_error(value)
    assert why.startswith(f"config.eval.transfer={value!r}: ") and words in why, why
  with flagsaver.flagsaver():
    evaluate.FLAGS(["evaluate", "--gym=countdown,leg_counting:max_animals=99", "--out=unused"])
    with pytest.raises(app.UsageError, match=r"--gym=leg_counting:max_animals=99: .*max_animals "
                       r"must be <= number of available animals"):
      evaluate.check_flags()
  assert not transfer.unknown("gym-chain_sum:max_terms=2,gym-countdown")
  assert transfer.unknown("gym-spiral_matrix:n=2") == ["gym-spiral_matrix:n=2"]
  assert transfer.parse("gym-chain_sum:max_terms=2+gym-countdown") == ("gym-chain_sum:max_terms=2",
                                                                      "gym-countdown")


def test_two_configs_of_one_task_are_two_tasks():
  """Each config of a task has its own key, task and instance cache; a key never names two
  configs, and config.eval.transfer refuses one config twice and a task trained at any config."""
  gym.register_keys(["gym-chain_sum", "gym-chain_sum:max_terms=2:max_digits=1"])
  full, easy = domain.get("gym-chain_sum"), domain.get("gym-chain_sum:max_terms=2:max_digits=1")
  assert full is not easy and full.config == {"size": 10_000, "seed": 0}
  assert easy.config == {"size": 10_000, "seed": 0, "max_terms": 2, "max_digits": 1}
  assert full.instance(5) != easy.instance(5)
  assert gym.domain("chain_sum", max_terms=2, max_digits=1) is easy  # its default key is the key
  assert gym.domain("chain_sum", max_terms=3).key == "gym-chain_sum:max_terms=3"  # the default key
  with pytest.raises(ValueError, match="spells another config"):
    gym.domain("chain_sum", key="gym-chain_sum:max_terms=4", max_terms=5)
  with pytest.raises(ValueError, match="taken"):
    gym.domain("chain_sum", key="gym-chain_sum", max_terms=5)
  assert domain.get("gym-chain_sum") is full and full.config == {"size": 10_000, "seed": 0}
  assert transfer.config_error("gym-chain_sum,gym-chain_sum:max_terms=2:max_digits=1") is None
  why = transfer.config_error("gym-chain_sum,gym-chain_sum:min_terms=2")  # min_terms' default is 2
  assert "are one config of one task" in why and "config.eval.transfer" in why
  why = transfer.config_error("gym-chain_sum:max_terms=2:max_digits=1,gym-countdown", ["gym-chain_sum"])
  assert "trained on at another config" in why and "['gym-chain_sum'] in config.tasks" in why


def test_a_key_config_reaches_the_held_out_instances():
  """basic_arithmetic with max_terms=2 asks about two one-digit numbers; its default config
  asks about up to six; the held-out questions of each config are distinct."""
  import re
  items, _ = transfer.held_out(["gym-basic_arithmetic", EASY_SUM], 12)
  terms = {k: [len(re.findall(r"\d+", q["question"])) for kk, q in items if kk == k]
           for k in ("gym-basic_arithmetic", EASY_SUM)}
  assert terms[EASY_SUM] == [2] * 12, [q["question"] for k, q in items if k == EASY_SUM]
  assert max(terms["gym-basic_arithmetic"]) > 2
  assert all(len(n) == 1 for k, q in items if k == EASY_SUM for n in re.findall(r"\d+", q["question"]))
  easy = [q["question"] for k, q in items if k == EASY_SUM]
  assert len(set(easy)) == len(easy)  # content-disjoint by question text


def test_transfer_records_each_task_config(tmp_path):
  """eval_transfer_*.json and results.json's "transfer" settings hold each task's whole
  reasoning-gym config, and `transfer.score` (evaluate --gym) its task_configs."""
  keys = (EASY_SUM, "gym-countdown")
  items, _ = transfer.held_out(keys, 2)
  tok = CharTokenizer()
  enc = pipeline.PromptEncoder(tok, "compact", 10**4, False)
  sample_fn, _ = reference_policy(items, tok, enc, width=128)

  def make_sampler(max_new_tokens):
    return lambda params, pt, pm, key: (*sample_fn(pt, pm, key), None)

  spec = transfer.TransferSpec(keys=keys, num_per_task=2, samples=2, k=2, pass_ks=(1, 2),
                               max_new_tokens=128)
  run = transfer.Transfer(spec, str(tmp_path), tok, "compact", False, rewards.RewardConfig(),
                          make_sampler)
  res = run("before", None, jax.random.key(0))
  cfg = res["settings"]["task_configs"][EASY_SUM]
  assert cfg["task"] == "basic_arithmetic"
  assert (cfg["min_terms"], cfg["max_terms"], cfg["max_digits"]) == (2, 2, 1)
  assert cfg["min_digits"] == 1 and cfg["size"] == 10_000 and cfg["seed"] == 0  # defaults too
  assert res["settings"]["task_configs"]["gym-countdown"]["max_numbers"] == 6
  assert res["transfer"][EASY_SUM]["full_rate"] == 1.0
  saved = json.loads((tmp_path / "eval_transfer_before.json").read_text())
  assert saved["settings"]["task_configs"] == res["settings"]["task_configs"]
  assert transfer.results({"before": saved, "after": saved})["settings"]["task_configs"][EASY_SUM] == cfg


@pytest.mark.slow  # builds and samples a tiny model
def test_evaluate_gym_with_config_fields(tmp_path, capsys):
  """evaluate --gym=<name>:<field>=<value>: scored under that key, its config in eval.json; a bad
  field is refused before the model loads (the --hf folder does not exist then)."""
  from dmpo_jax.models import tokenizer as tokenizer_lib
  code, _, err = helpers.run_evaluate([f"--hf={tmp_path}/none", "--gym=chain_sum:max_terms=x",
                                       f"--out={tmp_path}/out"], capsys)
  assert code == 2 and "--gym=chain_sum:max_terms=x: " in err and "max_terms='x': expected an int" in err
  tok = tokenizer_lib.build(str(tmp_path / "model"))
  helpers.tiny_hf(str(tmp_path / "model"), vocab=len(tok))
  spec = "chain_sum:max_terms=2:max_digits=1"
  code, out, err = helpers.run_evaluate([f"--hf={tmp_path}/model", f"--gym={spec}", "--num=2",
                                         "--samples=2", "--k=1", "--max_new_tokens=4",
                                         "--batch_prompts=2", "--style=compact",
                                         f"--out={tmp_path}/out"], capsys)
  assert code == 0, err
  res = json.loads((tmp_path / "out" / "eval.json").read_text())
  assert set(res["transfer"]) == {"gym-" + spec}
  cfg = res["task_configs"]["gym-" + spec]
  assert (cfg["task"], cfg["min_terms"], cfg["max_terms"], cfg["max_digits"]) == ("chain_sum", 2, 2, 1)


# ---------------------------------------------------------------------------
# config.sft.gym_tasks: reasoning-gym tasks in SFT only, their transfer instances kept out.
# leg_counting with one animal once has one question per kind of animal (a few dozen): six
# reserved ones would be drawn again and again by an SFT stream that did not keep them out.
LEGS = "gym-leg_counting:min_animals=1:max_animals=1:max_instances=1"


def test_sft_gym_tasks_are_mixed_into_sft_only_and_skip_the_transfer_instances():
  """SFT cycles through config.tasks then the SFT-only tasks (rows of step s: (s*n + i) mod
  the number of keys), RL through config.tasks alone; the SFT stream redraws the first
  sft_only_reserved held-out instances of each SFT-only task (the transfer evaluation's), which
  it draws otherwise."""
  gym.register_keys([LEGS, "gym-chain_sum:max_terms=2"])
  sft_only = (LEGS, "gym-chain_sum:max_terms=2")

  def stream(reserved):
    ts = pipeline.TaskSet(["subset-sum", "knapsack"], "tiny", 0, held_out_per_task=2,
                          sft_only=sft_only, sft_only_reserved=reserved)
    return ts, [it for s in range(15) for it in ts.train("sft", s, 4)]

  ts, sft = stream(6)
  # 60 rows over a cycle of 4 keys: 15 of each, row j of the stream is key j mod 4
  assert [k for k, _ in sft] == [("subset-sum", "knapsack", *sft_only)[j % 4] for j in range(60)]
  rl = [k for s in range(15) for k, _ in ts.train("rl", s, 4)]
  assert sorted(set(rl)) == ["knapsack", "subset-sum"] and len(rl) == 60
  ident = lambda rows: {splits.instance_id(k, q) for k, q in rows}
  reserved = ident(pipeline.held_out_items([LEGS], 6, "tiny"))
  assert len(reserved) == 6 and reserved == ident(transfer.held_out([LEGS], 6, "tiny")[0])
  assert not ident(sft) & reserved
  _, unreserved = stream(0)  # the same stream without the reservation draws them
  assert ident(unreserved) & reserved


def test_all_tasks_exclude_registered_gym_keys():
  """config.tasks='all' is the NP tasks even after a transfer or SFT-only gym key is registered
  (config checks register them before the trainer reads config.tasks): RL never draws them."""
  from ml_collections import config_dict
  gym.register_keys(["gym-chain_sum:max_terms=2"])
  keys = config_lib.task_keys(config_dict.ConfigDict({"tasks": "all"}))
  assert keys == [k for k in domain.names() if not k.startswith("gym-")] and len(keys) == 10


def test_sft_gym_tasks_field_is_checked_before_anything_is_written(tmp_path):
  """config.sft.gym_tasks: an unknown task or field, a key named twice, a task of config.tasks,
  optimal SFT targets, a fixed pool, and a transfer task at another config are refused in one
  line naming the field, before the workdir is written."""
  from dmpo_jax.training import run as run_lib
  cases = (({"sft.gym_tasks": "gym-spiral_matrix"}, r"config\.sft\.gym_tasks=.*spiral_matrix"),
           ({"sft.gym_tasks": "chain_sum"}, r"config\.sft\.gym_tasks='chain_sum': must be"),
           ({"sft.gym_tasks": "gym-chain_sum:max_termz=2"}, r"config\.sft\.gym_tasks=.*max_termz"),
           ({"sft.gym_tasks": "gym-chain_sum+gym-chain_sum"}, r"config\.sft\.gym_tasks=.*more than once"),
           ({"sft.gym_tasks": "gym-chain_sum,gym-chain_sum:min_terms=2"},
            r"config\.sft\.gym_tasks=.*one config of one task"),
           ({"sft.gym_tasks": "gym-chain_sum:max_terms=2", "tasks": "subset-sum,gym-chain_sum"},
            r"config\.sft\.gym_tasks=.*tasks of config\.tasks"),
           ({"sft.gym_tasks": "gym-chain_sum", "sft.targets": "optimal"},
            r"config\.sft\.gym_tasks=.*sft\.targets='optimal'"),
           ({"sft.gym_tasks": "gym-chain_sum", "eval.transfer": "gym-chain_sum:max_terms=2"},
            r"config\.eval\.transfer=.*trained in SFT at another config"))
  for over, pattern in cases:
    cfg = helpers.smoke(**over)
    with pytest.raises((config_lib.ConfigError, ValueError), match=pattern):
      run_lib.setup(cfg, str(tmp_path / "w"))
    assert not os.path.exists(tmp_path / "w"), over
  assert "not reasoning-gym tasks" in transfer.sft_error("chain_sum")
  gym.register_keys(["gym-chain_sum"])
  with pytest.raises(ValueError, match=r"config\.sft\.gym_tasks=.*config\.collapse\.pool"):
    pipeline.TaskSet(["TSP"], "tiny", 0, pool=4, sft_only=("gym-chain_sum",))
  with pytest.raises(ValueError, match=r"config\.sft\.gym_tasks: \['TSP'\] are in config\.tasks"):
    pipeline.TaskSet(["TSP"], "tiny", 0, sft_only=("TSP",))
  assert transfer.sft_error("gym-chain_sum,gym-letter_counting", ["TSP"]) is None
  for check, field in ((transfer.sft_error, "config.sft.gym_tasks"), (transfer.config_error, "config.eval.transfer")):
    why = check("gym-chain_sum", ["TSP"], style="image")  # gym prompts are text
    assert why.startswith(f"{field}='gym-chain_sum': reasoning-gym prompts are text") and "'image'" in why
  assert transfer.config_error("gym-chain_sum", ["TSP"], sft_keys=("gym-chain_sum",)) is None
  cfg = helpers.smoke()  # a workdir saved before the field existed resumes unchanged
  saved = config_lib.config_json(cfg)
  del saved["sft"]["gym_tasks"]
  assert config_lib.config_changes(saved, cfg) == {}


def test_dry_run_shows_the_sft_mix_and_disjoint_transfer_instances(tmp_path):
  """--dry_run's instances.json with SFT-only gym tasks that are also transfer tasks: their
  rows are in "sft" (one in every len(tasks) + len(gym_tasks)), none in "rl", and "transfer"
  (the transfer evaluation's instances) shares none with either; the checks say so."""
  from dmpo_jax.data import instances
  from dmpo_jax.training import specs
  both = f"{LEGS},gym-chain_sum:max_terms=2"
  cfg = helpers.smoke(**{"tasks": "subset-sum,knapsack", "sft.gym_tasks": both,
                         "eval.transfer": both, "sft.steps": 15, "sft.batch_size": 8,
                         "sft.solutions_per_instance": 2, "rl.steps": 5})
  config_lib.check_fields(cfg)
  res = instances.write(specs.instances_spec(cfg),
                        specs.taskset(cfg, config_lib.task_keys(cfg)), str(tmp_path))
  sft_keys = [k for k, _ in res["sft"]]
  assert len(sft_keys) == 60 and sum(k.startswith("gym-") for k in sft_keys) == 30
  assert sft_keys.count(LEGS) == 15 and not any(k.startswith("gym-") for k, _ in res["rl"])
  assert [k for k, _ in res["transfer"]] == [LEGS] * 6 + ["gym-chain_sum:max_terms=2"] * 6
  assert res["checks"] == {"eval_distinct": True, "sft_eval_shared": 0, "rl_eval_shared": 0,
                           "rl_sft_only_rows": 0, "sft_transfer_shared": 0,
                           "rl_transfer_shared": 0, "rl_transfer_rows": 0, "disjoint": True}
  assert "transfer: 12 rows, 12 distinct" in instances.summary(res)
  with open(tmp_path / "instances.json") as f:
    assert json.load(f)["checks"]["disjoint"]


def test_demo_table_reads_finished_runs_and_names_the_rest(tmp_path, capsys):
  """studies/gym_transfer/demo_table.py: per label, NP-Bench's SR@3 and each transfer task's
  full rate at the three evaluations, and the median regulariser / policy-gradient norm ratio
  of the RL rows that logged one; a run without results.json is named, not filled in."""
  from studies.gym_transfer import demo, demo_table
  assert demo.DESIGN.baseline == "grpo" and demo.SETTINGS["dmpo-20"]["rl.objective.dm_coef"] == 20.0
  tasks = ["gym-chain_sum", "gym-letter_counting"]
  for label, rate, ratios in (("grpo", 0.5, []), ("dmpo-20", 0.25, [0.1, 0.3, float("nan"), 0.2])):
    d = tmp_path / label / "seed0"
    d.mkdir(parents=True)
    stage = lambda sr, fr: ({"overall": {"SR@3": sr, "QR@3": sr / 2}}, {t: {"full_rate": fr, "score_mean": fr}
                                                                      for t in tasks})
    res = {"transfer": {"tasks": tasks}}
    for name, sr in (("zero_shot", 0.0), ("before", 0.4), ("after", 0.6)):
      res[name], res["transfer"][name] = stage(sr, rate)
    (d / "results.json").write_text(json.dumps(res))
    rows = [{"stage": "sft", "step": 1}] + [{"stage": "rl", "step": 2 + i, "grad_ratio": r}
                                            for i, r in enumerate(ratios)] + [{"stage": "rl", "step": 9}]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  (tmp_path / "dph_f" / "seed0").mkdir(parents=True)  # not finished
  res = json.loads((tmp_path / "grpo" / "seed0" / "results.json").read_text())
  del res["zero_shot"], res["transfer"]["zero_shot"]  # made by the seed's SFT stage, kept there
  (tmp_path / "grpo" / "seed0" / "results.json").write_text(json.dumps(res))
  (tmp_path / "_sft" / "seed0").mkdir(parents=True)
  (tmp_path / "_sft" / "seed0" / "eval_zero_shot.json").write_text(json.dumps({"overall": {"SR@3": 0.05}}))
  (tmp_path / "_sft" / "seed0" / "eval_transfer_zero_shot.json").write_text(
      json.dumps({"transfer": {t: {"full_rate": 0.125, "score_mean": 0.125} for t in tasks}}))
  assert demo_table.main([str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert "dph_f/seed0: not finished" in out and "| dph_f" not in out
  lines = [l for l in out.splitlines() if l.startswith("| ")]
  assert "gym-letter_counting full rate / mean score" in lines[0]
  dm_after = next(l for l in lines if l.startswith("|  | after") and "0.250 / 0.250" in l)
  assert "0.200 (0.100-0.300, n=3)" in dm_after  # the NaN row left out of the median
  assert any(l.startswith("| grpo | zero_shot | 0.050 |") and "0.125 / 0.125" in l for l in lines)
  grpo_rows = [l for l in lines if "0.500 / 0.500" in l]
  assert len(grpo_rows) == 2 and "not logged" in grpo_rows[-1] and "| 0.600 | 0.300 |" in grpo_rows[-1]
  assert demo_table.main([str(tmp_path / "nowhere")]) == 2
