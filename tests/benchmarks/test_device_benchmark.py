"""benchmarks/device.py: its tiny CPU case runs from the source tree, writes every section's
JSON, and imports none of the packages a bare accelerator machine may lack."""

import json
import os
import subprocess
import sys

import pytest
from tests.helpers import REPO

ROOT = REPO
# Installed here but not on a machine that has only jax, flax, optax, orbax, transformers, numpy
# (absl comes with optax; transformers is allowed there but must not be needed).
NOT_THERE = {"ml_collections", "tqdm", "matplotlib", "ortools", "tensorboardX", "torch",
             "chex", "PIL", "safetensors", "tokenizers", "transformers"}


@pytest.mark.slow
def test_device_benchmark_tiny_case_from_source_tree(tmp_path):
  script = (
      "import sys, json\n"
      "sys.path.insert(0, 'benchmarks')\n"
      "import device\n"
      f"code = device.main(['--out', {str(tmp_path)!r}, '--tiny', '--reps', '1'])\n"
      "top = {m.split('.')[0] for m in sys.modules}\n"
      f"print('IMPORTED', json.dumps(sorted(top & set({sorted(NOT_THERE)!r}))))\n"
      "sys.exit(code)\n")
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
  lines = run.stdout.strip().splitlines()
  assert json.loads(lines[-1].split("IMPORTED ", 1)[1]) == []
  last = json.loads(lines[-2])  # the benchmark's last line: every section
  for name in ("env", "rollout_tiny", "update_tiny", "update_lora_tiny", "attention_tiny"):
    on_disk = json.loads((tmp_path / f"{name}.json").read_text())
    assert on_disk == last[name]
    assert "error" not in on_disk, on_disk
  assert last["rollout_tiny"]["tokens_per_s"] > 0
  assert last["update_tiny"]["planned_update_peak_bytes"] > 0
  full, lora = last["update_tiny"], last["update_lora_tiny"]
  assert (full["lora_rank"], lora["lora_rank"]) == (0, 4)
  assert 0 < lora["trained_params"] < full["trained_params"] / 4  # the adapters alone train
  assert 0 < lora["planned_update_peak_bytes"] < full["planned_update_peak_bytes"]
  assert set(last["attention_tiny"]["cores"]) == {"reference", "xla"}
