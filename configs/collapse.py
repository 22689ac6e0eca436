"""The mode-collapse testbed (docs/COLLAPSE.md). Instances with several optimal
solutions, an SFT start that is competent and diverse, then RL at group size 8 or 16.

    python -m dmpo_jax.train --config=configs/collapse.py --workdir=runs/collapse
    python -m dmpo_jax.train --config=configs/collapse.py:algo=grpo,group=16,seed=3 --workdir=...
    python -m dmpo_jax.train --config=configs/collapse.py:tasks=maximum-set+GCP-D,level=tiny ...
    python -m studies.collapse_frontier.sweep --config=configs/collapse.py --out=runs/sweep  # every label x 5 seeds

Arguments after the colon (comma-separated): `algo=<preset>`, `level=<level>`,
`seed=<int>`, `tasks=<key+key+...>`, `group=<8|16>`, `regime=<splits|stream>`,
`pool=<N>`, `sft_steps=<N>`, `pass256` (evaluate with 256 samples per instance, pass@k for
k = 1, 2, 4, ..., 256), and `smoke`. Everything else is configs/nphard.py's default run.

Three regimes (docs/COLLAPSE.md):
- `regime=splits` (default): per task three disjoint sets of distinct instances
  (dmpo_jax/data/splits.py): SFT on A (16), RL on A + B (B: 16, never in SFT),
  evaluation on C (8); evaluation points along RL report A, B and C separately.
- `regime=stream`: SFT and RL draw fresh instances (redrawing any that falls in C, and for
  SFT in B); the tiny policy generalises weakly (about a fifth of samples optimal).
- `pool=N`: SFT, RL and evaluation all use the same N instances per task (RLVR on a fixed
  prompt set; the regime of docs/RESULTS.md section 2.1). Evaluation is on the instances
  trained on, by design.

What the trainer reads beyond configs/nphard.py: `sft.targets` (SFT on optimal
solutions), `collapse.*` (instance filter by number of optima; collapse metrics
per RL step and in evaluation), `rl.log_term_grads` (gradient norms of the
policy-gradient term and of the regulariser, per RL step).
"""

from ml_collections import config_dict

from dmpo_jax.training import config as config_lib

nphard = config_lib.sibling(__file__, "nphard")

# Tasks whose `tiny` instances have >= 2 optima most often (docs/COLLAPSE.md, 50 instances each):
# GCP-D 72%, maximum-set 56%, maximum_clique_problem 54%, subset-sum 36%.
DEFAULT_TASKS = "GCP-D+maximum-set+maximum_clique_problem+subset-sum"
KNOWN = {"algo", "level", "seed", "tasks", "group", "smoke", "pool", "regime", "sft_steps", "pass256"}
REGIMES = ("splits", "stream")
# SFT steps of the splits regime: a start with headroom (docs/COLLAPSE.md, pre-registration),
# measured on seed 0: optimal pass@1 at T = 1.0 on A 0.66 (target 0.5..0.75), optimal pass@64
# on B 0.73 (target 0.3..0.95); 300 steps gave 0.46 on A.
SPLITS_SFT_STEPS = 400
PASS256_KS = tuple(2 ** i for i in range(9))  # 1, 2, 4, ..., 256


def get_config(arg: str | None = None):
  opts = config_lib.parse_config_args(arg, KNOWN, "configs/collapse.py")
  passed = ",".join(f"{k}={opts[k]}" for k in ("algo", "level", "seed") if k in opts)
  c = nphard.get_config(passed + (",smoke" if opts.get("smoke") else ""))
  c.tasks = str(opts.get("tasks", DEFAULT_TASKS)).replace("+", ",")
  group = int(opts.get("group", 8))
  if group not in (8, 16):
    raise ValueError(f"configs/collapse.py: group={group}; the testbed runs group sizes 8 and 16")
  c.rl.group_size = group if not opts.get("smoke") else 4
  # SFT long enough for a start that solves about a quarter of the instances optimally with
  # two or more distinct optima per 16 samples (docs/RESULTS.md); RL at lr 3e-4 for 100 steps,
  # the regime in which GRPO's loss of distinct optima shows (lr 1e-3 degenerates instead).
  if not opts.get("smoke"):
    c.sft.steps = 2000
    c.rl.steps = 100
  # SFT targets: "optimal" = drawn uniformly from the enumerated optimal set
  # (Task.sample_optimal_solutions); "sampled" = Task.sample_solutions (varied quality).
  c.sft.targets = "optimal"
  # Prompts of these tiny tasks take <= 76 tokens and optimal answers <= 19 (with EOS): shorter
  # buffers than configs/nphard.py's 160 + 32 make every stage about 2x faster.
  c.model.update(max_prompt_len=80, max_new_tokens=24)
  # The study's results are float32 results: pinned here, whatever configs/nphard.py's default
  # (never "auto", which picks bfloat16 on CPUs with native bfloat16: docs/PERFORMANCE.md).
  c.model.update(dtype="float32", param_dtype="float32")
  # DPH-RL as the authors run it: D_pef = prompts whose 8 samples are all correct (here:
  # optimal), taken from the RL stream that every preset sees; each rehearsed response weighs
  # eta x one RL sample (8 of them next to 8 x 8 RL samples: 1/8, as 256 next to 2,048).
  # DPH-RL's own rule is pef_threshold=1.0 (all 8 correct); the SFT start below solves no
  # held-out instance optimally in more than 10 of 16 samples, so that D_pef would be empty
  # and dph_* would be GRPO. 0.5 keeps the prompts it solves at least half the time.
  c.dph.update(num_prompts=64, samples=8, pef_threshold=0.5, correct="optimal", batch=8,
               weighting="per_sample")
  # pg_grad_norm, reg_grad_norm, grad_ratio every 4th RL step (one forward, three backward
  # passes on those steps).
  c.rl.log_term_grads = 4
  c.collapse = config_dict.ConfigDict(dict(
      limit=64,             # distinct optima enumerated per instance (Task.optimal_solutions)
      time_limit=10.0,      # seconds per enumeration
      min_optima=2,         # training and eval instances: keep those with min..max optima
      max_optima=16,        # (complete enumerations only; optima.optima_in_range)
      keep_k=8,             # DPH-RL's keep / exploration split: base pass@8
      correct=("feasible", "optimal"),  # pass@k / keep / exploration reported for both
      pool=0,               # > 0: train and evaluate on a fixed pool of N instances per task
      splits=(),            # (A, B, C) per task: disjoint sets (set below for the default regime)
  ))
  # pass@k and QR@k for every k = 1..64 need >= 64 samples per held-out instance.
  c.eval.update(num_per_task=12, samples=64, pass_ks=tuple(range(1, 65)), batch_prompts=24)
  # Evaluation points along RL (dmpo_jax/training/points.py): start, 1/3, 2/3, end, at the RL
  # temperature, with KL to the start policy; 64 samples per instance (pass@64).
  c.eval.update(points=4, points_samples="64")
  regime = str(opts.get("regime", "splits"))
  if regime not in REGIMES:
    raise ValueError(f"configs/collapse.py: regime={regime!r}; choose from {REGIMES} (or pool=N)")
  pool = int(opts.get("pool", 0))
  if not pool:
    # A 16, B 16, C 8 distinct instances per task (dmpo_jax/data/splits.py).
    c.collapse.update(splits=(16, 16, 8), split_file="", sft_from="A", rl_from="AB")
    c.eval.num_per_task = 8  # with splits the held-out evaluation is on C
    # Samples per instance at each point: pass@64 on B (primary), 32 on A (coverage, pass@1)
    # and C; the evaluation points cost more than the RL steps, and this keeps tier 1 in
    # budget (docs/COLLAPSE.md, pre-registration). NP-Bench's protocol on C (T = 0.7) beside
    # it: 16 samples.
    c.eval.update(points_samples="A:32,B:64,C:32", samples=16)
    if regime == "stream":
      c.collapse.update(sft_from="stream", rl_from="stream")
    else:
      # D_pef candidates: every RL prompt (A + B of every task), each once; DPH-RL's own rule
      # (all 8 samples optimal), as in the pool regime.
      c.dph.update(num_prompts=32 * len(c.tasks.split(",")), pef_threshold=1.0)
      if not opts.get("smoke"):
        c.sft.steps = SPLITS_SFT_STEPS
  if pool:
    c.collapse.pool = pool
    c.eval.num_per_task = pool
    c.dph.pef_threshold = 1.0  # DPH-RL's rule: all 8 samples optimal
    # 600 SFT steps on a pool of 12 per task: 73% of samples optimal at T = 0.7, nearly every
    # optimum reached in 64 samples (docs/RESULTS.md). More SFT leaves GRPO groups whose 8
    # samples are all optimal, which carry no policy gradient.
    if not opts.get("smoke"):
      c.sft.steps = 600
  if "sft_steps" in opts:
    c.sft.steps = int(opts["sft_steps"])
  if opts.get("pass256"):
    # pass@k to k = 256 (feasible and optimal): 256 samples per instance, 4 instances per sampler
    # call, so a call holds 1,024 rows, fewer than the default 24 x 64: memory stays flat.
    c.eval.update(samples=256, pass_ks=PASS256_KS, batch_prompts=4)
  if opts.get("smoke"):
    c.collapse.update(limit=16, time_limit=2.0)
    if c.collapse.get("splits"):
      c.collapse.splits = (2, 2, 1)
      c.dph.num_prompts = 4 * len(c.tasks.split(","))
    c.eval.update(points=2, points_samples="8")
    c.eval.update(num_per_task=1, samples=8, pass_ks=(1, 8), batch_prompts=8)
    c.dph.update(num_prompts=8, samples=4, batch=8)
  return c
