"""DPH-RL's Llama setting: a local Llama-3.1-8B-Instruct checkpoint, DPH-JS, NP-Bench prompts.

    python -m dmpo_jax.train --config=configs/llama3_dph.py:/models/Llama-3.1-8B-Instruct \
        --workdir=runs/llama3_dph_js
    python -m dmpo_jax.parallel.plan --config=configs/llama3_dph.py:/models/Llama-3.1-8B-Instruct

DPH-RL (arXiv 2509.07430) trains Llama-3.1-8B-Instruct among its models; its
JS-divergence variant (`dph_js`) kept Pass@k of the Llama base while raising
Mean@k, so it is the default here (any preset works: --config.rl.algo=dph_f).
The folder's config.json must use Llama 3 rope scaling (`rope_type: llama3`),
which the model implements; other scalings are refused by name.

Numerics: bfloat16 compute with float32 master weights and AdamW state;
log-probs and losses in float32 (docs/PERFORMANCE.md, "Mixed precision").
Attention is 'auto' (cuDNN on GPU, Pallas flash on TPU, the reference core on
CPU). Memory: parameters on `fsdp` over all devices, per-layer remat and 8
micro-batches; check the plan for your mesh with the second command above.
Nothing is downloaded: the argument after the colon is a local folder.
"""

from dmpo_jax.training import config as config_lib

nphard_qwen = config_lib.sibling(__file__, "nphard_qwen")


def get_config(arg: str | None = None):
  if not arg:
    raise ValueError("configs/llama3_dph.py needs a model folder: "
                     "--config=configs/llama3_dph.py:/path/to/Llama-3.1-8B-Instruct")
  c = nphard_qwen.get_config(arg)
  c.rl.algo = "dph_js"
  c.rl.micro_batches = 8
  c.rl.lr = 1e-6
  return c
