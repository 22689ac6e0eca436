"""A model and its tokenizer (or, for a vision-language model, its processor) from a training
config's `model` block: from scratch (the task tokenizer; config.model.vision adds a
Qwen2.5-VL tower) or from a local Hugging Face folder or GGUF file (`hf.load`).
config.model.lora adds low-rank adapters to the (language) model (`models.lora`)."""

from __future__ import annotations

from flax import nnx

from dmpo_jax.models import hf, lora as lora_lib, tokenizer as tok_lib
from dmpo_jax.models.config import LoRAConfig, ModelConfig
from dmpo_jax.models.qwen2_5_vl import Qwen2_5_VL, VLConfig
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.models.vision import VisionConfig
from dmpo_jax.models.vl_processor import IMAGE_TOKEN, VLProcessor, build_image_processor

VISION_MARKERS = ("<|vision_start|>", "<|vision_end|>")  # around an image span


def is_vlm(model) -> bool:
  return hasattr(model, "visual")


def build(cfg):
  """(model, tokenizer) from scratch (task tokenizer) or from a local HF folder. A
  vision-language model (config.model.vision from scratch, a Qwen2.5-VL folder) comes with
  its processor (`VLProcessor`) in place of the tokenizer."""
  m = cfg.model
  if (m.get("lora") or {}).get("export") == "adapter" and (m.get("vision") or (
      m.init != "scratch" and hf.is_vl_folder(m.init))):
    raise ValueError("config.model.lora.export='adapter': PEFT adapter folders are written for "
                     "text models only; use 'merged'")
  if m.init == "scratch" and m.get("vision"):
    return build_vlm(cfg)
  if m.init == "scratch":
    tok = scratch_tokenizer(cfg)
    return Transformer(scratch_config(cfg, tok), rngs=nnx.Rngs(cfg.seed)), tok
  model, tok = hf.load(m.init, dtype=m.dtype, param_dtype=m.param_dtype)
  lcfg = lora_config(cfg)
  if lcfg is not None:  # the base as loaded, adapters drawn from the run's seed
    lora_lib.attach(model.language if is_vlm(model) else model, lcfg, nnx.Rngs(cfg.seed).params())
  if m.tokenizer and not is_vlm(model):
    tok = tok_lib.load(m.tokenizer)
  if tok is None:
    raise ValueError(f"config.model.init={m.init!r} has no tokenizer files; set config.model.tokenizer")
  if m.remat and is_vlm(model):
    model.language.cfg = model.language.cfg.replace(remat=True)
  elif m.remat:
    model.cfg = model.cfg.replace(remat=True)  # read when the forward is traced
  return model, tok


def lora_config(cfg) -> LoRAConfig | None:
  """config.model.lora as a LoRAConfig (rank, alpha, targets, init); None when absent or None.
  A bad value is a ValueError naming the field."""
  block = cfg.model.get("lora")
  if block is None:
    return None
  fields = {k: v for k, v in dict(block).items() if k != "export" and v is not None}
  if "rank" not in fields:
    raise ValueError("config.model.lora.rank is missing (a positive int: the adapters' rank)")
  try:
    return LoRAConfig(**fields)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.model.lora: {e}") from e


def scratch_tokenizer(cfg):
  """A from-scratch text model's tokenizer: config.model.tokenizer's folder, else the task's."""
  return tok_lib.load(cfg.model.tokenizer) if cfg.model.tokenizer else tok_lib.build()


def scratch_config(cfg, tok) -> ModelConfig:
  """A from-scratch text model's ModelConfig: config.model's sizes, the vocabulary of `tok`
  rounded up to a multiple of 8 (also what parallel/plan.py sizes a run's memory by)."""
  m = cfg.model
  return ModelConfig(vocab_size=-(-len(tok) // 8) * 8, hidden_size=m.hidden_size,
                     intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                     num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                     rope_theta=m.rope_theta, dtype=m.dtype, param_dtype=m.param_dtype,
                     max_position_embeddings=m.max_prompt_len + m.max_new_tokens,
                     architecture="llama", remat=m.remat, lora=lora_config(cfg))


def shape(model) -> dict:
  """The text model's sizes (what a checkpoint must match)."""
  c = model.cfg.text if is_vlm(model) else model.cfg
  return {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                     "num_heads", "num_kv_heads", "head_dim")}


def build_vlm(cfg):
  """(model, processor) of a from-scratch Qwen2.5-VL (`vlm_config`), initialised from config.seed."""
  vlcfg, processor = vlm_config(cfg)
  return Qwen2_5_VL(vlcfg, rngs=nnx.Rngs(cfg.seed)), processor


def vlm_config(cfg):
  """(VLConfig, processor) of a from-scratch Qwen2.5-VL from config.model (its `vision` block
  and the text sizes) and config.image (the processor's pixel range): the task tokenizer
  with the image markers, an image processor of its own, and the tower's patch geometry."""
  m, im = cfg.model, cfg.image
  tok = tok_lib.build(vision=True)
  vocab = -(-len(tok) // 8) * 8
  section = tuple(int(s) for s in m.mrope_section)
  head_dim = m.head_dim or m.hidden_size // m.num_heads
  if len(section) != 3 or 2 * sum(section) != head_dim:
    raise ValueError(f"config.model.mrope_section={section}: three sections summing to "
                     f"head_dim / 2 = {head_dim // 2}")
  text = ModelConfig(vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                     num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                     head_dim=m.head_dim, rope_theta=m.rope_theta, dtype=m.dtype,
                     param_dtype=m.param_dtype, qkv_bias=True, architecture="qwen2",
                     max_position_embeddings=m.max_prompt_len + m.max_new_tokens,
                     mrope_section=section, remat=m.remat, lora=lora_config(cfg))
  v = dict(m.vision)
  v["fullatt_block_indexes"] = tuple(v.get("fullatt_block_indexes", ()))
  try:
    vision = VisionConfig(out_hidden_size=m.hidden_size, dtype=m.dtype, param_dtype=m.param_dtype,
                          **v)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.model.vision: {e}") from e
  vlcfg = VLConfig(text, vision, image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
                   vision_start_token_id=tok.convert_tokens_to_ids(VISION_MARKERS[0]),
                   vision_end_token_id=tok.convert_tokens_to_ids(VISION_MARKERS[1]))
  ip = build_image_processor(vision, min_pixels=im.min_pixels, max_pixels=im.max_pixels,
                             mean=im.get("mean"), std=im.get("std"))
  return vlcfg, VLProcessor(tok, ip, patch_budget=im.patch_budget or None)
