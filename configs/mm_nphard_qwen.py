"""MM-NP-Bench with a local Qwen2.5-VL folder, bf16, on a GPU/TPU mesh.

    python -m dmpo_jax.train --config=configs/mm_nphard_qwen.py:/models/Qwen2.5-VL-3B-Instruct \
        --workdir=runs/qwen_vl_dmpo --config.rl.algo=dmpo

The settings of configs/nphard_qwen.py (fsdp over all devices, remat, NP-Bench's
curriculum easy -> medium -> hard, no SFT) with image prompts: each instance is drawn
at `image.size` pixels (tasks/render.py) and the prompt is NP-Bench's wording with the
image in place of the instance listing (prompt_style "npbench_image", in the chat
template). The folder's own image processor resizes the render (448 px: a 32 x 32
patch grid, 256 image tokens). The vision tower is frozen in the update
(rl.freeze_vision), so the sampler's image features are exactly the update's.
Evaluation scores the image prompts, the blank-image control and the text prompts of
the same instances. DPH presets work with image prompts (docs/MULTIMODAL.md). No run
at Qwen2.5-VL size has been measured (no accelerator yet); tests/training/test_mm_nphard.py
trains this config for one RL step on a tiny local Qwen2.5-VL folder on 2 CPU devices.

The argument after the colon is the local folder (config.json, *.safetensors,
tokenizer and preprocessor_config.json); nothing is downloaded. The renderer is ours:
scores are not comparable with the DMPO paper's MM-NP-Bench figures.
"""

from dmpo_jax.training import config as config_lib

nphard_qwen = config_lib.sibling(__file__, "nphard_qwen")


def get_config(arg: str | None = None):
  if not arg:
    raise ValueError("configs/mm_nphard_qwen.py needs a model folder: "
                     "--config=configs/mm_nphard_qwen.py:/path/to/Qwen2.5-VL")
  c = nphard_qwen.get_config(arg)
  c.prompt_style = "npbench_image"
  c.model.max_prompt_len = 768      # ~300 text tokens in the chat template + 256 image tokens
  c.image = dict(size=448, patch_budget=1024, cache=4096)  # 448 px = 32 x 32 patches of 14 px
  c.rl.freeze_vision = True
  c.sft.freeze_vision = True
  c.eval.modalities = ("image", "blank", "text")
  return c
