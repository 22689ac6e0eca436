"""A small processor for image prompts: a folder's tokenizer plus its Hugging Face image processor.

Image preprocessing (resize to a multiple of patch x merge pixels within the configured
pixel range, rescale, normalise, cut into temporal x spatial patches in merge-block
order) is transformers' Qwen2-VL image processor, not a copy: the torch backend when
torchvision is installed, else the PIL backend, loaded by class (AutoProcessor also
builds a video processor, which fails without torchvision). The wrapper adds what the
policy needs around it: each image placeholder of a prompt expanded into one image-pad
token per merged patch, and a patch budget (the fixed shape the jitted vision tower is
compiled for) checked with a clear error.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from dmpo_jax.models.hf_text import load_tokenizer
from dmpo_jax.models.weights import CheckpointError

IMAGE_TOKEN = "<|image_pad|>"
PROCESSOR_FILE = "preprocessor_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def image_processor_class():
  """transformers' Qwen2-VL image processor class: torch backend if torchvision is
  importable, else the PIL backend (imported directly, without the fallback warning)."""
  try:
    import torchvision  # noqa: F401
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    return Qwen2VLImageProcessor
  except ImportError:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)
    return Qwen2VLImageProcessorPil


def build_image_processor(vision_cfg, *, min_pixels: int, max_pixels: int,
                          mean: Sequence[float] | None = None, std: Sequence[float] | None = None):
  """An image processor for a from-scratch model of `vision_cfg` (a VisionConfig): images
  resized to between min_pixels and max_pixels pixels, then each channel (in [0, 1]) mapped
  to (x - mean) / std (None: the processor's CLIP statistics, those of the released
  checkpoints). A drawing on white wants mean 1: the background is then 0 (docs/MULTIMODAL.md)."""
  stats = {}
  for name, value in (("image_mean", mean), ("image_std", std)):
    if value is not None:
      value = [float(v) for v in value]
      if len(value) != 3 or (name == "image_std" and min(value) <= 0):
        raise ValueError(f"{name} must be three floats{' > 0' if name == 'image_std' else ''}, "
                         f"got {value}")
      stats[name] = value
  return image_processor_class()(
      patch_size=vision_cfg.patch_size, temporal_patch_size=vision_cfg.temporal_patch_size,
      merge_size=vision_cfg.spatial_merge_size, min_pixels=min_pixels, max_pixels=max_pixels,
      **stats)


class VLProcessor:
  """tokenizer + image processor -> prompt ids and the vision tower's inputs.

  `processor(text, images)` -> {"input_ids": [L] int32, "pixel_values": [P, C] float32,
  "image_grid_thw": [I, 3] int64}; `text` holds `image_token` once per image, in order.
  """

  def __init__(self, tokenizer, image_processor, *, image_token: str = IMAGE_TOKEN,
               patch_budget: int | None = None):
    self.tokenizer = tokenizer
    self.image_processor = image_processor
    self.image_token = image_token
    ids = tokenizer.convert_tokens_to_ids([image_token])
    unk = getattr(tokenizer, "unk_token_id", None)
    if not ids or ids[0] is None or (ids[0] == unk and image_token != tokenizer.unk_token):
      raise ValueError(f"the tokenizer has no image token {image_token!r}")
    self.image_token_id = int(ids[0])
    self.merge_size = int(image_processor.merge_size)
    self.patch_budget = patch_budget
    if patch_budget is not None and patch_budget % self.merge_size ** 2:
      raise ValueError(f"patch_budget={patch_budget} must be a multiple of merge_size ** 2 = "
                       f"{self.merge_size ** 2}")

  @classmethod
  def from_folder(cls, path: str, *, patch_budget: int | None = None) -> "VLProcessor":
    """The processor of a local folder (tokenizer files + preprocessor_config.json)."""

    if not os.path.isdir(path):
      raise CheckpointError(f"processor folder {path!r} does not exist")
    if not os.path.exists(os.path.join(path, PROCESSOR_FILE)):
      raise CheckpointError(f"{os.path.join(path, PROCESSOR_FILE)} is missing: the folder has no "
                            "image processor")
    if not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
      raise CheckpointError(f"{path} has no tokenizer file (one of {', '.join(TOKENIZER_FILES)})")
    image_processor = image_processor_class().from_pretrained(path, local_files_only=True)
    proc = cls(load_tokenizer(path), image_processor, patch_budget=patch_budget)
    cfg_file = os.path.join(path, "config.json")
    if os.path.exists(cfg_file):
      with open(cfg_file) as f:
        declared = json.load(f).get("image_token_id")
      if declared is not None and declared != proc.image_token_id:
        raise CheckpointError(f"config.json image_token_id={declared}, but the tokenizer maps "
                              f"{proc.image_token!r} to {proc.image_token_id}")
    return proc

  def save_pretrained(self, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    self.tokenizer.save_pretrained(path)
    self.image_processor.save_pretrained(path)

  def check_vision_config(self, vision_cfg) -> None:
    """Refuse a vision config whose patch geometry differs from the image processor's."""
    ip = self.image_processor
    for ours, theirs in (("patch_size", "patch_size"),
                         ("temporal_patch_size", "temporal_patch_size"),
                         ("spatial_merge_size", "merge_size")):
      if getattr(vision_cfg, ours) != getattr(ip, theirs):
        raise ValueError(f"vision_config.{ours}={getattr(vision_cfg, ours)} differs from the "
                         f"image processor's {theirs}={getattr(ip, theirs)}")

  def images(self, images: Sequence[Any]) -> dict[str, np.ndarray]:
    """Images (PIL images or [H, W, 3] uint8 arrays) -> {"pixel_values": [P, C] float32,
    "image_grid_thw": [I, 3] int64}, within the patch budget."""
    out = self.image_processor(images=list(images), return_tensors="np")
    pixels = np.asarray(out["pixel_values"], np.float32)
    grids = np.asarray(out["image_grid_thw"], np.int64).reshape(-1, 3)
    if self.patch_budget is not None and pixels.shape[0] > self.patch_budget:
      raise ValueError(
          f"the images need {pixels.shape[0]} patches (image_grid_thw {grids.tolist()}), more "
          f"than the patch budget of {self.patch_budget}; raise patch_budget or lower the "
          "image processor's max_pixels")
    return {"pixel_values": pixels, "image_grid_thw": grids}

  def num_image_tokens(self, grid_thw) -> list[int]:
    """Image-pad tokens (merged patches) per image of grid_thw [I, 3]."""
    grids = np.asarray(grid_thw, np.int64).reshape(-1, 3)
    return [int(g.prod()) // self.merge_size ** 2 for g in grids]

  def __call__(self, text: str, images: Sequence[Any] = ()) -> dict[str, np.ndarray]:
    pieces = text.split(self.image_token)
    if len(pieces) - 1 != len(images):
      raise ValueError(f"the text holds {len(pieces) - 1} image token(s) {self.image_token!r} "
                       f"but {len(images)} image(s) were given")
    if images:
      vis = self.images(images)
    else:
      vis = {"pixel_values": np.zeros((0, 0), np.float32),
             "image_grid_thw": np.zeros((0, 3), np.int64)}
    counts = self.num_image_tokens(vis["image_grid_thw"])
    expanded = pieces[0] + "".join(self.image_token * n + p for n, p in zip(counts, pieces[1:]))
    ids = np.asarray(self.tokenizer(expanded, add_special_tokens=False)["input_ids"], np.int32)
    return {"input_ids": ids, **vis}
