"""Attention cores, one per backend, behind one choice: `ModelConfig.attention`.

- 'reference': our own softmax attention with a hand-written backward
  (`attend`). It serves every call, including decode over a KV cache and the
  prompt prefix shared by a group of samples; the fastest on XLA:CPU.
  `attend_shared` is its form for the prefix-shared update (completions that
  read their group's prompt keys once, whatever the configured core).
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


def to_groups(x, prompts: int):
  """[B, K, Q, X] -> [Bp, K, R*Q, X]: the R = B / Bp adjacent rows of each of Bp groups side by
  side on the query axis (row i * R + r, query j -> group i, query r * Q + j)."""
  b, k, q, d = x.shape
  r = b // prompts
  return x.reshape(prompts, r, k, q, d).transpose(0, 2, 1, 3, 4).reshape(prompts, k, r * q, d)


def from_groups(x, rows: int):
  """[Bp, K, R*Q, X] -> [B, K, Q, X], the inverse of `to_groups` (B = rows)."""
  bp, k, rq, d = x.shape
  r = rows // bp
  return x.reshape(bp, k, r, rq // r, d).transpose(0, 2, 1, 3, 4).reshape(rows, k, rq // r, d)


@jax.custom_vjp
def attend_shared(q, k, v, mask, pk, pv, pmask):
  """`attend` over a shared prefix and the rows' own keys: one softmax over [prefix | own].

  q [B, K, Q, H], own k [B, K, H, S], v [B, K, S, H], mask [B or 1, 1, Q, S] bool; the prefix
  pk [Bp, K, H, P], pv [Bp, K, P, H], pmask [Bp, 1, 1, P] bool is read by the R = B / Bp
  adjacent rows of each group (row i * R + r reads prefix i) -> [B, K, Q, H].

  The prefix is never repeated R times: its logits are one dot of the group's R*Q queries
  (`to_groups`) against its P keys, [Bp, K, R*Q, P]; only the row statistics (max, sum) and
  the outputs move between the two layouts. The backward (as `attend`'s) contracts the
  prefix's key and value gradients over the R*Q queries, i.e. sums them over the group.
  """
  return _attend_shared_fwd(q, k, v, mask, pk, pv, pmask)[0]


def _attend_shared_fwd(q, k, v, mask, pk, pv, pmask):
  f32, scale = jnp.float32, q.shape[-1] ** -0.5
  b, bp = q.shape[0], pk.shape[0]
  logits = jnp.einsum("bkqh,bkhs->bkqs", q, k, preferred_element_type=f32)
  logits = jnp.where(mask, logits * scale, NEG_INF)  # [B, K, Q, S]
  plogits = jnp.einsum("bkqh,bkhs->bkqs", to_groups(q, bp), pk, preferred_element_type=f32)
  plogits = jnp.where(pmask, plogits * scale, NEG_INF)  # [Bp, K, R*Q, P]
  m = jnp.maximum(jnp.max(logits, -1, keepdims=True),
                  from_groups(jnp.max(plogits, -1, keepdims=True), b))  # [B, K, Q, 1]
  e, pe = jnp.exp(logits - m), jnp.exp(plogits - to_groups(m, bp))
  z = jnp.sum(e, -1, keepdims=True) + from_groups(jnp.sum(pe, -1, keepdims=True), b)
  probs, pprobs = e / z, pe / to_groups(z, bp)  # float32
  out = (jnp.einsum("bkqs,bksh->bkqh", probs.astype(q.dtype), v, preferred_element_type=f32)
         + from_groups(jnp.einsum("bkqs,bksh->bkqh", pprobs.astype(q.dtype), pv,
                                  preferred_element_type=f32), b)).astype(q.dtype)
  return out, (q, k, v, mask, pk, pv, pmask, probs, pprobs, out)


def _attend_shared_bwd(res, d_out):
  q, k, v, mask, pk, pv, pmask, probs, pprobs, out = res
  dt, f32, scale = q.dtype, jnp.float32, q.shape[-1] ** -0.5
  b, bp = q.shape[0], pk.shape[0]
  gd_out, gq = to_groups(d_out, bp), to_groups(q, bp)
  delta = jnp.sum(d_out.astype(f32) * out.astype(f32), axis=-1, keepdims=True)  # [B, K, Q, 1]
  d_v = jnp.einsum("bkqs,bkqh->bksh", probs.astype(dt), d_out)
  d_pv = jnp.einsum("bkqs,bkqh->bksh", pprobs.astype(dt), gd_out)  # summed over the group
  d_probs = jnp.einsum("bkqh,bksh->bkqs", d_out, v, preferred_element_type=f32)
  d_pprobs = jnp.einsum("bkqh,bksh->bkqs", gd_out, pv, preferred_element_type=f32)
  d_logits = jnp.where(mask, probs * (d_probs - delta) * scale, 0.0).astype(dt)
  d_plogits = jnp.where(pmask, pprobs * (d_pprobs - to_groups(delta, bp)) * scale,
                        0.0).astype(dt)
  d_q = (jnp.einsum("bkqs,bkhs->bkqh", d_logits, k, preferred_element_type=f32)
         + from_groups(jnp.einsum("bkqs,bkhs->bkqh", d_plogits, pk,
                                  preferred_element_type=f32), b)).astype(dt)
  d_k = jnp.einsum("bkqh,bkqs->bkhs", q, d_logits)
  d_pk = jnp.einsum("bkqh,bkqs->bkhs", gq, d_plogits)  # summed over the group
  return d_q, d_k, d_v, None, d_pk, d_pv, None


attend_shared.defvjp(_attend_shared_fwd, _attend_shared_bwd)


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
