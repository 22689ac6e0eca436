"""Attention cores by backend agree with the reference in forward and gradient (GQA, padding)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dmpo_jax.models import attention, positions
from tests.helpers import tiny_model


def _inputs(b, l, n, k, h, pads, seed=0):
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (b, l, n, h))
  kk = jax.random.normal(keys[1], (b, l, k, h))
  v = jax.random.normal(keys[2], (b, l, k, h))
  w = jax.random.normal(keys[3], (b, l, n, h))
  offsets = jnp.asarray(pads, jnp.int32)
  slots = jnp.arange(l)
  real = (slots[None, :] >= offsets[:, None])[:, :, None, None]  # [B, L, 1, 1]
  return q, kk, v, jnp.where(real, w, 0.0), offsets, positions.visible(offsets, slots, slots)


def _check_against_reference(fn, b, l, n, k, h, pads, tol):
  q, kk, v, w, offsets, mask = _inputs(b, l, n, k, h, pads)
  # Pad queries' outputs are unused (weights 0 there): cores may differ on them.
  loss = lambda core: lambda *a: jnp.sum(core(*a, mask, offsets) * w)
  vg = lambda core: jax.jit(jax.value_and_grad(loss(core), argnums=(0, 1, 2)))(q, kk, v)
  (want, want_g), (got, got_g) = vg(attention.reference), vg(fn)
  out = np.asarray(jax.jit(lambda *a: fn(*a) - attention.reference(*a))(q, kk, v, mask, offsets))
  real = np.asarray(w != 0)
  assert np.abs(out[real]).max() < tol
  assert abs(float(got - want)) < tol * max(1.0, abs(float(want)))
  for name, a, e in zip("qkv", got_g, want_g):
    err = float(jnp.abs(a - e).max())
    assert err < tol, f"d{name}: max error {err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["xla"])
def test_cpu_cores_equal_reference_with_gqa_and_padding(name):
  _check_against_reference(attention.core(name), 3, 12, 4, 2, 8, [0, 5, 11], 1e-5)


def test_cudnn_needs_a_gpu():
  if jax.default_backend() != "gpu":
    pytest.skip("cuDNN flash attention runs only on an NVIDIA GPU (CPU backend here)")
  _check_against_reference(lambda *a: attention.dot_product(*a, implementation="cudnn"),
                           2, 128, 4, 2, 64, [0, 37], 2e-2)  # bf16/fp16 only on cuDNN


@pytest.mark.slow
def test_pallas_tpu_flash_in_interpret_mode_at_real_block_shapes():
  """JAX's Pallas TPU flash kernel (forward and its own backward) in interpret mode: checked on
  the CPU until it runs on a TPU. Sequence 256 = two 128-blocks; GQA; left padding."""
  from jax.experimental.pallas import tpu as pltpu

  with pltpu.force_tpu_interpret_mode():
    _check_against_reference(attention.pallas_flash, 2, 256, 4, 2, 64, [0, 131], 1e-5)


def test_resolve_auto_by_backend_and_refuse_unknown():
  assert attention.resolve("auto", jnp.bfloat16, "cpu") == "reference"
  assert attention.resolve("auto", jnp.bfloat16, "gpu") == "cudnn"
  assert attention.resolve("auto", jnp.float32, "gpu") == "xla"
  assert attention.resolve("auto", jnp.bfloat16, "tpu") == "flash"
  with pytest.raises(ValueError, match="unknown attention implementation 'sdpa'"):
    attention.resolve("sdpa", jnp.float32)
  with pytest.raises(ValueError, match="ModelConfig.attention"):
    tiny_model(attention="sdpa")
  with pytest.raises(ValueError, match="multiple of 128"):
    attention.pallas_flash(*_inputs(1, 12, 2, 2, 8, [0])[:3], None, jnp.zeros((1,), jnp.int32))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["xla"])
def test_model_with_core_equals_reference_model_in_logits_and_gradients(name):
  """The whole model on a padded GQA batch: logits and parameter gradients; then a shared-prefix
  greedy rollout (prefill by the core, decode by the reference) gives the same tokens."""
  from dmpo_jax import sampling

  ref, other = tiny_model(scale=3.0), tiny_model(scale=3.0, attention=name)
  tokens = jnp.asarray(np.random.RandomState(0).randint(3, 61, (3, 10)), jnp.int32)
  offsets = jnp.asarray([0, 4, 9], jnp.int32)
  real = (jnp.arange(10)[None] >= offsets[:, None])[..., None]

  def loss(model):
    graphdef, state = nnx.split(model)
    fn = lambda st: jnp.sum(jnp.where(real, nnx.merge(graphdef, st)(tokens, offsets=offsets), 0)
                            ** 2)
    return jax.jit(jax.value_and_grad(fn))(state)

  (a, ga), (b, gb) = loss(ref), loss(other)
  assert abs(float(a - b)) < 1e-5 * abs(float(a))
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(x, y, atol=1e-5 * float(jnp.abs(x).max()) + 1e-7)
  prompts = [[5, 9, 11, 3], [7], [20, 21, 22, 23, 24, 25]]
  run = lambda m: np.asarray(sampling.generate(m, prompts, rng=jax.random.key(0),
                                               max_new_tokens=5, num_samples=2,
                                               greedy=True).tokens)
  np.testing.assert_array_equal(run(other), run(ref))
