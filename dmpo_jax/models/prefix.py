"""Which forward a log-prob pass runs: each group's prompt once (`Transformer.shared_hidden`,
docs/PERFORMANCE.md "Prefix-shared update forward") or every row in full, decided from the
shapes alone. One rule for the trainer (training/steps.py, which runs the forward and reports
it), the config check and memory estimate (training/memory.py) and the memory planner's CLI
(parallel/plan.py, which may not import the training layer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# config.rl.prefix_shared's settings -> `forward_path`'s prefix_shared
PREFIX_SHARED = {"auto": None, "on": True, "off": False}


def forward_path(prefix_shared, seqs, prompt_len: int, group_size=None) -> tuple:
  """("prefix_shared", why, G) or ("per_row", why, 1): the forward that
  `training.steps.make_logprob_fn(prefix_shared=...)` runs on seqs (arrays or shapes,
  [..., P+T]) with this group_size, decided from the shapes alone (so a caller can say which
  ran without tracing); a ValueError where prefix_shared=True does not apply."""
  lead, t = seqs["tokens"].shape[:-1], seqs["tokens"].shape[-1] - prompt_len
  if prefix_shared not in (None, True, False):
    raise ValueError(f"prefix_shared must be None, True or False, got {prefix_shared!r}")
  if prefix_shared is False:
    return ("per_row", "prefix_shared=False", 1)
  if seqs.get("images") is not None:
    why = "image prompts (Qwen2.5-VL): the tower's features enter the prompt per row"
  elif len(lead) > 1 and group_size not in (None, lead[-1]):
    why = f"group_size={group_size} is not the seqs' group axis ({lead[-1]})"
  elif len(lead) < 2 and group_size is None:
    why = "flat seqs [B, P+T] and no group_size"
  elif t < 2:
    why = f"a completion of {t} token(s)"
  else:
    g = lead[-1] if len(lead) > 1 else group_size
    rows = int(np.prod(lead))
    if g < 1 or rows % g:
      why = f"{rows} rows are not groups of {g}"
    elif g == 1 and prefix_shared is None:
      why = "groups of one (nothing to share)"
    else:
      return ("prefix_shared", f"{rows // g} prompts x {g}", g)
  if prefix_shared:
    raise ValueError(f"prefix_shared=True does not apply: {why}")
  return ("per_row", why, 1)


def update_forward(setting: str, prompts: int, group: int, prompt_len: int, new_tokens: int,
                   images: bool = False, field: str = "config.rl.prefix_shared") -> tuple:
  """The forward the RL update runs under config.rl.prefix_shared = setting ("auto", "on" or
  "off"): `forward_path` on the shape of the update's batch, seqs [prompts, G, P+T], with image
  inputs for a vision-language policy (images). DPH's stored rows, flat, run per row beside it.
  A ValueError naming the field where the setting is unknown or "on" cannot apply (field: the
  name the messages give the setting)."""
  if setting not in PREFIX_SHARED:
    raise ValueError(f"{field}={setting!r}: choose one of {list(PREFIX_SHARED)}")
  lead = (prompts, group)
  seqs = {"tokens": jax.ShapeDtypeStruct(lead + (prompt_len + new_tokens,), jnp.int32),
          "prompt_mask": jax.ShapeDtypeStruct(lead + (prompt_len,), jnp.int32),
          "images": {} if images else None}
  try:
    return forward_path(PREFIX_SHARED[setting], seqs, prompt_len)
  except ValueError as e:
    raise ValueError(f"{field}={setting!r}: {e}") from None
