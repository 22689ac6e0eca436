"""Checkpoints with orbax: params, optimizer state and a JSON record of everything else.

A checkpoint holds ``state = {"params", "opt_state"}`` and ``meta`` (the
step, the stage, the PRNG key data, the data position, the model shape, the
full config, counters). Orbax writes each step into a temporary folder and
renames it when complete, so an interrupted save leaves the previous
checkpoints as they were; ``latest_step`` only ever sees finished ones.

The reference policy of objectives that read one (a KL term, FlowRL) is its
own item, ``checkpoints/reference``: written once when RL starts, outside
the step rotation (``keep`` never deletes it), and restored on resume so that
a resumed run regularises toward the same policy as an uninterrupted one.
"""

from __future__ import annotations

import os
import signal

import jax
import orbax.checkpoint as ocp

# The one error for a checkpoint that cannot be used (another model shape, damaged, ...),
# shared with the model loaders.
from dmpo_jax.models.weights import CheckpointError  # noqa: F401


REFERENCE = "reference"  # folder of the reference policy inside the checkpoint directory


class Checkpointer:

  def __init__(self, directory: str, keep: int = 3):
    self.directory = os.path.abspath(directory)
    self.mngr = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))
    self.reference_path = os.path.join(self.directory, REFERENCE)

  def latest_step(self) -> int | None:
    return self.mngr.latest_step()

  def save(self, step: int, params, opt_state, meta: dict) -> None:
    """Save (synchronously); a step that is already saved is left as it is."""
    if step in self.mngr.all_steps():
      return
    self.mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
        meta=ocp.args.JsonSave(meta)), force=True)
    self.mngr.wait_until_finished()

  def read_meta(self, step: int) -> dict:
    return self.mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def _checked_meta(self, step: int, model_shape: dict) -> dict:
    """The step's meta; a CheckpointError when it was written for another model shape."""
    meta = self.read_meta(step)
    saved = meta.get("model_shape", {})
    diff = {k: (saved.get(k), v) for k, v in model_shape.items() if saved.get(k) != v}
    if diff:
      detail = ", ".join(f"{k}: checkpoint {a} vs config {b}" for k, (a, b) in sorted(diff.items()))
      raise CheckpointError(f"checkpoint {self.directory}/{step} was written for another model "
                            f"shape ({detail}); use another --workdir or the matching config")
    return meta

  def restore_params(self, step: int, params, model_shape: dict):
    """The params alone (evaluation), in the structure/shardings of `params`, whatever the
    optimizer that wrote the checkpoint; returns (params, meta)."""
    meta = self._checked_meta(step, model_shape)
    abstract = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, params)}
    try:
      state = self.mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
          partial_restore=True)))["state"]
    except Exception as e:  # orbax raises assorted types on shape/structure mismatch
      raise CheckpointError(f"cannot restore the params of {self.directory}/{step}: {e}") from e
    return state["params"], meta

  def restore(self, step: int, params, opt_state, model_shape: dict):
    """Restore into the structure/shardings of (params, opt_state); refuse another model shape."""
    meta = self._checked_meta(step, model_shape)
    target = {"params": params, "opt_state": opt_state}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    try:
      state = self.mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract)))["state"]
    except Exception as e:  # orbax raises assorted types on shape/structure mismatch
      raise CheckpointError(f"cannot restore {self.directory}/{step}: {e}") from e
    return state["params"], state["opt_state"], meta

  def has_reference(self) -> bool:
    return os.path.isdir(self.reference_path)

  def save_reference(self, params) -> None:
    """Write the reference policy once (an existing one is kept: it is the run's)."""
    if self.has_reference():
      return
    saver = ocp.StandardCheckpointer()
    saver.save(self.reference_path, params)
    saver.wait_until_finished()
    saver.close()

  def restore_reference(self, params):
    """The saved reference policy, in the structure and shardings of `params`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, params)
    loader = ocp.StandardCheckpointer()
    try:
      return loader.restore(self.reference_path, abstract)
    except Exception as e:  # orbax raises assorted types on shape/structure mismatch
      raise CheckpointError(f"cannot restore the reference policy {self.reference_path}: {e}") from e
    finally:
      loader.close()

  def close(self):
    self.mngr.close()


class StopSignal:
  """SIGINT/SIGTERM set a flag; the training loop saves and exits at the next step boundary.
  A second signal falls through to the default handler."""

  def __init__(self):
    self.received = None
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGINT, signal.SIGTERM):
      self._old[sig] = signal.getsignal(sig)
      signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    if self.received is not None:
      signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
      raise KeyboardInterrupt
    self.received = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)
    return False
