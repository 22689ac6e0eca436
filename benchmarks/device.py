"""One-command device check: rollout throughput, update MFU, peak memory, attention cores.

    PYTHONPATH=. python benchmarks/device.py --out=DIR          # from the source tree
    PYTHONPATH=. python benchmarks/device.py --out=DIR --tiny   # the CPU case the tests run

Needs only jax, flax, optax and numpy (what the modules it imports import at
module level); no package install, no network, random weights. On a GPU or
TPU it builds Qwen2.5-0.5B- and 1.5B-shaped models in bfloat16 and measures:

- rollout: tokens/s of the sampler at 64 prompts x 8 samples, prompt 512,
  512 new tokens, against the HBM-bandwidth bound (each decode step reads the
  weights once and the KV cache of every row);
- update: the RL update's model FLOP utilisation (6 x params x tokens plus
  attention, over the datasheet bf16 peak) and its peak memory against
  `dmpo_jax.parallel.plan`'s prediction for the same shapes;
- update_lora: the same update with LoRA adapters (rank 64, alpha 128, every
  projection; the base frozen, `models/lora.py`) on the 1.5B shape, against the
  planner's LoRA prediction;
- attention: forward + backward of every attention core the backend has, on
  the 0.5B shape.

Each section's JSON is written to DIR as soon as it finishes, so a run cut
short still leaves figures. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dmpo_jax import sampling
from dmpo_jax.parallel import plan
from dmpo_jax.training import steps
from dmpo_jax.models import attention
from dmpo_jax.models import lora as lora_lib
from dmpo_jax.models.config import LoRAConfig, ModelConfig
from dmpo_jax.models.transformer import Transformer

# Datasheet dense bf16 FLOP/s and HBM bytes/s, matched against jax's device_kind.
DATASHEET = {"H200": (989e12, 4.8e12), "H100": (989e12, 3.35e12), "A100": (312e12, 2.0e12),
             "L4": (121e12, 0.3e12), "TPU v5 lite": (197e12, 0.82e12), "TPU v5p": (459e12, 2.76e12),
             "TPU v4": (275e12, 1.2e12), "TPU v6": (918e12, 1.64e12)}
SHAPES = {"qwen2.5-0.5b": plan.MODELS["qwen2.5-0.5b"], "qwen2.5-1.5b": plan.MODELS["qwen2.5-1.5b"],
          "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True)}
FULL = dict(prompts=64, samples=8, prompt_len=512, new_tokens=512, update_rows=16)
TINY = dict(prompts=2, samples=2, prompt_len=16, new_tokens=16, update_rows=4)


def _peaks():
  kind = jax.devices()[0].device_kind
  for name, peaks in DATASHEET.items():
    if name.lower() in kind.lower():
      return kind, peaks
  return kind, (None, None)


def _timed(fn, reps: int):
  """(first call seconds, best of `reps` later calls) of fn() -> array pytree."""
  t = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - t
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t)
  return first, best


def _model(shape: str, dtype: str, param_dtype: str | None = None, **kw):
  """A random-weight model of a named shape (no checkpoint, no hub)."""
  cfg = ModelConfig(**SHAPES[shape], dtype=dtype, param_dtype=param_dtype or dtype, **kw)
  return Transformer(cfg, rngs=nnx.Rngs(0))


def rollout(shape: str, dtype: str, w: dict, reps: int) -> dict:
  """Sampler tokens/s vs the bound: per decode step, the weights once plus every row's KV
  cache (prompt + half the new tokens on average) read from HBM."""
  model = _model(shape, dtype)
  cfg = model.cfg
  graphdef, params = nnx.split(model)
  rs = np.random.RandomState(0)
  tokens = jnp.asarray(rs.randint(3, cfg.vocab_size, (w["prompts"], w["prompt_len"])), jnp.int32)
  mask = jnp.ones_like(tokens)
  scfg = sampling.SamplingConfig(max_new_tokens=w["new_tokens"], num_samples=w["samples"])
  keys = iter(jax.random.split(jax.random.key(0), reps + 1))
  first, best = _timed(lambda: sampling.sample(graphdef, params, tokens, mask, next(keys),
                                               scfg).tokens, reps)
  rows, t = w["prompts"] * w["samples"], w["new_tokens"]
  tps = rows * t / best
  item = jnp.dtype(cfg.dtype).itemsize
  kv_per_row = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * item
  step_bytes = cfg.num_params() * item + rows * (w["prompt_len"] / w["samples"] + t / 2) * kv_per_row
  _, (_, hbm) = _peaks()
  bound = None if hbm is None else rows * hbm / step_bytes
  return {"shape": shape, "rows": rows, "tokens_per_s": round(tps, 1), "seconds": round(best, 3),
          "first_call_s": round(first, 1), "hbm_bound_tokens_per_s": bound and round(bound, 1),
          "fraction_of_bound": bound and round(tps / bound, 4)}


def update(shape: str, dtype: str, w: dict, reps: int, attn: str = "auto",
           lora_rank: int = 0) -> dict:
  """One RL update (log-probs, a policy-gradient loss, AdamW on float32 master weights, bf16
  compute): MFU over the datasheet peak and peak memory vs the planner. lora_rank > 0: LoRA
  adapters on every projection, the base frozen (no base gradient, no AdamW state for it);
  the MFU still counts the full model's 6 x params x tokens, as the forward and the
  activation gradients run through every layer (the base's weight gradients do not)."""
  model = _model(shape, dtype, param_dtype="float32", attention=attn)
  if lora_rank:
    lora_lib.attach(model, LoRAConfig(rank=lora_rank, alpha=2.0 * lora_rank), jax.random.key(0))
  cfg = model.cfg
  graphdef, state = nnx.split(model)
  params = {"model": state}
  rows, p, t = w["update_rows"], w["prompt_len"], w["new_tokens"]
  rs = np.random.RandomState(1)
  seqs = {"tokens": jnp.asarray(rs.randint(3, cfg.vocab_size, (rows, p + t)), jnp.int32),
          "prompt_mask": jnp.ones((rows, p), jnp.int32)}
  adv = jnp.asarray(rs.randn(rows, 1), jnp.float32)
  logprob_fn = steps.make_logprob_fn(graphdef, p, entropy=False)
  opt = steps.make_optimizer(1e-6, 100, 0, 1.0, lora=True) if lora_rank else optax.adamw(1e-6)
  opt_state = opt.init(params)

  def step(params, opt_state):
    loss = lambda prm: -jnp.mean(logprob_fn(prm, seqs)["logprobs"] * adv)
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  jitted = jax.jit(step, donate_argnums=(0, 1))
  state = [params, opt_state]

  def run():
    state[0], state[1], value = jitted(*state)
    return value

  first, best = _timed(run, reps)
  seq = p + t
  flops = rows * seq * (6 * cfg.num_params() + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq / 2)
  kind, (peak, _) = _peaks()
  stats = jax.devices()[0].memory_stats() or {}
  predicted = plan.plan(cfg, {"fsdp": 1}, plan.Workload(prompts=rows, group=1, prompt_len=p,
                                                        new_tokens=t, backend=jax.default_backend()))
  measured = stats.get("peak_bytes_in_use")
  return {"shape": shape, "rows": rows, "tokens": rows * seq, "seconds": round(best, 3),
          "lora_rank": lora_rank, "trained_params": (lora_lib.count(params) if lora_rank
                                                     else cfg.num_params()),
          "first_call_s": round(first, 1), "attention": attention.resolve(cfg.attention, cfg.dtype),
          "model_tflops_per_s": round(flops / best / 1e12, 3),
          "mfu": peak and round(flops / best / peak, 4), "peak_bytes": measured,
          "planned_update_peak_bytes": int(predicted["update_peak_bytes"]),
          "measured_over_planned": measured and round(measured / predicted["update_peak_bytes"], 3)}


def attention_sweep(shape: str, dtype: str, w: dict, reps: int) -> dict:
  """Forward + backward of each attention core the backend runs, at the update's shapes."""
  cfg = ModelConfig(**SHAPES[shape], dtype=dtype)
  b, l = w["update_rows"], w["prompt_len"] + w["new_tokens"]
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (b, l, cfg.num_heads, cfg.head_dim), dtype)
  k = jax.random.normal(ks[1], (b, l, cfg.num_kv_heads, cfg.head_dim), dtype)
  v = jax.random.normal(ks[2], (b, l, cfg.num_kv_heads, cfg.head_dim), dtype)
  offsets = jnp.arange(b, dtype=jnp.int32) % 7
  slots = jnp.arange(l)
  mask = (slots[None, None] <= slots[None, :, None]) & (slots[None, None] >= offsets[:, None, None])
  backend = jax.default_backend()
  names = ["reference", "xla"] + {"gpu": ["cudnn"], "tpu": ["flash"]}.get(backend, [])
  out = {}
  for name in names:
    core = attention.core(name)
    fn = jax.jit(jax.grad(lambda q, k, v: jnp.sum(core(q, k, v, mask, offsets).astype(jnp.float32)),
                          argnums=(0, 1, 2)))
    try:
      _, best = _timed(lambda: fn(q, k, v), reps)
      out[name] = {"seconds": round(best, 4)}
    except Exception as e:  # a core this device cannot run: say why, keep the others
      out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
  return {"shape": shape, "batch": b, "seq": l, "cores": out}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="folder for one JSON file per section")
  ap.add_argument("--tiny", action="store_true", help="the tiny CPU case (default on CPU)")
  ap.add_argument("--reps", type=int, default=3)
  args = ap.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  tiny = args.tiny or jax.default_backend() == "cpu"
  w, dtype = (TINY, "float32") if tiny else (FULL, "bfloat16")
  shapes = ["tiny"] if tiny else ["qwen2.5-0.5b", "qwen2.5-1.5b"]
  kind, (peak, hbm) = _peaks()
  results = {"env": {"backend": jax.default_backend(), "device_kind": kind, "jax": jax.__version__,
                     "peak_flops": peak, "hbm_bytes_per_s": hbm, "workload": w, "dtype": dtype}}
  plan_ = [(f"rollout_{s}", lambda s=s: rollout(s, dtype, w, args.reps)) for s in shapes]
  plan_ += [(f"update_{s}", lambda s=s: update(s, dtype, w, args.reps)) for s in shapes]
  plan_ += [(f"update_lora_{shapes[-1]}", lambda: update(shapes[-1], dtype, w, args.reps,
                                                          lora_rank=4 if tiny else 64))]
  plan_ += [(f"attention_{shapes[0]}", lambda: attention_sweep(shapes[0], dtype, w, args.reps))]
  for name, fn in [("env", lambda: results["env"])] + plan_:
    try:
      results[name] = fn()
    except Exception as e:  # keep going: later sections still report
      results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
      json.dump(results[name], f, indent=1)
    print(f"{name:28s} {json.dumps(results[name])[:150]}", flush=True)
  print(json.dumps(results))
  return 1 if any("error" in v for v in results.values() if isinstance(v, dict)) else 0


if __name__ == "__main__":
  sys.exit(main())
