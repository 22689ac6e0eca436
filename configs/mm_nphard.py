"""MM-NP-Bench on a CPU: a small vision-language model from scratch on rendered `tiny` instances.

    python -m dmpo_jax.train --config=configs/mm_nphard.py --workdir=runs/mm
    python -m dmpo_jax.train --config=configs/mm_nphard.py:algo=grpo,seed=1 --workdir=runs/mm_grpo
    python -m dmpo_jax.train --config=configs/mm_nphard.py:smoke --workdir=/tmp/mm_smoke

The policy is a Qwen2.5-VL (dmpo_jax/models/qwen2_5_vl.py) built from the fields
below: a two-block vision tower (patches of 14 px, 2x2 merge, window attention in
block 0, full attention in block 1) and the text model of configs/nphard.py with
multimodal RoPE. Each prompt is the instance drawn at `image.size` pixels
(tasks/render.py) and the task's word ("TSP", "knap", ...): no instance number is
in the text (prompt_style "image"). Stages, arguments and evaluation are those of
configs/nphard.py (same argument syntax: algo= any preset, dph_* included, level=,
seed=, tasks=, smoke); evaluation also scores the blank-image control (the same
prompts, the image replaced by a white one of the same size) and the text prompts
of the same instances (`eval.modalities`). SFT opens with the perception stage: 600 steps
in which the policy transcribes each instance from its image (docs/MULTIMODAL.md; about
7 of the run's minutes on a 2-core CPU). Pixels enter with white at 0
(`image.mean`/`image.std`), without which a from-scratch tower does not learn to read.
The renderer is ours: MM-NP-Bench numbers here are
not comparable with the DMPO paper's.
"""

from dmpo_jax.training import config as config_lib

nphard = config_lib.sibling(__file__, "nphard")


def get_config(arg: str | None = None):
  c = nphard.get_config(arg)
  smoke = "smoke" in (arg or "").split(",")
  c.prompt_style = "image"        # or "npbench_image" (NP-Bench's wording, for instruction models)
  c.model.vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                        patch_size=14, temporal_patch_size=2, spatial_merge_size=2,
                        window_size=56, fullatt_block_indexes=(1,))
  c.model.mrope_section = (4, 6, 6)   # frequencies per stream (temporal, height, width): head_dim / 2
  c.model.max_prompt_len = 80     # the image span (8 x 8 = 64 merged patches at 224 px) + the words
  c.image = dict(
      size=224,                   # render size (pixels); `tiny` instances stay legible
      min_pixels=224 * 224, max_pixels=224 * 224,  # the processor's range: a 16 x 16 patch grid
      patch_budget=256,           # patches per prompt the jitted tower is sized for
      cache=4096,                 # rendered and preprocessed instances kept (LRU)
      # Pixels (in [0, 1]) -> (x - mean) / std: white is 0, so the background adds nothing to a
      # patch and only the ink moves the tower. With the CLIP statistics (the processor's
      # default) white is +1.9 on every input of every patch, and a from-scratch tower's first
      # Adam steps push every patch's features along that one direction (docs/MULTIMODAL.md).
      mean=(1.0, 1.0, 1.0), std=(0.5, 0.5, 0.5),
  )
  c.eval.modalities = ("image", "blank", "text")  # scored side by side on the same instances
  c.sft.freeze_vision = False     # SFT trains the tower from scratch (features get gradients)
  c.sft.vision_lr_scale = 1.0     # the tower's learning rate / the language model's (SFT)
  c.rl.freeze_vision = True       # RL keeps it: the sampler's image features are the update's
  # The perception stage (dmpo_jax/training/perception.py): the first `steps` SFT steps train
  # the policy to write each instance's transcript from its image (tiny transcripts: 18-125
  # tokens), at its own learning rate; perception.json scores it against blank images. Then
  # 300 steps of task SFT (sft.steps counts both) and 40 of RL.
  c.perception = dict(steps=600, lr=2e-3, warmup=20, max_new_tokens=128)  # tiny: up to 125 tokens
  c.sft.steps, c.rl.steps = 600 + 300, 40
  c.eval.num_per_task = 8
  if smoke:
    c.model.vision = dict(c.model.vision, hidden_size=32, intermediate_size=64)
    c.model.mrope_section = (2, 3, 3)
    c.image.update(size=128, min_pixels=112 * 112, max_pixels=112 * 112, patch_budget=64)
    c.model.max_prompt_len = 32
    c.sft.steps, c.rl.steps = 3, 3
    c.perception.update(steps=0, max_new_tokens=48)  # tests/training/test_perception.py drills it
  return c
