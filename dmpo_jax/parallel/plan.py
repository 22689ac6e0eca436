r"""Memory planner: bytes per device for params, optimizer state, gradients, activations, KV cache.

    python -m dmpo_jax.parallel.plan --model=qwen2.5-7b --mesh=data=1,fsdp=8,tensor=1 --device_gib=141
    python -m dmpo_jax.parallel.plan --config=configs/nphard_qwen.py:/models/Qwen2.5-1.5B-Instruct
    python -m dmpo_jax.parallel.plan --model=qwen2.5-vl-7b --remat --micro_batches=4 --patch_budget=1024

Parameters and optimizer state are exact: the model is built abstractly
(`nnx.eval_shape`, no weights) and every parameter is divided over the mesh
axes its logical names map to (the same rules and divisibility fallback as
training). Activations and the KV cache are estimates from the shapes
(stated in `activation_note`). A plan that does not fit is refused with the
numbers that do not fit (exit status 1). The trainer plans every stage of a
config the same way before it builds anything (training/memory.py): an RL
update's `extra_rows` (DPH-RL's stored responses) and a `reference` policy
(a second copy of the params) are part of the workload.

The update's forward is the trainer's (`--prefix_shared`, as config.rl.prefix_shared; the one
rule of models/prefix.py, `with_update_forward`): by default, for text prompts in
groups of two or more, each group's prompt runs once (`Workload.prefix_shared`), so its
activations hold P prompt tokens per group and T completion tokens per row instead of P + T
per row; image prompts, groups of one, DPH's stored rows and `--prefix_shared=off` run per
row.

A Qwen2.5-VL model (`VL_MODELS`, or a config whose checkpoint is one) adds its
vision tower: parameters and AdamW state exact like the text model's (the
tower's logical axis names shard it like the text layers), gradients only
with `--train_vision` (RL and SFT freeze the tower by default,
`freeze_vision`: its features are computed under stop_gradient), and the
tower's activations for `--patch_budget` patches per prompt. A frozen tower
has no AdamW state either (`make_optimizer(freeze_vision=True)` gives its
params a zero update and no moments).

LoRA (`--lora_rank`, or a config's model.lora; docs/TRAINING.md "LoRA"): the base is frozen
(bfloat16 by default here: a frozen base needs no float32 master copy), so gradients and AdamW
state are the adapters' alone (float32), and the reference policy is the base with the
adapters off: no second copy. The trainable-parameter count is exact (the adapters of the
abstractly built model).

    python -m dmpo_jax.parallel.plan --model=qwen2.5-7b --mesh=data=1,fsdp=1,tensor=1 \
        --device_gib=80 --lora_rank=64 --prompts=8 --group=8 --prompt_len=1024 --remat
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import types

import jax
import numpy as np

from dmpo_jax.parallel import sharding
from dmpo_jax.models import attention
from dmpo_jax.models import precision, prefix
from dmpo_jax.models.config import ATTENTION, LORA_TARGETS, LoRAConfig, ModelConfig, as_dtype
from dmpo_jax.models.vision import VisionConfig

# Published Qwen2.5-Instruct shapes (config.json of each model).
MODELS = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                         num_heads=14, num_kv_heads=2, head_dim=64, qkv_bias=True, tie_embeddings=True,
                         rope_theta=1e6),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                         num_heads=12, num_kv_heads=2, head_dim=128, qkv_bias=True, tie_embeddings=True,
                         rope_theta=1e6),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                       num_heads=28, num_kv_heads=4, head_dim=128, qkv_bias=True, tie_embeddings=False,
                       rope_theta=1e6),
    # Llama 3.x (config.json of Meta's releases) and Qwen3 dense.
    "llama3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=5e5, rope_type="llama3",
                        architecture="llama"),
    "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                        num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=5e5, rope_type="llama3",
                        rope_factor=32.0, tie_embeddings=True, architecture="llama"),
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
                     num_heads=32, num_kv_heads=8, head_dim=128, qk_norm=True, rope_theta=1e6,
                     architecture="qwen3"),
}

# Published Qwen2.5-VL-Instruct shapes (config.json): the text model's ModelConfig fields, the
# vision tower's VisionConfig fields and the image-pad token id.
VL_MODELS = {
    "qwen2.5-vl-7b": dict(
        text=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                  num_heads=28, num_kv_heads=4, head_dim=128, qkv_bias=True, tie_embeddings=False,
                  rope_theta=1e6, max_position_embeddings=128000, mrope_section=(16, 24, 24)),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, in_channels=3,
                    patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                    out_hidden_size=3584, fullatt_block_indexes=(7, 15, 23, 31)),
        image_token_id=151655),
}

GIB = 1024 ** 3


@dataclasses.dataclass
class Workload:
  prompts: int = 32          # prompts per RL step (global)
  group: int = 8             # samples per prompt
  prompt_len: int = 2048
  new_tokens: int = 1024
  remat: bool = False        # activation checkpointing per layer
  micro_batches: int = 1     # gradient accumulation slices of the update (config.rl.micro_batches)
  backend: str = "gpu"       # 'cpu' | 'gpu' | 'tpu': picks the attention core and log-prob chunking
  patch_budget: int = 1024   # VL: image patches per prompt (before the merge; config.image.patch_budget)
  train_vision: bool = False  # VL: the tower is trained (rl.freeze_vision = False)
  extra_rows: int = 0        # update rows beyond prompts x group (DPH-RL's stored responses, dph.batch)
  reference: bool = False    # a reference policy (a second copy of the params) is held beside the policy
  prefix_shared: bool = False  # the update runs each group's prompt once (training/steps.py
  #                              `make_logprob_fn`'s prefix-shared forward, config.rl.prefix_shared):
  #                              its activations hold P prompt tokens per group, not per row


def _fake_mesh(shape: dict):
  return types.SimpleNamespace(shape={a: int(shape.get(a, 1)) for a in sharding.AXES})


def vl_config(name: str, dtype: str = "bfloat16", param_dtype: str = "float32"):
  """The VLConfig of a `VL_MODELS` entry."""
  from dmpo_jax.models.qwen2_5_vl import VLConfig
  m = VL_MODELS[name]
  return VLConfig(ModelConfig(**m["text"], dtype=dtype, param_dtype=param_dtype),
                  VisionConfig(**m["vision"], dtype=dtype, param_dtype=param_dtype),
                  m["image_token_id"])


def _module(cfg):
  """The (abstract-buildable) model of a config: Transformer, VisionTower or Qwen2_5_VL."""
  from dmpo_jax.models.transformer import Transformer
  from dmpo_jax.models.vision import VisionTower
  from dmpo_jax.models.qwen2_5_vl import Qwen2_5_VL
  if isinstance(cfg, ModelConfig):
    return Transformer
  if isinstance(cfg, VisionConfig):
    return VisionTower
  return Qwen2_5_VL


def param_bytes_per_device(cfg, mesh_shape: dict, adapters: bool = False) -> tuple[int, int, int]:
  """(bytes per device, total bytes, number of params) of the parameters of the model of
  `cfg`: a ModelConfig (text Transformer), a VisionConfig (the vision tower alone) or a
  VLConfig (both). adapters: of its LoRA adapters alone (cfg.lora)."""
  return _param_bytes(cfg, tuple(sorted((a, int(n)) for a, n in mesh_shape.items())), adapters)


@functools.lru_cache(maxsize=32)  # a config's check plans several workloads of one model
def _param_bytes(cfg, mesh_items: tuple, adapters: bool = False) -> tuple[int, int, int]:
  from flax import nnx
  module = _module(cfg)
  abstract = nnx.eval_shape(lambda: module(cfg, rngs=nnx.Rngs(0)))
  state = nnx.state(abstract, nnx.LoRAParam if adapters else nnx.Param)
  specs = nnx.get_partition_spec(state)
  mesh = _fake_mesh(dict(mesh_items))
  per_dev = total = count = 0
  for spec, x in zip(jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)),
                     jax.tree.leaves(state)):
    n = int(np.prod(x.shape))
    nbytes = n * np.dtype(x.dtype).itemsize
    mapped = sharding.logical_to_mesh(spec, x.shape, mesh)
    div = 1
    for axes in mapped:
      if axes is not None:
        for a in ((axes,) if isinstance(axes, str) else axes):
          div *= mesh.shape[a]
    per_dev += -(-nbytes // div)
    total += nbytes
    count += n
  return per_dev, total, count


def _auto_chunk(t: int, target: int = 128) -> int:
  """steps.auto_chunk (not imported: the planner needs no optimizer stack)."""
  return max(c for c in range(1, min(t, target) + 1) if t % c == 0)


def _split(n: int, ways: int) -> int:
  """A dimension of n over `ways` tensor devices: n / ways when it divides, else n (the
  sharding rules replicate a dimension the mesh axis does not divide)."""
  return n // ways if n % ways == 0 else n


def vision_activation_bytes(vc: VisionConfig, patch_budget: int, prompts: int, tensor: int,
                            act_bytes: int, trained: bool) -> float:
  """The vision tower's activations on one device running it on `prompts` prompts of
  `patch_budget` patches each (the tower runs once per prompt, attention dense over the
  budget with [P, P] segment masks, reference core: float32 probabilities per head).

  trained: what the backward keeps of every block, about 6D + 3F values per patch and the
  [heads, P, P] probabilities, and of the merger; frozen (stop_gradient): nothing is kept,
  one block's forward working set (logits and probabilities) lives at a time. Both count
  the two bool masks and the merged features [P / U, E] the text model reads."""
  p, d = patch_budget, vc.hidden_size
  heads = _split(vc.num_heads, tensor)
  tokens = (6 * d + 3 * _split(vc.intermediate_size, tensor)) * act_bytes  # per patch
  merged = p // vc.merge_unit
  fixed = 2 * p * p + merged * vc.out_hidden_size * act_bytes
  if trained:
    width = vc.merge_unit * d  # merger: its [U*D] input, and two [U*D] tensors split over tensor
    merger = merged * (width + 2 * _split(width, tensor)) * act_bytes
    per_prompt = vc.depth * (p * tokens + heads * p * p * 4) + merger + fixed
  else:
    per_prompt = p * tokens + 2 * heads * p * p * 4 + fixed
  return prompts * per_prompt


def vision_activations(vc: VisionConfig, work: Workload, rows_div: int, tensor: int) -> tuple:
  """(update, sampling) activation bytes of the vision tower per device: the update runs it on
  its slice's prompts, the sampler (frozen or not: no backward) on all of a device's."""
  u = vc.merge_unit
  if work.patch_budget <= 0 or work.patch_budget % u:
    raise ValueError(f"patch_budget={work.patch_budget} must be a positive multiple of "
                     f"spatial_merge_size ** 2 = {u}")
  if work.patch_budget // u > work.prompt_len:
    raise ValueError(f"patch_budget={work.patch_budget} gives {work.patch_budget // u} image "
                     f"tokens per prompt, more than prompt_len={work.prompt_len}")
  vdt = np.dtype(as_dtype(vc.dtype)).itemsize
  v_acts = vision_activation_bytes(vc, work.patch_budget, work.prompts // work.micro_batches
                                   // rows_div, tensor, vdt, work.train_vision)
  v_sample = vision_activation_bytes(vc, work.patch_budget, -(-work.prompts // rows_div),
                                     tensor, vdt, False)
  return v_acts, v_sample


def _text_and_vision(cfg, work: Workload):
  """(text ModelConfig, VisionConfig or None) of a ModelConfig or a VLConfig."""
  if isinstance(cfg, ModelConfig):
    return cfg, None
  if not isinstance(getattr(cfg, "vision", None), VisionConfig):
    raise TypeError(f"plan: cfg must be a ModelConfig or a VLConfig, got {type(cfg).__name__}")
  if work.prefix_shared:
    raise ValueError("prefix_shared: a vision-language policy's update runs per row (the "
                     "image prompts' tower features enter each row's prompt)")
  return cfg.text, cfg.vision


def _layer_activations(cfg, work: Workload, impl: str, rows_dev: int, micro_rows: int, rows_div: int,
                       tensor: int, attn_saved: int, act_bytes: int) -> tuple[float, int]:
  """(bytes one layer saves for the backward per device, tokens per device and slice) of the
  update: every row's prompt and completion (per row), or each group's prompt once and each
  row's completion (`work.prefix_shared`). attn_saved: what attention keeps per token of a
  per-row forward."""
  d, f = cfg.hidden_size, cfg.intermediate_size
  heads_dev, kv_heads_dev = _split(cfg.num_heads, tensor), _split(cfg.num_kv_heads, tensor)
  seq = work.prompt_len + work.new_tokens
  token_bytes = (6 * d + 3 * f / tensor) * act_bytes
  if work.prefix_shared:
    # The prefix-shared forward (`Transformer.shared_hidden`): each group's P prompt tokens run
    # once and attend to themselves (probabilities [heads, P] per token with the reference
    # core); each row's T completion tokens attend to [prompt | own] keys, through
    # `attention.attend_shared` (float32 probabilities over P + T keys kept, also under a flash
    # core) unless the core is 'xla' / 'cudnn', whose inputs are the prompt's K and V repeated
    # per row (kept for the backward). DPH's extra rows (flat, one per prompt) run per row.
    shared_rows = -(-rows_dev // work.micro_batches)
    groups = -(-work.prompts // (rows_div * work.micro_batches))  # prompts per device and slice
    extra = micro_rows - shared_rows
    p_len, t_len = work.prompt_len, work.new_tokens
    repeat = impl in ("xla", "cudnn")
    prompt_attn = heads_dev * p_len * 4 if impl == "reference" else heads_dev * 4
    completion_attn = heads_dev * 4 if repeat else heads_dev * seq * 4
    tokens = groups * p_len + shared_rows * t_len + extra * seq
    per_layer = (tokens * token_bytes + groups * p_len * prompt_attn
                 + shared_rows * t_len * completion_attn + extra * seq * attn_saved
                 + (shared_rows * p_len * 2 * kv_heads_dev * cfg.head_dim * act_bytes if repeat else 0))
  else:
    tokens = micro_rows * seq
    per_layer = tokens * (token_bytes + attn_saved)
  return per_layer, tokens


def plan(cfg, mesh_shape: dict, work: Workload, device_bytes: float | None = None) -> dict:
  """The per-device plan of `cfg` (a ModelConfig, or a qwen2_5_vl.VLConfig: text model and
  vision tower) on a mesh for an RL workload."""
  cfg, vc = _text_and_vision(cfg, work)
  ndev = math.prod(int(v) for v in mesh_shape.values())
  rows_div = int(mesh_shape.get("data", 1)) * int(mesh_shape.get("fsdp", 1))
  tensor = int(mesh_shape.get("tensor", 1))
  p_dev, p_total, n_params = param_bytes_per_device(cfg, mesh_shape)
  v_dev = v_total = n_vision = 0
  if vc is not None:
    v_dev, v_total, n_vision = param_bytes_per_device(vc, mesh_shape)
  lora = cfg.lora is not None
  v_grads = v_dev if vc is not None and work.train_vision and not lora else 0
  # What is trained: every text param (and a trained tower), or with LoRA the adapters alone
  # (the base, tower included, is frozen: no gradients, no AdamW state).
  t_dev, _, n_trained = (param_bytes_per_device(cfg, mesh_shape, adapters=True) if lora
                         else (p_dev, p_total, n_params))
  opt = 2 * (t_dev + v_grads)  # AdamW mu and nu, param dtype, sharded like the params; none
  #                              for a frozen tower (make_optimizer(freeze_vision=True))
  grads = t_dev + v_grads    # a frozen tower's gradients are stop_gradient zeros, never stored
  act_bytes = np.dtype(as_dtype(cfg.dtype)).itemsize
  rows = work.prompts * work.group  # sampled together
  rows_dev = -(-rows // rows_div)
  update_rows_dev = -(-(rows + work.extra_rows) // rows_div)
  seq = work.prompt_len + work.new_tokens
  d, L = cfg.hidden_size, cfg.num_layers
  heads_dev = _split(cfg.num_heads, tensor)
  # Saved per token per layer for the backward pass: residual, 2 norms, q/k/v/o (~6d),
  # the MLP's gate, up and activation (3f), and what attention keeps: the reference core
  # its float32 probabilities (heads x seq), a fused core (xla / cudnn / flash) only a
  # float32 log-sum-exp per head. (The 'xla' core on GPU builds the probabilities inside
  # the kernel call but frees them; counted as fused.)
  impl = attention.resolve(cfg.attention, as_dtype(cfg.dtype), work.backend)
  attn_saved = heads_dev * seq * 4 if impl == "reference" else heads_dev * 4
  if work.micro_batches > 1 and (work.prompts % work.micro_batches
                                 or (work.prompts // work.micro_batches) % rows_div):
    raise ValueError(f"micro_batches={work.micro_batches} must leave a whole number of prompts per "
                     f"data x fsdp device in each slice ({work.prompts} prompts, {rows_div} devices)")
  micro_rows = -(-update_rows_dev // work.micro_batches)  # rows whose activations live at once
  kv_heads_dev = _split(cfg.num_kv_heads, tensor)
  per_layer, tokens = _layer_activations(cfg, work, impl, rows_dev, micro_rows, rows_div, tensor,
                                         attn_saved, act_bytes)
  layers_saved = 1 if work.remat else L
  acts = per_layer * layers_saved + (tokens * d * act_bytes * L if work.remat else 0)
  v_acts, v_sample = (0, 0) if vc is None else vision_activations(vc, work, rows_div, tensor)
  acts += v_acts
  # float32 logits: all T completion tokens on CPU; on an accelerator the update makes them in
  # chunks of `steps.auto_chunk(T)` tokens (a chunk and its gradient live at once).
  logit_tokens = work.new_tokens if work.backend == "cpu" else 2 * _auto_chunk(work.new_tokens)
  logits = micro_rows * logit_tokens * _split(cfg.vocab_size, tensor) * 4
  kv = rows_dev * seq * L * 2 * kv_heads_dev * cfg.head_dim * act_bytes
  all_p = p_dev + v_dev
  # The reference policy: frozen params, no optimizer state; with LoRA the base with the
  # adapters off (models/lora.py): no copy.
  ref = all_p if work.reference and not lora else 0
  train_total = all_p + ref + opt + grads + acts + logits
  sample_total = all_p + ref + opt + kv + rows_dev * cfg.vocab_size * 4 + v_sample  # tower: counted
  #                                                        as if it overlapped the KV cache
  out = {"devices": ndev, "mesh": dict(mesh_shape), "params": n_params + n_vision,
         "trainable_params": n_trained + (n_vision if v_grads else 0), "lora": cfg.lora,
         "param_bytes_total": p_total + v_total,
         "param_bytes": all_p, "reference_bytes": ref, "optimizer_bytes": opt, "grad_bytes": grads,
         "activation_bytes": acts, "sampling_logit_bytes": rows_dev * cfg.vocab_size * 4,
         "attention": impl, "logit_bytes": logits, "kv_cache_bytes": kv, "update_peak_bytes": train_total,
         "sampling_peak_bytes": sample_total, "rows_per_device": rows_dev, "micro_rows": micro_rows,
         "reference": work.reference, "prefix_shared": work.prefix_shared,
         "activation_note": "activations, logits and KV cache are shape estimates; params and "
                            "optimizer state are exact"}
  if vc is not None:
    out.update(vision_params=n_vision, vision_param_bytes=v_dev, vision_optimizer_bytes=2 * v_grads,
               vision_grad_bytes=v_grads, vision_activation_bytes=v_acts,
               vision_sampling_bytes=v_sample, patch_budget=work.patch_budget,
               train_vision=work.train_vision)
  if device_bytes is not None:
    out["device_bytes"] = device_bytes
    out["fits"] = max(train_total, sample_total) <= device_bytes
  return out


def format_plan(name: str, p: dict) -> str:
  g = lambda b: f"{b / GIB:8.2f} GiB"
  lora = p.get("lora")
  trained = (f"LoRA rank {lora.rank} on {', '.join(lora.targets)}: {p['trainable_params'] / 1e6:.1f} "
             "M trainable, the base frozen" if lora else f"{p['trainable_params'] / 1e9:.3f} B trainable")
  lines = [f"{name}: {p['params'] / 1e9:.3f} B params ({trained}) on {p['devices']} device(s), "
           f"mesh {p['mesh']}, {p['rows_per_device']} rows per device ({p['micro_rows']} per update "
           "slice)",
           f"  params        {g(p['param_bytes'])}   (total {p['param_bytes_total'] / GIB:.2f} GiB)",
           *([f"  reference     {g(p['reference_bytes'])}   (a frozen copy of the params)"]
             if p.get("reference_bytes") else []),
           *([f"  reference     {g(0)}   (the base with the adapters off: no copy)"]
             if lora and p.get("reference") else []),
           f"  optimizer     {g(p['optimizer_bytes'])}   (AdamW mu + nu"
           f"{' of the adapters' if lora else ''})",
           f"  gradients     {g(p['grad_bytes'])}",
           f"  activations   {g(p['activation_bytes'])}   (estimate; attention core {p['attention']!r}; "
           + ("each group's prompt once" if p.get("prefix_shared") else "prompt + completion per row")
           + ")",
           f"  logits f32    {g(p['logit_bytes'])}   (estimate)",
           f"  KV cache      {g(p['kv_cache_bytes'])}   (estimate)",
           f"  update peak   {g(p['update_peak_bytes'])}",
           f"  sampling peak {g(p['sampling_peak_bytes'])}"]
  if "vision_params" in p:
    state = "trained" if p["train_vision"] else "frozen: no gradients, no AdamW state"
    lines[1:1] = [
        f"  vision tower  {p['vision_params'] / 1e6:.1f} M params ({state}), "
        f"{p['patch_budget']} patches per prompt; included above:",
        f"    params {g(p['vision_param_bytes']).strip()}, optimizer "
        f"{g(p['vision_optimizer_bytes']).strip()}, gradients {g(p['vision_grad_bytes']).strip()}, "
        f"activations {g(p['vision_activation_bytes']).strip()} (update), "
        f"{g(p['vision_sampling_bytes']).strip()} (sampling)"]
  if "fits" in p:
    lines.append(f"  device        {g(p['device_bytes'])}   -> {'fits' if p['fits'] else 'DOES NOT FIT'}")
  return "\n".join(lines)


def with_lora(cfg, rank: int, targets: str, error):
  """`cfg` (a ModelConfig or VLConfig) with LoRA adapters of `rank` (alpha = 2 x rank) on the
  comma-separated `targets`; a bad value is error(message) naming the flag."""
  try:
    lcfg = LoRAConfig(rank=rank, alpha=2.0 * rank, targets=tuple(filter(None, targets.split(","))))
  except ValueError as e:
    error(f"--lora_rank/--lora_targets: {e}")
  if isinstance(cfg, ModelConfig):
    return cfg.replace(lora=lcfg)
  return dataclasses.replace(cfg, text=cfg.text.replace(lora=lcfg))


def _parse_mesh(text: str) -> dict:
  out = {}
  for part in filter(None, text.split(",")):
    k, _, v = part.partition("=")
    if k not in sharding.AXES:
      raise ValueError(f"--mesh: unknown axis {k!r}; axes are {sharding.AXES}")
    out[k] = int(v)
  return out


def arg_parser():
  import argparse
  ap = argparse.ArgumentParser(description="Per-device memory plan for a model, mesh and RL workload.")
  ap.add_argument("--model", choices=sorted(MODELS) + sorted(VL_MODELS), help="a published model shape")
  ap.add_argument("--config", help="a training config file[:arg] (its model folder's config.json)")
  ap.add_argument("--mesh", default="data=1,fsdp=8,tensor=1")
  ap.add_argument("--device_gib", type=float, default=141.0, help="memory per device (H200: 141)")
  ap.add_argument("--prompts", type=int, default=32)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--prompt_len", type=int, default=2048)
  ap.add_argument("--new_tokens", type=int, default=1024)
  ap.add_argument("--dtype", default="bfloat16")
  ap.add_argument("--remat", action="store_true")
  ap.add_argument("--micro_batches", type=int, default=1)
  ap.add_argument("--backend", default="gpu", choices=("cpu", "gpu", "tpu"),
                  help="where the update runs: picks the attention core ('auto') and log-prob chunks")
  ap.add_argument("--attention", default="auto", choices=ATTENTION)
  ap.add_argument("--patch_budget", type=int, default=None,
                  help="vision-language models: image patches per prompt, before the 2 x 2 merge "
                       "(default: the config's image.patch_budget, else 1024)")
  ap.add_argument("--lora_rank", type=int, default=None,
                  help="plan LoRA fine-tuning: adapters of this rank on --lora_targets, the base "
                       "frozen (docs/TRAINING.md 'LoRA')")
  ap.add_argument("--lora_targets", default=",".join(LORA_TARGETS),
                  help="with --lora_rank: the projections adapted, comma-separated")
  ap.add_argument("--param_dtype", default=None, choices=("float32", "bfloat16", "float16"),
                  help="the stored weights' dtype (default: float32; with --lora_rank the frozen "
                       "base's, bfloat16)")
  ap.add_argument("--reference", action="store_true",
                  help="a reference policy is held (KL presets): a copy of the params, or with "
                       "LoRA the base with the adapters off (no copy)")
  ap.add_argument("--prefix_shared", default=None, choices=PREFIX_SHARED,
                  help="the update's log-prob forward, as config.rl.prefix_shared: 'auto' (the "
                       "default; a config's own with --config) runs each group's prompt once "
                       "where the trainer does (text prompts, groups of 2 or more), 'off' every "
                       "row's prompt + completion, 'on' shared or an error")
  ap.add_argument("--train_vision", action="store_true", default=None,
                  help="vision-language models: the vision tower is trained (default: frozen, "
                       "as rl.freeze_vision)")
  return ap


PREFIX_SHARED = tuple(prefix.PREFIX_SHARED)  # config.rl.prefix_shared's values


def with_update_forward(work: Workload, setting: str, images: bool,
                        field: str = "config.rl.prefix_shared") -> Workload:
  """work with `prefix_shared` as the trainer decides it for config.rl.prefix_shared = setting
  on the update's batch [prompts, G, P+T] (models/prefix.py `update_forward`, the trainer's and
  the config check's rule); images: the policy is a vision-language model. A ValueError naming
  `field` where the setting is unknown or "on" cannot apply."""
  path = prefix.update_forward(setting, work.prompts, work.group, work.prompt_len, work.new_tokens,
                               images, field)
  return dataclasses.replace(work, prefix_shared=path[0] == "prefix_shared")


def planned_dtype(dtype: str, backend: str) -> str:
  """A config's model.dtype for a plan on `backend`: "auto" resolved (models/precision.py) on
  this machine's devices when they are that backend; for another backend, from its platform
  alone (a GPU of unknown compute capability: float32, the larger plan)."""
  if dtype != precision.AUTO:
    return dtype
  here = jax.default_backend() == backend
  return precision.resolve(dtype, precision.local_backend() if here else precision.Backend(backend)).dtype


def from_config_file(spec: str, backend: str, mesh: dict):
  """(model config, mesh, workload, name) of a training config file[:arg] whose model.init is
  a Hugging Face folder (its config.json), with the config's LoRA, mesh and RL shapes and the
  update's forward (rl.prefix_shared)."""
  import importlib.util, json, os
  path, _, arg = spec.partition(":")
  spec_ = importlib.util.spec_from_file_location("cfgmod", path)
  mod = importlib.util.module_from_spec(spec_)
  spec_.loader.exec_module(mod)
  c = mod.get_config(arg or None)
  from dmpo_jax.models import build, hf, qwen2_5_vl
  with open(os.path.join(c.model.init, "config.json")) as fh:
    hf_cfg = json.load(fh)
  vl = hf_cfg.get("model_type") == qwen2_5_vl.MODEL_TYPE
  cfg = (qwen2_5_vl if vl else hf).config_from_hf(hf_cfg, dtype=planned_dtype(c.model.dtype, backend),
                                                  param_dtype=c.model.param_dtype)
  lcfg = build.lora_config(c.model.get("lora"))  # config.model.lora
  if lcfg is not None:
    cfg = dataclasses.replace(cfg, text=cfg.text.replace(lora=lcfg)) if vl else cfg.replace(lora=lcfg)
  mesh = {k: v for k, v in dict(c.mesh).items() if v != -1} or mesh
  image = dict(c.get("image") or {})
  work = Workload(c.rl.prompts_per_step, c.rl.group_size, c.model.max_prompt_len,
                  c.model.max_new_tokens, c.model.remat, c.rl.micro_batches or 1,  # 0: auto, 1 off CPU
                  backend, image.get("patch_budget") or Workload.patch_budget,
                  not c.rl.get("freeze_vision", True))
  work = with_update_forward(work, c.rl.get("prefix_shared", "auto"), vl)
  return cfg, mesh, work, c.model.init


def main(argv=None):
  ap = arg_parser()
  args = ap.parse_args(argv)
  mesh = _parse_mesh(args.mesh)
  work = Workload(args.prompts, args.group, args.prompt_len, args.new_tokens, args.remat,
                  args.micro_batches, args.backend, reference=args.reference)
  param_dtype = args.param_dtype or ("bfloat16" if args.lora_rank else "float32")
  if args.config:
    cfg, mesh, work, name = from_config_file(args.config, args.backend, mesh)
  elif args.model in VL_MODELS:
    cfg = vl_config(args.model, dtype=args.dtype, param_dtype=param_dtype)
    name = args.model
  elif args.model:
    cfg = ModelConfig(**MODELS[args.model], dtype=args.dtype, param_dtype=param_dtype)
    name = args.model
  else:
    ap.error("give --model or --config")
  is_vl = not isinstance(cfg, ModelConfig)
  if args.lora_rank is not None:
    cfg = with_lora(cfg, args.lora_rank, args.lora_targets, ap.error)
  for flag, value in (("--patch_budget", args.patch_budget), ("--train_vision", args.train_vision)):
    if value is not None and not is_vl:
      ap.error(f"{flag} applies to vision-language models only; {name} is a text model")
  if args.prefix_shared is not None or not args.config:  # a config file's own: from_config_file
    try:
      work = with_update_forward(work, args.prefix_shared or "auto", is_vl, "--prefix_shared")
    except ValueError as e:
      ap.error(str(e))
  if args.patch_budget is not None:
    work = dataclasses.replace(work, patch_budget=args.patch_budget)
  if args.train_vision:
    work = dataclasses.replace(work, train_vision=True)
  if args.attention != "auto":
    cfg = (cfg.replace(attention=args.attention) if not is_vl else
           dataclasses.replace(cfg, text=cfg.text.replace(attention=args.attention)))
  try:
    p = plan(cfg, mesh, work, args.device_gib * GIB)
  except ValueError as e:  # a workload the model cannot take (patch budget): name it, no trace
    ap.error(str(e))
  print(format_plan(name, p))
  if not p["fits"]:
    need = max(p["update_peak_bytes"], p["sampling_peak_bytes"]) / GIB
    print(f"error: the plan needs {need:.1f} GiB per device but a device has {args.device_gib:.1f} GiB; "
          "use more fsdp devices, --remat, more --micro_batches, fewer prompts or shorter sequences", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  main()
