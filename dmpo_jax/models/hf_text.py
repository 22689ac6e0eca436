"""The Hugging Face format of our text Transformer: config.json <-> ModelConfig, the
tensor name map (ours <-> HF names and layouts), a folder's tokenizer, and PEFT's LoRA adapter
format (adapter_config.json <-> LoRAConfig, adapter tensor names and layouts).

Shared by every loader (`hf` for folders and GGUF files, `qwen2_5_vl` for the language
model of a vision-language folder); imports no other loader.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dmpo_jax.models import lora as lora_lib
from dmpo_jax.models.config import LORA_TARGETS, LoRAConfig, ModelConfig
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
  """The model's tensors by HF name, in HF layout; a model with adapters gives its merged
  weights W + scale * A @ B (what the adapted model computes, as one dense model)."""
  cfg = model.cfg
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  merged = lora_lib.merged_weights(model)
  out = {}
  for ours, (hf_name, transpose) in name_map(cfg).items():
    node = merged.get(ours)
    if node is None:
      node = pure
      for key in ours:
        node = node[key]
    value = jnp.asarray(node)
    out[hf_name] = jnp.asarray(value.T if transpose else value)
  return out


# ---------------------------------------------------------------------------
# PEFT's LoRA adapter folders: adapter_config.json and adapter_model.safetensors.
ADAPTER_CONFIG, ADAPTER_FILE = "adapter_config.json", "adapter_model.safetensors"
# adapter_config.json fields whose non-default values change what the adapter computes and
# are not implemented here (refused by name rather than ignored).
_PEFT_UNSUPPORTED = ("use_dora", "use_rslora", "fan_in_fan_out", "lora_bias", "modules_to_save",
                     "rank_pattern", "alpha_pattern", "layers_to_transform", "layers_pattern",
                     "layer_replication", "trainable_token_indices", "target_parameters",
                     "exclude_modules", "use_qalora", "use_bdlora", "alora_invocation_tokens")


def peft_config(lcfg: LoRAConfig, base: str | None = None) -> dict[str, Any]:
  """LoRAConfig -> an adapter_config.json dict that `peft.PeftModel.from_pretrained` reads."""
  alpha = int(lcfg.alpha) if float(lcfg.alpha).is_integer() else lcfg.alpha
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lcfg.rank, "lora_alpha": alpha, "target_modules": list(lcfg.targets), "lora_dropout": 0.0,
          "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
          "init_lora_weights": True, "modules_to_save": None, "inference_mode": True,
          "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None,
          "base_model_name_or_path": base}


def lora_from_peft(peft: dict[str, Any], where: str) -> LoRAConfig:
  """An adapter_config.json dict -> LoRAConfig; what is not implemented is refused by name."""
  if peft.get("peft_type") != "LORA":
    raise CheckpointError(f"{where}: peft_type={peft.get('peft_type')!r}; only 'LORA' adapters load")
  bad = [k for k in _PEFT_UNSUPPORTED if peft.get(k)]
  if peft.get("bias", "none") != "none":
    bad.append("bias")
  if bad:
    raise CheckpointError(f"{where}: {', '.join(f'{k}={peft[k]!r}' for k in bad)} not supported "
                          "(plain LoRA on whole projections only)")
  targets = peft.get("target_modules")
  if targets == "all-linear":
    targets = LORA_TARGETS
  if isinstance(targets, str) or not targets:
    raise CheckpointError(f"{where}: target_modules={targets!r}; a list of {list(LORA_TARGETS)} "
                          "is supported (not a pattern)")
  # PEFT matches a name by its last components, and writes "all-linear" as module paths
  # (model.layers.0.self_attn.q_proj): the module is the last one. Every layer must then have
  # its tensors (a missing one is refused by name).
  names = tuple(dict.fromkeys(str(t).rsplit(".", 1)[-1] for t in targets))
  try:
    return LoRAConfig(rank=peft.get("r"), alpha=peft.get("lora_alpha"), targets=names)
  except ValueError as e:
    raise CheckpointError(f"{where}: {e}") from e


def adapter_tensors(model: Transformer, prefix: str = "model.") -> dict[str, jax.Array]:
  """The adapters of `model` by PEFT tensor name, in PEFT's layout (lora_A [r, in], lora_B
  [out, r]); `prefix` is the transformers model's path to its layers' parent."""
  if model.cfg.lora is None:
    raise CheckpointError("the model has no adapters (ModelConfig.lora is None): nothing to save "
                          "as an adapter; save the whole model instead")
  out = {}
  for (i, target), ad in lora_lib.adapters(model).items():
    out[lora_lib.peft_name(i, target, "A", prefix)] = jnp.asarray(ad.lora_a[...]).T
    out[lora_lib.peft_name(i, target, "B", prefix)] = jnp.asarray(ad.lora_b[...]).T
  return out


def attach_peft(model: Transformer, peft: dict[str, Any], read, available, where: str) -> None:
  """Give `model` (a base without adapters) the adapter of an adapter_config.json dict and its
  tensors: read(name) gives one, `available` lists the file's names. Every tensor is checked
  (missing, unexpected, shape against the base) before the model is changed."""
  if model.cfg.lora is not None:
    raise CheckpointError(f"cannot load the adapter {where}: the model already has adapters")
  lcfg = lora_from_peft(peft, where)
  shapes = model.cfg.projection_shapes()
  want = {}
  for i in range(model.cfg.num_layers):
    for t in lcfg.targets:
      d_in, d_out = shapes[t]
      want[(i, t, "A")] = (lora_lib.peft_name(i, t, "A"), (lcfg.rank, d_in))
      want[(i, t, "B")] = (lora_lib.peft_name(i, t, "B"), (d_out, lcfg.rank))
  names = {name for name, _ in want.values()}
  unexpected = sorted(set(available) - names)
  if unexpected:
    raise CheckpointError(f"unexpected tensor(s) in {where}: {', '.join(unexpected[:10])}"
                          f"{' ...' if len(unexpected) > 10 else ''} (layers or modules the base "
                          "does not have)")
  values = {}
  for key, (name, shape) in want.items():
    if name not in available:
      raise CheckpointError(f"tensor {name} is missing from {where}")
    values[key] = read(name)
    if tuple(values[key].shape) != shape:
      raise CheckpointError(f"tensor {name} has shape {tuple(values[key].shape)} in {where}; the "
                            f"base needs {shape} (rank {lcfg.rank}): the adapter does not fit it")
  lora_lib.attach(model, lcfg, jax.random.key(0))
  dtype = jnp.dtype(lcfg.param_dtype)
  for (i, t), ad in lora_lib.adapters(model).items():
    ad.lora_a[...] = jnp.asarray(values[(i, t, "A")], dtype).T
    ad.lora_b[...] = jnp.asarray(values[(i, t, "B")], dtype).T


