"""The embedded default: a small model trained from scratch on `tiny` NP instances, on a CPU.

    python -m dmpo_jax.train --config=configs/nphard.py --workdir=runs/default
    python -m dmpo_jax.train --config=configs/nphard.py:algo=grpo,level=tiny,seed=1 --workdir=...
    python -m dmpo_jax.train --config=configs/nphard.py:smoke --workdir=/tmp/smoke

Arguments after the colon (comma-separated): `algo=<preset>`, `level=<level>`,
`seed=<int>`, `tasks=<key+key+...>`, and the flag `smoke` (a few steps of every
stage, for tests). Any field can also be set with --config.<path>=<value>;
unknown fields are refused (the config is locked).
"""

from ml_collections import config_dict

from dmpo_jax.objectives import presets
from dmpo_jax.training import config as config_lib


KNOWN = {"algo", "level", "seed", "tasks", "smoke"}


def get_config(arg: str | None = None):
  opts = config_lib.parse_config_args(arg, KNOWN, "configs/nphard.py")
  c = config_dict.ConfigDict()
  c.seed = int(opts.get("seed", 0))
  c.tasks = str(opts.get("tasks", "all")).replace("+", ",")  # "all" or comma-separated keys
  c.level = opts.get("level", "tiny")
  c.prompt_style = "compact"  # "compact" (from-scratch models) or "npbench"
  c.chat_template = False     # wrap npbench prompts in the tokenizer's chat template
  c.stop_at_step = -1         # >= 0: save and exit after this global step (preemption drills, tests)
  c.check_memory = True       # refuse a run whose memory estimate exceeds a device (training/memory.py)

  c.model = config_dict.ConfigDict(dict(
      init="scratch",          # "scratch" or a local Hugging Face folder
      tokenizer="",            # "" = the task tokenizer (scratch) / the HF folder's
      hidden_size=128, intermediate_size=384, num_layers=3, num_heads=4, num_kv_heads=2,
      head_dim=32, rope_theta=10000.0, dtype="float32", param_dtype="float32",
      max_prompt_len=160,      # prompts are left-padded to this (fixed shapes)
      max_new_tokens=32,
      remat=False,             # activation checkpointing per layer in the update
  ))
  c.sft = config_dict.ConfigDict(dict(
      steps=400, batch_size=32, lr=2e-3, warmup=40, solutions_per_instance=4,
      targets="sampled",       # or "optimal": drawn uniformly from the enumerated optima
      freeze_vision=True,      # a vision-language policy's tower gets no update (text models: unused)
      vision_lr_scale=1.0,     # a trained tower's learning rate / the language model's
      # reasoning-gym tasks mixed into SFT only (never RL), cycled after config.tasks; their
      # transfer evaluation instances are kept out (docs/GYM.md): "gym-chain_sum:max_terms=2"
      gym_tasks="",
  ))
  c.dph = config_dict.ConfigDict(dict(   # DPH-RL pre-sampling (dph_* presets only)
      num_prompts=64, samples=8, correct="feasible",  # or "optimal"; sampled at rl.temperature
      # D_pef: prompts the initial policy solves in at least this share of its samples. DPH-RL
      # uses 1.0 (all); the small from-scratch policy solves almost nothing every time, so 0.5.
      pef_threshold=0.5,
      batch=16,                             # stored D_pef responses per RL step
      # "separate": L = L_RL + eta * L_f (two means); "per_sample": eta scaled by
      # batch / (prompts_per_step * group_size), each D_pef response weighing eta x one RL sample
      # as in the DPH-RL authors' mixed batches (docs/METHODS.md).
      weighting="separate",
  ))
  c.rl = config_dict.ConfigDict(dict(
      algo=opts.get("algo", "dmpo"), steps=60, prompts_per_step=8, group_size=8, lr=3e-4,
      temperature=1.0, top_p=1.0, max_grad_norm=1.0,
      curriculum="",           # e.g. "easy:0,medium:100,hard:200" (RL step at which a level starts)
      rollout_chunks=2,        # sample in pieces; the host scores one while the device samples the next
      micro_batches=0,         # the update runs over this many slices of prompts (gradient accumulation);
                               # 0 = auto: one per group on a CPU when exact (train.micro_batches)
      nonfinite_patience=3,    # stop after this many non-finite steps in a row
      check_recompile=True,    # error if the update recompiles after its first step
      freeze_vision=True,      # as sft.freeze_vision, for RL
      vision_lr_scale=1.0,
      log_term_grads=0,        # N >= 1: log the terms' gradient norms every N-th RL step (0: never)
      # the update's and reference pass's forward runs each prompt once per group (the same
      # log-probs up to float32 rounding, docs/PERFORMANCE.md): "auto" wherever it applies
      # (not image prompts or DPH's stored rows), "on" required, "off" per row
      prefix_shared="auto",
  ))
  # Overrides of the preset's objective fields (None = the preset's default).
  c.rl.objective = config_dict.ConfigDict(
      {name: config_dict.placeholder(object) for name in presets.field_names()})
  c.rl.reward = config_dict.ConfigDict(dict(
      format_bonus=0.1, ground_truth="reference", cap=2.0, compat="strict"))
  c.eval = config_dict.ConfigDict(dict(
      num_per_task=12, samples=8, k=3, temperature=0.7, pass_ks=(1, 3, 8), batch_prompts=24,
      zero_shot=False,      # also evaluate the initial policy, before SFT (eval_zero_shot.json)
      points=0,             # evaluation points along RL (training/points.py; configs/collapse.py)
      points_samples="",    # their samples per instance: "N" or "SET:N,..."; "": eval.samples
      points_kl_samples=0,  # the KL to the start on the first N samples per instance; 0: all
      # bounds the start (the point at RL step 0) must meet, else the run stops before RL:
      # "B:pass_optimal@64<=0.95,AB:pass_optimal@1<=0.8"; "": none (docs/TRAINING.md)
      start_bounds="",
      # reasoning-gym tasks never trained on in RL (in SFT only through sft.gym_tasks), scored
      # before and after RL beside the held-out evaluation (docs/GYM.md):
      # "gym-countdown,gym-graph_color"; "": none
      transfer="",
      transfer_num_per_task=6, transfer_samples=4,  # held-out instances per task, samples each
      transfer_max_prompt_len=0,   # 0: the longest transfer prompt (within the model's context)
      transfer_max_new_tokens=0,   # 0: model.max_new_tokens
  ))
  c.checkpoint = config_dict.ConfigDict(dict(every=100, keep=2, export_hf=True))
  c.mesh = config_dict.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  c.log = config_dict.ConfigDict(dict(every=1, tensorboard=True, plots=True, progress=True))

  if opts.get("smoke"):
    c.sft.steps, c.sft.batch_size, c.sft.warmup = 3, 8, 1
    c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = 3, 8, 4
    c.eval.num_per_task, c.eval.samples, c.eval.pass_ks, c.eval.batch_prompts = 1, 4, (1, 3), 8
    c.dph.num_prompts, c.dph.samples, c.dph.batch = 8, 4, 8
    c.model.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                   num_kv_heads=1, head_dim=16, max_new_tokens=16)
    c.checkpoint.every = 2
    c.log.progress = False
  return c
