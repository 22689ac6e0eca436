"""benchmarks/trl_step.py and benchmarks/sampler.py against the peers: the logic that picks each
side's best and its ratio, and the refusals, without running a model."""

import os
import sys

import pytest
from tests.helpers import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import sampler  # noqa: E402
import trl_step  # noqa: E402


def _run(side, precision, checkpointing, step_s, **extra):
  return dict(side=side, precision=precision, checkpointing=checkpointing, step_s=step_s,
              rollout_reward_s=step_s / 4, update_s=3 * step_s / 4, peak_rss_gib=1.0, **extra)


RESULTS = {
    "ours_float32": _run("ours", "float32", False, 10.0),
    "ours_bfloat16": _run("ours", "bfloat16", False, 8.0),
    "trl_float32": _run("trl", "float32", True, 20.0),
    "trl_bfloat16": _run("trl", "bfloat16", True, 16.0),
    "trl_float32_no_checkpointing": _run("trl", "float32", False, 18.0),
    "trl_bfloat16_no_checkpointing": {"side": "trl", "precision": "bfloat16", "checkpointing": False,
                                      "error": "resident memory 15.0 GiB > --max_rss_gib=14.0"},
}


def test_summary_takes_each_sides_best_and_same_precision_speedups():
  s = trl_step.summarize(RESULTS)
  # ours' best is bfloat16 (8 s); TRL's best any variant is bfloat16 with checkpointing (16 s);
  # the failed variant (no time) is left out, not taken as 0.
  assert (s["best_ours"], s["best_trl"]) == ("ours_bfloat16", "trl_bfloat16")
  assert s["speedup_best"] == pytest.approx(16.0 / 8.0)
  assert s["speedup_float32"] == pytest.approx(18.0 / 10.0)  # TRL float32's best: no checkpointing
  assert s["speedup_bfloat16"] == pytest.approx(16.0 / 8.0)


def test_summary_without_a_side_gives_no_ratio_and_the_table_says_which_failed():
  only_ours = {k: v for k, v in RESULTS.items() if v["side"] == "ours"}
  failed = {k: {**v, "error": "exit status 1"} for k, v in RESULTS.items() if v["side"] == "trl"}
  s = trl_step.summarize({**only_ours, **failed})
  assert s["best_trl"] is None and s["speedup_best"] is None and s["speedup_float32"] is None
  lines = trl_step.table({**only_ours, **failed})
  assert sum("failed: exit status 1" in line for line in lines) == 4
  assert "n/a" in lines[-3]


def test_table_has_a_row_per_variant_with_its_precision_checkpointing_and_rss():
  lines = trl_step.table(RESULTS)
  rows = lines[1:1 + len(RESULTS)]
  assert [r.split()[:3] for r in rows] == [
      ["ours", "float32", "off"], ["ours", "bfloat16", "off"], ["trl", "float32", "on"],
      ["trl", "bfloat16", "on"], ["trl", "float32", "off"], ["trl", "bfloat16", "off"]]
  assert rows[0].split()[3:] == ["10.00", "2.50", "7.50", "1.00"]
  assert "2.00x" in lines[-3] and "1.80x" in lines[-2] and "2.00x" in lines[-1]


def test_prompt_len_refusal_names_the_flag_and_the_longest_prompt():
  assert trl_step.prompt_len_error([302, 368, 340], 384) is None
  assert trl_step.prompt_len_error([302, 384], 384) is None
  msg = trl_step.prompt_len_error([302, 368, 340], 350)
  assert "--prompt_len=350" in msg and "368" in msg and msg.startswith("1 of 3 prompts")


def test_main_refuses_prompts_longer_than_prompt_len_before_running_anything(tmp_path):
  from dmpo_jax.models import tokenizer as task_tokenizer
  task_tokenizer.build(str(tmp_path))  # a folder with a tokenizer: enough to measure prompts
  with pytest.raises(SystemExit, match=r"--prompt_len=16 .*longest has 2[13] tokens"):
    trl_step.main(["--folder", str(tmp_path), "--prompts", "2", "--prompt_len", "16"])


def test_precisions_and_variants():
  assert trl_step.parse_precisions("bfloat16,float32,bfloat16") == ["bfloat16", "float32"]
  for bad in ("float16", "", "float32,fp8"):
    with pytest.raises(Exception, match="--precisions"):
      trl_step.parse_precisions(bad)
  args = trl_step.argparse.Namespace(precisions=["float32", "bfloat16"], skip_trl_checkpointing=False,
                                     trl_no_checkpointing=True)
  names = [v["name"] for v in trl_step.variants(args)]
  assert names == ["ours_float32", "ours_bfloat16", "trl_float32", "trl_bfloat16",
                   "trl_float32_no_checkpointing", "trl_bfloat16_no_checkpointing"]
  args.skip_trl_checkpointing, args.precisions = True, ["bfloat16"]
  assert [v["name"] for v in trl_step.variants(args)] == ["ours_bfloat16", "trl_bfloat16_no_checkpointing"]


def test_sampler_dtypes_and_best():
  assert sampler.parse_dtypes("float32,bfloat16") == ["float32", "bfloat16"]
  with pytest.raises(Exception, match="--dtype"):
    sampler.parse_dtypes("float16")
  per = {"float32": {"ours_tokens_per_s": 300.0, "transformers_tokens_per_s": 200.0},
         "bfloat16": {"ours_tokens_per_s": 250.0, "transformers_tokens_per_s": 220.0}}
  assert sampler.best_of(per, "ours_tokens_per_s") == ("float32", 300.0)
  assert sampler.best_of(per, "transformers_tokens_per_s") == ("bfloat16", 220.0)
  skipped = {"float32": {"ours_tokens_per_s": 300.0, "transformers_tokens_per_s": None}}
  assert sampler.best_of(skipped, "transformers_tokens_per_s") == (None, None)
