"""A decoder-only transformer in Flax NNX covering the Llama (2, 3.x), Qwen2 and Qwen3 families.

RMSNorm, rotary embeddings (HF's rotate-half layout, the config's theta, Llama 3
scaling, multimodal sections), optional per-head q/k RMSNorm (Qwen3),
grouped-query attention with an optional explicit KV cache, SwiGLU MLP,
optional QKV bias, tied or untied embeddings, separate parameter and
compute dtypes, optional low-rank adapters on the projections (ModelConfig.lora,
`models.lora`). Every parameter carries logical axis names (`out_sharding`
metadata) that `dmpo_jax.parallel.sharding` maps to mesh axes.

Shapes: B batch, L tokens in this call, S key/cache length,
D model, F ffn, N query heads, K kv heads, H head dim, V vocab.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dmpo_jax.models import attention
from dmpo_jax.models import lora as lora_lib
from dmpo_jax.models import positions as positions_lib
from dmpo_jax.models.config import ModelConfig, as_dtype

# One layer's cache: {"k": [B, K, H, S], "v": [B, K, S, H]}, optionally with a
# prefix shared by groups of R = B / Bp adjacent rows, {"prefix_k": [Bp, K, H, P],
# "prefix_v": [Bp, K, P, H]} (the prompt of R samples, stored and read once).
# The whole cache is a tuple over layers; the write index is passed separately
# so that the cache stays a plain pytree of arrays.
Cache = tuple[dict[str, jax.Array], ...]

_NEG_INF = attention.NEG_INF
attend = attention.attend  # re-exported: the reference core


def init_param(rngs: nnx.Rngs, shape, dtype, names, scale: float | None = None, zeros=False):
  """A parameter with logical axis names; normal(0, scale) or zeros."""
  if zeros:
    value = jnp.zeros(shape, dtype)
  else:
    std = scale if scale is not None else 0.02
    value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  # eager_sharding=False: the model is built on one device (or abstractly)
  # and sharded by dmpo_jax.parallel.sharding from these names.
  return nnx.Param(value, out_sharding=names, eager_sharding=False)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, param_dtype, *, rngs: nnx.Rngs):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype), out_sharding=("norm",),
                           eager_sharding=False)
    self.eps = eps

  def __call__(self, x):
    # As HF: normalise in float32, cast back, then scale.
    dtype = x.dtype
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(dtype) * x32.astype(dtype)


def dense(x, w, **kw):
  """x [.., D] @ w [D, F] as one 2-D matmul over the flattened leading axes.

  Same result as `x @ w`; the 2-D form matters for the backward pass on
  XLA:CPU: the weight gradient then contracts one token axis, while with
  [B, L, D] activations it contracts two and XLA writes a transposed copy of
  each [B, L, F] activation gradient first (about a tenth of an RL update).
  """
  y = jnp.matmul(x.reshape(-1, x.shape[-1]), w, **kw)
  return y.reshape(*x.shape[:-1], w.shape[-1])


def project(module: nnx.Module, name: str, x):
  """x @ module.<name> in x's dtype, plus the weight's low-rank adapter if it has one
  (`models.lora`: x @ W + scale * (x @ A) @ B). Without one: exactly `dense(x, W)`."""
  y = dense(x, getattr(module, name)[...].astype(x.dtype))
  adapter = getattr(module, lora_lib.suffix(name), None)
  return y if adapter is None else y + adapter(x)


def inv_frequencies(cfg: ModelConfig):
  """RoPE inverse frequencies [H/2] float32: theta ** (-2i / H), rescaled for 'llama3'.

  Llama 3's scaling (arXiv 2407.21783) divides the frequencies whose wavelength
  exceeds original_max / low_freq_factor by `factor`, keeps those shorter than
  original_max / high_freq_factor, and interpolates smoothly in between.
  """
  h = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
  if cfg.rope_type == "llama3":
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old = cfg.rope_original_max_position
    wavelen = 2 * jnp.pi / inv
    scaled = jnp.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    inv = jnp.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
  return inv


def rope_tables(positions, cfg: ModelConfig):
  """Rotary tables for `rope`: ([cos, cos], [-sin, sin]), each [B, L, 1, H].

  positions [B, L], or [R, B, L] for multimodal RoPE (Qwen2-VL, arXiv 2409.12191):
  the H/2 frequencies are split into `cfg.mrope_section` consecutive chunks and
  chunk i rotates by stream i % R (temporal, height, width). Computed once per
  forward and shared by every layer (per layer, XLA:CPU fused the sin and cos
  into each consumer: the benchmark rollout took 15-25% longer).
  """
  inv_freq = inv_frequencies(cfg)
  if positions.ndim == 3:
    if cfg.mrope_section is None:
      raise ValueError(f"positions {positions.shape} have several streams but "
                       "ModelConfig.mrope_section is not set")
    streams = positions.shape[0]
    owner = np.concatenate([np.full(n, i % streams) for i, n in enumerate(cfg.mrope_section)])
    pos = jnp.moveaxis(positions[owner], 0, -1).astype(jnp.float32)  # [B, L, H/2]
    freqs = pos * inv_freq
  else:
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, L, H/2]
  cos, sin = jnp.cos(freqs), jnp.sin(freqs)
  return (jnp.concatenate([cos, cos], axis=-1)[:, :, None, :],
          jnp.concatenate([-sin, sin], axis=-1)[:, :, None, :])


def rope(x, tables):
  """Rotary embedding, HF layout (halves, not interleaved). x [B, L, *, H]; tables from
  `rope_tables`.

  Written as x * [cos, cos] + swap_halves(x) * [-sin, sin]: the same numbers
  as HF's concatenate of the two rotated halves, but one elementwise fusion
  (the concatenate form cost ~8% of an attention layer's forward + backward
  on XLA:CPU).
  """
  cos, sin = tables
  h = x.shape[-1]
  x32 = x.astype(jnp.float32)
  swapped = jnp.flip(x32.reshape(*x.shape[:-1], 2, h // 2), axis=-2).reshape(x.shape)
  return (x32 * cos + swapped * sin).astype(x.dtype)


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pd = as_dtype(cfg.param_dtype)
    self.cfg = cfg
    self.q = init_param(rngs, (d, n * h), pd, ("embed", "heads"))
    self.k = init_param(rngs, (d, k * h), pd, ("embed", "kv_heads"))
    self.v = init_param(rngs, (d, k * h), pd, ("embed", "kv_heads"))
    self.o = init_param(rngs, (n * h, d), pd, ("heads", "embed"))
    if cfg.qkv_bias:
      self.q_bias = init_param(rngs, (n * h,), pd, ("heads",), zeros=True)
      self.k_bias = init_param(rngs, (k * h,), pd, ("kv_heads",), zeros=True)
      self.v_bias = init_param(rngs, (k * h,), pd, ("kv_heads",), zeros=True)
    if cfg.qk_norm:  # Qwen3: RMSNorm over each head's H features, before RoPE
      self.q_norm = RMSNorm(h, cfg.rms_norm_eps, pd, rngs=rngs)
      self.k_norm = RMSNorm(h, cfg.rms_norm_eps, pd, rngs=rngs)

  def _qkv(self, x, rope_tabs):
    """Queries [B, L, N, H] and keys [B, L, K, H] (biased, normed, rotated), values [B, L, K, H]."""
    cfg = self.cfg
    b, l, _ = x.shape
    h = cfg.head_dim

    def proj(name, heads):
      y = project(self, name, x)
      if cfg.qkv_bias:
        y = y + getattr(self, name + "_bias")[...].astype(x.dtype)
      return y.reshape(b, l, heads, h)

    q, kk = proj("q", cfg.num_heads), proj("k", cfg.num_kv_heads)
    if cfg.qk_norm:
      q, kk = self.q_norm(q), self.k_norm(kk)
    return rope(q, rope_tabs), rope(kk, rope_tabs), proj("v", cfg.num_kv_heads)

  def shared(self, xp, xc, tabs_p, tabs_c, mask_p, offsets, fused=False):
    """Prompts xp [Bp, P, D] and completions xc [B, L, D] that continue them in groups of
    R = B / Bp adjacent rows -> their attention outputs ([Bp, P, D], [B, L, D]).

    The prompts attend to themselves (mask_p [Bp, P, P], offsets [Bp]; fused: the config's
    core); each completion token to its prompt's real keys (slots >= offset), read once per
    group (`attention.attend_shared`), and to its own row's tokens up to itself. With a
    fused 'xla' / 'cudnn' core the completions go through it instead, over their prompt's
    keys and values repeated per row (no [L, P + L] probabilities kept)."""
    cfg = self.cfg
    bp, p, _ = xp.shape
    b, l, _ = xc.shape
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qp, kp, vp = self._qkv(xp, tabs_p)
    impl = attention.resolve(cfg.attention, xp.dtype)
    core = attention.core(impl) if fused and impl != "reference" else attention.reference
    out_p = core(qp, kp, vp, mask_p, offsets).reshape(bp, p, n * h)
    qc, kc, vc = self._qkv(xc, tabs_c)
    if fused and impl in ("xla", "cudnn"):
      rep = lambda t: jnp.repeat(t, b // bp, axis=0)
      mask = positions_lib.visible(rep(offsets), p + jnp.arange(l), jnp.arange(p + l))  # [B, L, P+L]
      out_c = attention.core(impl)(qc, jnp.concatenate([rep(kp), kc], 1),
                                   jnp.concatenate([rep(vp), vc], 1), mask, None)
      return project(self, "o", out_p), project(self, "o", out_c.reshape(b, l, n * h))
    causal = attention.grouped_mask(jnp.tril(jnp.ones((1, l, l), bool)), n // k)  # [1, 1, G*L, L]
    pmask = (jnp.arange(p)[None, :] >= offsets[:, None])[:, None, None, :]  # [Bp, 1, 1, P]
    out_c = attention.attend_shared(
        attention.grouped_queries(qc, k), kc.transpose(0, 2, 3, 1), vc.transpose(0, 2, 1, 3),
        causal, kp.transpose(0, 2, 3, 1), vp.transpose(0, 2, 1, 3), pmask)  # [B, K, G*L, H]
    return project(self, "o", out_p), project(self, "o", attention.ungrouped(out_c, n))

  def __call__(self, x, rope_tabs, mask, layer_cache=None, cache_index=None, offsets=None,
               fused=False):
    """x [B, L, D]; rope_tabs from `rope_tables`; mask [B, L, S] bool (`positions.visible`),
    or [B, L, P + S] with a shared prefix in the cache; offsets [B] (the rows' pad offsets);
    layer_cache {'k': [B, K, H, S], 'v': [B, K, S, H]} (+ 'prefix_k', 'prefix_v');
    fused: use the config's attention implementation (the keys are this call's tokens)."""
    cfg = self.cfg
    dt = x.dtype
    b, l, _ = x.shape
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q, kk, vv = self._qkv(x, rope_tabs)
    impl = attention.resolve(cfg.attention, dt)
    if fused and impl != "reference":
      out = attention.core(impl)(q, kk, vv, mask, offsets).reshape(b, l, n * h)
      new_cache = None
      if layer_cache is not None:  # a prefill: the whole cache is this call's keys
        new_cache = dict(layer_cache, k=kk.transpose(0, 2, 3, 1).astype(layer_cache["k"].dtype),
                         v=vv.transpose(0, 2, 1, 3).astype(layer_cache["v"].dtype))
      return project(self, "o", out), new_cache

    # Keys are kept as [B, K, H, S] and values as [B, K, S, H]: both attention
    # dots are then plain row-major matmuls per (b, k), which XLA:CPU runs ~4x
    # faster in decode than a dot contracting the last axis of both operands.
    kk = kk.transpose(0, 2, 3, 1)  # [B, K, H, L]
    vv = vv.transpose(0, 2, 1, 3)  # [B, K, L, H]
    new_cache = None
    if layer_cache is not None:
      # Static-shape cache: write this call's keys at cache_index, attend over all S.
      kk = jax.lax.dynamic_update_slice(layer_cache["k"], kk.astype(layer_cache["k"].dtype),
                                        (0, 0, 0, cache_index))
      vv = jax.lax.dynamic_update_slice(layer_cache["v"], vv.astype(layer_cache["v"].dtype),
                                        (0, 0, cache_index, 0))
      new_cache = dict(layer_cache, k=kk, v=vv)
      kk, vv = kk.astype(dt), vv.astype(dt)
    prefix = layer_cache is not None and "prefix_k" in layer_cache

    g = n // k
    q = attention.grouped_queries(q, k)  # [B, K, G*L, H]
    qmask = attention.grouped_mask(mask, g)  # [B, 1, G*L, S]
    if not prefix:
      out = attention.attend(q, kk, vv, qmask)  # [B, K, G*L, H]
    else:
      # The shared prefix: row i * R + r reads prefix row i, each prefix key once
      # per group. The prefix is small (prompt slots x prompts), so broadcast,
      # multiply and reduce in float32: one fusion, no transposes (a dot over
      # [Bp, R, K, Q, H] needs two). Decode only: plain autodiff suffices.
      f32 = jnp.float32
      pk, pv = layer_cache["prefix_k"].astype(f32), layer_cache["prefix_v"].astype(f32)
      bp, p = pk.shape[0], pk.shape[3]
      grouped = lambda t: t.reshape(bp, b // bp, *t.shape[1:])  # [B, ..] -> [Bp, R, ..]
      logits = jnp.einsum("bkqh,bkhs->bkqs", q, kk, preferred_element_type=f32)
      prefix_logits = (grouped(q).astype(f32)[..., None] * pk[:, None, :, None]).sum(4)
      logits = jnp.concatenate([prefix_logits.reshape(b, k, g * l, p), logits], axis=-1)
      logits = jnp.where(qmask, logits * (h ** -0.5), _NEG_INF)
      probs = jax.nn.softmax(logits, axis=-1).astype(dt)  # float32 softmax
      prefix_out = (grouped(probs[..., :p]).astype(f32)[..., None] * pv[:, None, :, None]).sum(4)
      out = (prefix_out.reshape(b, k, g * l, h).astype(dt)
             + jnp.einsum("bkqs,bksh->bkqh", probs[..., p:], vv))
    out = attention.ungrouped(out, n)  # [B, L, N*H]
    return project(self, "o", out), new_cache


@jax.custom_vjp
def swiglu(gate, up):
  """silu(gate) * up. Its backward saves only the two inputs and recomputes the
  sigmoid in one fusion (autodiff stored the sigmoid and silu as two extra
  [tokens, F] tensors, three forward passes over them on XLA:CPU)."""
  return jax.nn.silu(gate) * up


def _swiglu_fwd(gate, up):
  return swiglu(gate, up), (gate, up)


def _swiglu_bwd(res, d_out):
  gate, up = res
  sig = jax.nn.sigmoid(gate)
  return d_out * up * sig * (1 + gate * (1 - sig)), d_out * gate * sig


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    pd = as_dtype(cfg.param_dtype)
    self.gate = init_param(rngs, (d, f), pd, ("embed", "mlp"))
    self.up = init_param(rngs, (d, f), pd, ("embed", "mlp"))
    self.down = init_param(rngs, (f, d), pd, ("mlp", "embed"))

  def __call__(self, x):
    g, u = project(self, "gate", x), project(self, "up", x)
    return project(self, "down", swiglu(g, u))


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    pd = as_dtype(cfg.param_dtype)
    self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, rope_tabs, mask, layer_cache=None, cache_index=None, offsets=None,
               fused=False):
    a, new_cache = self.attn(self.attn_norm(x), rope_tabs, mask, layer_cache, cache_index,
                             offsets, fused)
    x = x + a
    x = x + self.mlp(self.mlp_norm(x))
    return x, new_cache

  def shared(self, xp, xc, *args):
    """The block on prompts xp [Bp, P, D] and their groups' completions xc [B, L, D]
    (`Attention.shared`'s args) -> (xp, xc)."""
    ap, ac = self.attn.shared(self.attn_norm(xp), self.attn_norm(xc), *args)
    xp, xc = xp + ap, xc + ac
    return xp + self.mlp(self.mlp_norm(xp)), xc + self.mlp(self.mlp_norm(xc))


class Transformer(nnx.Module):
  """Decoder-only LM. `model(tokens)` -> logits [B, L, V] with positions 0..L-1."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = as_dtype(cfg.param_dtype)
    self.embed = init_param(rngs, (cfg.vocab_size, cfg.hidden_size), pd, ("vocab", "embed"))
    self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
    if not cfg.tie_embeddings:
      self.lm_head = init_param(rngs, (cfg.hidden_size, cfg.vocab_size), pd, ("embed", "vocab"))
    if cfg.lora is not None:  # drawn after the base: the base is the one without adapters
      lora_lib.attach(self, cfg.lora, rngs.params())

  def init_cache(self, batch: int, length: int, dtype=None) -> Cache:
    """A zero KV cache of S = length slots for B = batch rows."""
    cfg = self.cfg
    dtype = as_dtype(cfg.dtype) if dtype is None else dtype
    k_shape = (batch, cfg.num_kv_heads, cfg.head_dim, length)
    v_shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
    return tuple({"k": jnp.zeros(k_shape, dtype), "v": jnp.zeros(v_shape, dtype)}
                 for _ in range(cfg.num_layers))

  def with_prefix(self, prefix: Cache, rows: int, length: int) -> Cache:
    """A cache of `length` empty slots for `rows` rows that share `prefix` (a cache of Bp
    rows, e.g. prefilled prompts): rows r * R .. r * R + R - 1 read prefix row r, R = rows / Bp."""
    if rows % prefix[0]["k"].shape[0]:
      raise ValueError(f"rows={rows} must be a multiple of the prefix's {prefix[0]['k'].shape[0]} rows")
    empty = self.init_cache(rows, length, prefix[0]["k"].dtype)
    return tuple(dict(e, prefix_k=pre["k"], prefix_v=pre["v"]) for e, pre in zip(empty, prefix))

  def _layout(self, b: int, l: int, offsets, cache: Cache | None, cache_index):
    """(offsets [B], query slots [L], key slots [S'], fused?) of one call: queries sit at
    slots cache_index .. + L - 1 after any shared prefix's P slots (0 .. L - 1 without a
    cache); fused attention applies when the keys are exactly this call's tokens."""
    offsets = jnp.zeros((b,), jnp.int32) if offsets is None else jnp.asarray(offsets, jnp.int32)
    if cache is None:
      return offsets, jnp.arange(l, dtype=jnp.int32), jnp.arange(l, dtype=jnp.int32), True
    if cache_index is None:
      raise ValueError("cache_index is required when a cache is given")
    p = cache[0]["prefix_k"].shape[3] if "prefix_k" in cache[0] else 0
    s = cache[0]["k"].shape[3]
    q_slots = p + cache_index + jnp.arange(l, dtype=jnp.int32)
    return offsets, q_slots, jnp.arange(p + s, dtype=jnp.int32), p == 0 and s == l

  def hidden(self, tokens, positions=None, *, offsets=None, mask=None,
             cache: Cache | None = None, cache_index=None, embeds=None):
    """Final-norm hidden states [B, L, D] (and the updated cache if one is given).
    embeds [B, L, D], if given, replaces the token embeddings (e.g. image features)."""
    b, l = tokens.shape
    dt = as_dtype(self.cfg.dtype)
    offsets, q_slots, k_slots, fused = self._layout(b, l, offsets, cache, cache_index)
    if positions is None:  # each row counts its own tokens: slot - offset (models.positions)
      positions = jnp.maximum(q_slots[None, :] - offsets[:, None], 0)
    if mask is None:
      mask = positions_lib.visible(offsets, q_slots, k_slots)  # [B, L, S]
    else:
      fused = False  # an explicit mask is served by the reference core
    x = jnp.take(self.embed[...], tokens, axis=0) if embeds is None else embeds
    x = x.astype(dt)
    tabs = rope_tables(positions, self.cfg)
    new_cache = []
    for i, layer in enumerate(self.layers):
      if self.cfg.remat and cache is None:  # training forward: keep only each layer's input
        x, c = nnx.remat(lambda lyr, h: lyr(h, tabs, mask, None, None, offsets, fused))(layer, x)
      else:
        x, c = layer(x, tabs, mask, None if cache is None else cache[i], cache_index, offsets,
                     fused)
      new_cache.append(c)
    x = self.final_norm(x)
    return x, (None if cache is None else tuple(new_cache))

  def shared_hidden(self, prompts, completions, *, offsets=None):
    """Final-norm hidden states of prompts [Bp, P] and of the completions [B, L] that continue
    them in groups of R = B / Bp adjacent rows (row i * R + r continues prompt i):
    ([Bp, P, D], [B, L, D]), each prompt run once.

    The same numbers (up to float32 rounding) as `hidden` of each row's prompt + completion
    with the sampler's layout (`positions.sequence_layout`): offsets [Bp] are the prompts'
    left-pad counts, a completion token in slot P + j has position P + j - offset and sees
    its prompt's slots offset .. P - 1 and its own slots P .. P + j. Under autodiff the
    prompt's gradient is the sum over its group. Text only (no embeds, no cache)."""
    bp, p = prompts.shape
    b, l = completions.shape
    if b % bp:
      raise ValueError(f"{b} completion rows are not groups of the {bp} prompts")
    dt = as_dtype(self.cfg.dtype)
    offsets = jnp.zeros((bp,), jnp.int32) if offsets is None else jnp.asarray(offsets, jnp.int32)
    slots = jnp.arange(p, dtype=jnp.int32)
    mask_p = positions_lib.visible(offsets, slots, slots)  # [Bp, P, P]
    tabs_p = rope_tables(positions_lib.slot_positions(offsets, p), self.cfg)
    tabs_c = rope_tables(positions_lib.slot_positions(jnp.repeat(offsets, b // bp), l, start=p),
                         self.cfg)
    # A fused core over the prompt alone, as in `hidden` (Pallas flash: P a multiple of 128).
    fused = attention.resolve(self.cfg.attention, dt) != "flash" or p % 128 == 0
    embed = self.embed[...]
    xp = jnp.take(embed, prompts, axis=0).astype(dt)
    xc = jnp.take(embed, completions, axis=0).astype(dt)
    step = lambda lyr, a, c: lyr.shared(a, c, tabs_p, tabs_c, mask_p, offsets, fused)
    if self.cfg.remat:  # training forward: keep only each layer's inputs
      step = nnx.remat(step)
    for layer in self.layers:
      xp, xc = step(layer, xp, xc)
    return self.final_norm(xp), self.final_norm(xc)

  def unembed_weight(self):
    """The output projection [D, V] (the embedding's transpose when tied)."""
    return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

  def unembed(self, x):
    """Hidden [.., D] -> logits [.., V] in float32."""
    return dense(x, self.unembed_weight().astype(x.dtype), preferred_element_type=jnp.float32)

  def __call__(self, tokens, positions=None, *, offsets=None, mask=None,
               cache: Cache | None = None, cache_index=None) -> Any:
    """tokens [B, L] int32 -> logits [B, L, V] float32; with a cache: (logits, new cache).

    offsets [B]: each row's left-pad count (default 0); key slot s is visible to
    the query in slot q iff offset <= s <= q (`models.positions`), built inside
    attention. positions [B, L], or [R, B, L] for R multimodal-RoPE streams
    (default: slot - offset, i.e. 0..L-1 without padding). mask [B, L, S] bool
    overrides the visibility for custom patterns (reference core only). cache a tuple of
    {'k': [B, K, H, S], 'v': [B, K, S, H]} written at slot `cache_index` (a scalar).
    A cache may also hold a read-only prefix shared by groups of adjacent rows
    ({'prefix_k': [Bp, K, H, P], 'prefix_v': [Bp, K, P, H]}, see `with_prefix`);
    the mask is then [B, L, P + S], the prefix's P keys first.
    """
    x, new_cache = self.hidden(tokens, positions, offsets=offsets, mask=mask, cache=cache,
                               cache_index=cache_index)
    logits = self.unembed(x)
    return logits if cache is None else (logits, new_cache)
