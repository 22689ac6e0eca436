"""Qwen2.5-VL in Flax NNX: the vision tower's features in place of the image-pad embeddings,
the text Transformer with multimodal RoPE, and the loader of local checkpoint folders.

The language model is the repository's own `Transformer` (Qwen2 layers), fed input
embeddings instead of token ids: at every image-pad token the embedding is the next merged
vision feature (in the order of the tokens over the flattened batch, the order of
`image_grid_thw`), elsewhere the token's embedding. Positions are the three streams of
`mrope.rope_index` over `ModelConfig.mrope_section` (Qwen2-VL, arXiv:2409.12191).

Fixed shapes: the images of a call are packed into a patch budget (`vision.vision_layout`),
so calls of the same [B, L] and budget share one compilation whatever the image sizes.

Shapes: B rows, L tokens, P patches (budget), C pixel values per patch, M = P / 4 merged
features, E the language model's width, V vocab.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dmpo_jax.models import hf_text, mrope, vision
from dmpo_jax.models.config import ModelConfig, as_dtype
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.models.vision import VisionConfig, VisionTower
from dmpo_jax.models.vl_processor import PROCESSOR_FILE, TOKENIZER_FILES, VLProcessor
from dmpo_jax.models.weights import (CheckpointError, read_json, read_tensor, safetensor_files,
                                     write_folder)

MODEL_TYPE = "qwen2_5_vl"
ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"


@dataclasses.dataclass(frozen=True)
class VLConfig:
  """A Qwen2.5-VL: the text model (with `mrope_section`), the vision tower, special tokens."""

  text: ModelConfig
  vision: VisionConfig
  image_token_id: int
  video_token_id: int | None = None
  vision_start_token_id: int | None = None
  vision_end_token_id: int | None = None

  def __post_init__(self):
    if self.text.mrope_section is None or len(self.text.mrope_section) != 3:
      raise ValueError(f"VLConfig.text.mrope_section must hold 3 sections (temporal, height, "
                       f"width), got {self.text.mrope_section}")
    if self.vision.out_hidden_size != self.text.hidden_size:
      raise ValueError(f"VLConfig.vision.out_hidden_size ({self.vision.out_hidden_size}) must "
                       f"equal text.hidden_size ({self.text.hidden_size})")
    if not 0 <= self.image_token_id < self.text.vocab_size:
      raise ValueError(f"VLConfig.image_token_id={self.image_token_id} is outside the vocabulary "
                       f"(0..{self.text.vocab_size - 1})")


class Qwen2_5_VL(nnx.Module):
  """`model(tokens, pixel_values, layout, positions, offsets=)` -> logits [B, L, V] float32.

  Host-side inputs come from `model.prepare(...)`; `model.visual` and `model.language`
  are the vision tower and the text Transformer."""

  def __init__(self, cfg: VLConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.visual = VisionTower(cfg.vision, rngs=rngs)
    self.language = Transformer(cfg.text, rngs=rngs)

  def prepare(self, input_ids, image_grid_thw=None, *, attention_mask=None,
              patch_budget: int | None = None) -> dict[str, np.ndarray]:
    """Host-side (numpy) inputs of a left-padded batch: `layout` (the tower's index arrays
    for the batch's images packed into `patch_budget` patches, default exactly theirs),
    `positions` [3, B, L], `deltas` [B] (decode offsets) and `offsets` [B] (left pads).
    Refuses a batch whose image-pad tokens differ from the images' merged patches."""
    ids = np.asarray(input_ids)
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
    grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw)
    grids = grids.reshape(-1, 3)
    vc = self.cfg.vision
    wanted = vision.num_patches(grids) // vc.merge_unit
    have = int((ids == self.cfg.image_token_id).sum())  # `embed` counts them in every slot
    if have != wanted:
      raise ValueError(f"input_ids hold {have} image-pad tokens (id {self.cfg.image_token_id}) "
                       f"but image_grid_thw {grids.tolist()} gives {wanted} merged patches")
    positions, deltas = mrope.rope_index(ids, grids, image_token_id=self.cfg.image_token_id,
                                         spatial_merge_size=vc.spatial_merge_size,
                                         attention_mask=mask)
    budget = patch_budget if patch_budget is not None else max(vision.num_patches(grids),
                                                               vc.merge_unit)
    # Without images the tower still runs (fixed shapes) on one dummy merged token that no
    # image-pad token reads.
    m = vc.spatial_merge_size
    layout = vision.vision_layout(grids if len(grids) else [[1, m, m]], vc, budget)
    return {"layout": layout, "positions": positions,
            "deltas": deltas, "offsets": (mask.shape[1] - (mask > 0).sum(1)).astype(np.int32)}

  def embed(self, tokens, pixel_values, layout: Mapping[str, Any]):
    """Input embeddings [B, L, E]: token embeddings, the image features at image-pad tokens.

    pixel_values [P, C] (the budget's rows); the k-th image-pad token of the flattened
    batch takes merged feature k (features past the images are never read)."""
    dt = as_dtype(self.cfg.text.dtype)
    feats = self.visual(pixel_values, layout).astype(dt)  # [M, E]
    text = jnp.take(self.language.embed[...], tokens, axis=0).astype(dt)  # [B, L, E]
    is_img = tokens == self.cfg.image_token_id  # [B, L]
    k = jnp.cumsum(is_img.reshape(-1)).reshape(tokens.shape) - 1  # [B, L]
    picked = jnp.take(feats, jnp.clip(k, 0, feats.shape[0] - 1), axis=0)  # [B, L, E]
    return jnp.where(is_img[..., None], picked, text)

  def __call__(self, tokens, pixel_values, layout: Mapping[str, Any], positions, *,
               offsets=None):
    """tokens [B, L]; pixel_values [P, C]; layout and positions [3, B, L] from `prepare`;
    offsets [B] left pads -> logits [B, L, V] float32."""
    embeds = self.embed(tokens, pixel_values, layout)
    x, _ = self.language.hidden(tokens, jnp.asarray(positions), offsets=offsets, embeds=embeds)
    return self.language.unembed(x)


# --- per-prompt images: the sampler's and the update's inputs ---------------------------------


def prompt_images(cfg: VLConfig, prompt_tokens, prompt_mask, images,
                  patch_budget: int | None = None) -> dict[str, Any]:
  """Host-side (numpy) image inputs of Bp left-padded prompts [Bp, P], one patch budget N
  per prompt (each prompt's images packed on their own, so the tower's attention is
  O(Bp N^2), not O((Bp N)^2)).

  images: per prompt {"pixel_values": [patches, C], "image_grid_thw": [I, 3]} (as the image
  processor returns them; numpy or jax) or None (text only). patch_budget: N, a multiple
  of spatial_merge_size ** 2 (default: the largest image set's patches). Returns, every
  array with the prompt axis first (slicing prompts slices them all):
  "pixel_values" [Bp, N, C] float32 (zero past the images), "layout" (`vision_layout`'s
  arrays, each [Bp, ...]), "positions" [Bp, 3, P] (`mrope.rope_index`) and "deltas" [Bp]
  (a later token k of a prompt, counting its unpadded tokens from 0, has position
  k + delta in all three streams). Errors name the prompt and `patch_budget`."""
  ids, mask = np.asarray(prompt_tokens), np.asarray(prompt_mask)
  if ids.ndim != 2 or mask.shape != ids.shape:
    raise ValueError(f"prompt_tokens {ids.shape} and prompt_mask {mask.shape} must both be [Bp, P]")
  if len(images) != ids.shape[0]:
    raise ValueError(f"images has {len(images)} entries for {ids.shape[0]} prompts (one dict "
                     "or None per prompt)")
  vc = cfg.vision
  u, m = vc.merge_unit, vc.spatial_merge_size
  grids, pixels = [], []
  for i, item in enumerate(images):
    if item is None:
      g, px = np.zeros((0, 3), np.int64), np.zeros((0, vc.patch_dim), np.float32)
    else:
      missing = {"pixel_values", "image_grid_thw"} - set(item)
      if missing:
        raise ValueError(f"images[{i}] lacks {sorted(missing)}")
      g = np.asarray(item["image_grid_thw"], np.int64).reshape(-1, 3)
      px = np.asarray(item["pixel_values"], np.float32)
      if px.shape != (vision.num_patches(g), vc.patch_dim):
        raise ValueError(f"images[{i}].pixel_values has shape {px.shape}; image_grid_thw "
                         f"{g.tolist()} and the vision config give "
                         f"({vision.num_patches(g)}, {vc.patch_dim})")
    have = int(((ids[i] == cfg.image_token_id) & (mask[i] > 0)).sum())
    if have != vision.num_patches(g) // u:
      raise ValueError(f"prompt {i} holds {have} image-pad tokens (id {cfg.image_token_id}) but "
                       f"its image_grid_thw {g.tolist()} gives {vision.num_patches(g) // u} "
                       "merged patches")
    grids.append(g)
    pixels.append(px)
  need = max(vision.num_patches(g) for g in grids)
  budget = max(need, u) if patch_budget is None else int(patch_budget)
  if budget <= 0 or budget % u:
    raise ValueError(f"patch_budget={budget} must be a positive multiple of "
                     f"spatial_merge_size ** 2 = {u}")
  for i, g in enumerate(grids):
    if vision.num_patches(g) > budget:
      raise ValueError(f"prompt {i}'s images need {vision.num_patches(g)} patches "
                       f"(image_grid_thw {g.tolist()}), more than patch_budget={budget}")
  positions, deltas = mrope.rope_index(ids, np.concatenate(grids), attention_mask=mask,
                                       image_token_id=cfg.image_token_id, spatial_merge_size=m)
  # A prompt without images runs the tower on one dummy merged token that nothing reads.
  layouts = [vision.vision_layout(g if len(g) else [[1, m, m]], vc, budget) for g in grids]
  padded = np.zeros((len(grids), budget, vc.patch_dim), np.float32)
  for i, px in enumerate(pixels):
    padded[i, :len(px)] = px
  return {"pixel_values": padded,
          "layout": {k: np.stack([lay[k] for lay in layouts]) for k in layouts[0]},
          "positions": positions.transpose(1, 0, 2), "deltas": deltas}


def image_features(model: Qwen2_5_VL, pixel_values, layout):
  """The tower once per prompt: pixel_values [Bp, N, C], layout arrays [Bp, ...] ->
  merged features [Bp, N / 4, E] in the language model's compute dtype."""
  feats = jax.vmap(model.visual)(pixel_values, layout)
  return feats.astype(as_dtype(model.cfg.text.dtype))


def embed_rows(model: Qwen2_5_VL, tokens, feats, prompt_len: int | None = None):
  """Input embeddings [Bp, R, L, E] of R rows per prompt (tokens [Bp, R, L]) that share the
  prompt's features [Bp, M, E]: the k-th image-pad token of a row takes feature k. Only the
  first `prompt_len` slots (default all) hold images: an image-pad token the policy
  generated is text, as it was when the sampler decoded it."""
  text = jnp.take(model.language.embed[...], tokens, axis=0).astype(feats.dtype)
  is_img = tokens == model.cfg.image_token_id
  if prompt_len is not None:
    is_img = is_img & (jnp.arange(tokens.shape[-1]) < prompt_len)
  k = jnp.clip(jnp.cumsum(is_img, axis=-1) - 1, 0, feats.shape[1] - 1)  # [Bp, R, L]
  picked = jax.vmap(lambda f, i: jnp.take(f, i, axis=0))(feats, k)  # [Bp, R, L, E]
  return jnp.where(is_img[..., None], picked, text)


def sequence_positions(prompt_positions, deltas, offsets, completion_len: int, rows: int = 1):
  """Positions [3, Bp * rows, P + T] of prompts (prompt_positions [Bp, 3, P], deltas [Bp],
  left-pad offsets [Bp]) followed by T completion slots, each prompt repeated for `rows`
  adjacent rows: completion slot t (slot P + t) has position P + t - offset + delta."""
  p = prompt_positions.shape[-1]
  t = jnp.arange(p, p + completion_len, dtype=jnp.int32)
  after = t[None, :] - offsets[:, None] + deltas[:, None]  # [Bp, T]
  full = jnp.concatenate([prompt_positions.astype(jnp.int32),
                          jnp.broadcast_to(after[:, None], (after.shape[0], 3, completion_len))],
                         axis=-1)  # [Bp, 3, P + T]
  return jnp.repeat(full, rows, axis=0).transpose(1, 0, 2)


# --- checkpoints --------------------------------------------------------------------------------


def _mrope_rope(rope: Mapping[str, Any], where: str) -> tuple[tuple[int, ...], dict[str, Any]]:
  """(mrope_section, the rope dict as plain RoPE) from `rope_scaling` / `rope_parameters`."""
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ("mrope", "default"):
    raise CheckpointError(f"{where}.rope_type={kind!r} is not implemented; only multimodal RoPE "
                          "('mrope', or 'default' with mrope_section)")
  section = rope.get("mrope_section")
  if not isinstance(section, (list, tuple)) or len(section) != 3:
    raise CheckpointError(f"{where}.mrope_section={section!r}: three sections (temporal, "
                          "height, width) are required")
  plain = {k: v for k, v in rope.items() if k not in ("type", "rope_type", "mrope_section")}
  return tuple(int(s) for s in section), dict(plain, rope_type="default")


def config_from_hf(hf_cfg: Mapping[str, Any], *, dtype: str = "float32",
                   param_dtype: str | None = None) -> VLConfig:
  """A Qwen2.5-VL config.json dict (released flat layout with `rope_scaling` type mrope, or
  the nested `text_config` transformers 5 writes) -> VLConfig; refuses, naming the field,
  what the model does not implement."""
  if hf_cfg.get("model_type") != MODEL_TYPE:
    raise CheckpointError(f"model_type={hf_cfg.get('model_type')!r} is not {MODEL_TYPE!r}")
  nested = isinstance(hf_cfg.get("text_config"), Mapping)
  text = dict(hf_cfg["text_config"]) if nested else {
      k: v for k, v in hf_cfg.items() if k != "vision_config"}
  where = "text_config" if nested else "config"
  key = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
  if not text.get(key):
    raise CheckpointError(f"{where} has neither rope_parameters nor rope_scaling with an "
                          "mrope_section")
  section, plain = _mrope_rope(text[key], f"{where}.{key}")
  text.pop("rope_scaling", None)
  text["rope_parameters"] = plain
  if "rope_theta" not in text and "rope_theta" not in plain:
    text["rope_theta"] = 1000000.0  # the architecture's default
  text["model_type"] = "qwen2"  # the same decoder layers (QKV bias, SwiGLU, RMSNorm)
  if "tie_word_embeddings" in hf_cfg:
    text["tie_word_embeddings"] = hf_cfg["tie_word_embeddings"]
  try:
    text_cfg = hf_text.config_from_hf(text, dtype=dtype, param_dtype=param_dtype)
    text_cfg = text_cfg.replace(mrope_section=section)
  except CheckpointError as e:
    raise CheckpointError(f"{where}: {e}") from e
  except (KeyError, ValueError) as e:
    raise CheckpointError(f"{where}: {e}") from e
  vision_cfg = vision.vision_config_from_hf(hf_cfg, dtype=dtype, param_dtype=param_dtype)
  image = hf_cfg.get("image_token_id", text.get("image_token_id"))
  if not isinstance(image, int):
    raise CheckpointError(f"config.json image_token_id={image!r}: an int is required")
  try:
    return VLConfig(text_cfg, vision_cfg, image,
                    video_token_id=hf_cfg.get("video_token_id"),
                    vision_start_token_id=hf_cfg.get("vision_start_token_id"),
                    vision_end_token_id=hf_cfg.get("vision_end_token_id"))
  except ValueError as e:
    raise CheckpointError(str(e)) from e


def _language_prefix(names) -> str:
  """'model.' (released: model.layers.*) or 'model.language_model.' (transformers 5 modules)."""
  nested = any(n.startswith("model.language_model.") for n in names)
  flat = any(n.startswith("model.layers.") or n == "model.embed_tokens.weight" for n in names)
  if nested and flat:
    raise CheckpointError("the checkpoint has language-model tensors under both 'model.' and "
                          "'model.language_model.'")
  return "model.language_model." if nested else "model."


def load_language_params(files: Mapping[str, str], cfg: ModelConfig,
                         where: str = "the checkpoint") -> Transformer:
  """The text Transformer from tensor name -> safetensors file, through hf_text's name map;
  a missing, unexpected or wrongly shaped language tensor is an error naming it."""
  vis = vision.vision_prefix(files)
  ignore = lambda n: (n.startswith(vis) or n.endswith(hf_text.IGNORED_SUFFIXES)
                      or (cfg.tie_embeddings and n == "lm_head.weight"))
  return hf_text.params_from_tensors(cfg, lambda n: read_tensor(files[n], n), files, where,
                                     ignore=ignore, prefix=_language_prefix(files))


def load(path: str, *, dtype: str = "float32", param_dtype: str | None = None,
         patch_budget: int | None = None):
  """A local Qwen2.5-VL folder -> (model, processor). The processor is our `VLProcessor`
  (the folder's tokenizer and image processor), None if the folder has neither."""
  cfg_file = os.path.join(path, "config.json")
  try:
    cfg = config_from_hf(read_json(cfg_file), dtype=dtype, param_dtype=param_dtype)
  except KeyError as e:
    raise CheckpointError(f"{cfg_file} lacks the field {e.args[0]!r}") from e
  files = safetensor_files(path)
  language = load_language_params(files, cfg.text, path)
  vis = vision.vision_prefix(files)
  tower = vision.load_vision_params(
      {n: read_tensor(f, n) for n, f in files.items() if n.startswith(vis)}, cfg.vision)
  model = nnx.eval_shape(lambda: Qwen2_5_VL(cfg, rngs=nnx.Rngs(0)))
  model.visual, model.language = tower, language
  has = lambda names: any(os.path.exists(os.path.join(path, n)) for n in names)
  processor = None
  if has((PROCESSOR_FILE,) + TOKENIZER_FILES):
    # from_folder also checks config.json's image_token_id against the tokenizer.
    processor = VLProcessor.from_folder(path, patch_budget=patch_budget)
    processor.check_vision_config(cfg.vision)
  return model, processor


def config_to_hf(cfg: VLConfig) -> dict[str, Any]:
  """VLConfig -> a config.json dict in the nested layout transformers 5 writes and opens."""
  text = hf_text.config_to_hf(cfg.text.replace(mrope_section=None))
  for name in ("architectures", "tie_word_embeddings", "torch_dtype", "rope_theta",
               "rope_scaling", "attention_bias", "mlp_bias"):
    text.pop(name, None)
  text.update(model_type="qwen2_5_vl_text", rope_parameters={
      "rope_type": "default", "rope_theta": cfg.text.rope_theta,
      "mrope_section": list(cfg.text.mrope_section)})
  vc = cfg.vision
  fields = ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels",
            "patch_size", "temporal_patch_size", "spatial_merge_size", "window_size",
            "out_hidden_size")
  vision_cfg = {f: getattr(vc, f) for f in fields}
  vision_cfg.update(model_type="qwen2_5_vl_vision", hidden_act="silu",
                    fullatt_block_indexes=list(vc.fullatt_block_indexes),
                    rope_parameters={"rope_type": "axial", "rope_theta": vc.rope_theta})
  out = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "text_config": text,
         "vision_config": vision_cfg, "image_token_id": cfg.image_token_id,
         "tie_word_embeddings": cfg.text.tie_embeddings, "torch_dtype": cfg.text.param_dtype}
  for name in ("video_token_id", "vision_start_token_id", "vision_end_token_id"):
    if getattr(cfg, name) is not None:
      out[name] = getattr(cfg, name)
  return out


def _vision_tensors(tower: VisionTower) -> dict[str, np.ndarray]:
  """The tower's parameters under HF's names (released layout, 'visual.'): the inverse of
  `vision.load_vision_params` (q, k, v fused back into qkv, the Conv3d kernel reshaped)."""
  cfg = tower.cfg
  pure = nnx.to_pure_dict(nnx.state(tower, nnx.Param))
  fused: dict[str, dict[str, np.ndarray]] = {}
  out = {}
  for ours, (name, how) in vision.vision_name_map(cfg).items():
    node = pure
    for key in ours:
      node = node[key]
    value = np.asarray(node)
    if how in ("q", "k", "v"):
      fused.setdefault(name, {})[how] = value.T if value.ndim == 2 else value
      continue
    if how == "conv":
      value = value.T.reshape(cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size,
                              cfg.patch_size, cfg.patch_size)
    out["visual." + name] = value.T if how == "T" else value
  for name, parts in fused.items():
    out["visual." + name] = np.concatenate([parts[p] for p in "qkv"], 0)
  return out


def save(model: Qwen2_5_VL, processor, path: str) -> None:
  """Write `model` (and `processor`: a VLProcessor, or None) as a folder transformers opens
  with `Qwen2_5_VLForConditionalGeneration.from_pretrained`: config.json, model.safetensors
  (released tensor names: `visual.*`, `model.layers.*`), tokenizer and image processor files.
  Written to a temporary folder and moved into place, as `hf.save` does."""
  import jax
  from safetensors.flax import save_file

  def write(tmp):
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(config_to_hf(model.cfg), f, indent=2)
    text = {k: np.asarray(jax.device_get(v)) for k, v in hf_text.hf_tensors(model.language).items()}
    tensors = {**text, **_vision_tensors(model.visual)}
    save_file({k: jnp.asarray(v) for k, v in tensors.items()},
              os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    if processor is not None:
      processor.save_pretrained(tmp)

  write_folder(path, write)
