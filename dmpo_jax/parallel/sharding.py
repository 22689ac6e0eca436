"""Device mesh, logical axis rules and sharding helpers.

The mesh has three named axes: ``data`` (batch), ``fsdp`` (batch and
parameters, ZeRO-3 style) and ``tensor`` (heads, MLP, vocab). Parameters
carry logical axis names (``out_sharding`` metadata on every nnx.Param);
``RULES`` maps them onto mesh axes. A dimension whose size does not divide by
its mesh axes is replicated instead (tiny test models on 8 devices).
"""

from __future__ import annotations

import math
from typing import Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH = ("data", "fsdp")
RULES = {
    "batch": BATCH,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "norm": None,
}


def make_mesh(shape: Mapping[str, int], devices=None) -> Mesh:
  """A mesh with axes (data, fsdp, tensor); one axis may be -1 (all remaining devices)."""
  devices = list(jax.devices() if devices is None else devices)
  unknown = set(shape) - set(AXES)
  if unknown:
    raise ValueError(f"mesh has unknown axes {sorted(unknown)}; valid axes: {AXES}")
  sizes = [int(shape.get(a, 1)) for a in AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh: at most one axis may be -1, got {dict(zip(AXES, sizes))}")
  if -1 in sizes:
    rest = math.prod(s for s in sizes if s != -1)
    if len(devices) % rest:
      raise ValueError(f"mesh {dict(zip(AXES, sizes))}: {len(devices)} devices do not divide by {rest}")
    sizes[sizes.index(-1)] = len(devices) // rest
  if math.prod(sizes) != len(devices):
    if math.prod(sizes) > len(devices) or any(s < 1 for s in sizes):
      raise ValueError(f"mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices; "
                       f"{len(devices)} available")
    devices = devices[:math.prod(sizes)]
  return Mesh(np.asarray(devices).reshape(sizes), AXES)


def _mesh_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  return math.prod(mesh.shape[a] for a in axes)


def logical_to_mesh(logical: P, shape, mesh: Mesh, rules=RULES) -> P:
  """Map a PartitionSpec of logical names to mesh axes, replicating non-divisible dims."""
  out = []
  used = set()
  for name, dim in zip(tuple(logical) + (None,) * (len(shape) - len(logical)), shape):
    axes = rules.get(name) if name is not None else None
    if axes is not None:
      tup = (axes,) if isinstance(axes, str) else tuple(axes)
      tup = tuple(a for a in tup if a not in used and mesh.shape[a] > 1)
      if not tup or dim % _mesh_size(mesh, tup):
        axes = None
      else:
        used.update(tup)
        axes = tup[0] if len(tup) == 1 else tup
    out.append(axes)
  return P(*out)


def param_shardings(params: nnx.State, mesh: Mesh, rules=RULES):
  """NamedShardings for a params State from each parameter's logical axis names."""
  specs = nnx.get_partition_spec(params)
  return jax.tree.map(
      lambda spec, x: NamedSharding(mesh, logical_to_mesh(spec, x.shape, mesh, rules)),
      specs, params, is_leaf=lambda s: isinstance(s, P))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Leading (row) axis over data x fsdp, the rest replicated."""
  return NamedSharding(mesh, P(BATCH, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_rows(mesh: Mesh) -> int:
  """Rows of a batch must divide by this (the data x fsdp size)."""
  return _mesh_size(mesh, BATCH)


def init_opt_state(opt, params, param_sharding, mesh: Mesh):
  """Optimizer state placed like the params it mirrors (AdamW mu and nu are FSDP-sharded with
  their params); non-parameter leaves (step counts) are replicated. Returns (state, shardings)
  (`opt_state_shardings`)."""
  shardings = opt_state_shardings(opt, params, param_sharding, mesh)
  return jax.jit(opt.init, out_shardings=shardings)(params), shardings


def opt_state_shardings(opt, params, param_sharding, mesh: Mesh):
  """The shardings of `opt`'s state of `params` (placed by `param_sharding`), without making it.

  A state leaf mirrors the param whose key path is the longest tail of its own with the same
  shape (mu's path is (..., "mu", *param_path)); this holds for chains, `optax.masked` and
  `optax.multi_transform` alike (a frozen part has no leaves at all)."""
  abstract = jax.eval_shape(opt.init, params)
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  by_path = {tuple(path): (leaf.shape, s)
             for (path, leaf), s in zip(flat, jax.tree.leaves(param_sharding))}

  def placement(path, leaf):
    for i in range(len(path)):
      shape, s = by_path.get(tuple(path[i:]), (None, None))
      if s is not None and shape == leaf.shape:
        return s
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(placement, abstract)
