"""Low-rank adapters (LoRA, arXiv 2106.09685) on the text Transformer's projections.

A targeted projection x @ W becomes x @ W + (alpha / r) * (x @ A) @ B, as PEFT computes it:
A [in, r] and B [r, out] are `nnx.LoRAParam`s on an `Adapter` beside the weight (attribute
`<weight>_lora` of the attention or MLP module, params `lora_a` and `lora_b`), cast to the
compute dtype like the weight. B starts at zero, so a fresh adapter changes nothing. The base
is frozen: the training steps give it no gradient and no optimizer state (`training.steps`),
checkpoints save it once (`training.checkpoint`), and the reference policy is the base with
the adapters switched off (`adapters_off`), with no second copy of the weights.

Adapters carry logical axis names: A the weight's input axis, B its output axis (the rank
axis is replicated), so they shard like the weight they adapt. Our A and B are PEFT's
lora_A.weight and lora_B.weight transposed (torch Linear is [out, in]); `peft_name` gives
PEFT's tensor names.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dmpo_jax.models.config import LORA_TARGETS, LoRAConfig, as_dtype

# Our (module, weight) of each target, by its Hugging Face module name; HF's block submodule.
TARGETS = {"q_proj": ("attn", "q"), "k_proj": ("attn", "k"), "v_proj": ("attn", "v"),
           "o_proj": ("attn", "o"), "gate_proj": ("mlp", "gate"), "up_proj": ("mlp", "up"),
           "down_proj": ("mlp", "down")}
HF_PARENT = {"attn": "self_attn", "mlp": "mlp"}
ADAPTER_PARAMS = ("lora_a", "lora_b")  # the names of an adapter's params in a params tree
PEFT_PREFIX = "base_model.model."  # PEFT's wrapper around the transformers model


def suffix(weight: str) -> str:
  """The attribute of the adapter of weight `weight` (e.g. 'q' -> 'q_lora')."""
  return weight + "_lora"


def matmul(x, w):
  """x [.., I] @ w [I, O] as one 2-D matmul (as `transformer.dense`, for the same reason)."""
  y = jnp.matmul(x.reshape(-1, x.shape[-1]), w)
  return y.reshape(*x.shape[:-1], w.shape[-1])


class Adapter(nnx.Module):
  """A [in, r] and B [r, out] of one projection; `adapter(x)` = scale * (x @ A) @ B."""

  def __init__(self, weight: nnx.Param, cfg: LoRAConfig, key):
    d_in, d_out = weight.shape
    names = weight.get_metadata().get("out_sharding") or (None, None)
    pd = as_dtype(cfg.param_dtype)
    if cfg.init == "kaiming":  # torch's kaiming_uniform_(a=sqrt(5)), as PEFT: bound 1/sqrt(in)
      a = jax.random.uniform(key, (d_in, cfg.rank), jnp.float32, -1.0, 1.0) / jnp.sqrt(d_in)
    else:
      a = jax.random.normal(key, (d_in, cfg.rank), jnp.float32) / cfg.rank
    # eager_sharding=False: placed by dmpo_jax.parallel.sharding from these names, like the base.
    self.lora_a = nnx.LoRAParam(a.astype(pd), out_sharding=(names[0], None), eager_sharding=False)
    self.lora_b = nnx.LoRAParam(jnp.zeros((cfg.rank, d_out), pd), out_sharding=(None, names[1]),
                                eager_sharding=False)
    self.scale = cfg.scale

  def __call__(self, x):
    dt = x.dtype
    h = matmul(x, self.lora_a[...].astype(dt))
    return matmul(h, self.lora_b[...].astype(dt)) * jnp.asarray(self.scale, dt)

  def delta(self):
    """scale * A @ B [in, out] in float32: what merging adds to the weight."""
    f32 = jnp.float32
    return self.scale * (self.lora_a[...].astype(f32) @ self.lora_b[...].astype(f32))


def attach(model, cfg: LoRAConfig, key) -> None:
  """Give every layer of text Transformer `model` an adapter on each of cfg.targets, in place
  (A drawn from fold_in(key, layer x 7 + target index), B zero); model.cfg.lora becomes cfg.
  The base weights are untouched, so a model loaded from a checkpoint keeps them exactly."""
  if not isinstance(cfg, LoRAConfig):
    raise ValueError(f"lora must be a LoRAConfig, got {type(cfg).__name__}")
  if model.cfg.lora is not None and model.cfg.lora != cfg:
    raise ValueError(f"the model already has adapters ({model.cfg.lora}); cannot attach {cfg}")
  for i, block in enumerate(model.layers):
    for target in cfg.targets:
      part, weight = TARGETS[target]
      module = getattr(block, part)
      k = jax.random.fold_in(key, i * len(LORA_TARGETS) + LORA_TARGETS.index(target))
      setattr(module, suffix(weight), Adapter(getattr(module, weight), cfg, k))
  model.cfg = model.cfg.replace(lora=cfg)


def adapters(model) -> dict[tuple[int, str], Adapter]:
  """{(layer, HF target name): Adapter} of a text Transformer (empty without adapters)."""
  lcfg = model.cfg.lora
  if lcfg is None:
    return {}
  return {(i, t): getattr(getattr(block, TARGETS[t][0]), suffix(TARGETS[t][1]))
          for i, block in enumerate(model.layers) for t in lcfg.targets}


# ---------------------------------------------------------------------------
# Params trees (what the training steps and checkpoints see).
def is_adapter_path(path) -> bool:
  """Whether a leaf's key path (jax.tree_util, through an nnx.State) is an adapter's A or B."""
  return any(getattr(k, "key", None) in ADAPTER_PARAMS for k in path)


def is_base_path(path) -> bool:
  """In a LoRA params tree ({"model": State, ...}): whether a leaf is the frozen base's (under
  "model" and not an adapter). The rest (adapters, a FlowRL log Z head) is trained."""
  return getattr(path[0], "key", None) == "model" and not is_adapter_path(path)


def has_adapters(tree) -> bool:
  """Whether a params tree holds adapters (then every other model param is frozen)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return any(is_adapter_path(path) for path, _ in flat)


def adapters_off(params):
  """`params` with every B zeroed: the base model (its logits exactly, op by op; compiled, up to
  float rounding where XLA fuses the two graphs differently), the reference policy. The other
  leaves are the same arrays, not copies."""
  is_b = lambda path: any(getattr(k, "key", None) == "lora_b" for k in path)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.zeros_like(x) if is_b(path) else x, params)


# A LoRA policy's reference policy: the base with the adapters switched off. The base is
# frozen (bit-identical at every step), so it is read from the current params at each use
# (`reference_params`): no copy is kept, and none could be, since every update donates the
# params' buffers.
ADAPTERS_OFF = "adapters_off"


def reference_params(reference, params):
  """The reference policy's params: `params` with the adapters off for ADAPTERS_OFF (a LoRA
  policy's reference), else `reference` itself (a saved copy of the policy at RL start)."""
  if isinstance(reference, str) and reference == ADAPTERS_OFF:
    return adapters_off(params)
  return reference


def freeze_base(params):
  """`params` with every non-adapter leaf of a LoRA model under stop_gradient (the base gets
  no gradient: its weight-gradient matmuls are not computed); unchanged without adapters."""
  if not has_adapters(params):
    return params
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x if is_adapter_path(path) else jax.lax.stop_gradient(x), params)


def count(tree) -> int:
  """The number of adapter parameters in a params tree or nnx.State."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return sum(int(x.size) for path, x in flat if is_adapter_path(path))


# ---------------------------------------------------------------------------
# Merging and PEFT names.
def merged_weights(model) -> dict[tuple, jax.Array]:
  """{our weight path: W + scale * A @ B} of every adapted projection, in the weight's dtype
  (the sum in float32), e.g. ("layers", 0, "attn", "q")."""
  out = {}
  for (i, target), ad in adapters(model).items():
    part, weight = TARGETS[target]
    w = getattr(getattr(model.layers[i], part), weight)[...]
    out[("layers", i, part, weight)] = (w.astype(jnp.float32) + ad.delta()).astype(w.dtype)
  return out


def peft_name(layer: int, target: str, which: str, prefix: str = "model.") -> str:
  """PEFT's tensor name of layer `layer`'s adapter on `target`, which 'A' or 'B'; `prefix`
  is the transformers model's path to its layers' parent ('model.': a CausalLM)."""
  part = TARGETS[target][0]
  return f"{PEFT_PREFIX}{prefix}layers.{layer}.{HF_PARENT[part]}.{target}.lora_{which}.weight"
