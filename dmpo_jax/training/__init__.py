"""The training layer: one RL step as parts a script or notebook can call.

    state = TrainState(params, opt_state, step, key)           # state.py
    rollouts = collect_rollouts(sampler, state.params, items, encoder, rng=state.rl_key(), ...)
    state, metrics = update(state, rollouts.batch(data_sh), rl_step)   # steps.py

rollout.py     `collect_rollouts` (sampling overlapped with host scoring, reward shaping) and
               its typed result `Rollouts`
steps.py       log-probs, the jitted SFT and RL steps (`make_sft_step`, `make_rl_step`),
               optimizers, micro-batching, and `update` (one step on a batch)
state.py       `TrainState`, the checkpoint record, the run's random streams
dph.py         DPH-RL pre-sampling, its store, and the step's instances
run.py         the run context (`Run`: config, objective, shardings, optimizers, data, outputs),
               `setup`
stages.py      `train(cfg, workdir)`: SFT, evaluation, DPH pre-sampling, RL, evaluation, results
specs.py       the config compiled once at setup: the typed specs the modules below read
config.py      the config schema, check_config, the resume contract, config files by path
memory.py      the memory estimate check_config refuses absurd sizes by (through parallel/plan.py)
evaluation.py  SR/QR, pass@k and diversity on held-out instances; points.py along RL
perception.py  an image policy's perception stage (transcribing the image) and its scores
checkpoint.py  orbax checkpoints; report.py metrics, JSON files, plots
lock.py        the workdir's lock: one run at a time writes a workdir
`python -m dmpo_jax.train` is their command line; docs/ARCHITECTURE.md follows one step.
"""

from dmpo_jax.training.rollout import Rollouts, collect_rollouts
from dmpo_jax.training.state import TrainState
from dmpo_jax.training.steps import make_optimizer, update

__all__ = ["Rollouts", "TrainState", "collect_rollouts", "make_optimizer", "update"]
