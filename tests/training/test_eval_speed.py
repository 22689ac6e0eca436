"""The evaluation points' fast path (issue 38): the prompt-shared log-probs of `points.py` equal the
update's full forward, KL between equal policies stays exactly 0, and the pipelined evaluation
loop hands each chunk the key and prompts it had when chunks ran in turn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dmpo_jax import sampling
from dmpo_jax.training import evaluation, points, steps
from tests.helpers import random_prompts, tiny_model

P, T, VOCAB = 12, 7, 61


def layout(bp=3, r=4, seed=0):
  """Left-padded prompts [Bp, P] of varied lengths and random completions [Bp * r, T] (pads
  after some rows' ends, as the sampler leaves them)."""
  pt, pm = sampling.pad_prompts(random_prompts(bp, 2, P, VOCAB, seed=seed), P, 0)
  rs = np.random.RandomState(seed + 1)
  tokens = rs.randint(3, VOCAB, (bp * r, T)).astype(np.int32)
  tokens[1, 4:] = 0
  return pt, pm, tokens


def full_forward(graphdef, params, pt, pm, tokens, temperature):
  r = tokens.shape[0] // pt.shape[0]
  seqs = {"tokens": jnp.concatenate([np.repeat(pt, r, 0), tokens], 1),
          "prompt_mask": np.repeat(pm, r, 0)}
  fn = steps.make_logprob_fn(graphdef, P, temperature=temperature, entropy=False)
  return np.asarray(jax.jit(fn)(params, seqs)["logprobs"])


def shared(graphdef, params, pt, pm, tokens, temperature):
  return np.asarray(jax.jit(points.completion_logprobs, static_argnums=(0, 5))(
      graphdef, params, pt, pm, tokens, temperature))


@pytest.mark.parametrize("temperature,t", [pytest.param(1.0, T, marks=pytest.mark.slow),
                                           pytest.param(0.7, T, marks=pytest.mark.slow), (1.0, 1)])
def test_prompt_shared_logprobs_equal_the_full_forward(temperature, t):
  graphdef, state = nnx.split(tiny_model(seed=3, scale=4.0))
  params = {"model": state}
  pt, pm, tokens = layout()
  tokens = tokens[:, :t]
  want = full_forward(graphdef, params, pt, pm, tokens, temperature)
  got = shared(graphdef, params, pt, pm, tokens, temperature)
  assert got.shape == want.shape == tokens.shape
  assert np.abs(want).max() > 1.0  # far from uniform: a wrong position or mask would show
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_a_shifted_prompt_position_is_caught():
  """The comparison above discriminates: the same completions after prompts shifted by one
  slot (another left-pad offset, so other positions) give other log-probs."""
  graphdef, state = nnx.split(tiny_model(seed=3, scale=4.0))
  params = {"model": state}
  pt, pm, tokens = layout()
  want = full_forward(graphdef, params, pt, pm, tokens, 1.0)
  shifted = np.roll(pt, -1, axis=1), np.roll(pm, -1, axis=1)  # one pad moves to the end
  got = shared(graphdef, params, *shifted, tokens, 1.0)
  assert np.abs(got - want).max() > 1e-3


def test_kl_of_equal_policies_is_exactly_zero_and_of_different_ones_is_not():
  graphdef, state = nnx.split(tiny_model(seed=3, scale=4.0))
  params = {"model": state}
  copy = jax.tree.map(lambda x: x + 0, params)
  other = {"model": nnx.split(tiny_model(seed=4, scale=4.0))[1]}
  pt, pm, tokens = layout()
  kl = points.make_kl_logprobs(graphdef, 1.0)
  lp, lp0 = kl(params, copy, pt, pm, tokens)
  mask = (tokens > 0).astype(np.int32)
  assert np.array_equal(np.asarray(lp), np.asarray(lp0))
  assert points.kl_terms(lp, lp0, mask)["kl_k1"].tolist() == [0.0] * tokens.shape[0]
  lp, lp1 = kl(params, other, pt, pm, tokens)
  np.testing.assert_allclose(np.asarray(lp1), full_forward(graphdef, other, pt, pm, tokens, 1.0),
                             rtol=0, atol=2e-5)
  assert np.abs(points.kl_terms(lp, lp1, mask)["kl_k1"]).min() > 1e-3


class FakeEncoder:
  """Prompt ids from an instance's number; texts that the verifier refuses (no 'Answer:')."""
  pad = 0
  truncated = {"prompt": 0}

  def encode(self, key, q):
    return [3 + q["n"]] * (1 + q["n"] % 4)

  def texts(self, tokens, mask):
    return [f"row {int(t[0])}" for t in tokens]


def test_pipelined_loop_gives_each_chunk_its_key_and_prompts_in_order():
  """Chunk c0 gets fold_in(rng, c0) and its own (padded) prompts, chunks are dispatched in
  order, the next one before this one is read, and results do not depend on dispatch."""
  items = [("subset-sum", {"n": i, "target": 1, "numbers": {"0": 1}}) for i in range(7)]
  rng, calls, reads = jax.random.key(5), [], []
  sample = jax.jit(lambda pt, key: jnp.repeat(pt[:, -1:], 2, 0) + jax.random.randint(key, (1, 1), 0, 3))

  def sample_fn(pt, pm, key):
    calls.append((np.asarray(jax.random.key_data(key)).tolist(), pt[:, -1].tolist(), len(reads)))
    tokens = sample(pt, key)
    return tokens, jnp.ones_like(tokens)

  encoder = FakeEncoder()
  texts = encoder.texts
  encoder.texts = lambda tokens, mask: reads.append(1) or texts(tokens, mask)
  spec = evaluation.ScoreSpec(samples=2, batch_prompts=3, prompt_len=4,
                              reward_cfg=evaluation.domain.RewardConfig(), k=1, pass_ks=(1,))
  run = lambda fn: evaluation.evaluate(fn, encoder, items, spec=spec, rng=rng)
  res = run(sample_fn)
  want_keys = [np.asarray(jax.random.key_data(jax.random.fold_in(rng, c0))).tolist() for c0 in (0, 3, 6)]
  assert [c[0] for c in calls] == want_keys
  assert [c[1] for c in calls] == [[3, 4, 5], [6, 7, 8], [9, 9, 9]]  # the last chunk padded
  assert [c[2] for c in calls] == [0, 0, 1]  # chunk c + 1 dispatched before chunk c is read
  blocking = run(lambda pt, pm, key: jax.block_until_ready(sample_fn(pt, pm, key)))
  assert blocking == res and res["num_problems"] == 7


def test_no_points_with_a_per_set_sample_spec_is_no_error():
  """eval.points = 0 under configs/collapse.py (points_samples "A:32,B:64,C:32"): no points,
  and nothing to parse (the spec names sets that this run does not evaluate)."""
  from dmpo_jax.training import specs
  from tests.helpers import config_module
  cfg = config_module("collapse").get_config("smoke")
  cfg.eval.points, cfg.eval.points_samples = 0, "A:32,B:64,C:32"
  pts = points.Points(specs.points_spec(cfg), "", None, None)
  assert not pts.enabled and pts.samples == {} and pts.sets == {}
  cfg.eval.points = 2
  with pytest.raises(AttributeError):  # with points, the sets are read from the task set
    points.Points(specs.points_spec(cfg), "", None, None)


# ---------------------------------------------------------------------------
# config.eval.points_kl_samples: the KL on the first N samples of each instance.
def test_kl_rows_take_the_first_samples_of_each_prompt():
  tokens = np.arange(3 * 4 * 2).reshape(12, 2)  # 3 prompts x 4 samples, row i = [2i, 2i + 1]
  mask = tokens % 3
  kt, km = points.kl_rows(tokens, mask, 3, 4, 2)
  assert kt[:, 0].tolist() == [0, 2, 8, 10, 16, 18]  # rows 0, 1, 4, 5, 8, 9
  assert np.array_equal(km, mask[[0, 1, 4, 5, 8, 9]])
  for s in (0, 4, 9):  # 0 or at least g: every row, unchanged
    kt, km = points.kl_rows(tokens, mask, 3, 4, s)
    assert kt is tokens and km is mask


def test_kl_on_the_first_samples_equals_those_rows_of_the_full_kl():
  graphdef, state = nnx.split(tiny_model(seed=3, scale=4.0))
  params = {"model": state}
  other = {"model": nnx.split(tiny_model(seed=4, scale=4.0))[1]}
  pt, pm, tokens = layout(bp=3, r=4)
  mask = (tokens > 0).astype(np.int32)
  kl = points.make_kl_logprobs(graphdef, 1.0)
  full = points.kl_terms(*kl(params, other, pt, pm, tokens), mask)["kl_k1"]
  kt, km = points.kl_rows(tokens, mask, 3, 4, 2)
  part = points.kl_terms(*kl(params, other, pt, pm, kt), km)["kl_k1"]
  np.testing.assert_allclose(part, full.reshape(3, 4)[:, :2].reshape(-1), rtol=0, atol=1e-5)
  assert not np.allclose(part, full.reshape(3, 4)[:, 2:].reshape(-1), atol=1e-5)  # not the others


@pytest.mark.parametrize("bad", [-1, True])  # a float is refused by the ConfigDict itself
def test_points_kl_samples_is_checked_naming_the_field(bad):
  from dmpo_jax.training import config as config_lib
  from tests.helpers import config_module
  cfg = config_module("collapse").get_config("smoke")
  config_lib.check_fields(cfg)  # the default (0) passes
  with cfg.unlocked():
    cfg.eval.points_kl_samples = bad
  with pytest.raises(ValueError, match=r"config\.eval\.points_kl_samples=.*an int >= 0"):
    config_lib.check_fields(cfg)


@pytest.mark.slow
def test_a_run_with_the_kl_on_fewer_samples_changes_only_its_kl(tmp_path, capsys):
  """configs/collapse.py:smoke (8 samples per instance at each point) with points_kl_samples=4
  against the default: the same samples, so every other metric of every point is identical;
  the point records kl_samples; KL at the start is still exactly 0."""
  import os
  from dmpo_jax.training import report
  from tests.helpers import REPO
  from tests.training.test_bad_input import train_cli
  args = lambda wd, *more: [f"--config={os.path.join(REPO, 'configs', 'collapse.py')}:smoke",
                            "--config.log.tensorboard=False", "--config.log.plots=False",
                            "--config.log.progress=False", "--config.checkpoint.export_hf=False",
                            f"--workdir={wd}", *more]
  for wd, more in ((tmp_path / "all", ()), (tmp_path / "four", ("--config.eval.points_kl_samples=4",))):
    code, err = train_cli(args(wd, *more), capsys)
    assert code in (0, None), err
  names = sorted(os.listdir(tmp_path / "all" / "points"))
  assert names == ["rl0.json", "rl3.json"]
  for name in names:
    a, b = (report.read_json(str(tmp_path / d / "points" / name)) for d in ("all", "four"))
    assert "kl_samples" not in a and b.pop("kl_samples") == 4
    for s, sa in a["sets"].items():
      for view in ("overall", "overall_instance"):
        ka, kb = (x["sets"][s][view] for x in (a, b))
        assert {k: v for k, v in ka.items() if not k.startswith("kl_")} == \
               {k: v for k, v in kb.items() if not k.startswith("kl_")}, (name, s, view)
        if name == "rl0.json":
          assert ka["kl_k1"] == kb["kl_k1"] == 0.0
        else:
          assert kb["kl_k1"] != ka["kl_k1"]  # 4 of the 8 samples: another estimate
