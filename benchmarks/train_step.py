"""One full RL step, split: rollout (our sampler), reward (host: decode + verify), update.

    python benchmarks/train_step.py

Shapes: the policy issue's benchmark (8 prompts x 8 samples, prompt 64, 128
new tokens, EOS off, the Qwen2-shaped model: vocab 512, hidden 256, 4
layers, 4 heads, 2 KV heads, ffn 704), for `grpo` and `dmpo`. The update is
the training loop's jitted step (steps.make_rl_step: forward, backward,
AdamW, non-finite guard). Its achieved FLOP/s (3 x the forward's matmul
FLOPs over its time) is printed as a fraction of the float32 matmul rate
measured in the same run (1024^3), and of the rate the update's own matmuls
reach alone (the same dots at the same shapes with nothing in between: on a
2-core CPU, hidden-256 matmuls run well below the square rate). Rewards:
completions are decoded with the task tokenizer (ids modulo its vocabulary)
and verified against a TSP instance,
the host work a real step does. The update runs as one pass over the batch
and, where the training default differs (rl.micro_batches = 0: on a CPU,
one slice per prompt group for objectives that are means over sequences and
groups, exact up to summation order), as that. Last line: one JSON object.
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


def update_flops(cfg, rows: int, length: int, predicted: int | None = None) -> float:
  """Matmul FLOPs of the forward on [rows, length] (full masked attention; the
  unembedding on the `predicted` completion positions only, as make_rl_step
  does; default all), times 3 for forward + backward."""
  d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  n, k, layers = cfg.num_heads, cfg.num_kv_heads, cfg.num_layers
  per_token = 2 * layers * (d * n * h * 2 + d * k * h * 2 + 3 * d * f)
  attn = 4 * layers * n * h * length * length
  unembed = 2 * d * cfg.vocab_size * (length if predicted is None else predicted)
  return 3.0 * rows * (per_token * length + attn + unembed)


def matmuls_alone_rate(cfg, rows: int, length: int, predicted: int, reps: int = 5) -> float:
  """FLOP/s of the update's own matmuls with nothing in between: every dot of one
  layer's forward and backward (dense projections: output, input gradient,
  weight gradient; attention: the two forward and four backward batched dots)
  at the update's shapes, timed as one jitted program, times the layers, plus
  the unembedding's three dots. The ceiling for this model's shapes on this
  machine's XLA GEMMs, beside the square-matmul rate."""
  import jax
  import jax.numpy as jnp

  d, f, h, v = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.vocab_size
  n, k = cfg.num_heads, cfg.num_kv_heads
  t, q = rows * length, n // k * length

  def dense_dots(shapes, tokens):
    arrays = [(jnp.ones((tokens, a)), jnp.ones((a, b)), jnp.ones((tokens, b))) for a, b in shapes]
    # out = x @ w; dx = dy @ w.T; dw = x.T @ dy
    fn = lambda arrs: [(x @ w, dy @ w.T, x.T @ dy) for x, w, dy in arrs]
    return fn, arrays

  layer_fn, layer_args = dense_dots(
      [(d, n * h), (d, k * h), (d, k * h), (n * h, d), (d, f), (d, f), (f, d)], t)
  qs, ks, vs = jnp.ones((rows, k, q, h)), jnp.ones((rows, k, h, length)), jnp.ones((rows, k, length, h))
  ps = jnp.ones((rows, k, q, length))

  def layer(arrs, qs, ks, vs, ps):
    e = jnp.einsum
    attn = [e("bkqh,bkhs->bkqs", qs, ks), e("bkqs,bksh->bkqh", ps, vs),  # forward
            e("bkqs,bkqh->bksh", ps, qs), e("bkqh,bksh->bkqs", qs, vs),  # dV, dP
            e("bkqs,bkhs->bkqh", ps, ks), e("bkqh,bkqs->bkhs", qs, ps)]  # dQ, dK
    return layer_fn(arrs), attn

  un_fn, un_args = dense_dots([(d, v)], rows * predicted)

  def timed(fn, *args):
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(reps):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      best = min(best, time.perf_counter() - t0)
    return best

  seconds = cfg.num_layers * timed(layer, layer_args, qs, ks, vs, ps) + timed(un_fn, un_args)
  return update_flops(cfg, rows, length, predicted) / seconds


def main(argv=None):
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from dmpo_jax import pipeline, steps
  from dmpo_jax import tasks as tasks_lib
  from dmpo_jax.models import tokenizer
  from dmpo_jax.models.hf import config_from_hf
  from dmpo_jax.models.transformer import Transformer
  from dmpo_jax.objectives import presets
  from dmpo_jax.sampling import sampler as sampler_lib
  from dmpo_jax.tasks import rewards as rewards_lib
  from dmpo_jax.train import auto_micro_batches, make_optimizer
  from sampler import DEFAULT_CONFIG, matmul_rate

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=5)
  args = ap.parse_args(argv)

  P, G, LP, LT = 8, 8, 64, 128
  cfg = config_from_hf(DEFAULT_CONFIG)
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  params = {"model": state}
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, cfg.vocab_size, (P, LP)).astype(np.int32)  # one per group
  pt = np.repeat(prompts, G, 0)  # each sample's prompt
  pm = np.ones_like(pt)
  scfg = sampler_lib.SamplingConfig(max_new_tokens=LT, num_samples=G, temperature=1.0)
  sample = jax.jit(lambda p, a, b, r: sampler_lib._generate(graphdef, p["model"], a, b, r, scfg))
  tok = tokenizer.build()
  enc = pipeline.PromptEncoder(tok, "compact", LP)
  task = tasks_lib.get("TSP")
  items = [("TSP", task.generate(i, "tiny")) for i in range(P)]
  reward_cfg = rewards_lib.RewardConfig()
  gts = [task.reference_value(q) for _, q in items]

  def one_step(update, params, opt_state, i):
    t0 = time.perf_counter()
    r = sample(params, prompts, np.ones_like(prompts), jax.random.key(i))
    tokens = np.asarray(r.tokens)
    t1 = time.perf_counter()
    texts = enc.texts(tokens % len(tok), np.asarray(r.mask))
    rewards, _ = pipeline.score_groups(items, texts, G, reward_cfg, gts)
    t2 = time.perf_counter()
    batch = {"seqs": {"tokens": jnp.concatenate([jnp.asarray(pt), r.tokens], 1).reshape(P, G, LP + LT),
                      "prompt_mask": jnp.asarray(pm).reshape(P, G, LP)},
             "mask": r.mask.reshape(P, G, LT), "old_logprobs": r.logprobs.reshape(P, G, LT),
             "rewards": jnp.asarray(rewards + rng.normal(0, 0.1, rewards.shape).astype(np.float32))}
    params, opt_state, m = update(params, opt_state, batch)
    jax.block_until_ready(m["loss"])
    t3 = time.perf_counter()
    return params, opt_state, (t1 - t0, t2 - t1, t3 - t2)

  rate = matmul_rate()
  flops = update_flops(cfg, P * G, LP + LT - 1, LT)
  own = {}  # rows per pass -> rate of the update's matmuls alone at those shapes
  out = {"matmul_gflops": rate / 1e9, "update_gflop": flops / 1e9}
  print(f"RL step, {P} prompts x {G} samples, prompt {LP}, {LT} new tokens; backend {jax.default_backend()}; "
        f"measured matmul rate {rate / 1e9:.0f} GFLOP/s (1024^3)")
  for name in ("grpo", "dmpo"):
    obj = presets.objective_config(name)
    auto = auto_micro_batches(obj, P)  # the training default (rl.micro_batches = 0), one device
    results = {}
    for mb in sorted({1, auto}):
      opt = make_optimizer(1e-5, 100, 1, 1.0)
      update = steps.make_rl_step(graphdef, obj, opt, LP, 1.0, micro_batches=mb)
      p = jax.tree.map(jnp.copy, params)
      o = opt.init(p)
      p, o, _ = one_step(update, p, o, 0)  # compile
      best = None
      for i in range(args.reps):
        p, o, t = one_step(update, p, o, i + 1)
        best = t if best is None else tuple(min(a, b) for a, b in zip(best, t))
      rows = P * G // mb
      if rows not in own:
        own[rows] = matmuls_alone_rate(cfg, rows, LP + LT - 1, LT)
      total = sum(best)
      frac = flops / best[2] / rate
      results[mb] = {"micro_batches": mb, "rollout_s": best[0], "reward_s": best[1],
                     "update_s": best[2], "update_gflops": flops / best[2] / 1e9,
                     "update_fraction_of_matmul_rate": frac, "own_matmuls_gflops": own[rows] / 1e9,
                     "update_fraction_of_own_matmuls": flops / best[2] / own[rows]}
      label = ("one pass" if mb == 1 else f"{mb} micro-batches") + (
          " (training default)" if mb == auto else "")
      print(f"  {name:5s} {label}")
      print(f"        rollout {best[0] * 1e3:7.1f} ms ({100 * best[0] / total:4.1f}%)  "
            f"reward {best[1] * 1e3:6.1f} ms ({100 * best[1] / total:4.1f}%)  "
            f"update {best[2] * 1e3:7.1f} ms ({100 * best[2] / total:4.1f}%)")
      print(f"        update {flops / best[2] / 1e9:6.1f} GFLOP/s = {100 * frac:.0f}% of the matmul rate "
            f"(target >= 50%); its matmuls alone at these shapes run at {own[rows] / 1e9:.0f} GFLOP/s "
            f"({100 * own[rows] / rate:.0f}%), the update at {100 * flops / best[2] / own[rows]:.0f}% of that")
    out[name] = results[auto] if auto == 1 else dict(results[auto], one_pass=results[1])
  print(json.dumps(out))


if __name__ == "__main__":
  main()
