"""llama.cpp GGUF files -> our Flax Transformer and a transformers tokenizer, with no torch.

A GGUF file holds the weights (often quantised), the model's hyperparameters and its
tokenizer (vocabulary, merges, special ids, chat template) as metadata. `hf.load(file)`
(or a folder holding one) opens it as a `GGUFCheckpoint` and gives (model, tokenizer) as for
a Hugging Face folder; `hf.save` then writes an ordinary safetensors folder.

What is read, and what is refused by name:
- architectures `llama`, `qwen2`, `qwen3` (dense, plain RoPE); others name
  `general.architecture`;
- tensor types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, dequantised to float32 by the
  `gguf` package (llama.cpp's own reader); others name the type and the tensor;
- llama.cpp's converter reorders the rows of each llama Q and K projection (its RoPE pairs
  dimensions i and i+1 of a head, Hugging Face pairs i and i + H/2); that is undone here.
  Qwen2 and Qwen3 files are written without the reordering;
- byte-level BPE tokenizers (`tokenizer.ggml.model = gpt2`) with the split rule of
  `tokenizer.ggml.pre`, built with the `tokenizers` library and wrapped as a transformers
  `PreTrainedTokenizerFast` carrying the file's chat template.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dmpo_jax.models.config import ModelConfig
from dmpo_jax.models.weights import CheckpointError

ARCHITECTURES = ("llama", "qwen2", "qwen3")
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")

# tokenizer.ggml.pre -> the regular expression that cuts text into words before BPE, as the
# vocabulary was trained. None: GPT-2's own rule, which the ByteLevel pre-tokenizer applies.
# (SmolLM's original tokenizer also splits digits one by one; its merges join no digits, so
# GPT-2's rule gives the same tokens.)
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"  # digits in 3s
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"default": None, "gpt2": None, "smollm": None,
                  "qwen2": _QWEN2_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT}

_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def open_reader(path: str):
  """A gguf.GGUFReader that first checks every tensor's bytes lie inside the file, so a
  truncated file is refused naming the first tensor it cuts."""
  import gguf

  class CheckedReader(gguf.GGUFReader):
    def _build_tensors(self, start_offs, fields):
      size = len(self.data)
      for field in fields:
        _, name, _, dims, raw_type, offset = field.parts
        name = bytes(name).decode("utf-8", "replace")
        try:
          qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
        except ValueError:
          raise CheckpointError(f"{path}: tensor {name} has unknown type id {int(raw_type[0])}; "
                                f"supported: {', '.join(TENSOR_TYPES)}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        end = int(start_offs + offset[0]) + int(np.prod(dims)) * type_size // block
        if end > size:
          raise CheckpointError(f"{path} is truncated: tensor {name} needs bytes up to {end}, "
                                f"the file has {size}")
      super()._build_tensors(start_offs, fields)

  if not os.path.isfile(path):
    raise CheckpointError(f"GGUF file {path!r} does not exist")
  try:
    return CheckedReader(path)
  except CheckpointError:
    raise
  except Exception as e:  # numpy/gguf errors on a damaged header name nothing
    raise CheckpointError(f"cannot read the GGUF header (metadata and tensor table) of {path}: "
                          f"{type(e).__name__}: {e}; the file is truncated or not a GGUF "
                          "file") from e


def metadata(reader) -> dict[str, Any]:
  """The file's key-value metadata as Python values (scalars, strings, lists)."""
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("GGUF."):
      continue
    out[key] = field.contents()
  return out


def _get(meta: dict, key: str, where: str, kind=int, default=None):
  if key not in meta:
    if default is not None:
      return default
    raise CheckpointError(f"{where} lacks the metadata field {key}")
  value = meta[key]
  try:
    return kind(value)
  except (TypeError, ValueError):
    raise CheckpointError(f"{where}: metadata field {key}={value!r} is not a {kind.__name__}") \
        from None


def config_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]], where: str, *,
                     dtype: str = "float32", param_dtype: str | None = None) -> ModelConfig:
  """ModelConfig from the metadata and tensor shapes (name -> numpy shape) of a GGUF file."""
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise CheckpointError(f"{where}: general.architecture={arch!r} is not supported; "
                          f"supported: {', '.join(ARCHITECTURES)}")
  get = lambda key, kind=int, default=None: _get(meta, f"{arch}.{key}", where, kind, default)
  for key in ("expert_count", "rope.scaling.type"):
    value = meta.get(f"{arch}.{key}")
    if value not in (None, 0, "none"):
      raise CheckpointError(f"{where}: metadata field {arch}.{key}={value!r} is not supported "
                            "(mixture-of-experts and RoPE scaling are not implemented)")
  if "rope_freqs.weight" in shapes:
    raise CheckpointError(f"{where}: tensor rope_freqs.weight (scaled RoPE frequencies, as in "
                          "Llama 3.1) is not supported")
  if "token_embd.weight" not in shapes:
    raise CheckpointError(f"tensor token_embd.weight is missing from {where}")
  vocab = shapes["token_embd.weight"][0]
  declared = meta.get(f"{arch}.vocab_size")
  if declared is not None and int(declared) != vocab:
    raise CheckpointError(f"{where}: metadata field {arch}.vocab_size={declared} differs from "
                          f"the {vocab} rows of token_embd.weight")
  hidden, heads = get("embedding_length"), get("attention.head_count")
  head_dim = get("attention.key_length", default=hidden // heads)
  rotary = get("rope.dimension_count", default=head_dim)
  if rotary != head_dim:
    raise CheckpointError(f"{where}: metadata field {arch}.rope.dimension_count={rotary} "
                          f"rotates part of a head of {head_dim}; not implemented")
  return ModelConfig(
      vocab_size=vocab,
      hidden_size=hidden,
      intermediate_size=get("feed_forward_length"),
      num_layers=get("block_count"),
      num_heads=heads,
      num_kv_heads=get("attention.head_count_kv", default=heads),
      head_dim=head_dim,
      rope_theta=get("rope.freq_base", float, 10000.0),
      rms_norm_eps=get("attention.layer_norm_rms_epsilon", float),
      qkv_bias=arch == "qwen2",
      qk_norm=arch == "qwen3",
      tie_embeddings="output.weight" not in shapes,
      max_position_embeddings=get("context_length", default=4096),
      param_dtype=param_dtype or dtype,
      dtype=dtype,
      architecture=arch,
  )


def hf_name(name: str) -> str:
  """A GGUF tensor name -> the HF name `hf_text.name_map` uses; unknown names unchanged."""
  top = {"token_embd.weight": "model.embed_tokens.weight",
         "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
  if name in top:
    return top[name]
  parts = name.split(".", 3)
  if len(parts) != 4 or parts[0] != "blk":
    return name
  _, i, what, kind = parts
  layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
           "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
           "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj"}
  return f"model.layers.{i}.{layer[what]}.{kind}" if what in layer else name


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Undo llama.cpp's reordering of a llama Q or K projection's rows (or bias).

  Within each head of H rows, llama.cpp stores row 2j as HF's row j and row 2j+1 as HF's
  row j + H/2 (interleaved pairs for its RoPE); this puts them back as two halves.
  """
  h = w.shape[0] // heads
  return w.reshape(heads, h // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(tensor, path: str) -> np.ndarray:
  import gguf

  kind = tensor.tensor_type.name
  if kind not in TENSOR_TYPES:
    raise CheckpointError(f"{path}: tensor {tensor.name} has type {kind}, which is not supported; "
                          f"supported: {', '.join(TENSOR_TYPES)}")
  value = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  return np.asarray(value, np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))


def tensor_shapes(reader) -> dict[str, tuple[int, ...]]:
  return {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}


def _hf_layout(tensor, cfg: ModelConfig, path: str) -> np.ndarray:
  value = _dequantize(tensor, path)
  if cfg.architecture == "llama":
    for part, heads in ((".attn_q.", cfg.num_heads), (".attn_k.", cfg.num_kv_heads)):
      if part in tensor.name:
        if value.shape[0] % (2 * heads):
          raise CheckpointError(f"{path}: tensor {tensor.name} has shape {value.shape}; its "
                                f"{value.shape[0]} rows do not split into {heads} heads")
        value = unpermute(value, heads)
  return value


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable character table, in which byte-level vocabularies are spelled:
  printable Latin-1 bytes stand for themselves, the rest map to 256, 257, ... in order."""
  keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
  table, extra = {}, 0
  for b in range(256):
    if b in keep:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


def bpe_merges(merges, vocab: dict[str, int], where: str) -> list[tuple[str, str]]:
  """tokenizer.ggml.merges as (left, right) pairs; a merge that is not two tokens, or whose
  parts or result are not in the vocabulary (which the BPE model refuses), is named."""
  out = []
  for i, m in enumerate(merges):
    pair = m.split(" ")
    if len(pair) != 2:
      raise CheckpointError(f"{where}: tokenizer.ggml.merges holds {m!r}, not two tokens")
    missing = [t for t in (*pair, "".join(pair)) if t not in vocab]
    if missing:
      raise CheckpointError(f"{where}: tokenizer.ggml.merges[{i}] = {m!r} names token "
                            f"{missing[0]!r}, which is not in tokenizer.ggml.tokens")
    out.append(tuple(pair))
  return out


def tokenizer_from_gguf(meta: dict[str, Any], where: str):
  """The file's tokenizer as a transformers PreTrainedTokenizerFast (vocabulary, merges,
  special tokens, chat template), built with `tokenizers` alone."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise CheckpointError(f"{where}: tokenizer.ggml.model={kind!r} is not supported; only "
                          "byte-level BPE ('gpt2') is implemented")
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZERS:
    raise CheckpointError(f"{where}: tokenizer.ggml.pre={pre!r} is not supported; supported: "
                          f"{', '.join(PRE_TOKENIZERS)}")
  for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
    if key not in meta:
      raise CheckpointError(f"{where} lacks the metadata field {key}")
  tokens = list(meta["tokenizer.ggml.tokens"])
  types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
  if len(types) != len(tokens):
    raise CheckpointError(f"{where}: tokenizer.ggml.token_type has {len(types)} entries for "
                          f"{len(tokens)} tokens")
  spelling = bytes_to_unicode()
  alphabet = set(spelling.values())
  # A token written in plain text (not in the byte alphabet) is respelled byte by byte.
  vocab = {}
  for i, t in enumerate(tokens):
    vocab[t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))] = i
  merges = bpe_merges(meta["tokenizer.ggml.merges"], vocab, where)
  try:
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
  except Exception as e:  # tokenizers raises a bare Exception; bpe_merges checks what it knows
    raise CheckpointError(f"{where}: the BPE tokenizer of tokenizer.ggml.tokens and "
                          f"tokenizer.ggml.merges is refused: {' '.join(str(e).split())}") from e
  split = PRE_TOKENIZERS[pre]
  if split is None:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  else:
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  # Control tokens (<|im_end|>, ...) stay whole and are special; user-defined ones stay whole.
  # A "control" token outside the byte alphabet is a mislabel in some files: not added.
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                          for t, k in zip(tokens, types) if k == _CONTROL and set(t) <= alphabet])
  tok.add_tokens([AddedToken(t, normalized=False, special=False)
                  for t, k in zip(tokens, types) if k == _USER_DEFINED and t in vocab])
  special = {}
  for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                    ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
    index = meta.get(f"tokenizer.ggml.{key}")
    if index is not None:
      if not 0 <= int(index) < len(tokens):
        raise CheckpointError(f"{where}: tokenizer.ggml.{key}={index} is outside the vocabulary "
                              f"of {len(tokens)}")
      special[name] = tokens[int(index)]
  return PreTrainedTokenizerFast(tokenizer_object=tok,
                                 chat_template=meta.get("tokenizer.chat_template"), **special)


class GGUFCheckpoint:
  """One GGUF file opened for loading: its config, tensors (HF names and layout, float32,
  dequantised on demand) and tokenizer. `hf.load` fills the model through its name map."""

  def __init__(self, path: str, *, dtype: str = "float32", param_dtype: str | None = None):
    self.path = path
    self.reader = open_reader(path)
    self.meta = metadata(self.reader)
    self.cfg = config_from_gguf(self.meta, tensor_shapes(self.reader), path, dtype=dtype,
                                param_dtype=param_dtype)
    for t in self.reader.tensors:  # refuse an unsupported type before any work
      if t.tensor_type.name not in TENSOR_TYPES:
        raise CheckpointError(f"{path}: tensor {t.name} has type {t.tensor_type.name}, which is "
                              f"not supported; supported: {', '.join(TENSOR_TYPES)}")
    self._by_name = {hf_name(t.name): t for t in self.reader.tensors}

  @property
  def names(self) -> list[str]:
    return list(self._by_name)

  def tensor(self, name: str) -> np.ndarray:
    return _hf_layout(self._by_name[name], self.cfg, self.path)

  def tokenizer(self):
    return tokenizer_from_gguf(self.meta, self.path)
