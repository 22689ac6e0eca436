"""The train state, its checkpoint record, and the run's fixed random streams.

A run is a pure function of (config, seed): the data of a step is a function
of (seed, step) (`pipeline.TaskSet`), and every random draw folds a fixed
stream number into the run's key `jax.random.key(seed)`. The numbers below
are part of a run's identity: changing one changes every result.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

LOG_Z_SEED_OFFSET = 1    # FlowRL's log Z head is initialised from jax.random.key(seed + 1)
EVAL_STREAM = 10**6      # evaluation sampling: fold_in(key, EVAL_STREAM)
DPH_STREAM = 2 * 10**6   # DPH pre-sampling of prompts c0...: fold_in(key, DPH_STREAM + c0)
# RL step s (global step) samples with fold_in(key, s), rollout chunk c with fold_in(that, c).


@dataclasses.dataclass
class TrainState:
  """What a checkpoint saves and a resume restores.

  params: {"model": nnx.State[, "log_z": head]}; opt_state: optax state;
  step: the global step (SFT then RL; also the data position); key: the run's
  PRNG key; counters: nonfinite_total and accumulated stage times;
  reference: the policy at the start of RL for objectives that read one
  (a separate checkpoint item, see `checkpoint.Checkpointer.save_reference`).
  """
  params: dict
  opt_state: Any
  step: int
  key: jax.Array
  counters: dict = dataclasses.field(default_factory=lambda: {"nonfinite_total": 0})
  reference: dict | None = None

  def rl_key(self) -> jax.Array:
    """The sampling key of the RL step about to run."""
    return jax.random.fold_in(self.key, self.step)

  def eval_key(self) -> jax.Array:
    return jax.random.fold_in(self.key, EVAL_STREAM)

  def dph_key(self, first_prompt: int) -> jax.Array:
    return jax.random.fold_in(self.key, DPH_STREAM + first_prompt)


def checkpoint_meta(state: TrainState, stage: str, config_json: dict, model_shape: dict,
                    precision: dict | None = None) -> dict:
  """The JSON record saved next to params and optimizer state; config_json: the run's config
  as config.json holds it (`config.config_json`); precision: the compute dtype it trained in
  (`models.precision.Precision.record`: what model.dtype = "auto" resolved to, and why)."""
  meta = {"step": state.step, "stage": stage, "seed": config_json["seed"],
          "rng_key": np.asarray(jax.random.key_data(state.key)).tolist(),
          "data_position": state.step, "model_shape": model_shape,
          "counters": state.counters, "config": config_json}
  if precision is not None:
    meta["precision"] = precision
  return meta
