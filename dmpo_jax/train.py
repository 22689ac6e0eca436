r"""Train a policy on the NP tasks: SFT warm start, DPH pre-sampling, RL, evaluation.

    python -m dmpo_jax.train --config=configs/nphard.py --workdir=runs/default
    python -m dmpo_jax.train --config=configs/nphard.py:algo=grpo --workdir=runs/grpo \
        --config.rl.steps=100

`train` reads top to bottom: setup -> SFT -> evaluation before RL -> DPH
pre-sampling (dph_* presets) -> RL -> evaluation after RL -> table, plots,
HF export. One RL step is `training.collect_rollouts` then `training.update`
(docs/ARCHITECTURE.md follows it file by file). Every stage resumes from the
workdir: checkpoints (orbax) hold the train state (params, optimizer state,
step, PRNG key, counters; the data position is the step, since data is a
pure function of (seed, step)) and, for objectives that read one, the
reference policy; finished evaluations and the DPH store are files.
SIGINT/SIGTERM save a checkpoint and exit cleanly.
The config is checked before anything is built or written (the memory estimate
of training/memory.py included; --dry_run runs the same checks), and a rerun must
match the workdir's config.json (training/config.py; --allow_config_change for
logging and checkpoint cadence); bad input is one line and exit status 2.

Workdir: config.json, checkpoints/ (steps, and reference/), metrics.jsonl,
tb/, eval_before.json, eval_after.json, results.json, dph_store.npz,
training.png, before_after.png, hf/ (the final policy as a Hugging Face folder); stopped.json
instead of results.json when the start of RL is outside config.eval.start_bounds (the run
stops before RL with one line and exit status 2; docs/TRAINING.md).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from dmpo_jax.parallel import distributed as dist
from dmpo_jax.parallel import sharding
from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.training import config as config_lib
from dmpo_jax.training import specs
from dmpo_jax.data import instances
from dmpo_jax.training.config import ConfigError, task_keys
from dmpo_jax.training.run import TrainingError, objective_from_config
from dmpo_jax.training.stages import train

FLAGS = flags.FLAGS


def define_flags(fv=FLAGS, argv=None):
  """CLI flags (defined only when run as a program, so other tools can import this module;
  tests pass their own FlagValues and the argv whose --config.<field> overrides apply)."""
  config_flags.DEFINE_config_file("config", None, "Training config (a .py file).", flag_values=fv,
                                  lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "Output folder; an existing run there is resumed.", flag_values=fv)
  flags.DEFINE_list("allow_config_change", [], "fields a resume may change (logging, checkpoint "
                    "cadence, mesh: training/config.py SAFE_TO_CHANGE)", flag_values=fv)
  flags.DEFINE_bool("verbose", False, "print the traceback of an error, not only its message",
                    flag_values=fv)
  flags.DEFINE_string("coordinator_address", None, "multi-process: host:port of process 0 "
                      "(or JAX_COORDINATOR_ADDRESS; automatic on TPU pods and SLURM)", flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "multi-process: number of processes (or JAX_NUM_PROCESSES)",
                       flag_values=fv)
  flags.DEFINE_integer("process_id", None, "multi-process: this process's index (or JAX_PROCESS_ID)",
                       flag_values=fv)
  flags.DEFINE_bool("dry_run", False, "check the config as training does (memory estimate "
                    "included), write workdir/instances.json (every SFT, RL and evaluation "
                    "instance, in order) and stop, without building a model", flag_values=fv)


# The project's own errors: bad input or a workdir that cannot be used. The CLI prints them as one
# line and exits with USAGE (the traceback with --verbose).
BAD_INPUT = (ConfigError, TrainingError, ckpt_lib.CheckpointError, ValueError, KeyError)
USAGE = 2


def fail(e: BaseException, verbose: bool = False) -> None:
  if verbose:
    import traceback
    traceback.print_exception(e)
  msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
  print(f"error: {msg}", file=sys.stderr, flush=True)
  sys.exit(USAGE)


def parse_flags(argv, fv=FLAGS):
  """absl's parser, with a bad --config.<field> (unknown, wrong type, a config argument the
  file refuses) as one line and exit status 2 instead of a traceback."""
  try:
    return fv(argv)
  except Exception as e:  # config_flags raises assorted types while it applies overrides
    fail(ConfigError(config_lib.flag_error(e, argv)), "--verbose" in argv)


def check(cfg) -> None:
  """The config checks `training.run.setup` runs before it builds or writes anything (field
  types and ranges, the rules between fields, the memory estimate, the evaluation points):
  what --dry_run runs before it writes instances.json."""
  config_lib.check_fields(cfg)  # before the objective and the mesh read the fields
  config_lib.check_config(cfg, objective_from_config(cfg), sharding.make_mesh(dict(cfg.mesh)))
  specs.check_points(cfg)


def main(argv, fv=FLAGS):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if fv.config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/nphard.py")
  if not fv.workdir:
    raise app.UsageError("--workdir is required")
  if "verbosity" in fv and not fv["verbosity"].present:  # orbax logs every save at INFO
    logging.set_verbosity(logging.WARNING)
  try:
    if fv.dry_run:
      check(fv.config)
      cfg = fv.config
      rows = instances.write(specs.instances_spec(cfg), specs.taskset(cfg, task_keys(cfg)),
                             fv.workdir)
      print(instances.summary(rows))
      return
  except BAD_INPUT as e:
    fail(e, fv.verbose)
  dist.initialize(fv.coordinator_address, fv.num_processes, fv.process_id)
  try:
    train(fv.config, fv.workdir, fv.allow_config_change)
  except BAD_INPUT as e:
    fail(e, fv.verbose)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
