"""The Qwen2.5-VL vision tower in Flax NNX, and its checkpoint loader.

Architecture (Qwen2.5-VL Technical Report, arXiv:2502.13923, section 2.1): a ViT over
patches of T frames x p x p pixels (the Conv3d with stride = kernel is one matmul over
the flattened patch), 2-D rotary positions (the row index rotates the first quarter of
each head's frequencies, the column index the second), pre-norm blocks with RMSNorm and
a SwiGLU MLP, window attention (windows of `window_size` pixels) in every block except
those in `fullatt_block_indexes`, which attend over the whole image; a merger (RMSNorm,
groups of merge x merge adjacent patches concatenated, Linear-GELU-Linear) maps the
result into the language model's width: one feature per image-pad token.

Variable-length images share one packed sequence: the grid-dependent index arrays
(window order, rotary positions, attention segments) are computed on the host by
`vision_layout` from `image_grid_thw`, padded to a fixed patch budget, and passed to
the jitted forward, which sees only fixed shapes. Attention is dense over the budget
with a segment mask (query and key in the same image frame, or the same window):
O(P^2) per block, fine for the few hundred to few thousand patches of a prompt.

Shapes: P patches (the budget, a multiple of U), U = merge ** 2 patches per merged
token, M = P / U merged tokens, C = channels * T * p * p pixel values per patch,
D vision width, N heads, H head dim, F ffn, E the language model's width.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dmpo_jax.models.config import as_dtype
from dmpo_jax.models.transformer import RMSNorm, attend, dense, init_param, rope, swiglu
from dmpo_jax.models.weights import (CheckpointError, load_into, read_json, read_tensor,
                                     safetensor_files)

_NORM_EPS = 1e-6  # fixed in the architecture (not a config field)


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """Shapes of the Qwen2.5-VL vision tower: HF `vision_config` field names, and HF's
  defaults (which fill the fields a checkpoint's config.json leaves out)."""

  depth: int = 32
  hidden_size: int = 3584  # D (the released checkpoints set 1280)
  intermediate_size: int = 3420  # F
  num_heads: int = 16  # N
  in_channels: int = 3
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  window_size: int = 112  # pixels per window side
  out_hidden_size: int = 3584  # E
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  rope_theta: float = 10000.0
  param_dtype: str = "float32"
  dtype: str = "float32"

  def __post_init__(self):
    object.__setattr__(self, "fullatt_block_indexes", tuple(self.fullatt_block_indexes))
    for field in ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels",
                  "patch_size", "temporal_patch_size", "spatial_merge_size", "window_size",
                  "out_hidden_size"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"VisionConfig.{field} must be a positive int, got {value!r}")
    if self.hidden_size % self.num_heads:
      raise ValueError(f"VisionConfig.hidden_size ({self.hidden_size}) must be a multiple of "
                       f"num_heads ({self.num_heads})")
    if self.head_dim % 4:
      raise ValueError(f"VisionConfig: head dim {self.head_dim} (hidden_size / num_heads) must "
                       "be a multiple of 4 for the 2-D rotary embedding")
    if self.window_size // self.spatial_merge_size // self.patch_size < 1:
      raise ValueError(f"VisionConfig.window_size ({self.window_size}) must be at least "
                       f"spatial_merge_size * patch_size "
                       f"({self.spatial_merge_size * self.patch_size})")
    bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
    if bad:
      raise ValueError(f"VisionConfig.fullatt_block_indexes {bad} outside 0..{self.depth - 1}")
    as_dtype(self.param_dtype)
    as_dtype(self.dtype)

  @property
  def head_dim(self) -> int:  # H
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:  # C
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @property
  def merge_unit(self) -> int:  # U
    return self.spatial_merge_size ** 2

  def num_params(self) -> int:
    """Parameters of the tower: patch embedding (no bias), per block two norms, q/k/v/o and
    the SwiGLU MLP with biases, and the merger (norm, fc1 [UD, UD], fc2 [UD, E], biases)."""
    d, f, wide = self.hidden_size, self.intermediate_size, self.hidden_size * self.merge_unit
    block = 2 * d + 4 * (d * d + d) + 3 * d * f + 2 * f + d
    merger = d + wide * wide + wide + wide * self.out_hidden_size + self.out_hidden_size
    return self.patch_dim * d + self.depth * block + merger

  def replace(self, **changes) -> "VisionConfig":
    return dataclasses.replace(self, **changes)


# --- host-side layout of a packed batch of images -------------------------------------------


def _check_grids(grid_thw, cfg: VisionConfig) -> np.ndarray:
  grids = np.asarray(grid_thw, np.int64).reshape(-1, 3)
  m = cfg.spatial_merge_size
  for i, (t, h, w) in enumerate(grids.tolist()):
    if t <= 0 or h <= 0 or w <= 0 or h % m or w % m:
      raise ValueError(f"image_grid_thw[{i}] = {(t, h, w)}: t, h, w must be positive and h, w "
                       f"multiples of spatial_merge_size={m}")
  return grids


def num_patches(grid_thw) -> int:
  """Patches the images of `grid_thw` [I, 3] take (sum of t * h * w)."""
  return int(np.asarray(grid_thw, np.int64).reshape(-1, 3).prod(-1).sum())


def _window_index(grids: np.ndarray, cfg: VisionConfig):
  """Merged tokens in window order and the window lengths (in patches), as HF groups them:
  per frame, windows of `window_size // merge // patch` merged tokens a side, row-major,
  the last row/column of windows cut short by the image's edge."""
  m, u = cfg.spatial_merge_size, cfg.merge_unit
  side = cfg.window_size // m // cfg.patch_size
  order, lengths, offset = [], [], 0
  for t, h, w in grids.tolist():
    gh, gw = h // m, w // m
    index = np.arange(t * gh * gw).reshape(t, gh, gw)
    nh, nw = -(-gh // side), -(-gw // side)
    padded = np.full((t, nh * side, nw * side), -1, np.int64)
    padded[:, :gh, :gw] = index
    windows = padded.reshape(t, nh, side, nw, side).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, -1)
    for win in windows.reshape(-1, side * side):
      kept = win[win >= 0]
      if kept.size:
        order.append(kept + offset)
        lengths.append(kept.size * u)
    offset += t * gh * gw
  return np.concatenate(order), np.asarray(lengths)


def _rotary_positions(grids: np.ndarray, m: int) -> np.ndarray:
  """(row, column) of every patch [P, 2] in the processor's order (merge blocks row-major,
  the m x m patches of a block row-major inside it, frames one after another)."""
  out = []
  for t, h, w in grids.tolist():
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    block = lambda a: a.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)
    out.append(np.tile(np.stack([block(rows), block(cols)], -1), (t, 1)))
  return np.concatenate(out)


def _segments(lengths: np.ndarray, total: int, budget: int) -> np.ndarray:
  """Segment id of each of `budget` slots: consecutive runs of `lengths`; -1 past `total`."""
  seg = np.full((budget,), -1, np.int32)
  seg[:total] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
  return seg


def vision_layout(grid_thw, cfg: VisionConfig, budget: int | None = None) -> dict[str, np.ndarray]:
  """Index arrays the jitted tower needs for the images of `grid_thw` [I, 3], packed
  in order and padded to `budget` patches (default: exactly their patches).

  Returns numpy arrays: `order` [P] (slot j of the window-ordered sequence holds input
  patch order[j]); `positions` [P, 2] (row, column of that patch, for the rotary
  embedding); `full_seg` / `window_seg` [P] (the frame / window each slot attends
  within, -1 for padding); `restore` [M] (merged token m of the output is window-ordered
  merged token restore[m]); `valid` [M] (False on padding).
  """
  grids = _check_grids(grid_thw, cfg)
  u = cfg.merge_unit
  total = num_patches(grids)
  budget = total if budget is None else int(budget)
  if budget % u:
    raise ValueError(f"patch budget {budget} must be a multiple of spatial_merge_size ** 2 = {u}")
  if total > budget:
    raise ValueError(f"the images need {total} patches (image_grid_thw {grids.tolist()}), "
                     f"more than the patch budget of {budget}")
  merged_order, window_lengths = _window_index(grids, cfg)
  pad_m = (budget - total) // u
  merged_order = np.concatenate([merged_order, np.arange(total // u, budget // u)])
  order = (merged_order[:, None] * u + np.arange(u)).reshape(-1).astype(np.int32)
  positions = np.zeros((budget, 2), np.int32)
  positions[:total] = _rotary_positions(grids, cfg.spatial_merge_size)[order[:total]]
  frame_lengths = np.repeat(grids[:, 1] * grids[:, 2], grids[:, 0])
  return {
      "order": order,
      "positions": positions,
      "full_seg": _segments(frame_lengths, total, budget),
      "window_seg": _segments(window_lengths, total, budget),
      "restore": np.argsort(merged_order).astype(np.int32),
      "valid": np.arange(budget // u) < (budget // u - pad_m),
  }


# --- the tower --------------------------------------------------------------------------------


def vision_rope_tables(positions, head_dim: int, theta: float):
  """Rotary tables for `transformer.rope` from (row, column) positions [P, 2]: each head's
  H / 2 frequencies are H / 4 row frequencies then the same H / 4 for the column.
  Returns ([cos, cos], [-sin, sin]), each [1, P, 1, H]."""
  quarter = head_dim // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, quarter, 2, dtype=jnp.float32) / quarter))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [P, 2, H/4]
  freqs = freqs.reshape(freqs.shape[0], -1)  # [P, H/2]: rows then columns
  cos, sin = jnp.cos(freqs), jnp.sin(freqs)
  return (jnp.concatenate([cos, cos], -1)[None, :, None, :],
          jnp.concatenate([-sin, sin], -1)[None, :, None, :])


class VisionAttention(nnx.Module):

  def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
    d, pd = cfg.hidden_size, as_dtype(cfg.param_dtype)
    self.cfg = cfg
    for name in ("q", "k", "v"):
      setattr(self, name, init_param(rngs, (d, d), pd, ("embed", "heads")))
      setattr(self, name + "_bias", init_param(rngs, (d,), pd, ("heads",), zeros=True))
    self.o = init_param(rngs, (d, d), pd, ("heads", "embed"))
    self.o_bias = init_param(rngs, (d,), pd, ("embed",), zeros=True)

  def __call__(self, x, tables, mask):
    """x [P, D]; tables from `vision_rope_tables`; mask [P, P] bool -> [P, D]."""
    cfg, dt = self.cfg, x.dtype
    p, n, h = x.shape[0], cfg.num_heads, cfg.head_dim
    proj = lambda w, b: (dense(x, w[...].astype(dt)) + b[...].astype(dt)).reshape(1, p, n, h)
    q = rope(proj(self.q, self.q_bias), tables).transpose(0, 2, 1, 3)  # [1, N, P, H]
    k = rope(proj(self.k, self.k_bias), tables).transpose(0, 2, 3, 1)  # [1, N, H, P]
    v = proj(self.v, self.v_bias).transpose(0, 2, 1, 3)  # [1, N, P, H]
    out = attend(q, k, v, mask[None, None])  # [1, N, P, H]
    out = out[0].transpose(1, 0, 2).reshape(p, n * h)
    return dense(out, self.o[...].astype(dt)) + self.o_bias[...].astype(dt)


class VisionMLP(nnx.Module):

  def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
    d, f, pd = cfg.hidden_size, cfg.intermediate_size, as_dtype(cfg.param_dtype)
    self.gate = init_param(rngs, (d, f), pd, ("embed", "mlp"))
    self.gate_bias = init_param(rngs, (f,), pd, ("mlp",), zeros=True)
    self.up = init_param(rngs, (d, f), pd, ("embed", "mlp"))
    self.up_bias = init_param(rngs, (f,), pd, ("mlp",), zeros=True)
    self.down = init_param(rngs, (f, d), pd, ("mlp", "embed"))
    self.down_bias = init_param(rngs, (d,), pd, ("embed",), zeros=True)

  def __call__(self, x):
    dt = x.dtype
    lin = lambda y, w, b: dense(y, w[...].astype(dt)) + b[...].astype(dt)
    return lin(swiglu(lin(x, self.gate, self.gate_bias), lin(x, self.up, self.up_bias)),
               self.down, self.down_bias)


class VisionBlock(nnx.Module):

  def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
    pd = as_dtype(cfg.param_dtype)
    self.attn_norm = RMSNorm(cfg.hidden_size, _NORM_EPS, pd, rngs=rngs)
    self.attn = VisionAttention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, _NORM_EPS, pd, rngs=rngs)
    self.mlp = VisionMLP(cfg, rngs=rngs)

  def __call__(self, x, tables, mask):
    x = x + self.attn(self.attn_norm(x), tables, mask)
    return x + self.mlp(self.mlp_norm(x))


class PatchMerger(nnx.Module):
  """RMSNorm, then U adjacent patches concatenated, then Linear-GELU-Linear into E."""

  def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
    pd = as_dtype(cfg.param_dtype)
    wide = cfg.hidden_size * cfg.merge_unit
    self.norm = RMSNorm(cfg.hidden_size, _NORM_EPS, pd, rngs=rngs)
    self.fc1 = init_param(rngs, (wide, wide), pd, ("merged", "mlp"))
    self.fc1_bias = init_param(rngs, (wide,), pd, ("mlp",), zeros=True)
    self.fc2 = init_param(rngs, (wide, cfg.out_hidden_size), pd, ("mlp", "embed"))
    self.fc2_bias = init_param(rngs, (cfg.out_hidden_size,), pd, ("embed",), zeros=True)
    self.unit = cfg.merge_unit

  def __call__(self, x):
    """x [P, D] (each U consecutive rows one merge block) -> [P / U, E]."""
    dt = x.dtype
    y = self.norm(x).reshape(x.shape[0] // self.unit, -1)  # [M, U * D]
    y = jax.nn.gelu(dense(y, self.fc1[...].astype(dt)) + self.fc1_bias[...].astype(dt),
                    approximate=False)
    return dense(y, self.fc2[...].astype(dt)) + self.fc2_bias[...].astype(dt)


class VisionTower(nnx.Module):
  """`tower(pixel_values, layout)` -> one feature [M, E] per merged token, in the image
  processor's order (the order of the prompt's image-pad tokens)."""

  def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = as_dtype(cfg.param_dtype)
    self.patch_embed = init_param(rngs, (cfg.patch_dim, cfg.hidden_size), pd, ("patch", "embed"))
    self.blocks = nnx.List([VisionBlock(cfg, rngs=rngs) for _ in range(cfg.depth)])
    self.merger = PatchMerger(cfg, rngs=rngs)

  def __call__(self, pixel_values, layout: Mapping[str, Any]):
    """pixel_values [P, C] (rows past the images' patches are ignored); layout from
    `vision_layout` for the same budget P (numpy or jax arrays) -> [M, E], zero on padding."""
    cfg = self.cfg
    dt = as_dtype(cfg.dtype)
    budget = layout["order"].shape[0]
    if pixel_values.shape != (budget, cfg.patch_dim):
      raise ValueError(f"pixel_values has shape {tuple(pixel_values.shape)}; the layout and "
                       f"the config expect ({budget}, {cfg.patch_dim})")
    x = dense(jnp.take(pixel_values.astype(dt), jnp.asarray(layout["order"]), axis=0),
              self.patch_embed[...].astype(dt))  # [P, D], window order
    tables = vision_rope_tables(jnp.asarray(layout["positions"]), cfg.head_dim, cfg.rope_theta)
    same = lambda seg: jnp.asarray(seg)[:, None] == jnp.asarray(seg)[None, :]  # [P, P]
    full_mask, window_mask = same(layout["full_seg"]), same(layout["window_seg"])
    for i, block in enumerate(self.blocks):
      x = block(x, tables, full_mask if i in cfg.fullatt_block_indexes else window_mask)
    merged = jnp.take(self.merger(x), jnp.asarray(layout["restore"]), axis=0)  # [M, E]
    return jnp.where(jnp.asarray(layout["valid"])[:, None], merged, 0).astype(dt)


# --- checkpoints --------------------------------------------------------------------------------

# Fields of a Qwen2.5-VL `vision_config` that change nothing the tower computes on images
# (or are checked on their own).
_INERT = {"model_type", "initializer_range", "tokens_per_second", "torch_dtype", "dtype",
          "_name_or_path", "architectures", "transformers_version", "hidden_act",
          "rope_parameters", "rope_scaling", "attn_implementation", "_attn_implementation_autoset",
          "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
          "is_encoder_decoder", "id2label", "label2id", "problem_type", "tie_word_embeddings",
          "use_return_dict"}
_VISION_TYPES = ("qwen2_5_vl", "qwen2_5_vl_vision")
# Other names of our fields: older released configs, and HF's attribute_map.
_ALIASES = {"in_chans": "in_channels", "spatial_patch_size": "patch_size",
            "num_hidden_layers": "depth", "num_attention_heads": "num_heads"}


def vision_config_from_hf(hf: Mapping[str, Any], *, dtype: str = "float32",
                          param_dtype: str | None = None) -> VisionConfig:
  """A Qwen2.5-VL config.json dict (released flat layout or transformers-5 nested layout)
  -> VisionConfig; refuses, by field name, any vision setting the tower does not implement."""
  vc = hf.get("vision_config")
  if not isinstance(vc, Mapping):
    raise CheckpointError("config.json has no 'vision_config' object: not a vision-language "
                          f"checkpoint (model_type={hf.get('model_type')!r})")
  field = lambda name: f"vision_config.{name}"
  if vc.get("model_type", "qwen2_5_vl_vision") not in _VISION_TYPES:
    raise CheckpointError(f"{field('model_type')}={vc.get('model_type')!r} is not implemented; "
                          f"only the Qwen2.5-VL vision tower ({', '.join(_VISION_TYPES)})")
  if vc.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"{field('hidden_act')}={vc['hidden_act']!r} is not implemented; "
                          "only 'silu' (SwiGLU)")
  rope = vc.get("rope_parameters") or vc.get("rope_scaling") or {}
  if rope.get("rope_type", rope.get("type", "axial")) not in ("axial", "default"):
    raise CheckpointError(f"{field('rope_parameters')}: rope_type "
                          f"{rope.get('rope_type', rope.get('type'))!r} is not implemented")
  names = {f.name for f in dataclasses.fields(VisionConfig)} - {"dtype", "param_dtype"}
  unknown = sorted(set(vc) - names - _INERT - set(_ALIASES))
  if unknown:
    raise CheckpointError(f"{field(unknown[0])} is not implemented by the vision tower "
                          f"(unknown vision_config field(s): {', '.join(unknown)})")
  kw = {k: vc[k] for k in names if k in vc and k != "rope_theta"}
  for alias, name in _ALIASES.items():
    if alias in vc:
      if name in vc and vc[name] != vc[alias]:
        raise CheckpointError(f"{field(alias)}={vc[alias]!r} disagrees with "
                              f"{field(name)}={vc[name]!r}")
      kw[name] = vc[alias]
  for name in ("patch_size", "temporal_patch_size"):
    if name in kw and not isinstance(kw[name], int):
      raise CheckpointError(f"{field(name)}={kw[name]!r}: only a single int is implemented")
  text = hf.get("text_config") if isinstance(hf.get("text_config"), Mapping) else hf
  out, width = kw.get("out_hidden_size"), text.get("hidden_size")
  if out is not None and width is not None and out != width:
    raise CheckpointError(f"{field('out_hidden_size')}={out} differs from the language "
                          f"model's hidden_size={width}")
  kw["rope_theta"] = float(rope.get("rope_theta", 10000.0))
  try:
    return VisionConfig(**kw, dtype=dtype, param_dtype=param_dtype or dtype)
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"vision_config: {e}") from e


def vision_name_map(cfg: VisionConfig) -> dict[tuple, tuple[str, str]]:
  """Our parameter path -> (HF name under the vision prefix, how to convert):
  'T' transpose a torch Linear [out, in]; 'q'/'k'/'v' take that third of the fused qkv
  (then transpose); 'conv' flatten the Conv3d kernel; '' as is."""
  m = {("patch_embed",): ("patch_embed.proj.weight", "conv"),
       ("merger", "norm", "scale"): ("merger.ln_q.weight", ""),
       ("merger", "fc1"): ("merger.mlp.0.weight", "T"),
       ("merger", "fc1_bias"): ("merger.mlp.0.bias", ""),
       ("merger", "fc2"): ("merger.mlp.2.weight", "T"),
       ("merger", "fc2_bias"): ("merger.mlp.2.bias", "")}
  for i in range(cfg.depth):
    b, p = ("blocks", i), f"blocks.{i}."
    m[b + ("attn_norm", "scale")] = (p + "norm1.weight", "")
    m[b + ("mlp_norm", "scale")] = (p + "norm2.weight", "")
    for part in "qkv":
      m[b + ("attn", part)] = (p + "attn.qkv.weight", part)
      m[b + ("attn", part + "_bias")] = (p + "attn.qkv.bias", part)
    m[b + ("attn", "o")] = (p + "attn.proj.weight", "T")
    m[b + ("attn", "o_bias")] = (p + "attn.proj.bias", "")
    for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
      m[b + ("mlp", ours)] = (p + f"mlp.{theirs}.weight", "T")
      m[b + ("mlp", ours + "_bias")] = (p + f"mlp.{theirs}.bias", "")
  return m


def vision_prefix(names) -> str:
  """'visual.' (released checkpoints) or 'model.visual.' (saved by transformers 5)."""
  found = {p for p in ("model.visual.", "visual.") for n in names if n.startswith(p)}
  if len(found) != 1:
    raise CheckpointError("the checkpoint has " + (
        "no vision tensors (neither 'visual.*' nor 'model.visual.*')" if not found else
        "vision tensors under both 'visual.' and 'model.visual.'"))
  return found.pop()


def _converter(full: str, how: str, cfg: VisionConfig):
  """The function turning the stored tensor `full` into our layout (see vision_name_map)."""
  if how == "conv":
    def conv(value):
      if value.ndim != 5:
        raise CheckpointError(f"tensor {full} has shape {tuple(value.shape)}; expected a Conv3d "
                              "kernel [D, channels, T, p, p]")
      return value.reshape(value.shape[0], -1).T
    return conv
  if how in ("q", "k", "v"):
    d, i = cfg.hidden_size, "qkv".index(how)
    def part(value):
      if value.shape[0] != 3 * d:
        raise CheckpointError(f"tensor {full} has shape {tuple(value.shape)}; the config expects "
                              f"{3 * d} rows (3 x hidden_size)")
      third = value[d * i:d * (i + 1)]
      return third.T if third.ndim == 2 else third
    return part
  return how  # "T" or "": load_into's own conversions


def load_vision_params(tensors: Mapping[str, Any], cfg: VisionConfig,
                       where: str = "the checkpoint") -> VisionTower:
  """A VisionTower for `cfg` filled from `tensors` (safetensors name -> array, the whole
  checkpoint or only its vision part). Tensors outside the vision prefix are left alone;
  a missing or unexpected vision tensor, or a wrong shape, is an error naming it."""
  prefix = vision_prefix(tensors)
  names = {ours: (prefix + name, _converter(prefix + name, how, cfg))
           for ours, (name, how) in vision_name_map(cfg).items()}
  read = lambda name: (tensors[name] if isinstance(tensors[name], jax.Array)
                       else np.asarray(tensors[name]))
  abstract = nnx.eval_shape(lambda: VisionTower(cfg, rngs=nnx.Rngs(0)))
  return load_into(abstract, names, read, tensors, where, param_dtype=cfg.param_dtype,
                   ignore=lambda n: not n.startswith(prefix), what="vision tensor")


def load_vision(path: str, *, dtype: str = "float32",
                param_dtype: str | None = None) -> VisionTower:
  """The vision tower of a local Qwen2.5-VL folder (config.json + safetensors, either layout)."""
  cfg_file = os.path.join(path, "config.json")
  cfg = vision_config_from_hf(read_json(cfg_file), dtype=dtype, param_dtype=param_dtype)
  files = safetensor_files(path)
  prefix = vision_prefix(files)
  tensors = {n: read_tensor(f, n) for n, f in files.items() if n.startswith(prefix)}
  return load_vision_params(tensors, cfg, path)
