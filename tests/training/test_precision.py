"""The update's numerics: chunked log-probs equal whole ones; bf16 compute stays near float32
and keeps log-probs, entropies and losses in float32; model.dtype = "auto" in the config check,
configs/collapse.py's float32 pin, and an "auto" run's recorded precision and resume check."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dmpo_jax.training import steps
from tests.helpers import tiny_model

P, T = 6, 12


def _batch(seed=0, rows=4):
  rs = np.random.RandomState(seed)
  tokens = rs.randint(3, 61, (rows, P + T)).astype(np.int32)
  pmask = np.ones((rows, P), np.int32)
  for i, pad in enumerate([0, 2, 5, 3][:rows]):
    tokens[i, :pad], pmask[i, :pad] = 0, 0
  adv = rs.randn(rows, 1).astype(np.float32)
  return {"tokens": jnp.asarray(tokens), "prompt_mask": jnp.asarray(pmask)}, jnp.asarray(adv)


def _loss_and_grad(model, chunk=None):
  graphdef, state = nnx.split(model)
  fn = steps.make_logprob_fn(graphdef, P, temperature=0.9, chunk=chunk)
  seqs, adv = _batch()

  def loss(st):  # a policy-gradient surrogate plus an entropy bonus: both heads' outputs
    out = fn({"model": st}, seqs)
    return -jnp.mean(out["logprobs"] * adv) - 0.01 * jnp.mean(out["entropy"]), out

  (value, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
  return value, out, grads


@pytest.mark.slow
def test_chunked_logprobs_equal_whole_in_value_and_gradient():
  model = tiny_model(scale=3.0)
  v1, o1, g1 = _loss_and_grad(model, chunk=T)
  v4, o4, g4 = _loss_and_grad(model, chunk=4)
  np.testing.assert_allclose(o4["logprobs"], o1["logprobs"], atol=1e-6)
  np.testing.assert_allclose(o4["entropy"], o1["entropy"], atol=1e-6)
  assert abs(float(v4 - v1)) < 1e-6
  for a, b in zip(jax.tree.leaves(g4), jax.tree.leaves(g1)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert steps.auto_chunk(1024) == 128 and steps.auto_chunk(12) == 12 and steps.auto_chunk(300) == 100
  with pytest.raises(ValueError, match="chunk \\(5\\) must divide the completion length T \\(12\\)"):
    _loss_and_grad(model, chunk=5)


# bf16 compute (float32 master weights, float32 log-prob and loss math) against float32 on a
# tiny model. Stated bounds: loss within 0.1% relative, gradient cosine similarity above 0.999
# (measured on this model: 7e-5 and 0.99999).
LOSS_RTOL, GRAD_COSINE = 1e-3, 0.999


@pytest.mark.slow
def test_bfloat16_update_is_close_to_float32():
  f32 = tiny_model(scale=3.0)
  bf16 = tiny_model(scale=3.0, dtype="bfloat16")  # same seed: the same float32 weights
  v32, o32, g32 = _loss_and_grad(f32)
  v16, o16, g16 = _loss_and_grad(bf16)
  assert o16["logprobs"].dtype == jnp.float32  # log-prob math in float32
  for a in jax.tree.leaves(g16):
    assert a.dtype == jnp.float32  # gradients land on the float32 master weights
  rel = abs(float(v16 - v32)) / abs(float(v32))
  flat = lambda g: jnp.concatenate([x.ravel() for x in jax.tree.leaves(g)])
  a, b = flat(g16), flat(g32)
  cosine = float(a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))
  print(f"bf16 vs f32: loss relative error {rel:.2e}, gradient cosine {cosine:.5f}")
  assert rel < LOSS_RTOL
  assert cosine > GRAD_COSINE
  assert rel > 0 or cosine < 1  # it really computed in bf16


@pytest.mark.slow
def test_logits_logprobs_entropy_and_losses_stay_float32_under_bfloat16_compute():
  """bf16 compute (float32 weights): the sampler's log-probs, the update's log-probs and
  entropies, and every preset loss and metric tested here are float32 arrays, and the
  activations really are bf16. An accidental bf16 log-softmax would fail the dtype checks."""
  from dmpo_jax import sampling
  from dmpo_jax.objectives import presets

  model = tiny_model(scale=3.0, dtype="bfloat16")
  prompts, g, lt = [[5, 6, 7, 8, 9, 10], [11, 12, 13]], 4, 8
  assert model.hidden(jnp.asarray([prompts[0]]))[0].dtype == jnp.bfloat16  # compute: bf16
  assert model(jnp.asarray([prompts[0]])).dtype == jnp.float32  # logits: f32 accumulation
  out = sampling.generate(model, prompts, rng=jax.random.key(0), max_new_tokens=lt,
                          num_samples=g, prompt_length=P)
  assert out.logprobs.dtype == jnp.float32  # the sampler's log_softmax
  toks, pm = sampling.pad_prompts(prompts, P)
  seqs = {"tokens": jnp.concatenate([jnp.repeat(toks, g, 0), out.tokens], 1).reshape(2, g, P + lt),
          "prompt_mask": jnp.repeat(pm, g, 0).reshape(2, g, P)}
  batch = {"seqs": seqs, "mask": out.mask.reshape(2, g, lt),
           "old_logprobs": out.logprobs.reshape(2, g, lt),
           "rewards": jnp.asarray([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 1.0, 0.0]])}
  graphdef, state = nnx.split(model)
  fn = steps.make_logprob_fn(graphdef, P)
  lp = fn({"model": state}, seqs)
  assert lp["logprobs"].dtype == lp["entropy"].dtype == jnp.float32
  for name in ("grpo", "dmpo"):
    loss, metrics = presets.build_loss(presets.objective_config(name), fn)({"model": state}, batch)
    assert loss.dtype == jnp.float32, name
    for k, v in metrics.items():
      assert jnp.asarray(v).dtype in (jnp.float32, jnp.int32), (name, k, jnp.asarray(v).dtype)


def test_config_accepts_auto_and_refuses_a_typo_naming_the_field():
  from dmpo_jax.training import config as config_lib
  from tests.helpers import smoke
  config_lib.check_fields(smoke(**{"model.dtype": "auto"}))
  with pytest.raises(config_lib.ConfigError, match=r"config\.model\.dtype='bfloat61': must be one "
                     r"of \['float32', 'bfloat16', 'float16', 'auto'\]"):
    config_lib.check_fields(smoke(**{"model.dtype": "bfloat61"}))
  # "auto" is a compute choice: the master weights' dtype is always explicit
  with pytest.raises(config_lib.ConfigError, match=r"config\.model\.param_dtype='auto'"):
    config_lib.check_fields(smoke(**{"model.param_dtype": "auto"}))


def test_collapse_config_pins_float32_whatever_nphard_says(monkeypatch):
  """configs/collapse.py (the study's config) sets float32 itself: with configs/nphard.py's
  model block switched to "auto" and bfloat16 weights, it still computes in float32."""
  from tests.helpers import config_module
  collapse = config_module("collapse")
  for arg in (None, "smoke", "regime=stream,pool=8"):
    c = collapse.get_config(arg)
    assert (c.model.dtype, c.model.param_dtype) == ("float32", "float32")
  base = collapse.nphard.get_config

  def switched(arg=None):
    c = base(arg)
    c.model.dtype, c.model.param_dtype = "auto", "bfloat16"
    return c

  monkeypatch.setattr(collapse.nphard, "get_config", switched)
  assert collapse.nphard.get_config().model.dtype == "auto"
  for arg in (None, "smoke"):
    c = collapse.get_config(arg)
    assert (c.model.dtype, c.model.param_dtype) == ("float32", "float32")


def test_a_resume_refuses_another_resolved_compute_dtype():
  from dmpo_jax.models import precision
  from dmpo_jax.training import run as run_lib
  bf16 = precision.resolve("auto", precision.Backend("tpu"))
  f32 = precision.resolve("auto", precision.Backend("cpu", cpu_flags=frozenset({"avx2"})))
  run_lib.check_precision(bf16.record(), bf16, "w")  # the same: resumes
  run_lib.check_precision(None, f32, "w")  # a checkpoint from before the record: resumes
  with pytest.raises(run_lib.TrainingError, match=r"w's checkpoint was trained in bfloat16 "
                     r"\(model.dtype='auto': TPU.*computes in float32 here \(CPU without"):
    run_lib.check_precision(bf16.record(), f32, "w")


@pytest.mark.slow
def test_auto_run_records_its_precision_and_refuses_a_resume_that_resolves_otherwise(
    tmp_path, monkeypatch, capsys):
  """model.dtype = "auto" on a simulated bfloat16 CPU: the run prints what it computes in,
  records it in results.json and in the checkpoint's meta; rerun on a simulated CPU without
  bfloat16 ("auto" now float32), the resume is refused before anything is written."""
  from dmpo_jax.models import precision
  from dmpo_jax.training import checkpoint as ckpt_lib
  from dmpo_jax.training import run as run_lib
  from dmpo_jax.training import stages
  from tests.helpers import smoke
  flags = {"now": frozenset({"avx2", "avx512_bf16"})}
  monkeypatch.setattr(precision, "read_cpu_flags", lambda path="/proc/cpuinfo": flags["now"])
  cfg = smoke(**{"model.dtype": "auto", "sft.steps": 1, "rl.steps": 1, "log.plots": False,
                 "checkpoint.export_hf": False})
  res = stages.train(cfg, str(tmp_path))
  assert "compute dtype bfloat16 (model.dtype='auto': CPU flags avx512_bf16" in capsys.readouterr().out
  want = {"requested": "auto", "dtype": "bfloat16", "param_dtype": "float32"}
  assert {k: res["precision"][k] for k in want} == want
  assert json.loads((tmp_path / "results.json").read_text())["precision"] == res["precision"]
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"))
  assert ck.read_meta(ck.latest_step())["precision"]["dtype"] == "bfloat16"
  before = sorted(p.name for p in tmp_path.iterdir())
  flags["now"] = frozenset({"avx2"})
  with pytest.raises(run_lib.TrainingError, match="trained in bfloat16.*computes in float32 here"):
    stages.train(cfg, str(tmp_path))
  assert sorted(p.name for p in tmp_path.iterdir()) == before
