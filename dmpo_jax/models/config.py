"""ModelConfig: the frozen description of a decoder-only transformer (Llama / Qwen2 / Qwen3),
and LoRAConfig, the low-rank adapters it may carry (`models.lora`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ARCHITECTURES = ("qwen2", "llama", "qwen3")
ROPE_TYPES = ("default", "llama3")
ATTENTION = ("auto", "reference", "xla", "cudnn", "flash")  # see models.attention
# The projections an adapter may target, by their Hugging Face / PEFT module names.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_INITS = ("kaiming", "gaussian")  # A's draw (PEFT's default / init_lora_weights="gaussian")


def as_dtype(name: Any):
  """'float32' | 'bfloat16' | a jnp dtype -> a jnp dtype, with a clear error."""
  if isinstance(name, str):
    if name not in _DTYPES:
      raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]
  return jnp.dtype(name).type


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Low-rank adapters (arXiv 2106.09685): each targeted projection x @ W becomes
  x @ W + (alpha / rank) * (x @ A) @ B with A [in, rank] drawn as `init` says and B [rank, out]
  zero, so that a fresh adapter leaves the model exactly as it was. The base W is frozen.

  targets: Hugging Face module names (`LORA_TARGETS`); init: 'kaiming' (A uniform in
  +-1/sqrt(in), PEFT's default) or 'gaussian' (A normal with std 1/rank); param_dtype: the
  adapters' storage dtype (float32 by default, whatever the base's: their AdamW state is small).
  alpha None: alpha = rank (scale 1)."""

  rank: int
  alpha: float | None = None
  targets: tuple[str, ...] = LORA_TARGETS
  init: str = "kaiming"
  param_dtype: str = "float32"

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
      raise ValueError(f"LoRAConfig.rank must be a positive int, got {self.rank!r}")
    alpha = float(self.rank if self.alpha is None else self.alpha)
    if not alpha > 0 or alpha == float("inf"):
      raise ValueError(f"LoRAConfig.alpha must be a positive number, got {self.alpha!r}")
    object.__setattr__(self, "alpha", alpha)
    targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if unknown or not targets:
      raise ValueError(f"LoRAConfig.targets: unknown target module(s) {unknown or targets!r}; "
                       f"choose from {list(LORA_TARGETS)}")
    # One order whatever the config's: parameter paths and keys do not depend on it.
    object.__setattr__(self, "targets", tuple(t for t in LORA_TARGETS if t in targets))
    if self.init not in LORA_INITS:
      raise ValueError(f"LoRAConfig.init must be one of {LORA_INITS}, got {self.init!r}")
    as_dtype(self.param_dtype)

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and numerics of the decoder.

  Shape names: V vocab, D model dim, F ffn dim, N query heads,
  K kv heads, H head dim.
  """

  vocab_size: int  # V
  hidden_size: int  # D
  intermediate_size: int  # F
  num_layers: int
  num_heads: int  # N
  num_kv_heads: int  # K
  head_dim: int | None = None  # H; None -> D // N
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = False  # Qwen2: True; Llama: False
  tie_embeddings: bool = False
  max_position_embeddings: int = 4096
  param_dtype: str = "float32"
  dtype: str = "float32"  # compute dtype; norms, softmax and log-probs stay float32
  architecture: str = "qwen2"  # 'qwen2' | 'llama' | 'qwen3': which HF class save() writes
  remat: bool = False  # recompute each layer's activations in the backward pass (memory for FLOPs)
  qk_norm: bool = False  # Qwen3: RMSNorm over each query / key head before RoPE
  rope_type: str = "default"  # 'default' | 'llama3' (Llama 3.x frequency scaling)
  rope_factor: float = 8.0  # llama3 scaling: factor, low / high frequency factors,
  rope_low_freq_factor: float = 1.0  # and the context length the frequencies were
  rope_high_freq_factor: float = 4.0  # trained for
  rope_original_max_position: int = 8192
  mrope_section: tuple[int, ...] | None = None  # multimodal RoPE: frequencies per stream (sum H/2)
  attention: str = "auto"  # attention core: 'auto' | 'reference' | 'xla' | 'cudnn' | 'flash'
  lora: LoRAConfig | None = None  # low-rank adapters on the projections (None: none)

  def __post_init__(self):
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                  "num_heads", "num_kv_heads"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
          f"num_kv_heads ({self.num_kv_heads})")
    if self.head_dim is None:
      if self.hidden_size % self.num_heads:
        raise ValueError(
            f"ModelConfig.hidden_size ({self.hidden_size}) is not divisible by "
            f"num_heads ({self.num_heads}); set head_dim explicitly")
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
    as_dtype(self.param_dtype)
    as_dtype(self.dtype)
    if self.architecture not in ARCHITECTURES:
      raise ValueError(
          f"ModelConfig.architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"ModelConfig.rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
    if self.attention not in ATTENTION:
      raise ValueError(f"ModelConfig.attention must be one of {ATTENTION}, got {self.attention!r}")
    if self.mrope_section is not None:
      object.__setattr__(self, "mrope_section", tuple(int(x) for x in self.mrope_section))
      if sum(self.mrope_section) != self.head_dim // 2:
        raise ValueError(f"ModelConfig.mrope_section {self.mrope_section} must sum to "
                         f"head_dim / 2 = {self.head_dim // 2}")
    if self.lora is not None and not isinstance(self.lora, LoRAConfig):
      raise ValueError(f"ModelConfig.lora must be a LoRAConfig or None, got {type(self.lora).__name__}")

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """The base model's parameter count (adapters: `num_adapter_params`)."""
    d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
    n, k = self.num_heads, self.num_kv_heads
    attn = d * n * h * 2 + d * k * h * 2 + (n * h + 2 * k * h) * self.qkv_bias
    attn += 2 * h * self.qk_norm
    layer = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_embeddings else self.vocab_size * d
    return self.num_layers * layer + self.vocab_size * d + d + head

  def projection_shapes(self) -> dict[str, tuple[int, int]]:
    """Each adaptable projection's [in, out], by its Hugging Face module name."""
    d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
    n, k = self.num_heads, self.num_kv_heads
    return {"q_proj": (d, n * h), "k_proj": (d, k * h), "v_proj": (d, k * h), "o_proj": (n * h, d),
            "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}

  def num_adapter_params(self) -> int:
    """The adapters' parameter count: rank x (in + out) per targeted projection and layer."""
    if self.lora is None:
      return 0
    shapes = self.projection_shapes()
    return self.num_layers * sum(self.lora.rank * sum(shapes[t]) for t in self.lora.targets)
