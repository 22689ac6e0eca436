"""Reading weight files into our Flax modules: the one `CheckpointError`, the safetensors
reader, and the checked name-map loader every model family uses.

A loader names, for each of our parameters, the tensor in the file and how to turn the
file's layout into ours (`load_into`). Everything a library raises while reading is
turned into a `CheckpointError` that names the file and what was being read, and
shapes in messages are the file's own (a torch Linear stores [out, in], we hold [in, out]).
This module imports no other model module, so every family can build on it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Iterable, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from dmpo_jax.models.config import as_dtype

# How a file tensor becomes ours: "" as stored, "T" transposed (a torch Linear [out, in]
# -> our [in, out]), or a function of the stored array (e.g. one third of a fused qkv).
Convert = str | Callable[[np.ndarray], np.ndarray]


class CheckpointError(ValueError):
  """A checkpoint (a model folder or file, or a training checkpoint) does not match what the
  model or run needs, or cannot be read."""


def read_json(file: str, what: str = "config") -> dict[str, Any]:
  """A JSON object from `file`; anything else (missing, not JSON, a list) names the file."""
  if not os.path.exists(file):
    raise CheckpointError(f"{file} is missing")
  try:
    with open(file, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise CheckpointError(f"cannot read the {what} {file}: {type(e).__name__}: {e}") from e
  if not isinstance(value, dict):
    raise CheckpointError(f"the {what} {file} holds a JSON {type(value).__name__}, "
                          "not an object")
  return value


def safetensor_files(path: str) -> dict[str, str]:
  """Tensor name -> file in a folder: from model.safetensors.index.json if sharded, else
  from every `*.safetensors` file's header."""
  from safetensors import safe_open

  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    weight_map = read_json(index, "safetensors index").get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index} has no 'weight_map' object")
    out = {}
    for name, fname in weight_map.items():
      full = os.path.join(path, fname)
      if not os.path.exists(full):
        raise CheckpointError(f"shard {full} (listed in {index} for {name}) is missing")
      out[name] = full
    return out
  files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not files:
    raise CheckpointError(f"no *.safetensors file in {path}")
  out = {}
  for fname in files:
    full = os.path.join(path, fname)
    try:
      with safe_open(full, framework="numpy") as f:
        names = list(f.keys())
    except Exception as e:  # safetensors raises its own SafetensorError, OSError, ...
      raise CheckpointError(f"cannot read the tensor list (header) of {full}: "
                            f"{type(e).__name__}: {e}") from e
    out.update((name, full) for name in names)
  return out


def read_tensor(file: str, name: str) -> np.ndarray:
  """Tensor `name` from the safetensors `file`, as a numpy-compatible array."""
  from safetensors import safe_open

  try:
    # framework="flax" reads bfloat16 too (numpy has no bf16 of its own).
    with safe_open(file, framework="flax") as f:
      return f.get_tensor(name)
  except Exception as e:  # a truncated data section surfaces here, not in the header
    raise CheckpointError(f"cannot read tensor {name} from {file}: {type(e).__name__}: {e}") from e


def _shape_error(name: str, where: str, stored, how: Convert, want, ours) -> CheckpointError:
  path = "/".join(map(str, ours))
  if how == "":
    return CheckpointError(f"tensor {name} has shape {stored} in {where}; the model expects "
                           f"{want} for {path}")
  if how == "T":  # say it in the file's [out, in] layout
    return CheckpointError(f"tensor {name} has shape {stored} in {where}; the model expects "
                           f"{tuple(reversed(want))} (stored [out, in]) for {path}")
  return CheckpointError(f"tensor {name} has shape {stored} in {where}, which does not give "
                         f"the model's {want} for {path}")


def load_into(abstract: nnx.Module, names: Mapping[tuple, tuple[str, Convert]],
              read: Callable[[str], Any], available: Iterable[str], where: str, *,
              param_dtype: str, ignore: Callable[[str], bool] = lambda name: False,
              what: str = "tensor") -> nnx.Module:
  """Fill `abstract` (a module from nnx.eval_shape) from a file through `names`.

  names: our parameter path -> (tensor name in the file, how to convert it);
  read(name): the stored array; available: every tensor name the file holds;
  where: the file or folder, for messages; what: the kind of tensor, for messages. A tensor
  the map does not use is refused unless `ignore(name)`; a missing tensor or a wrong shape is
  refused by name. A name may appear more than once (a fused qkv read three times).
  """
  available = set(available)
  expected = {name for name, _ in names.values()}
  unexpected = sorted(n for n in available if n not in expected and not ignore(n))
  if unexpected:
    raise CheckpointError(f"unexpected {what}(s) in {where}: {', '.join(unexpected[:10])}"
                          f"{' ...' if len(unexpected) > 10 else ''}")
  graphdef, state = nnx.split(abstract)
  pure = nnx.to_pure_dict(state)
  pd = as_dtype(param_dtype)
  for ours, (name, how) in names.items():
    if name not in available:
      raise CheckpointError(f"{what} {name} is missing from {where}")
    stored = read(name)
    node = pure
    for key in ours[:-1]:
      node = node[key]
    want = tuple(node[ours[-1]].shape)
    if how == "":
      value = stored
    elif how == "T":
      value = stored.T if stored.ndim == 2 else stored
    else:
      try:
        value = how(stored)
      except CheckpointError:
        raise
      except (ValueError, IndexError) as e:
        raise _shape_error(name, where, tuple(stored.shape), how, want, ours) from e
    if tuple(value.shape) != want:
      raise _shape_error(name, where, tuple(stored.shape), how, want, ours)
    node[ours[-1]] = jnp.asarray(value, pd)
  nnx.replace_by_pure_dict(state, pure)
  return nnx.merge(graphdef, state)


def write_folder(path: str, write) -> None:
  """Call write(tmp) on a fresh temporary folder beside `path`, then move it into place:
  a failure midway leaves any previous folder at `path` untouched."""
  parent = os.path.dirname(os.path.abspath(path)) or "."
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-hf-", dir=parent)
  try:
    write(tmp)
    if os.path.exists(path):
      old = path.rstrip("/") + ".old"
      shutil.rmtree(old, ignore_errors=True)
      os.replace(path, old)
      os.replace(tmp, path)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
