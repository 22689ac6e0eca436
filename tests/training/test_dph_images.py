"""DPH presets with image prompts: pre-sampling with the prompts' images, a store without
pixels, and the images re-rendered from pef_index for each step's D_pef rows."""

import json
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmpo_jax.training import run as run_lib
from dmpo_jax.training import stages
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training import dph, steps
from dmpo_jax.data import pipeline
from tests.helpers import config_module, override, smoke

mm_nphard = config_module("mm_nphard")


def all_correct(monkeypatch):
  """DPH's scoring marks every sample correct (an untrained smoke policy solves nothing, so
  D_pef would be empty): every pre-sampled prompt joins D_pef with all its samples. Only
  dph's own reference to the scoring changes; RL rollouts score as usual."""
  def score_groups(*args, **kw):
    rewards, stats = pipeline.score_groups(*args, **kw)
    return rewards, dict(stats, feasible=np.ones_like(stats["feasible"]),
                         ratio=np.ones_like(stats["ratio"]))
  monkeypatch.setattr(dph, "pipeline", types.SimpleNamespace(score_groups=score_groups))


def config(spec="smoke,algo=dph_js,tasks=TSP+knapsack", **over):
  c = mm_nphard.get_config(spec)
  c.log.tensorboard = c.log.plots = False
  c.mesh.data = 2
  return override(c, **over)


@pytest.mark.slow
def test_dph_rows_with_images_give_the_stored_logprobs(tmp_path, monkeypatch):
  """At the initial params, the update's log-prob function on a step's D_pef rows (images
  re-rendered from pef_index, one prompt per row, micro-batched) gives the log-probs the
  pre-sampling stored (ratio 1), which are the sampler's with the prompts' images."""
  cfg = config(**{"sft.steps": 0})
  run, state = run_lib.setup(cfg, str(tmp_path))
  all_correct(monkeypatch)
  real = run.sampler(run.sampling_config(cfg.dph.samples, cfg.rl.temperature, cfg.rl.top_p))
  calls = []

  def sampler(*args, **kw):
    out = real(*args, **kw)
    calls.append((kw.get("images"), dist.to_host(out[1]), dist.to_host(out[2])))
    return out

  logprob_eval = steps.make_logprob_eval(run.graphdef, run.prompt_len, cfg.rl.temperature,
                                         shardings=(run.p_sh, run.data_sh, None))
  store = dph.presample(run.specs.dph, str(tmp_path), run.taskset, run.encoder, sampler, logprob_eval,
                        state.params, state, run.reward_cfg, run.images)
  k, n = cfg.dph.samples, cfg.dph.num_prompts
  assert len(calls) == -(-n // cfg.eval.batch_prompts)
  assert all(c[0] is not None and c[0]["pixel_values"].shape[0] == cfg.eval.batch_prompts
             for c in calls), "the pre-sampling sampler got no images"
  assert len(store["pef_tokens"]) == n * k  # every sample stored, in prompt-major order
  saved = np.load(tmp_path / dph.STORE)
  assert not any("pixel" in name or "image" in name for name in saved.files)  # no pixels stored
  mask = store["pef_mask"] > 0
  sampler_lp = np.concatenate([c[2] for c in calls])[:n * k]
  np.testing.assert_allclose(store["pef_logprobs"][mask], sampler_lp[mask], atol=1e-5)

  images = stages.dph_image_fn(run, store)
  logprob_fn = steps.make_logprob_fn(run.graphdef, run.prompt_len, temperature=cfg.rl.temperature)

  @jax.jit
  def worst(params, part):  # largest |log ratio| of a slice's masked tokens
    lp = logprob_fn(params, part["dph_seqs"])["logprobs"]
    return jnp.max(jnp.abs(lp - part["dph_ref_logprobs"]) * part["dph_mask"])

  sliced = jax.jit(lambda p, b: steps.accumulate(worst, p, b, 2))
  for rl_step in range(n * k // cfg.dph.batch):  # every stored row once
    part = dph.batch_part(store, rl_step, cfg.dph.batch, images)
    assert part["dph_seqs"]["images"]["pixel_values"].shape[0] == cfg.dph.batch  # one per row
    part = dist.tree_to_global(part, run.data_sh)
    assert float(worst(state.params, part)) < 1e-5
    assert float(sliced(state.params, part)) < 1e-5  # micro-batches slice images with their rows
  blind = dict(part, dph_seqs={kk: v for kk, v in part["dph_seqs"].items() if kk != "images"})
  assert float(worst(state.params, blind)) > 1e-3  # the check sees the images
  run.ckpt.close()
  run.writer.close()


@pytest.mark.slow
def test_mm_dph_smoke_run_end_to_end_with_resume(tmp_path, monkeypatch):
  """configs/mm_nphard.py:smoke with dph_js: SFT, DPH pre-sampling with images (every
  sample marked correct, so D_pef holds responses), a stop after the first RL step, the
  resume (store read back, its images re-rendered from pef_index), RL and evaluation."""
  all_correct(monkeypatch)
  over = {"rl.steps": 2, "eval.modalities": ("image",)}
  wd = tmp_path / "run"
  first = config(stop_at_step=4, **over)
  assert stages.train(first, str(wd)) == {"stopped": True, "step": 4}
  store = dict(np.load(wd / dph.STORE))
  assert len(store["pef_tokens"]) == first.dph.num_prompts * first.dph.samples
  monkeypatch.undo()  # the resume reads the store back: no scoring of pre-samples
  res = stages.train(config(**over), str(wd))
  again = np.load(wd / dph.STORE)
  np.testing.assert_array_equal(again["pef_tokens"], store["pef_tokens"])
  rows = [json.loads(line) for line in open(wd / "metrics.jsonl")]
  assert [r["stage"] for r in rows] == ["sft"] * 3 + ["rl"] * 2
  rl = [r for r in rows if r["stage"] == "rl"]
  assert all(np.isfinite(r["divergence"]) for r in rl)
  # RL step 1 starts from the pre-sampling params: the stored rows, with their images
  # re-rendered, have ratio 1 (JS ~ (log ratio)^2 / 8: float noise only)
  assert rl[0]["divergence"] < 1e-9
  assert res["algo"] == "dph_js" and res["times_s"]["dph"] > 0
  assert set(res["after"]["per_task"]) == {"TSP", "knapsack"}
  assert 0.0 <= res["after"]["overall"]["SR_mean"] <= 1.0
