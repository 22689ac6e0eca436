"""Hugging Face checkpoints <-> our Flax model, from and to local folders.

`load(path)` reads config.json (Qwen2, Qwen3 dense, Llama 2 / 3.x families), `*.safetensors`
(one file, or shards listed in model.safetensors.index.json) and the
tokenizer (through transformers.AutoTokenizer) from a local folder; nothing
is fetched from a hub. A llama.cpp GGUF file (or a folder holding one) goes to
`models.gguf`, which reads it without torch; a Qwen2.5-VL folder to `models.qwen2_5_vl`.
`save(model, tokenizer, path)` writes a folder that transformers opens with
`AutoModelForCausalLM.from_pretrained(path)`. The format itself (config.json fields,
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
from dmpo_jax.models.hf_text import (IGNORED_SUFFIXES, config_from_hf, config_to_hf, hf_tensors,
                                     load_tokenizer, params_from_tensors)
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.models.weights import (CheckpointError, read_json, read_tensor, safetensor_files,
                                     write_folder)


def load_params(path: str, cfg: ModelConfig) -> Transformer:
  """Build a Transformer for `cfg` and fill it from the safetensors in `path`."""
  files = safetensor_files(path)
  ignore = lambda n: n.endswith(IGNORED_SUFFIXES) or (cfg.tie_embeddings and n == "lm_head.weight")
  return params_from_tensors(cfg, lambda name: read_tensor(files[name], name), files, path,
                             ignore=ignore)


def load(path: str, *, dtype: str = "float32", param_dtype: str | None = None):
  """A local HF folder -> (model, tokenizer). tokenizer is None if the folder has none.
  A Qwen2.5-VL folder gives (`qwen2_5_vl.Qwen2_5_VL`, `VLProcessor` or None).
  A `.gguf` file, or a folder holding one and no config.json, is read by `models.gguf`."""
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


def save(model: Transformer, tokenizer, path: str) -> None:
  """Write `model` (and `tokenizer`, if given) as a HF folder: config.json + model.safetensors.

  Written to a temporary folder first and moved into place, so an
  interrupted save never leaves a half-written checkpoint at `path`.
  """
  from safetensors.flax import save_file

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


