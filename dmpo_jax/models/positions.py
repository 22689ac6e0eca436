"""One definition of left padding, positions and the attention pattern they imply.

Every sequence the sampler and the update see is a row of slots: a prompt
left-padded to P slots, then completion slots. A row is described by one
integer, its pad offset (the number of pad slots before its first real
token), not by a dense mask: key slot s is visible to the query in slot q iff

    offset <= s <= q.

Positions count the row's own tokens: the token in slot q has position
q - offset (pads get 0). Attention implementations build their mask (or
segment ids, for the TPU kernels) from offsets and slot indices inside the
attention call, so callers never build [L, S] masks.

Several position streams (multimodal RoPE: temporal, height, width) are a
leading axis: positions [R, B, L]; for text all streams are equal.

Shapes: B rows, L tokens in this call, S key slots, P prompt, T completion,
R position streams.
"""

from __future__ import annotations

import jax.numpy as jnp


def left_pad_offsets(prompt_mask):
  """prompt_mask [B, P] (1 on real tokens, left-padded) -> offsets [B] int32."""
  p = prompt_mask.shape[-1]
  return (p - jnp.sum(prompt_mask.astype(jnp.int32), axis=-1)).astype(jnp.int32)


def slot_positions(offsets, length: int, start=0):
  """Positions [B, L] of slots start .. start + L - 1 of rows with `offsets` [B]."""
  slots = start + jnp.arange(length, dtype=jnp.int32)
  return jnp.maximum(slots[None, :] - offsets[:, None], 0).astype(jnp.int32)


def sequence_layout(prompt_mask, completion_len: int):
  """A left-padded prompt then `completion_len` completion slots -> (positions [B, P+T],
  offsets [B]): the layout the sampler decodes in and the update recomputes."""
  offsets = left_pad_offsets(prompt_mask)
  return slot_positions(offsets, prompt_mask.shape[-1] + completion_len), offsets


def visible(offsets, query_slots, key_slots):
  """Bool [B, L, S]: key slot s is visible to query slot q of row b iff offset_b <= s <= q.

  query_slots [L] or [B, L]; key_slots [S]."""
  q = jnp.asarray(query_slots)
  q = q[None] if q.ndim == 1 else q
  k = jnp.asarray(key_slots)
  return (k[None, None, :] <= q[..., None]) & (k[None, None, :] >= offsets[:, None, None])

