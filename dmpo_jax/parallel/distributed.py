"""Multi-process runs on JAX's own runtime (`jax.distributed`), and host <-> global array helpers.

Every process runs the same program. Host data is a pure function of (seed,
step), so each process builds the same global batch and hands JAX only the
shards its devices hold (`to_global`). Device results are read back with
`to_host` (an all-gather across processes). Files are written by process 0
only; checkpoints are written and restored by all processes together (orbax).
"""

from __future__ import annotations

import os

import jax
import numpy as np


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Start jax.distributed from arguments or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
  JAX_PROCESS_ID; with none of them and on a TPU pod or SLURM, JAX detects the cluster.
  A single process without any of these does nothing."""
  addr = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  n = num_processes or (int(os.environ["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in os.environ else None)
  pid = process_id if process_id is not None else (
      int(os.environ["JAX_PROCESS_ID"]) if "JAX_PROCESS_ID" in os.environ else None)
  if addr is None and n is None:
    if os.environ.get("TPU_WORKER_HOSTNAMES") or os.environ.get("SLURM_JOB_ID"):
      jax.distributed.initialize()  # cluster auto-detection
    return
  if n is None or pid is None or addr is None:
    raise ValueError("multi-process runs need a coordinator address, a process count and a process id "
                     f"(got address={addr!r}, num_processes={n!r}, process_id={pid!r})")
  try:  # cross-process collectives on CPU devices (tests, CPU clusters); no effect on GPU/TPU
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except AttributeError:
    pass
  jax.distributed.initialize(coordinator_address=addr, num_processes=n, process_id=pid)


def is_main() -> bool:
  return jax.process_index() == 0


def to_global(x, sharding):
  """A host array (the same on every process) -> a global jax.Array with `sharding`;
  each process supplies only its own devices' shards. Device arrays pass through."""
  if isinstance(x, jax.Array):
    return x
  x = np.asarray(x)
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def tree_to_global(tree, sharding):
  return jax.tree.map(lambda x: to_global(x, sharding), tree)


def to_host(x) -> np.ndarray:
  """A global jax.Array -> the full numpy array on every process."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable or jax.process_count() == 1:
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def tree_to_host(tree):
  return jax.tree.map(to_host, tree)


def agree(flag) -> bool:
  """Process 0's value of a host-side decision, on every process, so that all processes take
  the same branch (a file that exists, a signal received): diverging would deadlock collectives."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils
  return bool(multihost_utils.broadcast_one_to_all(np.int32(bool(flag))))
