"""The model: parity with transformers, cache/padding invariances, HF round trips, bad input."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dmpo_jax.models import hf
from dmpo_jax.models import tokenizer as task_tokenizer
from tests.helpers import jitted, tiny_config, tiny_hf, tiny_model


def _left_padded(ids, lengths):
  """Rows of `ids` truncated to `lengths`, left-padded: tokens, mask, positions."""
  b, l = ids.shape
  tokens = np.zeros_like(ids)
  mask = np.zeros((b, l), np.int64)
  for i, n in enumerate(lengths):
    tokens[i, l - n:] = ids[i, :n]
    mask[i, l - n:] = 1
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  return tokens, mask, positions


def _our_logits(model, tokens, mask, positions):
  l = tokens.shape[1]
  attn = (np.tril(np.ones((l, l), bool))[None] & mask[:, None, :].astype(bool))
  return np.asarray(model(jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32),
                          mask=jnp.asarray(attn)))


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
@pytest.mark.parametrize("arch,tie", [("qwen2", False), ("llama", True), ("llama", False)])
def test_parity_with_transformers_on_padded_batch(tmp_path, arch, tie):
  import torch

  ref_model = tiny_hf(tmp_path, arch, tie=tie)
  model, tok = hf.load(str(tmp_path))
  assert tok is None  # the folder has no tokenizer files
  assert model.cfg.qkv_bias == (arch == "qwen2")
  ids = np.random.RandomState(1).randint(0, 97, (3, 12))
  tokens, mask, positions = _left_padded(ids, [12, 8, 3])
  with torch.no_grad():
    ref = ref_model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(positions)).logits.numpy()
  ours = _our_logits(model, tokens, mask, positions)
  valid = mask.astype(bool)
  np.testing.assert_allclose(ours[valid], ref[valid], atol=1e-4, rtol=0)
  # The unmasked, unpadded call of the public API: positions 0..L-1, causal.
  with torch.no_grad():
    ref_full = ref_model(input_ids=torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids, jnp.int32))), ref_full,
                             atol=1e-4, rtol=0)


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_padding_does_not_change_results():
  model = tiny_model(scale=5.0)
  ids = np.random.RandomState(0).randint(3, 61, (1, 9))
  alone = np.asarray(model(jnp.asarray(ids, jnp.int32)))[0]
  batch = np.concatenate([ids, np.random.RandomState(1).randint(3, 61, (1, 9))])
  tokens, mask, positions = _left_padded(np.pad(batch, ((0, 0), (0, 4))), [9, 13])
  padded = _our_logits(model, tokens, mask, positions)[0, 4:]
  np.testing.assert_allclose(padded, alone, atol=1e-5)


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_cache_equals_no_cache_and_prefill_plus_decode_equals_full_forward():
  model = tiny_model(scale=3.0)
  b, l, p = 2, 10, 6
  ids = jnp.asarray(np.random.RandomState(2).randint(3, 61, (b, l)), jnp.int32)
  full = np.asarray(model(ids))
  cache, step = model.init_cache(b, l), jitted(model)
  slots = jnp.arange(l)
  mask = jnp.broadcast_to(slots[None, None, :] <= jnp.arange(p)[None, :, None], (b, p, l))
  logits, cache = step(ids[:, :p], mask=mask, cache=cache, cache_index=0)
  steps = [np.asarray(logits)]
  for t in range(p, l):
    pos = jnp.full((b, 1), t, jnp.int32)
    m = jnp.broadcast_to(slots <= t, (b, 1, l))
    logits, cache = step(ids[:, t:t + 1], pos, mask=m, cache=cache, cache_index=t)
    steps.append(np.asarray(logits))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_shared_prefix_decode_equals_full_forward():
  """R rows sharing one prefilled prompt (with_prefix) decode exactly like full forwards."""
  model = tiny_model(scale=3.0)
  bp, r, p, t = 2, 3, 5, 4
  rng = np.random.RandomState(3)
  prompts = rng.randint(3, 61, (bp, p))
  ids = np.concatenate([np.repeat(prompts, r, 0), rng.randint(3, 61, (bp * r, t))], axis=1)
  ids = jnp.asarray(ids, jnp.int32)
  full = np.asarray(model(ids))[:, p:]
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((p, p), bool)), (bp, p, p))
  _, prefix = model(ids[::r, :p], mask=causal, cache=model.init_cache(bp, p), cache_index=0)
  cache = model.with_prefix(prefix, bp * r, t)
  steps, step = [], jitted(model)
  for i in range(t):
    m = jnp.broadcast_to(jnp.arange(p + t) <= p + i, (bp * r, 1, p + t))
    pos = jnp.full((bp * r, 1), p + i, jnp.int32)
    logits, cache = step(ids[:, p + i:p + i + 1], pos, mask=m, cache=cache, cache_index=i)
    steps.append(np.asarray(logits))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)
  with pytest.raises(ValueError, match="multiple"):
    model.with_prefix(prefix, 5, t)

@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_bfloat16_compute_is_close_to_float32():
  model = tiny_model(scale=3.0)
  ids = jnp.asarray(np.random.RandomState(3).randint(3, 61, (2, 8)), jnp.int32)
  ref = np.asarray(model(ids))
  graphdef, state = nnx.split(model)
  bf = nnx.merge(graphdef, state)
  bf.cfg = model.cfg.replace(dtype="bfloat16")
  for blk in bf.layers:
    blk.attn.cfg = bf.cfg
  out = np.asarray(bf(ids))
  assert out.dtype == np.float32
  # bf16 has 8 bits of mantissa: about 1% relative error per op.
  scale = np.abs(ref).max()
  assert np.abs(out - ref).max() < 0.05 * scale
  assert np.abs(out - ref).max() > 0  # it really computed in bf16


@pytest.mark.slow  # > 6 s on the 2-core CPU: full suite only
def test_save_round_trip_opens_in_transformers(tmp_path):
  import torch
  import transformers

  model = tiny_model(seed=4, scale=2.0)
  tok = task_tokenizer.build()
  out = tmp_path / "export"
  hf.save(model, tok, str(out))
  assert sorted(os.listdir(tmp_path)) == ["export"]  # no temp folder left behind
  ref = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
  ids = np.random.RandomState(5).randint(3, 61, (2, 7))
  with torch.no_grad():
    theirs = ref(input_ids=torch.tensor(ids)).logits.numpy()
  ours = np.asarray(model(jnp.asarray(ids, jnp.int32)))
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  again, tok2 = hf.load(str(out))
  np.testing.assert_array_equal(np.asarray(again(jnp.asarray(ids, jnp.int32))), ours)
  assert tok2.decode(tok2.encode("Answer: [1, 2]")) == "Answer: [1, 2]"
  # Saving over an existing export replaces it whole.
  hf.save(again, None, str(out))
  assert not (out / "tokenizer.json").exists()


def test_sharded_checkpoint_loads(tmp_path):
  import torch

  ref_model = tiny_hf(tmp_path, "qwen2", max_shard_size="20KB")
  # Re-save with small shards (transformers picks the index format).
  ref_model.save_pretrained(tmp_path, max_shard_size="20KB")
  assert (tmp_path / "model.safetensors.index.json").exists()
  model, _ = hf.load(str(tmp_path))
  ids = np.arange(8)[None] % 97
  with torch.no_grad():
    ref = ref_model(input_ids=torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids, jnp.int32))), ref, atol=1e-4)


def test_bad_checkpoints_name_the_problem(tmp_path):
  from safetensors.numpy import load_file, save_file

  with pytest.raises(hf.CheckpointError, match="does not exist"):
    hf.load(str(tmp_path / "nowhere"))
  tiny_hf(tmp_path, "qwen2")
  cfg = json.loads((tmp_path / "config.json").read_text())

  bad = dict(cfg, model_type="gpt2")
  (tmp_path / "config.json").write_text(json.dumps(bad))
  with pytest.raises(hf.CheckpointError, match="unsupported architecture.*gpt2"):
    hf.load(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps(cfg))

  weights = tmp_path / "model.safetensors"
  tensors = load_file(str(weights))
  name = "model.layers.1.mlp.up_proj.weight"
  missing = {k: v for k, v in tensors.items() if k != name}
  save_file(missing, str(weights))
  with pytest.raises(hf.CheckpointError, match=f"{name} is missing"):
    hf.load(str(tmp_path))

  wrong = dict(tensors, **{name: np.zeros((96, 65), np.float32)})
  save_file(wrong, str(weights))
  # Shapes in the file's own [out, in] layout.
  with pytest.raises(hf.CheckpointError, match=rf"{name} has shape \(96, 65\) in .*expects \(96, 64\)"):
    hf.load(str(tmp_path))

  extra = dict(tensors, **{"model.layers.9.surprise.weight": np.zeros(3, np.float32)})
  save_file(extra, str(weights))
  with pytest.raises(hf.CheckpointError, match="unexpected tensor.*surprise"):
    hf.load(str(tmp_path))

  os.remove(weights)
  with pytest.raises(hf.CheckpointError, match="no \\*.safetensors"):
    hf.load(str(tmp_path))
  os.remove(tmp_path / "config.json")
  with pytest.raises(hf.CheckpointError, match="config.json is missing"):
    hf.load(str(tmp_path))


def test_model_config_refuses_bad_shapes():
  from dmpo_jax.models.config import ModelConfig

  with pytest.raises(ValueError, match="num_heads .* multiple of num_kv_heads"):
    ModelConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=3,
                num_kv_heads=2)
  with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
    ModelConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
                num_kv_heads=2, dtype="fp8")


def test_parameters_carry_logical_axes():
  model = tiny_model()
  specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
  flat = {"/".join(map(str, k)): v for k, v in nnx.to_flat_state(specs)}
  assert flat["embed"].get_value() == jax.sharding.PartitionSpec("vocab", "embed")
  assert flat["layers/0/attn/q"].get_value() == jax.sharding.PartitionSpec("embed", "heads")
  assert flat["layers/1/mlp/down"].get_value() == jax.sharding.PartitionSpec("mlp", "embed")
  # Every parameter is named, none left to default replication by accident.
  for path, spec in flat.items():
    assert len(spec.get_value()) >= 1, path


def test_task_tokenizer_round_trip(tmp_path):
  from transformers import PreTrainedTokenizerFast

  tok = task_tokenizer.build(str(tmp_path))
  again = task_tokenizer.load(str(tmp_path))
  assert isinstance(again, PreTrainedTokenizerFast)
  text = "TSP n=4 dist 0 12 7\nAnswer: [0, 12, 3, 0] Impossible"
  ids = again.encode(text)
  assert again.decode(ids) == text
  assert ids == tok.encode(text)
  assert len(ids) < len(text)  # task words are single tokens
  assert again.convert_ids_to_tokens(again.encode("12")) == ["1", "2"]  # digit by digit
  assert again.eos_token_id is not None and again.pad_token_id == 0


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_remat_gives_the_same_gradients():
  import jax.numpy as jnp
  from flax import nnx
  from dmpo_jax.models.transformer import Transformer
  cfg = tiny_config()
  g, s = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  g2, _ = nnx.split(Transformer(cfg.replace(remat=True), rngs=nnx.Rngs(0)))
  tok = jax.random.randint(jax.random.key(0), (2, 9), 0, cfg.vocab_size)
  loss = lambda gd: (lambda st: jnp.mean(nnx.merge(gd, st)(tok) ** 2))
  a, b = jax.grad(loss(g))(s), jax.grad(loss(g2))(s)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
  assert "remat" in str(jax.make_jaxpr(jax.grad(loss(g2)))(s))  # the recomputation is really there


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_attention_core_backward_matches_autodiff(dtype, tol):
  from dmpo_jax.models.transformer import _NEG_INF, attend

  b, k, q_len, s, h = 3, 2, 10, 7, 8
  keys = jax.random.split(jax.random.key(0), 5)
  q = jax.random.normal(keys[0], (b, k, q_len, h))
  kk = jax.random.normal(keys[1], (b, k, h, s))
  v = jax.random.normal(keys[2], (b, k, s, h))
  mask = jax.random.bernoulli(keys[3], 0.6, (b, 1, q_len, s)).at[0, 0, 3].set(False)  # one empty row
  weights = jax.random.normal(keys[4], (b, k, q_len, h))

  def reference(q, kk, v):  # float32, plain autodiff of masked softmax attention
    logits = jnp.where(mask, jnp.einsum("bkqh,bkhs->bkqs", q, kk) * h ** -0.5, _NEG_INF)
    return jnp.einsum("bkqs,bksh->bkqh", jax.nn.softmax(logits, -1), v)

  def grads(fn, *args):
    return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * weights), argnums=(0, 1, 2)))(*args)

  ours = grads(lambda *a: attend(*a, mask), *(t.astype(dtype) for t in (q, kk, v)))
  want = grads(reference, q, kk, v)
  for name, a, w in zip("qkv", ours, want):
    assert a.dtype == dtype, name
    err = float(jnp.abs(a.astype(jnp.float32) - w).max() / jnp.abs(w).max())
    assert err < tol, f"d{name}: relative error {err:.2e}"


def test_swiglu_backward_matches_autodiff():
  from dmpo_jax.models.transformer import swiglu

  keys = jax.random.split(jax.random.key(1), 3)
  gate, up, weights = (4 * jax.random.normal(k, (5, 12)) for k in keys)
  loss = lambda fn: lambda g, u: jnp.sum(fn(g, u) * weights)
  ours = jax.grad(loss(swiglu), argnums=(0, 1))(gate, up)
  want = jax.grad(loss(lambda g, u: jax.nn.silu(g) * u), argnums=(0, 1))(gate, up)
  np.testing.assert_allclose(swiglu(gate, up), jax.nn.silu(gate) * up, rtol=1e-6)
  for a, w in zip(ours, want):
    np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_offsets_equal_dense_masks_and_bad_positions_are_refused():
  """Padding as per-row offsets (models.positions) gives the logits of the equivalent dense
  mask; multi-stream positions need mrope_section, which must cover head_dim / 2."""
  from dmpo_jax.models import positions

  model = tiny_model(scale=3.0)
  ids = np.random.RandomState(4).randint(3, 61, (3, 9))
  tokens, mask, pos = _left_padded(ids, [9, 5, 1])
  dense = _our_logits(model, tokens, mask, pos)
  offsets = positions.left_pad_offsets(jnp.asarray(mask))
  np.testing.assert_array_equal(np.asarray(offsets), [0, 4, 8])
  np.testing.assert_array_equal(np.asarray(positions.slot_positions(offsets, 9)), pos)
  ours = np.asarray(model(jnp.asarray(tokens, jnp.int32), offsets=offsets))
  valid = mask.astype(bool)
  np.testing.assert_allclose(ours[valid], dense[valid], atol=1e-6)
  with pytest.raises(ValueError, match="mrope_section is not set"):
    model(jnp.asarray(tokens, jnp.int32), jnp.zeros((3, 3, 9), jnp.int32))
  with pytest.raises(ValueError, match=r"mrope_section \(2, 1\) must sum to head_dim / 2 = 4"):
    tiny_config(mrope_section=(2, 1))
