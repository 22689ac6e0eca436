"""Hugging Face checkpoints <-> our Flax model, from and to local folders.

`load(path)` reads config.json (Qwen2, Qwen3 dense, Llama 2 / 3.x families), `*.safetensors`
(one file, or shards listed in model.safetensors.index.json) and the
tokenizer (through transformers.AutoTokenizer) from a local folder; nothing
is fetched from a hub. A llama.cpp GGUF file (or a folder holding one) goes to
`models.gguf`, which reads it without torch; a Qwen2.5-VL folder to `models.qwen2_5_vl`.
`save(model, tokenizer, path)` writes a folder that transformers opens with
`AutoModelForCausalLM.from_pretrained(path)` (a model with LoRA adapters: merged);
`save(..., adapter_only=True)` writes its adapters alone as a PEFT folder
(adapter_config.json + adapter_model.safetensors) that `peft.PeftModel.from_pretrained`
puts on the transformers base, and `load(base, adapter=folder)` reads such a folder, from
PEFT or from here, onto a base. The format itself (config.json fields,
tensor names) is `models.hf_text`; `CheckpointError`, `config_from_hf`, `config_to_hf`,
`hf_tensors` and `load_tokenizer` stay importable from here.

Every mismatch (missing or unreadable file, unsupported architecture, missing or
unexpected tensor, wrong shape) is one `CheckpointError` naming the file or tensor;
shapes are given in the file's layout.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp

from dmpo_jax.models import gguf, qwen2_5_vl
from dmpo_jax.models.config import ModelConfig
from dmpo_jax.models.hf_text import (ADAPTER_CONFIG, ADAPTER_FILE, IGNORED_SUFFIXES, adapter_tensors,
                                     attach_peft, config_from_hf, config_to_hf, hf_tensors,
                                     load_tokenizer, params_from_tensors, peft_config)
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.models.weights import (CheckpointError, read_json, read_tensor, safetensor_files,
                                     write_folder)


def load_params(path: str, cfg: ModelConfig) -> Transformer:
  """Build a Transformer for `cfg` and fill it from the safetensors in `path`."""
  files = safetensor_files(path)
  ignore = lambda n: n.endswith(IGNORED_SUFFIXES) or (cfg.tie_embeddings and n == "lm_head.weight")
  return params_from_tensors(cfg, lambda name: read_tensor(files[name], name), files, path,
                             ignore=ignore)


def load(path: str, *, dtype: str = "float32", param_dtype: str | None = None,
         adapter: str | None = None):
  """A local HF folder -> (model, tokenizer). tokenizer is None if the folder has none.
  A Qwen2.5-VL folder gives (`qwen2_5_vl.Qwen2_5_VL`, `VLProcessor` or None).
  A `.gguf` file, or a folder holding one and no config.json, is read by `models.gguf`.
  adapter: a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) put on the
  text model (`models.lora`); one that does not fit the base is refused by tensor name."""
  model, tok = _load_base(path, dtype=dtype, param_dtype=param_dtype)
  if adapter is not None:
    if isinstance(model, qwen2_5_vl.Qwen2_5_VL):
      raise CheckpointError(f"adapter={adapter!r}: PEFT adapters load onto text models only")
    load_adapter(model, adapter)
  return model, tok


def load_adapter(model: Transformer, folder: str) -> None:
  """Put the PEFT LoRA adapter in `folder` on `model` (a base without adapters), in place."""
  if not os.path.isdir(folder):
    raise CheckpointError(f"adapter folder {folder!r} does not exist")
  peft = read_json(os.path.join(folder, ADAPTER_CONFIG))
  file = os.path.join(folder, ADAPTER_FILE)
  if not os.path.isfile(file):
    raise CheckpointError(f"{file} is missing: a PEFT adapter folder holds {ADAPTER_FILE}")
  from safetensors import safe_open
  try:
    with safe_open(file, framework="numpy") as f:
      names = list(f.keys())
  except Exception as e:  # safetensors raises assorted types on a damaged header
    raise CheckpointError(f"cannot read {file}: {type(e).__name__}: {e}") from e
  attach_peft(model, peft, lambda name: read_tensor(file, name), names, file)


def _load_base(path: str, *, dtype: str, param_dtype: str | None):
  """`load` without an adapter."""
  gguf_file = _gguf_file(path)
  if gguf_file is not None:
    ckpt = gguf.GGUFCheckpoint(gguf_file, dtype=dtype, param_dtype=param_dtype)
    model = params_from_tensors(ckpt.cfg, ckpt.tensor, ckpt.names, gguf_file)
    return model, ckpt.tokenizer()
  if os.path.isfile(path):
    raise CheckpointError(f"{path} is a file: pass a checkpoint folder or a .gguf file")
  if not os.path.isdir(path):
    raise CheckpointError(f"checkpoint folder {path!r} does not exist")
  if read_json(os.path.join(path, "config.json")).get("model_type") == qwen2_5_vl.MODEL_TYPE:
    return qwen2_5_vl.load(path, dtype=dtype, param_dtype=param_dtype)  # (model, VLProcessor)
  model = load_params(path, model_config(path, dtype=dtype, param_dtype=param_dtype))
  return model, load_tokenizer(path)


def is_vl_folder(path: str) -> bool:
  """Whether `path` is a Qwen2.5-VL checkpoint folder (its config.json says so)."""
  cfg_file = os.path.join(path, "config.json")
  return os.path.isfile(cfg_file) and read_json(cfg_file).get("model_type") == qwen2_5_vl.MODEL_TYPE


def model_config(path: str, *, dtype: str = "float32", param_dtype: str | None = None):
  """The ModelConfig (a Qwen2.5-VL folder: VLConfig) of a checkpoint, from its config.json
  or GGUF header alone: no weights are read (what parallel/plan.py sizes a run by)."""
  gguf_file = _gguf_file(path)
  if gguf_file is not None:
    reader = gguf.open_reader(gguf_file)
    return gguf.config_from_gguf(gguf.metadata(reader), gguf.tensor_shapes(reader), gguf_file,
                                 dtype=dtype, param_dtype=param_dtype)
  if os.path.isfile(path):
    raise CheckpointError(f"{path} is a file: pass a checkpoint folder or a .gguf file")
  if not os.path.isdir(path):
    raise CheckpointError(f"checkpoint folder {path!r} does not exist")
  cfg_file = os.path.join(path, "config.json")
  hf_cfg = read_json(cfg_file)
  try:
    if hf_cfg.get("model_type") == qwen2_5_vl.MODEL_TYPE:
      return qwen2_5_vl.config_from_hf(hf_cfg, dtype=dtype, param_dtype=param_dtype)
    return config_from_hf(hf_cfg, dtype=dtype, param_dtype=param_dtype)
  except KeyError as e:
    raise CheckpointError(f"{cfg_file} lacks the field {e.args[0]!r}") from e
  except (TypeError, ValueError) as e:  # CheckpointError included: say which file
    raise CheckpointError(f"{cfg_file}: {e}") from e


def _gguf_file(path: str) -> str | None:
  """The GGUF file `path` names (a `.gguf` file, or the one in a folder without
  config.json), else None."""
  if path.endswith(".gguf"):
    if not os.path.isfile(path):
      raise CheckpointError(f"GGUF file {path!r} does not exist")
    return path
  if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")):
    return None
  found = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
  if len(found) > 1:
    raise CheckpointError(f"{path} holds {len(found)} GGUF files ({', '.join(found)}); "
                          "pass the one to load")
  return os.path.join(path, found[0]) if found else None


def save(model: Transformer, tokenizer, path: str, *, adapter_only: bool = False,
         base: str | None = None) -> None:
  """Write `model` (and `tokenizer`, if given) as a HF folder: config.json + model.safetensors
  (a model with adapters: its merged weights). adapter_only: its LoRA adapters alone, as PEFT
  writes them (`save_adapter`; base: the base model's name or folder, recorded there).

  Written to a temporary folder first and moved into place, so an
  interrupted save never leaves a half-written checkpoint at `path`.
  """
  from safetensors.flax import save_file

  if adapter_only:
    return save_adapter(model, tokenizer, path, base)
  if isinstance(model, qwen2_5_vl.Qwen2_5_VL):  # `tokenizer` is then its VLProcessor (or None)
    return qwen2_5_vl.save(model, tokenizer, path)
  def write(tmp):
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(config_to_hf(model.cfg, tokenizer), f, indent=2)
    tensors = {k: jax.device_get(v) for k, v in hf_tensors(model).items()}
    save_file({k: jnp.asarray(v) for k, v in tensors.items()},
              os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
      tokenizer.save_pretrained(tmp)

  write_folder(path, write)


def save_adapter(model: Transformer, tokenizer, path: str, base: str | None = None) -> None:
  """Write the LoRA adapters of `model` as a PEFT folder: adapter_config.json (rank, alpha,
  target modules) and adapter_model.safetensors (PEFT's tensor names, lora_A [r, in] and
  lora_B [out, r], float32), with `tokenizer` if given. Text models only."""
  from safetensors.flax import save_file

  if isinstance(model, qwen2_5_vl.Qwen2_5_VL):
    raise CheckpointError("adapter_only=True: PEFT adapters are written for text models only")
  tensors = {k: jnp.asarray(jax.device_get(v)) for k, v in adapter_tensors(model).items()}

  def write(tmp):
    with open(os.path.join(tmp, ADAPTER_CONFIG), "w") as f:
      json.dump(peft_config(model.cfg.lora, base), f, indent=2)
    save_file(tensors, os.path.join(tmp, ADAPTER_FILE), metadata={"format": "pt"})
    if tokenizer is not None:
      tokenizer.save_pretrained(tmp)

  write_folder(path, write)
