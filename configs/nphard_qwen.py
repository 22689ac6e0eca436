"""A local Qwen2.5-Instruct checkpoint on NP-Bench prompts, bf16, on a GPU/TPU mesh.

    python -m dmpo_jax.train --config=configs/nphard_qwen.py:/models/Qwen2.5-1.5B-Instruct \
        --workdir=runs/qwen_dmpo --config.rl.algo=dmpo

The settings (fsdp over all devices, remat, 4 micro-batches) are sized by the
memory plan for Qwen2.5-0.5B, 1.5B and 7B-Instruct on 8 devices of 141 GiB;
no accelerator run of this config has been measured yet. `python -m
dmpo_jax.parallel.plan --config=configs/nphard_qwen.py:<folder>` prints the plan for a
folder and a mesh. On one device use --config.mesh.fsdp=1 and, for 7B, more
micro-batches (--config.rl.micro_batches=32).

The argument after the colon is the local Hugging Face folder (config.json,
*.safetensors, tokenizer files); nothing is downloaded. Prompts are
NP-Bench's own (`npbench` style, chat template on), RL follows NP-Bench's
curriculum easy -> medium -> hard, there is no SFT stage, and the mesh puts
parameters on `fsdp` (all devices) with batch rows over `data` x `fsdp`.
Check prompt lengths against `model.max_prompt_len` (errors name the task).

`,lora` after the folder (`,lora=<rank>`: another rank than 64) trains LoRA adapters on every
projection instead of all weights (docs/TRAINING.md "LoRA"): the base frozen in bfloat16, the
reference policy its own base with the adapters off, 8 prompts x 8 samples per step, so that
Qwen2.5-7B GRPO with a reference fits one 80 GB device by the memory plan (not yet run on one):

    python -m dmpo_jax.train --config=configs/nphard_qwen.py:/models/Qwen2.5-7B-Instruct,lora \
        --workdir=runs/qwen7b_lora --config.rl.algo=grpo --config.mesh.fsdp=1
    python -m dmpo_jax.parallel.plan --config=configs/nphard_qwen.py:/models/Qwen2.5-7B-Instruct,lora \
        --device_gib=80
"""

from ml_collections import config_dict

from dmpo_jax.models.config import LORA_TARGETS
from dmpo_jax.training import config as config_lib

nphard = config_lib.sibling(__file__, "nphard")


def get_config(arg: str | None = None):
  if not arg:
    raise ValueError("configs/nphard_qwen.py needs a model folder: --config=configs/nphard_qwen.py:/path/to/Qwen2.5")
  folder, _, rest = arg.partition(",")
  opts = config_lib.parse_config_args(rest, {"lora"}, "configs/nphard_qwen.py")
  c = nphard.get_config()
  c.model.init = folder
  c.model.dtype, c.model.param_dtype = "bfloat16", "float32"
  c.model.max_prompt_len, c.model.max_new_tokens = 2048, 1024
  c.model.remat = True         # python -m dmpo_jax.parallel.plan --config=... prints the memory plan
  c.prompt_style, c.chat_template = "npbench", True
  c.level = "easy"
  c.sft.steps = 0
  c.rl.update(steps=400, prompts_per_step=32, group_size=8, lr=1e-6, temperature=1.0,
              curriculum="easy:0,medium:150,hard:300", micro_batches=4)
  c.eval.update(num_per_task=20, samples=8, batch_prompts=32)
  c.dph.update(num_prompts=512, samples=8, batch=64, pef_threshold=1.0)  # DPH-RL's rule
  c.checkpoint.update(every=25, keep=3)
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  if opts.get("lora"):
    add_lora(c, 64 if opts["lora"] is True else int(opts["lora"]))
  return c


def add_lora(c, rank: int) -> None:
  """LoRA of `rank` on every projection (alpha 2 x rank), the base frozen in bfloat16 (no float32
  master copy: it is never updated), ten times the full fine-tuning rate (a common LoRA
  setting, not tuned here), and a step sized for one 80 GB device at 7B."""
  with c.unlocked():
    c.model.lora = config_dict.ConfigDict(dict(rank=rank, alpha=2.0 * rank, targets=LORA_TARGETS,
                                               init="kaiming", export="adapter"))
  c.model.param_dtype = "bfloat16"
  c.rl.update(lr=1e-5, prompts_per_step=8, group_size=8, micro_batches=4)
  c.eval.batch_prompts = 16
  c.dph.batch = 16
