"""A model and its tokenizer (or, for a vision-language model, its processor) from a
`ModelSpec` (training/specs.py: model_spec, of a config's `model` block): from scratch (the
task tokenizer; a `vision` block adds a Qwen2.5-VL tower) or from a local Hugging Face folder
or GGUF file (`hf.load`). `ModelSpec.lora` adds low-rank adapters to the (language) model
(`models.lora`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx

from dmpo_jax.models import hf, lora as lora_lib, tokenizer as tok_lib
from dmpo_jax.models.config import LoRAConfig, ModelConfig
from dmpo_jax.models.qwen2_5_vl import Qwen2_5_VL, VLConfig
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.models.vision import VisionConfig
from dmpo_jax.models.vl_processor import IMAGE_TOKEN, VLProcessor, build_image_processor

VISION_MARKERS = ("<|vision_start|>", "<|vision_end|>")  # around an image span


@dataclasses.dataclass(frozen=True)
class VisionSpec:
  """A from-scratch Qwen2.5-VL's own settings: config.model.vision (the tower's sizes) and
  mrope_section; config.image's pixel range and patch budget (its processor)."""
  tower: tuple          # config.model.vision's (field, value) pairs
  mrope_section: Any    # frequencies per stream (temporal, height, width): head_dim / 2
  min_pixels: Any
  max_pixels: Any
  mean: Any = None      # per channel; None: the processor's default
  std: Any = None
  patch_budget: Any = None  # patches per prompt (None or 0: the processor's)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The policy: config.model and the run's seed (`build`)."""
  init: str             # "scratch", a local Hugging Face folder or a .gguf file
  tokenizer: str        # a tokenizer folder; empty: the task's (or the checkpoint's)
  dtype: str
  param_dtype: str
  remat: bool
  seed: int             # a from-scratch model's init and the adapters' draw
  hidden_size: int      # the from-scratch sizes
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float
  max_position_embeddings: int  # config.model.max_prompt_len + max_new_tokens
  lora: LoRAConfig | None = None
  lora_export: str | None = None  # config.model.lora.export ("adapter": a PEFT folder)
  vision: VisionSpec | None = None  # config.model.vision (from scratch: a Qwen2.5-VL)


def is_vlm(model) -> bool:
  return hasattr(model, "visual")


def build(spec: ModelSpec):
  """(model, tokenizer) from scratch (task tokenizer) or from a local HF folder. A
  vision-language model (config.model.vision from scratch, a Qwen2.5-VL folder) comes with
  its processor (`VLProcessor`) in place of the tokenizer."""
  if spec.lora_export == "adapter" and (spec.vision is not None or (
      spec.init != "scratch" and hf.is_vl_folder(spec.init))):
    raise ValueError("config.model.lora.export='adapter': PEFT adapter folders are written for "
                     "text models only; use 'merged'")
  if spec.init == "scratch" and spec.vision is not None:
    return build_vlm(spec)
  if spec.init == "scratch":
    tok = scratch_tokenizer(spec)
    return Transformer(scratch_config(spec, tok), rngs=nnx.Rngs(spec.seed)), tok
  model, tok = hf.load(spec.init, dtype=spec.dtype, param_dtype=spec.param_dtype)
  if spec.lora is not None:  # the base as loaded, adapters drawn from the run's seed
    lora_lib.attach(model.language if is_vlm(model) else model, spec.lora,
                    nnx.Rngs(spec.seed).params())
  if spec.tokenizer and not is_vlm(model):
    tok = tok_lib.load(spec.tokenizer)
  if tok is None:
    raise ValueError(f"config.model.init={spec.init!r} has no tokenizer files; set config.model.tokenizer")
  if spec.remat and is_vlm(model):
    model.language.cfg = model.language.cfg.replace(remat=True)
  elif spec.remat:
    model.cfg = model.cfg.replace(remat=True)  # read when the forward is traced
  return model, tok


def lora_config(block) -> LoRAConfig | None:
  """config.model.lora (a mapping of rank, alpha, targets, init, export; or None) as a
  LoRAConfig; None when absent or None. A bad value is a ValueError naming the field."""
  if block is None:
    return None
  fields = {k: v for k, v in dict(block).items() if k != "export" and v is not None}
  if "rank" not in fields:
    raise ValueError("config.model.lora.rank is missing (a positive int: the adapters' rank)")
  try:
    return LoRAConfig(**fields)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.model.lora: {e}") from e


def scratch_tokenizer(spec: ModelSpec):
  """A from-scratch text model's tokenizer: config.model.tokenizer's folder, else the task's."""
  return tok_lib.load(spec.tokenizer) if spec.tokenizer else tok_lib.build()


def scratch_config(spec: ModelSpec, tok) -> ModelConfig:
  """A from-scratch text model's ModelConfig: the spec's sizes, the vocabulary of `tok`
  rounded up to a multiple of 8 (also what parallel/plan.py sizes a run's memory by)."""
  return ModelConfig(vocab_size=-(-len(tok) // 8) * 8, hidden_size=spec.hidden_size,
                     intermediate_size=spec.intermediate_size, num_layers=spec.num_layers,
                     num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                     head_dim=spec.head_dim, rope_theta=spec.rope_theta, dtype=spec.dtype,
                     param_dtype=spec.param_dtype,
                     max_position_embeddings=spec.max_position_embeddings,
                     architecture="llama", remat=spec.remat, lora=spec.lora)


def shape(model) -> dict:
  """The text model's sizes (what a checkpoint must match)."""
  c = model.cfg.text if is_vlm(model) else model.cfg
  return {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                     "num_heads", "num_kv_heads", "head_dim")}


def build_vlm(spec: ModelSpec):
  """(model, processor) of a from-scratch Qwen2.5-VL (`vlm_config`), initialised from the seed."""
  vlcfg, processor = vlm_config(spec)
  return Qwen2_5_VL(vlcfg, rngs=nnx.Rngs(spec.seed)), processor


def vlm_config(spec: ModelSpec):
  """(VLConfig, processor) of a from-scratch Qwen2.5-VL from the spec's text sizes and its
  `vision` part (the tower, the processor's pixel range): the task tokenizer with the image
  markers, an image processor of its own, and the tower's patch geometry."""
  v = spec.vision
  tok = tok_lib.build(vision=True)
  vocab = -(-len(tok) // 8) * 8
  section = tuple(int(s) for s in v.mrope_section)
  head_dim = spec.head_dim or spec.hidden_size // spec.num_heads
  if len(section) != 3 or 2 * sum(section) != head_dim:
    raise ValueError(f"config.model.mrope_section={section}: three sections summing to "
                     f"head_dim / 2 = {head_dim // 2}")
  text = ModelConfig(vocab_size=vocab, hidden_size=spec.hidden_size,
                     intermediate_size=spec.intermediate_size, num_layers=spec.num_layers,
                     num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                     head_dim=spec.head_dim, rope_theta=spec.rope_theta, dtype=spec.dtype,
                     param_dtype=spec.param_dtype, qkv_bias=True, architecture="qwen2",
                     max_position_embeddings=spec.max_position_embeddings,
                     mrope_section=section, remat=spec.remat, lora=spec.lora)
  tower = dict(v.tower)
  tower["fullatt_block_indexes"] = tuple(tower.get("fullatt_block_indexes", ()))
  try:
    vision = VisionConfig(out_hidden_size=spec.hidden_size, dtype=spec.dtype,
                          param_dtype=spec.param_dtype, **tower)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.model.vision: {e}") from e
  vlcfg = VLConfig(text, vision, image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
                   vision_start_token_id=tok.convert_tokens_to_ids(VISION_MARKERS[0]),
                   vision_end_token_id=tok.convert_tokens_to_ids(VISION_MARKERS[1]))
  ip = build_image_processor(vision, min_pixels=v.min_pixels, max_pixels=v.max_pixels,
                             mean=v.mean, std=v.std)
  return vlcfg, VLProcessor(tok, ip, patch_budget=v.patch_budget or None)
