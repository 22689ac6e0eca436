"""Attention cores, one per backend, behind one choice: `ModelConfig.attention`.

- 'reference': our own softmax attention with a hand-written backward
  (`attend`). It serves every call, including decode over a KV cache and the
  prompt prefix shared by a group of samples; the fastest on XLA:CPU.
- 'xla' / 'cudnn': `jax.nn.dot_product_attention` with that implementation
  (cuDNN flash attention on NVIDIA GPUs: bfloat16 / float16 only). Used where
  the keys are this call's own tokens: the update, scoring and the prefill.
- 'flash': JAX's Pallas TPU flash attention kernel
  (`jax.experimental.pallas.ops.tpu.flash_attention`), causal with segment
  ids for the left padding. Checked on the CPU in interpret mode only.
- 'auto': 'reference' on CPU, 'cudnn' on GPU in 16-bit compute ('xla' in
  float32), 'flash' on TPU.

Every core takes the same inputs: q [B, L, N, H], k and v [B, L, K, H] (GQA:
N a multiple of K, not repeated by the caller), the visibility mask
[B, L, L] bool (`positions.visible`) and the row offsets [B]; the fused
kernels never materialise the [L, L] probabilities.

Shapes: B batch, L tokens, N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite: a fully masked row must not produce NaNs
IMPLEMENTATIONS = ("auto", "reference", "xla", "cudnn", "flash")


def resolve(name: str, dtype, backend: str | None = None) -> str:
  """The implementation `name` means on `backend` (default: JAX's default backend)."""
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"unknown attention implementation {name!r}; choose one of "
                     f"{list(IMPLEMENTATIONS)}")
  if name != "auto":
    return name
  backend = backend or jax.default_backend()
  if backend == "gpu":
    return "cudnn" if jnp.dtype(dtype).itemsize == 2 else "xla"
  if backend == "tpu":
    return "flash"
  return "reference"


@jax.custom_vjp
def attend(q, k, v, mask):
  """Softmax attention core: q [B, K, Q, H], k [B, K, H, S], v [B, K, S, H], mask [B, 1, Q, S]
  bool -> [B, K, Q, H]. Logits and softmax in float32, scaled by H ** -0.5.

  A hand-written backward (the standard one: dP = dO V^T, dS = P * (dP - rowsum(dO * O)))
  saves several passes over the [B, K, Q, S] tensors that autodiff of the
  masked softmax makes: the attention core's forward + backward ran ~1.5x
  faster on XLA:CPU. tests/models/test_models.py checks it against autodiff.
  """
  return _attend_fwd(q, k, v, mask)[0]


def _attend_fwd(q, k, v, mask):
  logits = jnp.einsum("bkqh,bkhs->bkqs", q, k, preferred_element_type=jnp.float32)
  logits = jnp.where(mask, logits * (q.shape[-1] ** -0.5), NEG_INF)
  probs = jax.nn.softmax(logits, axis=-1)  # float32
  out = jnp.einsum("bkqs,bksh->bkqh", probs.astype(q.dtype), v)
  return out, (q, k, v, mask, probs, out)


def _attend_bwd(res, d_out):
  q, k, v, mask, probs, out = res
  dt, f32 = q.dtype, jnp.float32
  d_v = jnp.einsum("bkqs,bkqh->bksh", probs.astype(dt), d_out)
  d_probs = jnp.einsum("bkqh,bksh->bkqs", d_out, v, preferred_element_type=f32)
  delta = jnp.sum(d_out.astype(f32) * out.astype(f32), axis=-1, keepdims=True)
  d_logits = jnp.where(mask, probs * (d_probs - delta) * (q.shape[-1] ** -0.5), 0.0).astype(dt)
  d_q = jnp.einsum("bkqs,bkhs->bkqh", d_logits, k)
  d_k = jnp.einsum("bkqh,bkqs->bkhs", q, d_logits)
  return d_q, d_k, d_v, None


attend.defvjp(_attend_fwd, _attend_bwd)


def grouped_queries(q, num_kv_heads: int):
  """q [B, L, N, H] -> [B, K, G*L, H]: the G query heads of kv head k (query head n = k * G + g,
  HF's repeat_kv order) and the L queries share one axis, so GQA is one 4-D batched dot
  (5-D einsums ran ~4x slower on XLA:CPU)."""
  b, l, n, h = q.shape
  g = n // num_kv_heads
  return q.reshape(b, l, num_kv_heads, g, h).transpose(0, 2, 3, 1, 4).reshape(
      b, num_kv_heads, g * l, h)


def ungrouped(out, num_heads: int):
  """[B, K, G*L, H] -> [B, L, N*H], the inverse of `grouped_queries` (then heads flattened)."""
  b, k, gl, h = out.shape
  g = num_heads // k
  l = gl // g
  return out.reshape(b, k, g, l, h).transpose(0, 3, 1, 2, 4).reshape(b, l, num_heads * h)


def grouped_mask(mask, groups: int):
  """mask [B, L, S] -> [B, 1, G*L, S] for `grouped_queries` layouts."""
  b, l, s = mask.shape
  return jnp.broadcast_to(mask[:, None, None], (b, 1, groups, l, s)).reshape(b, 1, groups * l, s)


def reference(q, k, v, mask, offsets=None):
  """`attend` on [B, L, *, H] inputs: the reference every other core is tested against."""
  del offsets
  kv = k.shape[2]
  out = attend(grouped_queries(q, kv), k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3),
               grouped_mask(mask, q.shape[2] // kv))
  return ungrouped(out, q.shape[2]).reshape(q.shape)


def dot_product(q, k, v, mask, offsets=None, *, implementation: str = "xla"):
  """`jax.nn.dot_product_attention` (GQA native), mask built from the visibility [B, L, L]."""
  del offsets
  return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=q.shape[-1] ** -0.5,
                                      implementation=implementation)


def pallas_flash(q, k, v, mask, offsets, *, block: int = 128):
  """JAX's Pallas TPU flash attention: causal, left padding as segment ids (pads are segment
  0, real tokens 1, so a real query never sees a pad key; pad rows' outputs are unused).
  Needs L a multiple of `block`; kv heads repeated to N (the kernel is multi-head only)."""
  from jax.experimental.pallas.ops.tpu import flash_attention as fa

  del mask
  b, l, n, h = q.shape
  if l % block:
    raise ValueError(f"attention='flash' needs a sequence length that is a multiple of {block}, "
                     f"got {l}; pad the batch or use attention='reference'")
  rep = n // k.shape[2]
  to_heads = lambda t: jnp.repeat(t, rep, axis=2).transpose(0, 2, 1, 3)  # [B, N, L, H]
  seg = (jnp.arange(l)[None, :] >= offsets[:, None]).astype(jnp.int32)  # [B, L]
  sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1,
                        block_q_major_dkv=block, block_k_major_dkv=block, block_k_dkv=block,
                        block_q_dkv=block, block_k_major_dq=block, block_k_dq=block,
                        block_q_dq=block)
  out = fa.flash_attention(q.transpose(0, 2, 1, 3), to_heads(k), to_heads(v),
                           segment_ids=fa.SegmentIds(q=seg, kv=seg), causal=True,
                           sm_scale=h ** -0.5, block_sizes=sizes)
  return out.transpose(0, 2, 1, 3)


def core(name: str):
  """The core function (q, k, v, mask, offsets) -> [B, L, N, H] of a resolved name."""
  if name == "reference":
    return reference
  if name in ("xla", "cudnn"):
    return lambda *a: dot_product(*a, implementation=name)
  if name == "flash":
    return pallas_flash
  raise ValueError(f"no attention core {name!r}; resolve 'auto' first")
