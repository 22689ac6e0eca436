"""Rollout tokens/s against the memory-bandwidth bound, update FLOP/s against the compute peak.

    python benchmarks/throughput.py                          # CPU: measured copy bandwidth and matmul rate
    python benchmarks/throughput.py --config path/config.json --batch 32 --samples 8   # on a GPU

Peaks: on a GPU or TPU the datasheet numbers for the detected device
(H200: 4.8 TB/s, 989 TFLOP/s dense bf16), overridable with --peak_bw and
--peak_flops; on a CPU the copy bandwidth and float32 matmul rate measured
in the same run. Decode bound: each step reads the parameters once for the
whole batch plus each row's KV cache, so tokens/s <= rows * bandwidth /
(param bytes + KV bytes). Update: 3 x forward matmul FLOPs over the step time
(steps.make_rl_step, grpo). Prints a short table; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

PEAKS = {"H200": (4.8e12, 989e12), "H100": (3.35e12, 989e12), "A100": (2.0e12, 312e12)}


def copy_bandwidth(n_bytes=1 << 28, reps=10) -> float:
  import jax
  import jax.numpy as jnp
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  f = jax.jit(lambda a: a + 1.0)
  f(x).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    y = f(x)
  y.block_until_ready()
  return 2 * n_bytes * reps / (time.perf_counter() - t)  # read + write


def main(argv=None):
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from dmpo_jax.training import steps
  from dmpo_jax.models.hf import config_from_hf
  from dmpo_jax.models.transformer import Transformer
  from dmpo_jax.objectives import presets
  from dmpo_jax.sampling import sampler as sampler_lib
  from dmpo_jax.training import make_optimizer
  from sampler import DEFAULT_CONFIG, matmul_rate
  from train_step import update_flops

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", help="HF config.json (default: the Qwen2-shaped benchmark model)")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--samples", type=int, default=8)
  ap.add_argument("--prompt_len", type=int, default=64)
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--dtype", default=None, help="compute dtype (default: bfloat16 on GPU/TPU, float32 on CPU)")
  ap.add_argument("--peak_bw", type=float, default=None, help="bytes/s")
  ap.add_argument("--peak_flops", type=float, default=None, help="FLOP/s")
  args = ap.parse_args(argv)

  backend = jax.default_backend()
  kind = jax.devices()[0].device_kind
  dtype = args.dtype or ("float32" if backend == "cpu" else "bfloat16")
  hf_cfg = json.load(open(args.config)) if args.config else DEFAULT_CONFIG
  cfg = config_from_hf(hf_cfg, dtype=dtype)
  if backend == "cpu":
    bw, peak = copy_bandwidth(), matmul_rate()
    source = "measured on this CPU"
  else:
    known = next((v for k, v in PEAKS.items() if k in kind), (None, None))
    bw, peak = args.peak_bw or known[0], args.peak_flops or known[1]
    if bw is None or peak is None:
      raise SystemExit(f"unknown device {kind!r}: pass --peak_bw and --peak_flops")
    source = f"datasheet for {kind}"
  bw, peak = args.peak_bw or bw, args.peak_flops or peak

  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  rows, lp, lt = args.batch * args.samples, args.prompt_len, args.new_tokens
  prompts = np.random.default_rng(0).integers(3, cfg.vocab_size, (args.batch, lp)).astype(np.int32)
  ones = np.ones_like(prompts)
  pt, pm = np.repeat(prompts, args.samples, 0), np.repeat(ones, args.samples, 0)
  scfg = sampler_lib.SamplingConfig(max_new_tokens=lt, num_samples=args.samples, temperature=1.0)
  sample = jax.jit(lambda p, a, b, r: sampler_lib.generate_padded(graphdef, p, a, b, r, scfg))
  jax.block_until_ready(sample(state, prompts, ones, jax.random.key(0)).tokens)
  t = time.perf_counter()
  jax.block_until_ready(sample(state, prompts, ones, jax.random.key(1)).tokens)
  dt = time.perf_counter() - t
  tok_s = rows * lt / dt
  act_bytes = np.dtype(jnp.dtype(dtype)).itemsize
  param_bytes = sum(x.size for x in jax.tree.leaves(state)) * act_bytes  # weights read at compute dtype
  # Keys/values read per decode step: each prompt's once (shared by its samples), each row's
  # generated ones (T/2 on average).
  slots = args.batch * lp + rows * lt / 2
  kv_bytes = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * slots * act_bytes
  bound = rows * bw / (param_bytes + kv_bytes)

  opt = make_optimizer(1e-5, 100, 1, 1.0)
  update = steps.make_rl_step(graphdef, presets.objective_config("grpo"), opt, lp, 1.0)
  params = {"model": state}
  o = opt.init(params)
  b, g = args.batch, args.samples
  r = sample(state, prompts, ones, jax.random.key(2))
  batch = {"seqs": {"tokens": jnp.concatenate([pt, r.tokens], 1).reshape(b, g, lp + lt),
                    "prompt_mask": jnp.asarray(pm).reshape(b, g, lp)},
           "mask": r.mask.reshape(b, g, lt), "old_logprobs": r.logprobs.reshape(b, g, lt),
           "rewards": jax.random.normal(jax.random.key(3), (b, g))}
  params, o, m = update(params, o, batch)
  jax.block_until_ready(m["loss"])
  best = float("inf")
  for _ in range(3):
    t = time.perf_counter()
    params, o, m = update(params, o, batch)
    jax.block_until_ready(m["loss"])
    best = min(best, time.perf_counter() - t)
  flops = update_flops(cfg, rows, lp + lt - 1, lt)
  mfu = flops / best / peak
  out = {"backend": backend, "device": kind, "peaks_source": source, "bandwidth_Bps": bw,
         "peak_flops": peak, "rollout_tokens_per_s": tok_s, "rollout_bound_tokens_per_s": bound,
         "rollout_fraction_of_bound": tok_s / bound, "update_s": best,
         "update_flops_per_s": flops / best, "update_mfu": mfu}
  print(f"{kind} ({backend}), {dtype}; peaks {source}: {bw / 1e9:.0f} GB/s, {peak / 1e12:.2f} TFLOP/s")
  print(f"{'':22s}{'achieved':>16s}{'bound':>16s}{'fraction':>10s}")
  print(f"{'rollout tokens/s':22s}{tok_s:16,.0f}{bound:16,.0f}{tok_s / bound:10.3f}")
  print(f"{'update FLOP/s':22s}{flops / best:16.3e}{peak:16.3e}{mfu:10.3f}")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
