"""One training step: log-probs of completions, the jitted SFT and RL steps, optimizers,
micro-batching, and `update`, which runs a step and advances the train state.

Trainable params are a dict ``{"model": nnx.State[, "log_z": head]}`` (the
FlowRL log Z head only for ``policy_loss="flowrl"``). Every step is a pure
function of (params, opt_state, batch) jitted with explicit shardings and
donated buffers; a non-finite loss or gradient leaves params and optimizer
state untouched and reports ``skipped = 1``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dmpo_jax.models import lora as lora_lib
from dmpo_jax.models import positions, qwen2_5_vl
from dmpo_jax.models.prefix import PREFIX_SHARED, forward_path  # noqa: F401 (re-exported)
from dmpo_jax.models.transformer import dense
from dmpo_jax.objectives import common, flowrl, presets
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training.state import TrainState

TRACES: collections.Counter = collections.Counter()  # compilations per step function
# Traces of `make_logprob_fn`s by `forward_path`: (forward, reason, G), forward "prefix_shared"
# or "per_row".
PATHS: collections.Counter = collections.Counter()


def is_vision_param(path) -> bool:
  """Whether a params leaf (its path from tree_flatten_with_path) is in the vision tower
  (params["model"].visual of a vision-language policy)."""
  return len(path) > 1 and getattr(path[0], "key", None) == "model" and \
      getattr(path[1], "key", None) == "visual"


def frozen_filter(params, freeze_vision: bool = False):
  """The trainable-parameter filter of a params tree: path -> True for a leaf that is frozen
  (no gradient, no update, no optimizer state), or None when every leaf is trained. A LoRA
  model (params["model"] holds adapters, `models.lora`) trains its adapters and the FlowRL log
  Z head only: its base, vision tower included, is frozen. Otherwise freeze_vision freezes a
  vision-language policy's tower."""
  if lora_lib.has_adapters(params):
    return lora_lib.is_base_path
  return is_vision_param if freeze_vision else None


def trained_leaves(tree, frozen) -> list:
  """The leaves of a params-shaped tree (params, gradients) that `frozen` does not freeze."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [x for path, x in flat if frozen is None or not frozen(path)]


def make_schedule(lr: float, steps_total: int, warmup: int):
  """Linear warmup from 0 over `warmup` steps (none: start at lr), then a cosine to lr / 10 at
  `steps_total`."""
  if warmup <= 0:
    return optax.cosine_decay_schedule(lr, max(steps_total, 1), alpha=0.1)
  warmup = min(warmup, max(steps_total, 1))
  return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps_total, warmup + 1), lr * 0.1)


def make_optimizer(lr: float, steps_total: int, warmup: int, max_grad_norm: float, *,
                   freeze_vision: bool = False, vision_lr_scale: float = 1.0, lead=None,
                   lora: bool = False):
  """AdamW after global-norm clipping; the learning rate warms up linearly from 0 over
  `warmup` steps (the first step's rate is 0), then decays along a cosine to lr / 10 at
  `steps_total`. warmup=0: no warmup, the first step runs at lr (RL's setting).

  freeze_vision: the vision tower's params get a zero update and no optimizer state (no
  AdamW moments: 2 x the tower's f32 size saved, 5.4 GB for Qwen2.5-VL-7B's 677M-param
  tower); the clipping norm is over the trained params. A no-op for a text model.
  lead: (steps, lr, warmup) of a stage that opens the schedule (the perception stage): its
  own rate, warmed up over `warmup` steps and then constant, for the first `steps` steps;
  the warmup-cosine schedule above then runs over the remaining steps_total - steps.
  vision_lr_scale: a trained tower's learning rate is this times the rest's (one clipping
  norm over all params).
  lora: the params are a LoRA model's (`frozen_filter`): only the adapters (and a FlowRL log Z
  head) are trained, clipped and given AdamW state; the frozen base gets a zero update and no
  state (the tower options do not apply: the tower is part of the frozen base)."""
  if vision_lr_scale <= 0:
    raise ValueError(f"vision_lr_scale={vision_lr_scale} must be > 0 (freeze the tower "
                     "with freeze_vision instead)")
  sched = make_schedule(lr, steps_total, warmup)
  if lead is not None and lead[0] > 0:
    n, lead_lr, lead_warmup = lead
    first = (optax.linear_schedule(0.0, lead_lr, lead_warmup) if lead_warmup > 0
             else optax.constant_schedule(lead_lr))
    rest = make_schedule(lr, steps_total - n, warmup)
    sched = optax.join_schedules([first, rest], [n])
  clip = optax.clip_by_global_norm(max_grad_norm)
  opt = optax.chain(clip, optax.adamw(sched, weight_decay=0.0))

  def labels(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "vision" if is_vision_param(path) else "trained", params)
  if lora:
    return optax.multi_transform({"trained": opt, "frozen": optax.set_to_zero()}, lora_labels)
  if freeze_vision:
    return optax.multi_transform({"trained": opt, "vision": optax.set_to_zero()}, labels)
  if vision_lr_scale != 1.0:
    slow = optax.adamw(lambda count: vision_lr_scale * sched(count), weight_decay=0.0)
    return optax.chain(clip, optax.multi_transform(
        {"trained": optax.adamw(sched, weight_decay=0.0), "vision": slow}, labels))
  return opt


def lora_labels(params):
  """make_optimizer(lora=True)'s partition: "trained" (adapters, log Z head) or "frozen"."""
  frozen = frozen_filter(params) if isinstance(params, dict) and "model" in params else None
  if frozen is None:
    raise ValueError("make_optimizer(lora=True): the params ({'model': ...}) hold no adapters "
                     "(config.model.lora is not set on this model)")
  return jax.tree_util.tree_map_with_path(
      lambda path, _: "frozen" if frozen(path) else "trained", params)


def auto_micro_batches(obj: presets.ObjectiveConfig, prompts: int, rows: int = 1) -> int:
  """On a CPU, one slice per prompt group (as many as `rows` batch devices allow) when the
  objective is a mean over sequences and groups, so that slicing changes nothing but
  summation order; 1 otherwise (and on GPU/TPU). Slices of one group keep the update's
  matmuls cache-sized: about 1.4x faster on the 2-core CPU."""
  if jax.default_backend() != "cpu" or not presets.needs(obj).slice_exact:
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


def sequence_inputs(prompt_mask, completion_len: int):
  """Positions [B, P+T] and pad offsets [B] of prompt + completion rows, as the sampler
  decodes them (`dmpo_jax.models.positions.sequence_layout`: left-padded prompts,
  prompt_mask [B, P]; every completion slot a valid key; positions count each row's
  own tokens). The model builds causal + padding attention from the offsets."""
  return positions.sequence_layout(prompt_mask, completion_len)


def make_logprob_fn(graphdef, prompt_len: int, *, temperature: float = 1.0,
                    entropy: bool = True, chunk: int | None = None,
                    freeze_vision: bool = True, prefix_shared: bool | None = None,
                    group_size: int | None = None) -> Callable:
  """logprob_fn(params, seqs, group_size=None) -> {"logprobs", "entropy"[, "log_z"]}, shapes [..., T].

  seqs: {"tokens": [..., P+T] (prompt then completion), "prompt_mask": [..., P]}, and for a
  `Qwen2_5_VL` with image prompts "images": `qwen2_5_vl.prompt_images`' arrays, one per
  prompt (leading axis Bp; the rows, flattened, are Bp groups of adjacent samples).
  freeze_vision: the image features get no gradient (the tower is not trained).
  chunk: completion tokens per output-projection chunk; each chunk's float32
  logits [B, chunk, V] are made, reduced to log-probs (and entropy) and
  recomputed in the backward pass, so the full [B, T, V] never exists. None:
  whole T on CPU, `auto_chunk(T)` on an accelerator.

  prefix_shared: run each group's prompt once (`Transformer.shared_hidden`): its G completions
  read the prompt's keys and values, and the prompt's gradient is the sum over its group.
  The groups are the rows of seqs [..., G, P+T] (the rollouts' [prompts, G, .] layout), or of
  flat seqs [B, P+T] groups of `group_size` adjacent rows ([prompt0 x G, prompt1 x G, ...]);
  the call's group_size overrides the one given here. The same log-probs as the per-row
  forward up to float32 rounding; a row whose prompt is not its group's first row's gets NaN
  log-probs (a layout error must not train silently; `layout_errors` counts such rows).
  None (the default): prefix-shared wherever it applies, per-row otherwise (image prompts,
  flat seqs without a group size, groups of one, one-token completions); False: the per-row
  forward; True: prefix-shared or a ValueError. `forward_path` says which forward a call runs
  and why; each trace counts it in `fn.paths` and `PATHS`.
  """
  if prefix_shared not in (None, True, False):
    raise ValueError(f"prefix_shared must be None, True or False, got {prefix_shared!r}")
  paths = collections.Counter()

  def fn(params, seqs, group_size=group_size):
    tokens, pmask = seqs["tokens"], seqs["prompt_mask"]
    lead, n = tokens.shape[:-1], tokens.shape[-1]
    t = n - prompt_len
    tok = tokens.reshape(-1, n)
    pm = pmask.reshape(-1, prompt_len)
    model = nnx.merge(graphdef, lora_lib.freeze_base(params["model"]))  # LoRA: no base gradient
    vl = isinstance(model, qwen2_5_vl.Qwen2_5_VL)
    lm = model.language if vl else model
    path = forward_path(prefix_shared, seqs, prompt_len, group_size)
    paths[path] += 1
    PATHS[path] += 1
    c = chunk if chunk is not None else (t if jax.default_backend() == "cpu" else auto_chunk(t))
    if path[0] == "prefix_shared":
      g = path[2]
      lp, ent, h_prompt, same = _shared_logprobs(lm, tok, pm, g, prompt_len, temperature,
                                                 min(c, t), entropy)
      lp, ent = (jnp.where(same[:, None], x, jnp.nan) for x in (lp, ent))
    else:
      if seqs.get("images") is not None:
        h = _image_hidden(model, tok, pm, seqs["images"], t, freeze_vision)
      else:
        pos, offsets = sequence_inputs(pm, t)
        h, _ = lm.hidden(tok[:, :-1], pos[:, :-1], offsets=offsets)  # [B, P+T-1, D]
      lp, ent = _completion_logprobs(lm.unembed_weight(), h[:, prompt_len - 1:],
                                     tok[:, prompt_len:], temperature, min(c, t), entropy)
      h_prompt, g = h[:, :prompt_len], 1
    out = {"logprobs": lp.reshape(lead + (t,))}
    if entropy:
      out["entropy"] = ent.reshape(lead + (t,))
    if "log_z" in params:
      lz = flowrl.log_z_head(params["log_z"], h_prompt, pm[::g])  # [B / g]
      out["log_z"] = jnp.repeat(lz, g).reshape(lead)[..., 0]  # one log Z per prompt: first sample's
    return out

  fn.paths = paths
  return fn


def layout_errors(prefix_shared, seqs, prompt_len: int, group_size=None):
  """The number of rows (int32 scalar) to which the prefix-shared forward gives NaN log-probs:
  rows whose real prompt tokens or prompt mask differ from their group's first row's. 0 where
  `forward_path` is the per-row forward."""
  path = forward_path(prefix_shared, seqs, prompt_len, group_size)
  if path[0] != "prefix_shared":
    return jnp.zeros((), jnp.int32)
  n = seqs["tokens"].shape[-1]
  same = _same_prompt(seqs["tokens"].reshape(-1, n), seqs["prompt_mask"].reshape(-1, prompt_len),
                      path[2], prompt_len)
  return jnp.sum(~same).astype(jnp.int32)


def _same_prompt(tok, pm, g: int, prompt_len: int):
  """[B] whether each row of tok [B, P+T] (groups of g adjacent rows) has its group's first
  row's prompt: the same prompt mask and the same ids in its real (unpadded) slots."""
  b, n = tok.shape
  grouped = tok.reshape(b // g, g, n)
  pmask = pm.reshape(b // g, g, prompt_len)
  real = pmask[:, :1] != 0  # [B/g, 1, P]: pad slots' ids do not matter
  return (jnp.all(pmask == pmask[:, :1], -1)
          & jnp.all((grouped[..., :prompt_len] == grouped[:, :1, :prompt_len]) | ~real, -1)
          ).reshape(b)


def _shared_logprobs(lm, tok, pm, g: int, prompt_len: int, temperature: float, chunk: int,
                     entropy: bool):
  """`make_logprob_fn`'s prefix-shared forward of rows tok [B, P+T] in groups of g adjacent
  rows: (log-probs [B, T], entropies [B, T], the prompts' hidden states [B/g, P, D], [B]
  whether each row's prompt is its group's first row's)."""
  b, n = tok.shape
  grouped = tok.reshape(b // g, g, n)
  prompts, pmask = grouped[:, 0, :prompt_len], pm.reshape(b // g, g, prompt_len)
  same = _same_prompt(tok, pm, g, prompt_len)
  hp, hc = lm.shared_hidden(prompts, tok[:, prompt_len:-1],
                            offsets=positions.left_pad_offsets(pmask[:, 0]))
  first = jnp.broadcast_to(hp[:, None, -1:], (b // g, g, 1, hp.shape[-1])).reshape(b, 1, -1)
  h = jnp.concatenate([first, hc], axis=1)  # [B, T, D]: slot P - 1 predicts the first token
  lp, ent = _completion_logprobs(lm.unembed_weight(), h, tok[:, prompt_len:], temperature,
                                 chunk, entropy)
  return lp, ent, hp, same


def _image_hidden(model, tok, pm, images, completion_len: int, freeze_vision: bool):
  """Hidden states [B, P+T-1, D] of rows tok [B, P+T] (Bp prompts' groups of R = B / Bp
  adjacent rows) with the prompts' image features: the tower runs once per prompt, as in
  the sampler, and the positions are the sampler's (`qwen2_5_vl.sequence_positions`)."""
  bp = images["deltas"].shape[0]
  b, n = tok.shape
  if b % bp:
    raise ValueError(f"{b} rows are not groups of the images' {bp} prompts")
  feats = qwen2_5_vl.image_features(model, images["pixel_values"], images["layout"])
  if freeze_vision:
    feats = jax.lax.stop_gradient(feats)
  embeds = qwen2_5_vl.embed_rows(model, tok.reshape(bp, b // bp, n)[..., :-1], feats,
                                 pm.shape[-1])
  offsets = positions.left_pad_offsets(pm)  # [B]
  pos = qwen2_5_vl.sequence_positions(images["positions"], images["deltas"],
                                      offsets.reshape(bp, -1)[:, 0], completion_len, b // bp)
  h, _ = model.language.hidden(tok[:, :-1], pos[..., :-1], offsets=offsets,
                               embeds=embeds.reshape(b, n - 1, -1))
  return h


def auto_chunk(t: int, target: int = 128) -> int:
  """The largest divisor of T that is <= target: the log-prob chunk on accelerators."""
  return max(c for c in range(1, min(t, target) + 1) if t % c == 0)


def _completion_logprobs(w, h, tokens, temperature: float, chunk: int, entropy: bool):
  """Hidden h [B, T, D] (compute dtype), projection w [D, V], tokens [B, T] -> float32 token
  log-probs and entropies [B, T], over T in chunks (one chunk's float32 logits at a time)."""

  def piece(hc, tc):
    logits = dense(hc, w.astype(hc.dtype), preferred_element_type=jnp.float32)  # [B, c, V]
    lp = common.token_logprobs(logits, tc, temperature=temperature)
    ent = (common.token_entropy(jax.lax.stop_gradient(logits), temperature=temperature)
           if entropy else jnp.zeros_like(lp))
    return lp, ent

  b, t, d = h.shape
  if chunk >= t:
    return piece(h, tokens)
  if t % chunk:
    raise ValueError(f"chunk ({chunk}) must divide the completion length T ({t})")
  hs = h.reshape(b, t // chunk, chunk, d).transpose(1, 0, 2, 3)  # [T/c, B, c, D]
  ts = tokens.reshape(b, t // chunk, chunk).transpose(1, 0, 2)
  lp, ent = jax.lax.map(lambda a: jax.checkpoint(piece)(*a), (hs, ts))  # [T/c, B, c]
  return (lp.transpose(1, 0, 2).reshape(b, t), ent.transpose(1, 0, 2).reshape(b, t))


def _all_finite(tree):
  return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _guarded_update(opt, loss, grads, params, opt_state, freeze_vision: bool = False):
  """Apply the update only if the loss, the gradients and the new params are all finite.
  Frozen params (`frozen_filter`: freeze_vision's tower, a LoRA model's base) stay exactly as
  they were (whatever the optimizer's weight decay), their gradients zero.
  -> (params, opt_state, skipped int32, gradient norm; 0 when skipped for the gradients).

  The two checks choose whole trees with lax.cond, not per leaf with jnp.where: XLA turned the
  flag (an `and` over every leaf's check) into a chain of scalar ands and copied it into each
  leaf's select fusion, which took 88 s of compilation for SmolLM2-135M's 273 leaves
  (12 s as conds, the same outputs bit for bit; docs/PERFORMANCE.md)."""
  frozen = frozen_filter(params, freeze_vision)
  if frozen is not None:
    grads = jax.tree_util.tree_map_with_path(
        lambda path, g: jnp.zeros_like(g) if frozen(path) else g, grads)
  finite = jnp.isfinite(loss) & _all_finite(grads)
  no_norm = jnp.zeros((), jax.eval_shape(optax.global_norm, grads).dtype)

  def apply(params, opt_state, grads):
    updates, new_state = opt.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    if frozen is not None:
      new_params = jax.tree_util.tree_map_with_path(
          lambda path, new, old: old if frozen(path) else new, new_params, params)
    ok = _all_finite(trained_leaves(new_params, frozen))
    new_params, new_state, skipped = jax.lax.cond(
        ok, lambda: (new_params, new_state, jnp.int32(0)), lambda: (params, opt_state, jnp.int32(1)))
    return new_params, new_state, skipped, optax.global_norm(grads)

  def keep(params, opt_state, grads):
    return params, opt_state, jnp.int32(1), no_norm

  return jax.lax.cond(finite, apply, keep, params, opt_state, grads)


def accumulate(value_and_grad, params, batch, micro_batches: int, frozen=None):
  """Mean of (loss, metrics, grads) over `micro_batches` equal slices of every batch leaf's
  leading axis, one slice at a time (lax.scan): activations of one slice live at once.
  Exact for losses that are means over groups; a global token mean becomes a mean of slices'.
  frozen (`frozen_filter`'s predicate): the frozen leaves' gradients, zero (a LoRA model's base
  is under stop_gradient, a frozen tower's features are detached), ride through the slices as
  scalar zeros, not as a gradient-sized buffer, and come back as zeros of their shape. grads:
  a params-shaped tree, or a tuple of them (`term_gradients`)."""
  if micro_batches == 1:
    return value_and_grad(params, batch)
  vg = value_and_grad if frozen is None else _slim_grads(value_and_grad, frozen)
  split = jax.tree.map(lambda x: x.reshape((micro_batches, x.shape[0] // micro_batches) + x.shape[1:]),
                       batch)
  first = jax.tree.map(lambda x: x[0], split)
  zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(vg, params, first))

  def body(acc, piece):
    out = vg(params, piece)
    return jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc, out), None

  total, _ = jax.lax.scan(body, zeros, split)
  mean = jax.tree.map(lambda x: x / micro_batches, total)
  if frozen is None:
    return mean
  aux, grads = mean
  full = lambda g: jax.tree_util.tree_map_with_path(
      lambda path, x, p: jnp.zeros(p.shape, x.dtype) if frozen(path) else x, g, params)
  return aux, (tuple(map(full, grads)) if isinstance(grads, tuple) else full(grads))


def _slim_grads(value_and_grad, frozen):
  """value_and_grad with every frozen leaf of its gradient tree(s) a scalar zero."""
  slim = lambda g: jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.zeros((), x.dtype) if frozen(path) else x, g)

  def vg(params, piece):
    aux, grads = value_and_grad(params, piece)
    return aux, (tuple(map(slim, grads)) if isinstance(grads, tuple) else slim(grads))
  return vg


def make_rl_step(graphdef, obj_cfg: presets.ObjectiveConfig, opt, prompt_len: int,
                 temperature: float, *, shardings=None, chunk: int | None = None,
                 micro_batches: int = 1, term_grads: bool = False, freeze_vision: bool = True,
                 prefix_shared: bool | None = None):
  """(params, opt_state, batch) -> (params, opt_state, metrics).

  Image prompts: batch["seqs"]["images"] (see `make_logprob_fn`); the log-probs are
  recomputed with the image features. freeze_vision (default True): the features get no
  gradient and the vision tower's params stay bit-identical, so the sampler's features
  are exactly the ones the update uses; False trains the tower too (its features are
  recomputed, with gradients, in every update).

  term_grads: also log the global norms of the gradients of the policy-gradient term
  ("pg_grad_norm", of metrics["pg_loss"]) and of the regulariser as weighted in the loss
  ("reg_grad_norm", of `build_loss`'s "reg_loss": kl_coef x KL + dm_coef x DM + div_coef x
  divergence), and "grad_ratio" = reg_grad_norm / pg_grad_norm (NaN when the policy-gradient
  gradient is 0, e.g. policy_loss="none"). Cost: one forward and three backward passes
  (`term_gradients`) instead of one of each, and two more gradient-sized buffers (summed over
  micro-batches, so the norms are those of the whole batch's gradients).

  prefix_shared: `make_logprob_fn`'s (None, the default: wherever it applies), for
  batch["seqs"] [prompts, G, P+T] (each prompt's G samples; micro-batches slice the prompts,
  so each holds whole groups); DPH's stored rows (dph_seqs, flat, one per prompt) run per row
  under None. metrics["prefix_layout_errors"]: the rows of batch["seqs"] whose prompt is not
  their group's first row's (`layout_errors`; 0 on the per-row forward); a step with any is
  skipped (params and optimizer state unchanged, skipped = 1), not trained on NaN-free rows."""
  logprob_fn = make_logprob_fn(graphdef, prompt_len, temperature=temperature, chunk=chunk,
                               freeze_vision=freeze_vision, prefix_shared=prefix_shared)
  loss_fn = presets.build_loss(obj_cfg, logprob_fn, reg_loss=term_grads)
  vg = term_gradients(loss_fn) if term_grads else jax.value_and_grad(loss_fn, has_aux=True)

  def step(params, opt_state, batch):
    TRACES["rl_update_terms" if term_grads else "rl_update"] += 1
    (loss, metrics), grads = accumulate(vg, params, batch, micro_batches,
                                        frozen_filter(params, freeze_vision))
    if term_grads:
      grads, g_pg, g_reg = grads
      pg, reg = optax.tree.norm(g_pg), optax.tree.norm(g_reg)
      metrics = dict(metrics, pg_grad_norm=pg, reg_grad_norm=reg,
                     grad_ratio=jnp.where(pg > 0, reg / jnp.where(pg > 0, pg, 1.0), jnp.nan))
    errors = layout_errors(prefix_shared, batch["seqs"], prompt_len)
    # A layout error's NaN log-probs make the loss NaN anyway; a masked-out bad row might not.
    guarded = jnp.where(errors > 0, jnp.nan, loss)
    params, opt_state, skipped, gnorm = _guarded_update(opt, guarded, grads, params, opt_state,
                                                        freeze_vision)
    metrics = dict(metrics, skipped=skipped, grad_norm=gnorm, prefix_layout_errors=errors)
    return params, opt_state, metrics

  return _jit(step, shardings)


def term_gradients(loss_fn):
  """loss_fn(params, batch) -> (loss, metrics with "pg_loss" and "reg_loss") as
  (params, batch) -> ((loss, metrics), (grads, pg grads, reg grads)): one forward pass
  (jax.vjp keeps its residuals) and three backward passes, one per cotangent."""

  def vg(params, batch):
    def terms(p):
      loss, metrics = loss_fn(p, batch)
      return (loss, metrics["pg_loss"], metrics["reg_loss"]), metrics

    (loss, _, _), back, metrics = jax.vjp(terms, params, has_aux=True)
    one, zero = jnp.ones_like(loss), jnp.zeros_like(loss)
    grads = tuple(back(c)[0] for c in ((one, zero, zero), (zero, one, zero), (zero, zero, one)))
    return (loss, metrics), grads

  return vg


def make_sft_step(graphdef, opt, prompt_len: int, *, shardings=None, freeze_vision: bool = True):
  """Cross-entropy on the answer tokens (completion mask), token mean. Image prompts and
  freeze_vision as in `make_rl_step`."""
  logprob_fn = make_logprob_fn(graphdef, prompt_len, entropy=False, freeze_vision=freeze_vision)

  def step(params, opt_state, batch):
    TRACES["sft_update"] += 1

    def loss_fn(p):
      lp = logprob_fn(p, batch["seqs"])["logprobs"]
      m = batch["mask"].astype(jnp.float32)
      return -jnp.sum(lp * m) / jnp.maximum(jnp.sum(m), 1.0)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    params, opt_state, skipped, gnorm = _guarded_update(opt, loss, grads, params, opt_state,
                                                        freeze_vision)
    return params, opt_state, {"loss": loss, "skipped": skipped, "grad_norm": gnorm}

  return _jit(step, shardings)


def make_logprob_eval(graphdef, prompt_len: int, temperature: float, *, shardings=None,
                      prefix_shared: bool | None = None):
  """(params, seqs, group_size=None) -> token log-probs (reference log-probs, DPH storage),
  jitted once per group size. prefix_shared and group_size (the rows of flat seqs are groups
  of group_size adjacent samples of one prompt) as in `make_logprob_fn`: without a group
  size, flat seqs run per row; `forward_path(prefix_shared, seqs, prompt_len, group_size)`
  says which forward a call runs."""
  fn = make_logprob_fn(graphdef, prompt_len, temperature=temperature, entropy=False,
                       prefix_shared=prefix_shared)

  jitted = {}  # one compiled function per group size

  def call(params, seqs, group_size=None):
    if group_size not in jitted:
      def run(params, seqs):
        TRACES["logprobs"] += 1
        return fn(params, seqs, group_size)["logprobs"]

      if shardings is None:
        jitted[group_size] = jax.jit(run)
      else:
        p_sh, data_sh, _ = shardings
        jitted[group_size] = jax.jit(run, in_shardings=(p_sh, data_sh), out_shardings=data_sh)
    return jitted[group_size](params, seqs)

  return call


def _jit(step, shardings):
  if shardings is None:
    return jax.jit(step, donate_argnums=(0, 1))
  p_sh, o_sh, b_sh, rep = shardings
  return jax.jit(step, in_shardings=(p_sh, o_sh, b_sh), out_shardings=(p_sh, o_sh, rep),
                 donate_argnums=(0, 1))
