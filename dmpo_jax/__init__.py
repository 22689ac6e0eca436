"""dmpo_jax: RL on language models that keeps the policy from collapsing onto one answer.

DMPO (group-level distribution matching), the DPH-RL f-divergence
regularisers and the usual RLVR baselines, in JAX/Flax NNX, with the ten
NP-Bench tasks. docs/ARCHITECTURE.md describes the layout and the public API.
"""

__version__ = "0.1.0"

import importlib
import importlib.abc
import importlib.util
import sys

# Modules that moved into packages keep their old import paths: `dmpo_jax.pipeline` is the
# very module object `dmpo_jax.training.pipeline` (monkeypatching either patches both).
MOVED = {
    "dmpo_jax.checkpoint": "dmpo_jax.training.checkpoint",
    "dmpo_jax.evaluation": "dmpo_jax.training.evaluation",
    "dmpo_jax.pipeline": "dmpo_jax.training.pipeline",
    "dmpo_jax.report": "dmpo_jax.training.report",
    "dmpo_jax.steps": "dmpo_jax.training.steps",
    "dmpo_jax.sharding": "dmpo_jax.parallel.sharding",
    "dmpo_jax.distributed": "dmpo_jax.parallel.distributed",
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Resolves an old module path to the module at its new one."""

  def find_spec(self, name, path=None, target=None):
    return importlib.util.spec_from_loader(name, self) if name in MOVED else None

  def create_module(self, spec):
    return importlib.import_module(MOVED[spec.name])

  def exec_module(self, module):
    pass


if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
  sys.meta_path.insert(0, _OldPaths())
