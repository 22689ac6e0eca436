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
"""

from dmpo_jax.training import config as config_lib

nphard = config_lib.sibling(__file__, "nphard")


def get_config(arg: str | None = None):
  if not arg:
    raise ValueError("configs/nphard_qwen.py needs a model folder: --config=configs/nphard_qwen.py:/path/to/Qwen2.5")
  c = nphard.get_config()
  c.model.init = arg
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
  return c
