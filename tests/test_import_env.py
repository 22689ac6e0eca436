"""Importing the package sets no XLA flags: XLA_FLAGS is read once, when the backend starts,
so the command lines and benchmarks set it (before JAX starts), never a module on import."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

# Import every module of the package (command lines included), then report XLA_FLAGS.
SCRIPT = """
import json, os, pkgutil, importlib
import dmpo_jax
names = sorted(m.name for m in pkgutil.walk_packages(dmpo_jax.__path__, "dmpo_jax."))
for name in names:
  importlib.import_module(name)
print(json.dumps({"modules": len(names), "XLA_FLAGS": os.environ.get("XLA_FLAGS")}))
"""


@pytest.mark.parametrize("flags", [None, "--xla_force_host_platform_device_count=2"])
def test_importing_every_module_leaves_xla_flags_unchanged(flags):
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  if flags is not None:
    env["XLA_FLAGS"] = flags
  run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  out = json.loads(run.stdout.strip().splitlines()[-1])
  assert out["modules"] > 50  # the walk found the package, not an empty path
  assert out["XLA_FLAGS"] == flags
