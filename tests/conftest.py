"""Test setup: 8 forced CPU devices and XLA's backend at -O0 (both before JAX starts; see
tests.helpers.TEST_XLA_FLAGS and production_xla_env), small shapes, fixed seeds.

A persistent compilation cache, fresh for each test session, lets the many small
training runs of the suite (same sampler, same update shapes) compile each program once.
"""

import atexit
import os
import shutil
import tempfile

import pytest

from tests.helpers import TEST_XLA_FLAGS, xla_flags  # noqa: E402 (no JAX import)

_flags = os.environ.get("XLA_FLAGS", xla_flags(8))
os.environ["XLA_FLAGS"] = _flags if "xla_backend_optimization_level" in _flags else f"{_flags} {TEST_XLA_FLAGS}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="dmpo_jax_jit_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory):
  """A random tiny transformers Qwen2.5-VL folder (weights, tokenizer, image processor), built
  once per test process: (torch model, folder). Tests must not modify either."""
  from tests.helpers import tiny_vl_folder
  path = str(tmp_path_factory.mktemp("tiny_vl"))
  return tiny_vl_folder(path), path
