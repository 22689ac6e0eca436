"""The training layer's parts on their own: rollout collection, the update, the train state,
the reference checkpoint item, and the pipeline, evaluation, report and distributed helpers."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training import evaluation, report
from dmpo_jax.data import pipeline
from dmpo_jax.parallel import sharding
from dmpo_jax import tasks as tasks_lib
from dmpo_jax.models import tokenizer as tok_lib
from dmpo_jax.objectives import presets
from dmpo_jax.tasks import rewards as rewards_lib
from dmpo_jax.training import TrainState, collect_rollouts, state as state_lib, update
from dmpo_jax.training.rollout import RolloutSpec
from dmpo_jax import sampling
from tests.helpers import config_module, smoke

P, G, LP, LT = 4, 2, 48, 8


@pytest.fixture(scope="module")
def encoder():
  return pipeline.PromptEncoder(tok_lib.build(), "compact", LP)


def one_device():
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  return sharding.batch_sharding(mesh, 1)


def fake_sampler(events, lengths):
  """(params, prompts [n, LP], mask, key) -> tokens, mask, logprobs [n * G, LT]: completion
  i of the call has lengths[i] valid tokens; each call is recorded in `events`."""
  def sample(params, pt, pm, key):
    n = pt.shape[0] * G
    events.append(("sample", n))
    tokens = jnp.asarray(np.arange(n * LT).reshape(n, LT) % 50 + 5, jnp.int32)
    mask = jnp.asarray(np.arange(LT)[None] < np.asarray(lengths[:n])[:, None], jnp.int32)
    return tokens, mask, jnp.full((n, LT), -1.0) * mask
  return sample


class RecordingEncoder:
  """The encoder, with each host scoring (texts) recorded."""

  def __init__(self, encoder, events):
    self.encoder, self.events, self.pad = encoder, events, encoder.pad

  def encode(self, key, q):
    return self.encoder.encode(key, q)

  def texts(self, tokens, mask):
    self.events.append(("score", len(tokens)))
    return self.encoder.texts(tokens, mask)


def test_collect_rollouts_overlaps_scores_and_shapes(encoder):
  items = [("subset-sum", tasks_lib.get("subset-sum").generate(i, "tiny")) for i in range(P)]
  lengths = [2, 5, 6, 8]  # per chunk of 2 prompts x 2 samples
  events, refs = [], []
  obj = presets.objective_config("dapo", overlong_cache=4)  # free up to 4 tokens, -1 at 8
  reward_cfg = rewards_lib.RewardConfig()
  spec = RolloutSpec(group_size=G, chunks=2, prompt_len=LP, completion_len=LT,
                     reward_cfg=reward_cfg, objective=obj, data_sh=one_device())
  ro = collect_rollouts(fake_sampler(events, lengths), None, items, RecordingEncoder(encoder, events),
                        spec=spec, rng=jax.random.key(0),
                        ref_fn=lambda seqs: refs.append(seqs["tokens"].shape) or seqs["tokens"][:, LP:] * 0.0)
  # the second chunk is dispatched before the first is scored on the host
  assert events == [("sample", 4), ("sample", 4), ("score", 4), ("score", 4)]
  assert refs == [(4, LP + LT), (4, LP + LT)]
  assert ro.seqs["tokens"].shape == (P, G, LP + LT) and ro.old_logprobs.shape == (P, G, LT)
  assert ro.ref_logprobs.shape == (P, G, LT)
  np.testing.assert_array_equal(ro.lengths, np.tile(np.reshape(lengths, (2, 2)), (2, 1)))
  # rewards = the verifier's + DAPO's overlong penalty of each length
  tokens = np.asarray(ro.seqs["tokens"][..., LP:]).reshape(P * G, LT)
  sampled_mask = (np.arange(LT)[None] < np.tile(lengths, 2)[:, None]).astype(np.int32)
  raw, stats = pipeline.score_groups(items, encoder.texts(tokens, sampled_mask), G, reward_cfg)
  penalty = np.clip((4 - ro.lengths) / 4, -1, 0)
  np.testing.assert_allclose(ro.rewards, raw + penalty, rtol=1e-6)
  # dynamic sampling: groups all right or all wrong keep no tokens
  keep = (stats["feasible"].sum(-1) > 0) & (stats["feasible"].sum(-1) < G)
  assert (ro.completion_mask.sum((1, 2)) > 0).tolist() == keep.tolist()
  batch = ro.batch(one_device())
  assert set(batch) == {"seqs", "mask", "old_logprobs", "rewards", "ref_logprobs"}
  assert set(ro.metrics()) >= {"reward_mean", "qr_mean", "feasible", "distinct", "length"}


def test_update_advances_the_state_and_counts_skipped_steps():
  state = TrainState(params={"w": jnp.ones(2)}, opt_state=(), step=7, key=jax.random.key(3))
  step_fn = lambda p, o, b: (jax.tree.map(lambda x: x + b, p), o, {"skipped": jnp.int32(1),
                                                                    "loss": jnp.float32(0.5)})
  new, m = update(state, 2.0, step_fn)
  assert new.step == 8 and new.counters["nonfinite_total"] == 1 and m["loss"] == 0.5
  np.testing.assert_array_equal(new.params["w"], [3.0, 3.0])
  assert isinstance(m["loss"], np.ndarray)  # metrics come back on the host


def test_random_streams_keep_their_values():
  """The named stream numbers are a run's identity: today's values, today's keys."""
  assert (state_lib.LOG_Z_SEED_OFFSET, state_lib.EVAL_STREAM, state_lib.DPH_STREAM) == (1, 10**6, 2 * 10**6)
  key = jax.random.key(5)
  st = TrainState(params={}, opt_state=(), step=11, key=key)
  same = lambda a, b: np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
  assert same(st.rl_key(), jax.random.fold_in(key, 11))
  assert same(st.eval_key(), jax.random.fold_in(key, 10**6))
  assert same(st.dph_key(24), jax.random.fold_in(key, 2 * 10**6 + 24))


def test_reference_item_survives_rotation_and_is_written_once(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), keep=1)
  params = {"w": jnp.arange(3.0)}
  assert not ck.has_reference()
  ck.save_reference(params)
  ck.save_reference({"w": jnp.zeros(3)})  # a second save keeps the first
  for s in range(3):
    ck.save(s, params, {"count": jnp.int32(s)}, {"step": s})
  assert ck.mngr.all_steps() == [2] and ck.has_reference()
  np.testing.assert_array_equal(ck.restore_reference(params)["w"], [0.0, 1.0, 2.0])
  with pytest.raises(ckpt_lib.CheckpointError, match="reference policy"):
    ck.restore_reference({"w": jnp.zeros(4), "v": jnp.zeros(1)})
  ck.close()


def test_pad_prompts_and_pad_right():
  t, m = sampling.pad_prompts([[5, 6], [7]], 4, 0)
  np.testing.assert_array_equal(t, [[0, 0, 5, 6], [0, 0, 0, 7]])
  np.testing.assert_array_equal(m, [[0, 0, 1, 1], [0, 0, 0, 1]])
  t, m = pipeline.pad_right([[5, 6, 7, 8, 9], [7]], 3, 0)  # cut to the length
  np.testing.assert_array_equal(t, [[5, 6, 7], [7, 0, 0]])
  np.testing.assert_array_equal(m, [[1, 1, 1], [1, 0, 0]])


def test_taskset_is_a_function_of_seed_and_step():
  ts = pipeline.TaskSet(["subset-sum", "knapsack"], "tiny", 3, pipeline.parse_curriculum("tiny:0,easy:5", "tiny"))
  assert ts.train("rl", 2, 3) == ts.train("rl", 2, 3) and ts.train("rl", 2, 3) != ts.train("rl", 3, 3)
  assert [k for k, _ in ts.train("rl", 0, 3)] == ["subset-sum", "knapsack", "subset-sum"]
  assert ts.level_at(4) == "tiny" and ts.level_at(5) == "easy"
  with pytest.raises(ValueError, match="config.rl.curriculum: bad entry"):
    pipeline.parse_curriculum("nightmare:0", "tiny")


def test_evaluation_scores_a_sampler(encoder):
  items = [(k, tasks_lib.get(k).generate(10**6 + j, "tiny")) for k in ("subset-sum", "knapsack")
           for j in range(2)]
  answer = encoder.tok.encode(" [0]", add_special_tokens=False) + [encoder.eos]
  rows = np.zeros((3 * 3 * 2, LT), np.int32)  # batch_prompts 3, samples 3 ... padded to 2 batches
  rows[:, :len(answer)] = answer
  calls = []

  def sample_fn(pt, pm, rng):
    calls.append(pt.shape)
    return rows[:pt.shape[0] * 3], (np.arange(LT) < len(answer)).astype(np.int32)[None].repeat(pt.shape[0] * 3, 0)

  spec = evaluation.ScoreSpec(samples=3, batch_prompts=3, prompt_len=LP,
                              reward_cfg=rewards_lib.RewardConfig(), k=3, pass_ks=(1, 3))
  res = evaluation.evaluate(sample_fn, encoder, items, spec=spec, rng=jax.random.key(0))
  assert calls == [(3, LP), (3, LP)]  # the last batch is padded to a fixed shape
  assert res["num_problems"] == 4 and set(res["per_task"]) == {"subset-sum", "knapsack"}
  assert res["per_task"]["knapsack"]["length"] == len(answer)
  assert all(v["distinct"] <= 1.0 for v in res["per_task"].values())  # three identical answers
  table = evaluation.format_table(res, res)
  assert "overall (category mean)" in table and "->" in table
  # pass@k beyond the evaluation's sample count is left out (the run's other evaluations may
  # sample enough for it: configs/collapse.py asks pass@64 of its points and 16 samples here)
  res = evaluation.evaluate(sample_fn, encoder, items, rng=jax.random.key(0),
                            spec=dataclasses.replace(spec, pass_ks=(1, 3, 64)))
  assert "pass@3" in res["overall"] and "pass@64" not in res["overall"]
  with pytest.raises(ValueError, match="k=4 must lie in 1..samples=3"):
    evaluation.ScoreSpec(samples=3, batch_prompts=3, prompt_len=LP,
                         reward_cfg=rewards_lib.RewardConfig(), k=4)


def test_evaluation_success_as_npbench_counts_it(encoder):
  """NP-Bench counts a sample as solved when its quality ratio is above 0: an empty independent
  set (feasible in NP-Bench's rules, value 0) is a failure there and a success in ours."""
  items = [("maximum-set", tasks_lib.get("maximum-set").generate(10**6 + j, "tiny")) for j in range(3)]
  answer = encoder.tok.encode(" []", add_special_tokens=False) + [encoder.eos]
  rows = np.zeros((3 * 3, LT), np.int32)
  rows[:, :len(answer)] = answer
  mask = (np.arange(LT) < len(answer)).astype(np.int32)[None].repeat(9, 0)
  run = lambda success: evaluation.evaluate(
      lambda pt, pm, rng: (rows, mask), encoder, items, rng=jax.random.key(0),
      spec=evaluation.ScoreSpec(samples=3, batch_prompts=3, prompt_len=LP,
                                reward_cfg=rewards_lib.RewardConfig(compat="npbench"), k=3,
                                pass_ks=(1, 3), success=success))
  assert run("feasible")["per_task"]["maximum-set"]["SR@3"] == 1.0
  assert run("positive_ratio")["per_task"]["maximum-set"]["SR@3"] == 0.0
  with pytest.raises(ValueError, match="success"):
    run("ratio")


def test_metrics_writer_resume_drops_later_rows(tmp_path):
  w = report.MetricsWriter(str(tmp_path), tensorboard=False)
  for s in (1, 2, 3):
    w.write(s, "rl", {"loss": s / 10, "bad": float("nan")})
  w.close()
  rows = report.read_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["bad"] is None
  report.MetricsWriter(str(tmp_path), tensorboard=False, resume_step=2).close()
  assert [r["step"] for r in report.read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]


def test_write_json_keeps_the_old_file_on_failure(tmp_path):
  path = str(tmp_path / "r.json")
  report.write_json({"a": 1}, path)
  with pytest.raises(TypeError):
    report.write_json({"a": object()}, path)
  assert json.load(open(path)) == {"a": 1} and os.listdir(tmp_path) == ["r.json"]


def test_host_and_global_arrays_round_trip():
  mesh = sharding.make_mesh({"data": -1})
  sh = sharding.batch_sharding(mesh, 1)
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  g = dist.to_global(x, sh)
  assert len(g.sharding.device_set) == jax.device_count() == 8
  np.testing.assert_array_equal(dist.to_host(g), x)
  tree = dist.tree_to_host(dist.tree_to_global({"a": x, "b": x[:, :1]}, sh))
  np.testing.assert_array_equal(tree["b"], x[:, :1])
  assert dist.is_main() and dist.agree(True) is True and dist.agree(False) is False


def test_dph_rl_stream_skips_d_pef_and_refills():
  """D_exp is the RL stream minus D_pef's prompts, refilled past them: same prompts per step."""
  from dmpo_jax.training import dph
  ts = pipeline.TaskSet(["subset-sum", "knapsack"], "tiny", 3)
  n = 4
  flat = [f for s in range(4) for f in range(s * n, s * n + n)]
  stream = dph.stream_items(ts, flat, n)
  assert stream[5] == ts.train("rl", 1, n)[1]
  store = {"pef_index": np.array([1, 1, 3, 6])}  # one index per stored response; repeats allowed
  got = [dph.rl_items(store, ts, s, n) for s in range(3)]
  # step 0 takes flat 0, 2, 4, 5; step 1: 7, 8, 9, 10; step 2: 11, 12, 13, 14
  assert got[0] == [stream[i] for i in (0, 2, 4, 5)]
  assert got[1] == [stream[i] for i in (7, 8, 9, 10)]
  assert got[2] == [stream[i] for i in (11, 12, 13, 14)]
  # without D_pef (no store, or an empty one) every preset sees the plain stream
  assert dph.rl_items(None, ts, 1, n) == ts.train("rl", 1, n)
  assert dph.rl_items({"pef_index": np.array([], np.int64)}, ts, 2, n) == ts.train("rl", 2, n)


def test_taskset_pool_trains_and_evaluates_on_the_same_instances():
  """collapse.pool: every stage draws from held_out(pool), tasks still cycle, and the draw
  is a function of (seed, stage, step, row)."""
  keys = ["subset-sum", "knapsack"]
  ts = pipeline.TaskSet(keys, "tiny", 3, pool=3)
  pool = ts.pool_items()
  assert pool == pipeline.TaskSet(keys, "tiny", 3).held_out(3) and len(pool) == 6
  rows = [r for s in range(20) for r in ts.train("rl", s, 4)]
  assert all(r in pool for r in rows)
  assert [k for k, _ in rows[:4]] == ["subset-sum", "knapsack"] * 2
  assert len({repr(q) for _, q in rows}) == 6  # 80 draws reach every pool instance
  assert ts.train("sft", 5, 4) == pipeline.TaskSet(keys, "tiny", 3, pool=3).train("sft", 5, 4)
  assert ts.train("sft", 5, 4) != ts.train("rl", 5, 4) or ts.train("sft", 6, 4) != ts.train("rl", 6, 4)
  for s in range(3):
    for i in range(4):
      assert pool[ts.pool_id("rl", s, i, 4)] == ts.train("rl", s, 4)[i]
  assert ts.held_out(2) == [pool[0], pool[1], pool[3], pool[4]]
  with pytest.raises(ValueError, match="curriculum"):
    pipeline.TaskSet(keys, "tiny", 3, [(0, "tiny"), (5, "easy")], pool=3)


def test_dph_with_a_pool_skips_every_row_that_draws_a_d_pef_instance():
  from dmpo_jax.training import dph
  ts = pipeline.TaskSet(["subset-sum", "knapsack"], "tiny", 3, pool=3)
  n, pef = 4, {0, 4}
  store = {"pef_index": np.array(sorted(pef))}
  for s in range(5):
    got = dph.rl_items(store, ts, s, n)
    assert len(got) == n and all(it not in [ts.pool_items()[i] for i in pef] for it in got)
  flat = [f for f in range(200) if ts.pool_id("rl", f // n, f % n, n) not in pef]
  assert dph.rl_items(store, ts, 2, n) == dph.stream_items(ts, flat[8:12], n)
  with pytest.raises(ValueError, match="D_exp is empty"):
    dph.rl_items({"pef_index": np.arange(6)}, ts, 0, n)


def test_dph_per_sample_weighting_scales_eta(tmp_path):
  import sys
  nphard = config_module("nphard")
  from dmpo_jax.training import run as run_lib
  from dmpo_jax.training import stages
  cfg = nphard.get_config("algo=dph_f")
  base = run_lib.objective_from_config(cfg).div_coef
  cfg.dph.weighting = "per_sample"
  share = cfg.dph.batch / (cfg.rl.prompts_per_step * cfg.rl.group_size)
  assert run_lib.objective_from_config(cfg).div_coef == pytest.approx(base * share)
  assert share != 1.0
  cfg.rl.algo = "grpo"  # no divergence: nothing to scale
  assert run_lib.objective_from_config(cfg).div_coef == 0.0


def smoke_config():
  import os
  import sys
  nphard = config_module("nphard")
  return nphard.get_config("smoke")


def test_log_term_grads_interval():
  from ml_collections import config_dict
  from dmpo_jax.training import run as run_lib
  from dmpo_jax.training import stages
  every = lambda v: stages.term_grads_every(config_dict.ConfigDict({"rl": {"log_term_grads": v}}))
  assert (every(False), every(True), every(4)) == (0, 1, 4)
  # declared in configs/ (no default in code): 0, never
  assert stages.term_grads_every(smoke_config()) == 0
  for bad in (-1, 2.5, "4"):
    with pytest.raises(ValueError, match="log_term_grads"):
      every(bad)

