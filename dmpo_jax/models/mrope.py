"""Multimodal rotary positions (M-RoPE) of Qwen2-VL / Qwen2.5-VL.

Qwen2-VL (arXiv:2409.12191, section 2.1) gives every token three position streams:
temporal, height and width. A text token has the same position in all three, one more
than the token before it. The merged tokens of an image of gh x gw merged patches (per
frame) start at the current position s: stream t = s + frame, h = s + row, w = s + column;
the text after the image continues from s + max(gh, gw), one past the image's largest
position. Padding (attention mask 0) gets position 0 in all streams.

The rotary tables split each head's H / 2 frequencies into `mrope_section` (e.g.
[16, 24, 24] for H = 128): section i rotates by stream i % 3. With one stream repeated
three times they equal plain RoPE, so a text-only prompt is unchanged.

`rope_index` runs on the host (numpy, data-dependent spans); `mrope_tables` is jittable
and returns tables in the layout `transformer.rope` applies.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from dmpo_jax.models import transformer
from dmpo_jax.models.config import ModelConfig


def _image_positions(start: int, grid, merge: int) -> np.ndarray:
  """[3, t * gh * gw] positions of one image's merged tokens, row-major per frame."""
  t, h, w = (int(x) for x in grid)
  tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h // merge), np.arange(w // merge),
                           indexing="ij")
  return np.stack([tt, hh, ww]).reshape(3, -1) + start


def _row_positions(ids: np.ndarray, grids, image_token_id: int, merge: int, row: int):
  """Positions [3, n] of one row's unpadded tokens; consumes grids from the iterator."""
  parts, cur, i, n = [], 0, 0, len(ids)
  is_img = ids == image_token_id
  while i < n:
    j = i
    while j < n and is_img[j] == is_img[i]:
      j += 1
    if not is_img[i]:
      parts.append(np.broadcast_to(np.arange(cur, cur + j - i), (3, j - i)))
      cur += j - i
    else:
      left = j - i  # a run may hold several images back to back
      while left > 0:
        grid = next(grids, None)
        if grid is None:
          raise ValueError(f"row {row} has more image-pad tokens than image_grid_thw describes")
        t, h, w = (int(x) for x in grid)
        need = t * (h // merge) * (w // merge)
        if need > left:
          raise ValueError(f"row {row}: an image span of {left} image-pad tokens is shorter than "
                           f"the {need} merged patches of image_grid_thw {(t, h, w)}")
        parts.append(_image_positions(cur, grid, merge))
        cur += max(h, w) // merge
        left -= need
    i = j
  return np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), np.int64)


def rope_index(input_ids, image_grid_thw=None, *, image_token_id: int, spatial_merge_size: int,
               attention_mask=None):
  """Multimodal positions of a batch: (positions [3, B, L] int32, deltas [B] int32).

  input_ids [B, L] hold one image-pad token (`image_token_id`) per merged patch;
  image_grid_thw [I, 3] lists the images of all rows in order (as the image processor
  returns them for the batch); attention_mask [B, L] (1 on tokens, 0 on padding, any
  side). A later token k (counting unpadded tokens from 0) of row b, e.g. in decode,
  has position k + deltas[b] in all three streams.
  """
  ids = np.asarray(input_ids)
  if ids.ndim != 2:
    raise ValueError(f"input_ids must be [B, L], got shape {ids.shape}")
  mask = (np.ones_like(ids, bool) if attention_mask is None
          else np.asarray(attention_mask).astype(bool))
  if mask.shape != ids.shape:
    raise ValueError(f"attention_mask shape {mask.shape} differs from input_ids shape {ids.shape}")
  grid_list = [] if image_grid_thw is None else np.asarray(image_grid_thw).reshape(-1, 3)
  grids = iter(grid_list)
  positions = np.zeros((3,) + ids.shape, np.int32)
  deltas = np.zeros((ids.shape[0],), np.int32)
  for b in range(ids.shape[0]):
    pos = _row_positions(ids[b][mask[b]], grids, image_token_id, spatial_merge_size, b)
    positions[:, b, mask[b]] = pos
    deltas[b] = (pos.max() + 1 if pos.size else 0) - pos.shape[1]
  if next(grids, None) is not None:
    raise ValueError(f"image_grid_thw lists {len(grid_list)} images, more than the prompts' "
                     "image-pad spans hold")
  return positions, deltas


def mrope_tables(positions, head_dim: int, theta: float, mrope_section: Sequence[int]):
  """Rotary tables for `transformer.rope` from positions [3, B, L]: ([cos, cos], [-sin, sin]),
  each [B, L, 1, H]. A thin call to the language model's own `transformer.rope_tables`
  (frequency f rotates by stream i % 3 of the section i that holds f), so the vision-language
  model and the text model share one definition."""
  section = tuple(int(s) for s in mrope_section)
  if sum(section) != head_dim // 2 or min(section) < 0:
    raise ValueError(f"mrope_section {list(section)} must be non-negative and sum to head_dim / 2 = "
                     f"{head_dim // 2}")
  # The tables read only head_dim, rope_theta, rope_type and mrope_section of the config.
  cfg = ModelConfig(vocab_size=1, hidden_size=head_dim, intermediate_size=1, num_layers=1,
                    num_heads=1, num_kv_heads=1, head_dim=head_dim, rope_theta=theta,
                    mrope_section=section)
  return transformer.rope_tables(jnp.asarray(positions), cfg)
