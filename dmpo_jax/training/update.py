"""The update: optimizers, micro-batching, and one step on a batch (SFT or RL).

The jitted step functions themselves are `dmpo_jax.training.steps` (`make_rl_step`,
`make_sft_step`): pure functions of (params, opt_state, batch) with explicit
shardings and donation. `update` runs one and advances the train state.
"""

from __future__ import annotations

import dataclasses

import jax
import optax

from dmpo_jax.parallel import distributed as dist
from dmpo_jax.parallel import sharding
from dmpo_jax.objectives import presets
from dmpo_jax.training.state import TrainState


def is_vision_param(path) -> bool:
  """Whether a params leaf (its path from tree_flatten_with_path) is in the vision tower
  (params["model"].visual of a vision-language policy)."""
  return len(path) > 1 and getattr(path[0], "key", None) == "model" and \
      getattr(path[1], "key", None) == "visual"


def make_optimizer(lr: float, steps_total: int, warmup: int, max_grad_norm: float, *,
                   freeze_vision: bool = False, vision_lr_scale: float = 1.0):
  """AdamW after global-norm clipping; the learning rate warms up linearly from 0 over
  `warmup` steps (the first step's rate is 0), then decays along a cosine to lr / 10 at
  `steps_total`. warmup=0: no warmup, the first step runs at lr (RL's setting).

  freeze_vision: the vision tower's params get a zero update and no optimizer state (no
  AdamW moments: 2 x the tower's f32 size saved, 5.4 GB for Qwen2.5-VL-7B's 677M-param
  tower); the clipping norm is over the trained params. A no-op for a text model.
  vision_lr_scale: a trained tower's learning rate is this times the rest's (one clipping
  norm over all params)."""
  if vision_lr_scale <= 0:
    raise ValueError(f"vision_lr_scale={vision_lr_scale} must be > 0 (freeze the tower "
                     "with freeze_vision instead)")
  if warmup <= 0:
    sched = optax.cosine_decay_schedule(lr, max(steps_total, 1), alpha=0.1)
  else:
    warmup = min(warmup, max(steps_total, 1))
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps_total, warmup + 1),
                                               lr * 0.1)
  clip = optax.clip_by_global_norm(max_grad_norm)
  opt = optax.chain(clip, optax.adamw(sched, weight_decay=0.0))

  def labels(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "vision" if is_vision_param(path) else "trained", params)
  if freeze_vision:
    return optax.multi_transform({"trained": opt, "vision": optax.set_to_zero()}, labels)
  if vision_lr_scale != 1.0:
    slow = optax.adamw(lambda count: vision_lr_scale * sched(count), weight_decay=0.0)
    return optax.chain(clip, optax.multi_transform(
        {"trained": optax.adamw(sched, weight_decay=0.0), "vision": slow}, labels))
  return opt


def micro_batches(cfg, obj: presets.ObjectiveConfig, mesh) -> int:
  """config.rl.micro_batches, with 0 (auto) resolved by `auto_micro_batches`."""
  return cfg.rl.micro_batches or auto_micro_batches(obj, cfg.rl.prompts_per_step,
                                                    sharding.batch_rows(mesh))


def auto_micro_batches(obj: presets.ObjectiveConfig, prompts: int, rows: int = 1) -> int:
  """On a CPU, one slice per prompt group (as many as `rows` batch devices allow) when the
  objective is a mean over sequences and groups, so that slicing changes nothing but
  summation order; 1 otherwise (and on GPU/TPU). Slices of one group keep the update's
  matmuls cache-sized: about 1.4x faster on the 2-core CPU."""
  if jax.default_backend() != "cpu" or not presets.slice_exact(obj):
    return 1
  return max(m for m in range(1, prompts + 1) if prompts % m == 0 and (prompts // m) % rows == 0)


def update(state: TrainState, batch: dict, step_fn) -> tuple[TrainState, dict]:
  """One optimizer step: step_fn(params, opt_state, batch) -> (params, opt_state, metrics),
  a `steps.make_*_step`. Returns the next state and the metrics on the host; a skipped
  (non-finite) step leaves params and optimizer state as they were and is counted."""
  params, opt_state, metrics = step_fn(state.params, state.opt_state, batch)
  metrics = dist.tree_to_host(metrics)
  state.counters["nonfinite_total"] += int(metrics["skipped"])
  return dataclasses.replace(state, params=params, opt_state=opt_state, step=state.step + 1), metrics
