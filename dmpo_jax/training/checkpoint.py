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

A LoRA run (config.model.lora, `models.lora`) trains only its adapters: a step saves the
adapters (and any FlowRL log Z head) with their optimizer state, and the frozen base is its
own item, ``checkpoints/base``, written once with the first step and restored with every
step (`split_frozen`). Its reference policy is the base with the adapters off: no item.

A damaged workdir (a disk that filled up, a copy cut short) can hold a step
folder whose files are incomplete. `usable_step` finds the newest step whose
metadata files are whole; newer damaged steps are moved to
``checkpoints.damaged/`` (kept, not deleted) with a warning that names the
file and what is wrong, and the run resumes from the older step.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import jax
import orbax.checkpoint as ocp

from dmpo_jax.models import lora as lora_lib

# The one error for a checkpoint that cannot be used (another model shape, damaged, ...),
# shared with the model loaders.
from dmpo_jax.models.weights import CheckpointError  # noqa: F401


REFERENCE = "reference"  # folder of the reference policy inside the checkpoint directory
BASE = "base"  # folder of a LoRA run's frozen base params (written once)


# The files of a step folder that must parse as JSON objects, with the keys they must hold.
STEP_FILES = (("_CHECKPOINT_METADATA", ()), ("meta/metadata", ("step", "stage", "seed", "model_shape",
                                                               "counters")),
              ("state/_METADATA", ()))


def path_keys(path) -> tuple[str, ...]:
  """A leaf's key path as names ('model', 'layers', '0', ..., 'value')."""
  return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def split_frozen(params):
  """(trained, frozen) parts of a params tree: for a LoRA model, nested dicts of its trained
  leaves (adapters, log Z head) and of its frozen base (`lora.is_base_path`); otherwise
  (params, None): everything is saved at every step."""
  if not lora_lib.has_adapters(params):
    return params, None
  parts = ({}, {})
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    *keys, last = path_keys(path)
    node = parts[lora_lib.is_base_path(path)]
    for k in keys:
      node = node.setdefault(k, {})
    node[last] = x
  return parts


def join_frozen(params, trained, frozen):
  """The params tree of `params`' structure from `split_frozen`'s two parts."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  leaves = []
  for path, _ in flat:
    node = frozen if lora_lib.is_base_path(path) else trained
    for k in path_keys(path):
      node = node[k]
    leaves.append(node)
  return jax.tree_util.tree_unflatten(treedef, leaves)


class Checkpointer:

  def __init__(self, directory: str, keep: int = 3):
    if keep < 1:  # orbax's max_to_keep=0 deletes every checkpoint
      raise CheckpointError(f"keep={keep}: at least one checkpoint must be kept")
    self.directory = os.path.abspath(directory)
    self.keep = keep
    self.mngr = self._manager()
    self.reference_path = os.path.join(self.directory, REFERENCE)
    self.base_path = os.path.join(self.directory, BASE)

  def _manager(self):
    return ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=True))

  def latest_step(self) -> int | None:
    return self.mngr.latest_step()

  def damage(self, step: int) -> str | None:
    """None when step's folder is whole, else '<file>: <what is wrong>'."""
    d = os.path.join(self.directory, str(step))
    for name, keys in STEP_FILES:
      path = os.path.join(d, name)
      try:
        with open(path, encoding="utf-8") as f:
          obj = json.load(f)
      except FileNotFoundError:
        return f"{path}: missing"
      except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"{path}: {type(e).__name__}: {e}"
      if not isinstance(obj, dict) or any(k not in obj for k in keys):
        return f"{path}: not the expected record (keys {list(keys)})"
    return None

  def usable_step(self, set_aside: bool = True) -> int | None:
    """The newest step whose files are whole (None: no step). Newer damaged steps are
    reported, and with set_aside moved to checkpoints.damaged/, so that the run can save those
    steps again. When no step is whole, the newest one's damage is a CheckpointError (nothing
    is moved: there is nothing to fall back to)."""
    steps = sorted(self._step_dirs(), reverse=True)
    damaged = []
    for step in steps:
      why = self.damage(step)
      if why is None:
        break
      damaged.append((step, why))
    else:
      if damaged:
        raise CheckpointError(f"no usable checkpoint in {self.directory}: {damaged[0][1]}")
      return None
    for bad, why in damaged:
      print(f"warning: skipping checkpoint {self.directory}/{bad} ({why}); resuming from step "
            f"{step}" + (f" (moved to {self.directory}.damaged/)" if set_aside else ""), flush=True)
      if set_aside:
        aside = os.path.join(self.directory + ".damaged", f"{bad}-{int(time.time())}")
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        shutil.move(os.path.join(self.directory, str(bad)), aside)
    if damaged and set_aside:
      self.mngr.close()
      self.mngr = self._manager()  # it lists steps once
    return step

  def _step_dirs(self) -> list[int]:
    """Step folders, whole or not (orbax's list skips some damaged ones but not all)."""
    if not os.path.isdir(self.directory):
      return []
    return [int(n) for n in os.listdir(self.directory)
            if n.isdigit() and os.path.isdir(os.path.join(self.directory, n))]

  def save(self, step: int, params, opt_state, meta: dict) -> None:
    """Save (synchronously); a step that is already saved is left as it is. A LoRA model's
    frozen base goes to the base item, once (before its first step)."""
    if step in self.mngr.all_steps():
      return
    params, frozen = split_frozen(params)
    if frozen is not None:
      self.save_base(frozen)
    self.mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
        meta=ocp.args.JsonSave(meta)), force=True)
    self.mngr.wait_until_finished()

  def read_meta(self, step: int) -> dict:
    try:
      return self.mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax passes JSON and file errors through without the file
      why = self.damage(step) or f"{type(e).__name__}: {e}"
      raise CheckpointError(f"cannot read the record of checkpoint {self.directory}/{step}: {why}") from e

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
    trained, frozen = split_frozen(params)
    abstract = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, trained)}
    try:
      state = self.mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
          partial_restore=True)))["state"]
    except Exception as e:  # orbax raises assorted types on shape/structure mismatch
      raise CheckpointError(f"cannot restore the params of {self.directory}/{step}: {e}") from e
    return self._with_base(params, state["params"], frozen), meta

  def restore(self, step: int, params, opt_state, model_shape: dict):
    """Restore into the structure/shardings of (params, opt_state); refuse another model shape."""
    meta = self._checked_meta(step, model_shape)
    trained, frozen = split_frozen(params)
    target = {"params": trained, "opt_state": opt_state}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    try:
      state = self.mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract)))["state"]
    except Exception as e:  # orbax raises assorted types on shape/structure mismatch
      raise CheckpointError(f"cannot restore {self.directory}/{step}: {e}") from e
    return self._with_base(params, state["params"], frozen), state["opt_state"], meta

  def _with_base(self, params, trained, frozen):
    """Restored trained params joined with the base item (a LoRA model); else `trained`."""
    if frozen is None:
      return trained
    return join_frozen(params, trained, self.restore_base(frozen))

  def has_base(self) -> bool:
    return os.path.isdir(self.base_path)

  def save_base(self, frozen) -> None:
    """Write a LoRA model's frozen base once (an existing one is kept: it is the run's)."""
    if self.has_base():
      return
    saver = ocp.StandardCheckpointer()
    saver.save(self.base_path, frozen)
    saver.wait_until_finished()
    saver.close()

  def restore_base(self, frozen):
    """The saved frozen base, in the structure and shardings of `frozen`."""
    if not self.has_base():
      raise CheckpointError(f"{self.base_path} is missing: a LoRA run's checkpoints hold the "
                            "adapters only, and its frozen base is saved there once")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, frozen)
    loader = ocp.StandardCheckpointer()
    try:
      return loader.restore(self.base_path, abstract)
    except Exception as e:  # orbax raises assorted types on shape/structure mismatch
      raise CheckpointError(f"cannot restore the frozen base {self.base_path}: {e}") from e
    finally:
      loader.close()

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
