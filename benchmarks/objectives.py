"""DMPO's overhead: one update step (forward, backward, optimizer) of DMPO vs GRPO.

    python benchmarks/objectives.py

Both steps run on the same batch and model (the Qwen2-shaped benchmark
model: vocab 512, hidden 256, 4 layers; 8 prompts x 8 samples, prompt 64,
128 completion tokens). DMPO adds lambda * L_DM on the sequence scores of
the same forward, so its step should cost about the same as GRPO's
(target: at most 3% more). Prints both times and the ratio; the last line
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dmpo_jax.models.config import ModelConfig
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.objectives import common, presets


def make_step(graphdef, cfg, prompt_len):
  def logprob_fn(params, seqs):
    model = nnx.merge(graphdef, params)
    logits = model(seqs[:, :-1])[:, prompt_len - 1:]  # predicts the completion tokens
    lp = common.token_logprobs(logits, seqs[:, prompt_len:])
    return {"logprobs": lp.reshape(-1, 8, lp.shape[-1])}

  loss_fn = presets.build_loss(cfg, logprob_fn)
  opt = optax.adamw(1e-5)

  @jax.jit
  def step(params, opt_state, batch):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step, opt


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=5)
  args = ap.parse_args(argv)
  mcfg = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=704, num_layers=4,
                     num_heads=4, num_kv_heads=2, qkv_bias=True)
  graphdef, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(0)))
  p, t, b = 64, 128, 64
  seqs = jax.random.randint(jax.random.key(0), (b, p + t), 3, 512)
  batch = {"seqs": seqs, "mask": jnp.ones((b // 8, 8, t)),
           "old_logprobs": jnp.full((b // 8, 8, t), -6.0),
           "rewards": jax.random.uniform(jax.random.key(1), (b // 8, 8))}
  runs = {}
  for name in ("grpo", "dmpo"):
    step, opt = make_step(graphdef, presets.objective_config(name), p)
    state = (params, opt.init(params))
    jax.block_until_ready(step(*state, batch))  # compile
    runs[name] = (step, state)
  # Interleaved, best of reps: drift in machine load hits both alike.
  times = {name: float("inf") for name in runs}
  for _ in range(args.reps):
    for name, (step, state) in runs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(step(*state, batch))
      times[name] = min(times[name], time.perf_counter() - t0)
  ratio = times["dmpo"] / times["grpo"]
  print(f"update step, {b} sequences x {p + t} tokens, backend {jax.default_backend()}")
  print(f"  grpo  {times['grpo'] * 1e3:9.1f} ms")
  print(f"  dmpo  {times['dmpo'] * 1e3:9.1f} ms")
  print(f"  ratio dmpo / grpo = {ratio:.3f} (target <= 1.03)")
  print(json.dumps({"grpo_ms": round(times["grpo"] * 1e3, 2),
                    "dmpo_ms": round(times["dmpo"] * 1e3, 2), "ratio": round(ratio, 4),
                    "backend": jax.default_backend()}))


if __name__ == "__main__":
  main()
