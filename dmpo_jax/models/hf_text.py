"""The Hugging Face format of our text Transformer: config.json <-> ModelConfig, the
tensor name map (ours <-> HF names and layouts), and a folder's tokenizer.

Shared by every loader (`hf` for folders and GGUF files, `qwen2_5_vl` for the language
model of a vision-language folder); imports no other loader.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dmpo_jax.models.config import ModelConfig
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.models.weights import CheckpointError, load_into, read_json

SUPPORTED = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
             "qwen3": "Qwen3ForCausalLM"}
# Known relatives that are refused by name (what they add is not implemented).
_REFUSED = {"qwen3_moe": "Qwen3 mixture-of-experts", "qwen2_moe": "Qwen2 mixture-of-experts",
            "mistral": "Mistral (sliding-window attention)", "mixtral": "Mixtral (mixture-of-experts)"}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# HF buffers that carry no learned weights.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def config_from_hf(hf: dict[str, Any], *, dtype: str = "float32",
                   param_dtype: str | None = None) -> ModelConfig:
  """A HF config.json dict -> ModelConfig; refuses what the model does not implement."""
  model_type = hf.get("model_type")
  if model_type in _REFUSED:
    raise CheckpointError(f"unsupported architecture model_type={model_type!r} "
                          f"({_REFUSED[model_type]}); supported: {sorted(SUPPORTED)}")
  if model_type not in SUPPORTED:
    raise CheckpointError(
        f"unsupported architecture model_type={model_type!r} "
        f"(architectures={hf.get('architectures')}); supported: {sorted(SUPPORTED)}")
  rope = _rope_from_hf(hf)
  if model_type in ("llama", "qwen3") and (hf.get("attention_bias") or hf.get("mlp_bias")):
    raise CheckpointError(f"{model_type} with attention_bias or mlp_bias is not supported")
  if hf.get("use_sliding_window"):
    raise CheckpointError("sliding-window attention (use_sliding_window=true) is not supported")
  layer_types = set(hf.get("layer_types") or ["full_attention"])
  if layer_types != {"full_attention"}:
    raise CheckpointError(f"unsupported layer_types {sorted(layer_types)} in config.json; only "
                          "'full_attention' is implemented")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise CheckpointError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is implemented")
  num_heads = hf["num_attention_heads"]
  return ModelConfig(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=num_heads,
      num_kv_heads=hf.get("num_key_value_heads") or num_heads,
      head_dim=hf.get("head_dim"),
      **rope,
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      qkv_bias=model_type == "qwen2",
      qk_norm=model_type == "qwen3",
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_position_embeddings=hf.get("max_position_embeddings", 4096),
      param_dtype=param_dtype or dtype,
      dtype=dtype,
      architecture=model_type,
  )


def _rope_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
  """The RoPE fields of ModelConfig from config.json (`rope_scaling` in checkpoints,
  `rope_parameters` as transformers 5 writes them); other rope types refused by name."""
  rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
  rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
  theta = float(hf.get("rope_theta", rope.get("rope_theta", 10000.0)))
  if rope_type == "default":
    return {"rope_theta": theta}
  if rope_type != "llama3":
    raise CheckpointError(f"unsupported rope scaling {rope_type!r} in config.json; implemented: "
                          "plain RoPE ('default') and 'llama3'")
  missing = [k for k in _LLAMA3_KEYS if k not in rope]
  if missing:
    raise CheckpointError(f"rope scaling 'llama3' in config.json lacks {missing}")
  return {"rope_theta": theta, "rope_type": "llama3", "rope_factor": float(rope["factor"]),
          "rope_low_freq_factor": float(rope["low_freq_factor"]),
          "rope_high_freq_factor": float(rope["high_freq_factor"]),
          "rope_original_max_position": int(rope["original_max_position_embeddings"])}


def config_to_hf(cfg: ModelConfig, tokenizer=None) -> dict[str, Any]:
  """ModelConfig -> a config.json dict that transformers reads."""
  hf = {
      "architectures": [SUPPORTED[cfg.architecture]],
      "model_type": cfg.architecture,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "rope_theta": cfg.rope_theta,
      "rms_norm_eps": cfg.rms_norm_eps,
      "tie_word_embeddings": cfg.tie_embeddings,
      "max_position_embeddings": cfg.max_position_embeddings,
      "torch_dtype": cfg.param_dtype,
  }
  if cfg.rope_type == "llama3":
    hf["rope_scaling"] = {"rope_type": "llama3", "factor": cfg.rope_factor,
                          "low_freq_factor": cfg.rope_low_freq_factor,
                          "high_freq_factor": cfg.rope_high_freq_factor,
                          "original_max_position_embeddings": cfg.rope_original_max_position}
  if cfg.mrope_section is not None:
    raise CheckpointError("multimodal RoPE (mrope_section) has no text-only HF class to save as")
  if cfg.architecture in ("llama", "qwen3"):
    if cfg.qkv_bias:
      raise CheckpointError(f"a {cfg.architecture} checkpoint cannot carry QKV biases; use "
                            "architecture='qwen2'")
    hf.update(attention_bias=False, mlp_bias=False)
  elif not cfg.qkv_bias:
    raise CheckpointError("a Qwen2 checkpoint needs qkv_bias=True; use architecture='llama'")
  if cfg.qk_norm != (cfg.architecture == "qwen3"):
    raise CheckpointError(f"qk_norm={cfg.qk_norm} does not fit architecture={cfg.architecture!r} "
                          "(only Qwen3 normalises q and k)")
  if tokenizer is not None:
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
      value = getattr(tokenizer, name, None)
      if value is not None:
        hf[name] = value
  return hf


def name_map(cfg: ModelConfig) -> dict[tuple, tuple[str, bool]]:
  """Our parameter path -> (HF tensor name, transposed?). torch Linear is [out, in]."""
  m: dict[tuple, tuple[str, bool]] = {("embed",): ("model.embed_tokens.weight", False),
                                      ("final_norm", "scale"): ("model.norm.weight", False)}
  if not cfg.tie_embeddings:
    m[("lm_head",)] = ("lm_head.weight", True)
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}."
    m[("layers", i, "attn_norm", "scale")] = (p + "input_layernorm.weight", False)
    m[("layers", i, "mlp_norm", "scale")] = (p + "post_attention_layernorm.weight", False)
    for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
      m[("layers", i, "attn", ours)] = (p + f"self_attn.{theirs}.weight", True)
    if cfg.qkv_bias:
      for ours, theirs in (("q_bias", "q_proj"), ("k_bias", "k_proj"), ("v_bias", "v_proj")):
        m[("layers", i, "attn", ours)] = (p + f"self_attn.{theirs}.bias", False)
    if cfg.qk_norm:
      for ours, theirs in (("q_norm", "q_norm"), ("k_norm", "k_norm")):
        m[("layers", i, "attn", ours, "scale")] = (p + f"self_attn.{theirs}.weight", False)
    for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
      m[("layers", i, "mlp", ours)] = (p + f"mlp.{theirs}.weight", True)
  return m


def params_from_tensors(cfg: ModelConfig, read, available, where: str, *,
                        ignore=lambda name: False, prefix: str = "model.") -> Transformer:
  """A Transformer for `cfg` from tensors in HF naming and layout: read(name) gives one,
  `available` lists every name the source holds, `where` names the source in errors;
  `prefix` replaces 'model.' in the names (a VL checkpoint's 'model.language_model.')."""
  rename = lambda name: prefix + name[len("model."):] if name.startswith("model.") else name
  names = {ours: (rename(theirs), "T" if transpose else "")
           for ours, (theirs, transpose) in name_map(cfg).items()}
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  return load_into(abstract, names, read, available, where, param_dtype=cfg.param_dtype,
                   ignore=ignore)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
# The tokenizer files that are JSON objects: read here first, so that a damaged one is named
# (transformers' own error names no file).
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "added_tokens.json", "vocab.json")


def load_tokenizer(path: str):
  """The folder's tokenizer through transformers.AutoTokenizer, or None if it has none. A
  file that cannot be read, or a tokenizer transformers refuses, is a CheckpointError naming
  the file or the folder."""
  if not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
    return None
  from transformers import AutoTokenizer, PreTrainedTokenizerFast

  files = {f: read_json(os.path.join(path, f), "tokenizer file")
           for f in TOKENIZER_JSON if os.path.exists(os.path.join(path, f))}
  # A generic tokenizer.json (our task tokenizer) must not be re-read as the
  # model family's own class, which AutoTokenizer picks from config.json.
  declared = files.get("tokenizer_config.json", {}).get("tokenizer_class")
  generic = declared in ("PreTrainedTokenizerFast", "TokenizersBackend")
  try:
    return (PreTrainedTokenizerFast if generic else AutoTokenizer).from_pretrained(
        path, local_files_only=True)
  except Exception as e:  # tokenizers / transformers raise assorted types, naming no file
    raise CheckpointError(f"cannot load the tokenizer in {path}: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}") from e


def hf_tensors(model: Transformer) -> dict[str, jax.Array]:
  cfg = model.cfg
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  out = {}
  for ours, (hf_name, transpose) in name_map(cfg).items():
    node = pure
    for key in ours:
      node = node[key]
    value = jnp.asarray(node)
    out[hf_name] = jnp.asarray(value.T if transpose else value)
  return out


