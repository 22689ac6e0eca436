"""The trainer's collapse hooks: optimal SFT targets, the instance filter, per-step collapse metrics."""

import dataclasses
import types

import numpy as np
import pytest
from ml_collections import config_dict

from dmpo_jax.models import build as model_build
from dmpo_jax.data import pipeline
from dmpo_jax.training import specs, stages
from dmpo_jax import tasks as tasks_lib
from dmpo_jax.models import tokenizer as tok_lib
from dmpo_jax.tasks import rewards as rewards_lib
from tests.helpers import config_module, smoke

LP, LT = 160, 32
COLLAPSE = pipeline.Collapse(limit=16, time_limit=2.0, min_optima=2, max_optima=8)


@pytest.fixture(scope="module")
def encoder():
  return pipeline.PromptEncoder(tok_lib.build(), "compact", LP)


def n_optima(key, q):
  return len(tasks_lib.get(key).optimal_solutions(q, limit=16, time_limit=2.0).solutions)


def test_filter_keeps_instances_within_the_optima_range():
  keys = ["maximum-set", "subset-sum", "meeting-schedule"]  # the last: no enumeration, no filter
  plain = pipeline.TaskSet(keys, "tiny", 0)
  kept = pipeline.TaskSet(keys, "tiny", 0, collapse=COLLAPSE)
  rows = kept.train("rl", 3, 6)
  assert rows == kept.train("rl", 3, 6)  # deterministic
  for key, q in rows + kept.held_out(3):
    if key != "meeting-schedule":
      assert 2 <= n_optima(key, q) <= 8, key
  assert kept.held_out(2)[-2:] == plain.held_out(2)[-2:]
  # without the filter nothing changes; the plain stream has instances the filter rejects
  assert plain.held_out(2) == [(k, tasks_lib.get(k).generate(pipeline.EVAL_SEED0 + j, "tiny"))
                               for k in keys for j in range(2)]
  plain_rows = plain.train("rl", 3, 6) + plain.train("rl", 4, 6)
  assert any(not 2 <= n_optima(k, q) <= 8 for k, q in plain_rows if k != "meeting-schedule")
  # a range no instance meets (knapsack: one optimum at tiny) names the config field
  with pytest.raises(ValueError, match="config.collapse"):
    pipeline.TaskSet(["knapsack"], "tiny", 0, collapse=pipeline.Collapse(16, 2.0, 5, 8)).train("rl", 0, 1)


def test_collapse_config_switches_on_only_with_the_block():
  c = config_dict.ConfigDict({"seed": 0})
  assert specs.collapse_spec(c) is None
  c.collapse = config_dict.ConfigDict(dict(limit=16, time_limit=2.0, min_optima=2, max_optima=8))
  assert specs.collapse_spec(c) == COLLAPSE
  c.collapse.enabled = False
  assert specs.collapse_spec(c) is None


def sft_run(encoder, targets, collapse=COLLAPSE):
  cfg = config_dict.ConfigDict(dict(sft=dict(solutions_per_instance=4, batch_size=8, targets=targets)))
  taskset = pipeline.TaskSet(["maximum-set", "GCP-D"], "tiny", 0, collapse=collapse)
  return types.SimpleNamespace(cfg=cfg, taskset=taskset, encoder=encoder, prompt_len=LP, vl_cfg=None,
                               completion_len=LT)


def answers(encoder, batch):
  return encoder.texts(batch["seqs"]["tokens"][:, LP:], batch["mask"])


def test_sft_targets_optimal_are_distinct_optima(encoder):
  run = sft_run(encoder, "optimal")
  items = run.taskset.train("sft", 5, 2)
  texts = answers(encoder, stages.sft_batch(run, 5))
  for i, (key, q) in enumerate(items):
    task = tasks_lib.get(key)
    opt = task.optimal_solutions(q, limit=16, time_limit=2.0)
    group = [task.verify(q, t) for t in texts[4 * i:4 * i + 4]]
    assert all(v.feasible and v.solution in opt.solutions for v in group), key
    assert len({v.solution for v in group}) == min(4, len(opt.solutions))  # uniform without repeats
  # "sampled" (the default) is the heuristic sampler, as before
  run = sft_run(encoder, "sampled")
  key, q = run.taskset.train("sft", 5, 2)[0]
  want = [encoder.tok.decode(encoder.answer_ids(key, s)[:-1]) for s in
          (tasks_lib.get(key).sample_solutions(q, 4, seed=5) * 4)[:4]]
  got = answers(encoder, stages.sft_batch(run, 5))[:4]
  assert [g.removeprefix("Answer: ").strip() for g in got] == [w.strip() for w in want]


def test_score_groups_logs_distinct_optima_and_coverage():
  key = "maximum-set"
  task = tasks_lib.get(key)
  q = next(q for s in range(100) if COLLAPSE.accepts(key, q := task.generate(s, "tiny")))
  opt = task.optimal_solutions(q, limit=16, time_limit=2.0)
  a, b = (task.format_solution(s) for s in opt.solutions[:2])
  texts = ["Answer: " + t for t in (a, a, b, "[]")] + ["Answer: " + a] * 4
  cfg = rewards_lib.RewardConfig()
  _, plain = pipeline.score_groups([(key, q)] * 2, texts, 4, cfg)
  assert "coverage" not in plain
  _, st = pipeline.score_groups([(key, q)] * 2, texts, 4, cfg, collapse=COLLAPSE)
  n = len(opt.solutions)
  np.testing.assert_allclose(st["distinct_optimal"], [2, 1])
  np.testing.assert_allclose(st["coverage"], [2 / n, 1 / n])
  np.testing.assert_allclose(st["optimal_rate"], [0.75, 1.0])
  assert st["optimal"].tolist() == [[True, True, True, False], [True] * 4]
  # npbench rules for the reward: the collapse metrics still read strict verdicts
  _, st2 = pipeline.score_groups([(key, q)] * 2, texts, 4, rewards_lib.RewardConfig(compat="npbench"),
                                 collapse=COLLAPSE)
  np.testing.assert_allclose(st2["coverage"], st["coverage"])


def tiny_rl_batch(P=4, G=4, lp=6, lt=5):
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 100, (P, G, lp + lt)).astype(np.int32)
  tokens[:, :, :lp] = tokens[:, :1, :lp]  # a group's G samples share its prompt (rollouts' layout)
  return {"seqs": {"tokens": tokens, "prompt_mask": np.ones((P, G, lp), np.int32)},
          "mask": (rng.random((P, G, lt)) < 0.7).astype(np.int32),
          "old_logprobs": rng.normal(-4, 0.3, (P, G, lt)).astype(np.float32),
          "rewards": rng.random((P, G)).astype(np.float32)}


@pytest.mark.slow
def test_term_gradient_norms_are_those_of_each_term():
  """pg_grad_norm / reg_grad_norm equal the norms of separate jax.grad's of the policy-gradient
  term and of dm_coef x DM (also summed over micro-batches); the update itself is unchanged."""
  import jax
  import optax
  from flax import nnx
  nphard = config_module("nphard")
  from dmpo_jax.training import steps
  from dmpo_jax.objectives import presets
  cfg = nphard.get_config("smoke")
  cfg.model.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                   head_dim=16)
  model, _ = model_build.build(specs.model_spec(cfg))
  graphdef, state = nnx.split(model)
  batch = tiny_rl_batch()
  obj = presets.objective_config("dmpo", dm_coef=2.0, dm_alpha=1 / 15)
  loss_fn = presets.build_loss(obj, steps.make_logprob_fn(graphdef, 6))
  params = {"model": state}
  norm = lambda f: float(optax.tree.norm(jax.jit(jax.grad(lambda p: f(loss_fn(p, batch)[1])))(params)))
  want_pg, want_reg = norm(lambda m: m["pg_loss"]), norm(lambda m: 2.0 * m["dm_loss"])
  assert want_reg > 0 and want_pg > 0
  outs = {}
  for mb, tg in ((1, False), (1, True), (4, True)):
    opt = optax.sgd(0.1)
    p0 = {"model": jax.tree.map(jax.numpy.copy, state)}
    step = steps.make_rl_step(graphdef, obj, opt, 6, 1.0, micro_batches=mb, term_grads=tg)
    outs[mb, tg] = step(p0, opt.init(p0), batch)
  for mb in (1, 4):
    m = outs[mb, True][2]
    np.testing.assert_allclose(float(m["pg_grad_norm"]), want_pg, rtol=1e-4)
    np.testing.assert_allclose(float(m["reg_grad_norm"]), want_reg, rtol=1e-4)
    np.testing.assert_allclose(float(m["grad_ratio"]), want_reg / want_pg, rtol=1e-4)
  assert "pg_grad_norm" not in outs[1, False][2]
  for a, b in zip(jax.tree.leaves(outs[1, False][0]), jax.tree.leaves(outs[1, True][0])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  # GRPO has no regulariser: its gradient norm is 0
  opt = optax.sgd(0.1)
  p0 = {"model": jax.tree.map(jax.numpy.copy, state)}
  m = steps.make_rl_step(graphdef, presets.objective_config("grpo"), opt, 6, 1.0, term_grads=True)(
      p0, opt.init(p0), batch)[2]
  assert float(m["reg_grad_norm"]) == 0.0 and float(m["grad_ratio"]) == 0.0


def test_evaluation_reports_optima_and_pass_at_k_both_ways(encoder):
  """Two maximum-set problems, 4 samples each: problem 0 answers optimum a, a, b and an
  infeasible text; problem 1 answers a feasible non-optimal set 4 times."""
  import jax
  from dmpo_jax.training import evaluation
  from dmpo_jax.tasks import scoring
  key = "maximum-set"
  task = tasks_lib.get(key)
  qs = [q for s in range(200) if COLLAPSE.accepts(key, q := task.generate(s, "tiny"))][:2]
  opts = [task.optimal_solutions(q, limit=16, time_limit=2.0) for q in qs]
  a, b = (task.format_solution(s) for s in opts[0].solutions[:2])
  small = task.format_solution(opts[1].solutions[0][:1])  # one vertex: feasible, not optimal
  texts = [a, a, b, "[0, 0, 0]", small, small, small, small]
  ids = [encoder.tok.encode(" " + t, add_special_tokens=False) + [encoder.eos] for t in texts]
  tokens, mask = pipeline.pad_right(ids, LT, encoder.pad)
  spec = evaluation.ScoreSpec(samples=4, batch_prompts=2, prompt_len=LP,
                              reward_cfg=rewards_lib.RewardConfig(), k=3, pass_ks=(1, 2, 4),
                              collapse=COLLAPSE)
  res = evaluation.evaluate(lambda pt, pm, rng: (tokens, mask), encoder, [(key, q) for q in qs],
                            spec=spec, rng=jax.random.key(0))
  r = res["per_task"][key]
  assert r["distinct_optimal"] == (2 + 0) / 2
  assert r["coverage"] == pytest.approx((2 / len(opts[0].solutions) + 0) / 2)
  assert r["optimal_rate"] == pytest.approx((0.75 + 0) / 2)
  for k in (1, 2, 4):  # problem 0: 3 of 4 optimal and feasible; problem 1: 0 optimal, 4 feasible
    assert r[f"pass_optimal@{k}"] == pytest.approx(scoring.pass_at_k(4, 3, k) / 2)
    assert r[f"pass_feasible@{k}"] == pytest.approx((scoring.pass_at_k(4, 3, k) + 1) / 2)
  assert res["overall"]["pass_optimal@4"] == r["pass_optimal@4"]
  assert res["correct"]["optimal"][key] == [[True, True, True, False], [False] * 4]
  assert res["correct"]["feasible"][key] == [[True, True, True, False], [True] * 4]
  assert r["best_qr@1"] == pytest.approx(r["QR_mean"])  # one sample: its expected ratio
  assert r["best_qr@4"] == pytest.approx(r["QR@3"])  # all samples: the best (the 4th is infeasible)
  plain = evaluation.evaluate(lambda pt, pm, rng: (tokens, mask), encoder, [(key, q) for q in qs],
                              spec=dataclasses.replace(spec, collapse=None), rng=jax.random.key(0))
  assert "coverage" not in plain["overall"] and plain["overall"]["pass@4"] == r["pass@4"]


def test_rollout_metrics_average_collapse_stats_over_supported_groups():
  from dmpo_jax.training import Rollouts
  stats = {"ratio": np.ones((3, 2)), "feasible": np.ones((3, 2), bool), "distinct": np.ones(3),
           "solution_entropy": np.zeros(3)}
  r = Rollouts(items=[], seqs={}, completion_mask=None, old_logprobs=None, ref_logprobs=None,
               rewards=np.ones((3, 2)), lengths=np.ones((3, 2)), stats=dict(stats), sample_s=0, score_s=0)
  assert not set(pipeline.COLLAPSE_STATS) & set(r.metrics())
  r.stats.update(coverage=np.asarray([0.5, np.nan, 0.25]), distinct_optimal=np.asarray([2.0, np.nan, 1.0]),
                 optimal_rate=np.asarray([1.0, np.nan, 0.5]), entropy_optimal=np.full(3, np.nan))
  m = r.metrics()
  assert m["coverage"] == 0.375 and m["distinct_optimal"] == 1.5 and m["optimal_rate"] == 0.75
  assert np.isnan(m["entropy_optimal"])  # no group of a task with enumeration


def test_keep_and_exploration_after_rl_both_ways():
  cfg = config_dict.ConfigDict(dict(collapse=dict(keep_k=2, correct=("optimal",)), eval=dict(samples=2)))
  before = {"correct": {"optimal": {"t": [[True, True], [False, False]]}, "feasible": {"t": [[True] * 2] * 2}}}
  after = {"correct": {"optimal": {"t": [[False, False], [True, False]]}, "feasible": {"t": [[True] * 2] * 2}}}
  out = stages.collapse_keep_exploration(cfg, before, after)["keep_exploration_collapse"]
  assert list(out) == ["optimal"]
  assert out["optimal"]["t"]["keep_rate"] == 0.0 and out["optimal"]["t"]["exploration_rate"] == 1.0
  assert stages.collapse_keep_exploration(config_dict.ConfigDict(dict(eval=dict(samples=2))), {}, {}) == {}
