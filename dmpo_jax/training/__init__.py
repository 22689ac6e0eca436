"""The training layer: one RL step as parts a script or notebook can call.

    state = TrainState(params, opt_state, step, key)           # state.py
    rollouts = collect_rollouts(sampler, state.params, items, encoder, key=state.rl_key(), ...)
    state, metrics = update(state, rollouts.batch(data_sh), rl_step)   # update.py

rollout.py  `collect_rollouts` (sampling overlapped with
            host scoring, reward shaping) and its typed result `Rollouts`
update.py   optimizers, micro-batching, `update` (one step of a jitted
            `steps.make_rl_step` / `make_sft_step`)
state.py    `TrainState`, the checkpoint record, the run's random streams
dph.py      DPH-RL pre-sampling, its store, and the step's instances
run.py     the run context (`Run`: config, model, shardings, optimizers, data, outputs), `setup`
stages.py  `train(cfg, workdir)`: SFT, evaluation, DPH pre-sampling, RL, evaluation, results
`python -m dmpo_jax.train` is their command line; docs/ARCHITECTURE.md follows one step.
"""

from dmpo_jax.training.rollout import Rollouts, collect_rollouts
from dmpo_jax.training.state import TrainState
from dmpo_jax.training.update import make_optimizer, update

__all__ = ["Rollouts", "TrainState", "collect_rollouts", "make_optimizer", "update"]
