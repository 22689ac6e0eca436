"""models/precision.py: what model.dtype = "auto" computes in on simulated hardware (CPU flags
both ways, GPU compute capabilities, TPUs, unreadable machines), and a model built from a
config with "auto" on a simulated bfloat16 CPU."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from dmpo_jax.models import build as model_build
from dmpo_jax.models import precision
from dmpo_jax.models.precision import Backend
from dmpo_jax.training import specs
from tests.helpers import smoke

# An AVX2 machine's flags (no native bfloat16), and with each bfloat16 flag added.
PLAIN = frozenset("fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni".split())


def _dtype(backend):
  return precision.resolve("auto", backend).dtype


@pytest.mark.parametrize("flag", ["amx_bf16", "avx512_bf16"])
def test_auto_on_cpu_follows_the_bf16_flags(flag):
  assert _dtype(Backend("cpu", cpu_flags=PLAIN)) == "float32"
  p = precision.resolve("auto", Backend("cpu", cpu_flags=PLAIN | {flag}))
  assert (p.requested, p.dtype) == ("auto", "bfloat16") and flag in p.reason
  # and back: the same machine without the flag
  assert _dtype(Backend("cpu", cpu_flags=(PLAIN | {flag}) - {flag})) == "float32"


def test_auto_on_cpu_with_unreadable_flags_is_float32():
  p = precision.resolve("auto", Backend("cpu", cpu_flags=None))  # macOS: no /proc/cpuinfo
  assert p.dtype == "float32" and "unreadable" in p.reason


@pytest.mark.parametrize("capability,expected", [
    ("7.0", "float32"), ("7.5", "float32"), ("8.0", "bfloat16"), ("8.6", "bfloat16"),
    ("9.0", "bfloat16"), ("10.0", "bfloat16"), ("12", "bfloat16"), (None, "float32"),
    ("gfx90a", "float32")])
def test_auto_on_gpu_follows_the_compute_capability(capability, expected):
  # 10.0 > 8.0 as versions, not as strings ("10.0" < "8.0"); None and "gfx90a": a GPU that
  # reports no CUDA capability (ROCm) keeps float32
  assert _dtype(Backend("gpu", compute_capability=capability)) == expected


def test_auto_on_tpu_and_unknown_platforms():
  assert _dtype(Backend("tpu")) == "bfloat16"
  assert _dtype(Backend("METAL")) == "float32"


def test_an_explicit_dtype_is_kept_whatever_the_hardware():
  for dtype in ("float32", "bfloat16", "float16"):
    for b in (Backend("cpu", cpu_flags=PLAIN), Backend("gpu", compute_capability="9.0")):
      assert precision.resolve(dtype, b).dtype == dtype


def test_read_cpu_flags(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nmodel name\t: x\nflags\t\t: fpu avx2 avx512_bf16\n\n"
                  "processor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n")
  assert precision.read_cpu_flags(str(info)) == frozenset({"fpu", "avx2", "avx512_bf16"})
  arm = tmp_path / "arm"
  arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")  # no x86 flags line
  assert precision.read_cpu_flags(str(arm)) is None
  assert precision.read_cpu_flags(str(tmp_path / "missing")) is None


def test_local_backend_reads_this_machine():
  b = precision.local_backend()
  assert b.platform == jax.devices()[0].platform
  if b.platform == "cpu":
    assert b.cpu_flags == precision.read_cpu_flags()


@pytest.mark.parametrize("flags,dtype", [pytest.param(PLAIN | {"avx512_bf16"}, "bfloat16", marks=pytest.mark.slow),
                                         (PLAIN, "float32")])
def test_a_model_built_with_auto_computes_as_resolved_on_float32_params(monkeypatch, flags, dtype):
  """The config path: config.model.dtype = "auto" -> specs.model_spec (which reads the machine)
  -> build. On a simulated bfloat16 CPU the activations are bfloat16, the parameters float32
  and the logits float32; on a CPU without the flags everything is float32."""
  monkeypatch.setattr(precision, "read_cpu_flags", lambda path="/proc/cpuinfo": flags)
  cfg = smoke(**{"model.dtype": "auto"})
  assert cfg.model.param_dtype == "float32"
  spec = specs.model_spec(cfg)
  assert spec.dtype == dtype
  model, _ = model_build.build(spec)
  assert model.cfg.dtype == dtype
  params = nnx.state(model, nnx.Param)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  tokens = jnp.ones((2, 5), jnp.int32)
  h, _ = model.hidden(tokens)
  assert h.dtype == jnp.dtype(dtype)  # the compute dtype
  assert model(tokens).dtype == jnp.float32  # logits: float32 accumulation


def test_memory_plans_size_auto_as_the_target_backend_resolves_it():
  """parallel/plan.py (--config): "auto" on this machine's backend is what a run here computes
  in; on another it is judged by the platform alone (a GPU of unknown capability: float32,
  the larger plan)."""
  from dmpo_jax.parallel import plan
  here = jax.default_backend()
  assert plan.planned_dtype("auto", here) == precision.resolve("auto").dtype
  if here == "cpu":  # the suite's backend (tests/conftest.py)
    assert plan.planned_dtype("auto", "tpu") == "bfloat16"
    assert plan.planned_dtype("auto", "gpu") == "float32"
  assert plan.planned_dtype("bfloat16", "cpu") == "bfloat16"


# --- python -m dmpo_jax.evaluate --hf=... --dtype -------------------------------------------------

def test_evaluate_refuses_an_unknown_dtype_and_dtype_with_a_workdir(tmp_path, capsys):
  """Before a model loads (the folders need not exist): one line naming the flag and the choices."""
  from tests.helpers import run_evaluate
  code, _, err = run_evaluate([f"--hf={tmp_path}/none", "--dtype=float64", f"--out={tmp_path}/o"],
                              capsys)
  assert code == 2 and "--dtype='float64': choose one of ['float32', 'bfloat16', 'float16', 'auto']" in err
  code, _, err = run_evaluate([f"--workdir={tmp_path}/none", "--dtype=auto", f"--out={tmp_path}/o"],
                              capsys)
  assert code == 2 and "--dtype applies to --hf models" in err, err


@pytest.mark.slow  # builds and samples a tiny model, twice
def test_evaluate_dtype_auto_resolves_prints_and_records(tmp_path, capsys, monkeypatch):
  """--dtype=auto on a simulated AMX CPU: resolved by models/precision.py (through
  `local_backend`'s CPU flags) to bfloat16, which the model is loaded in; the line printed once
  and eval.json's "precision" say so (with the weights' dtype, the compute dtype here). The
  default, float32, is recorded as set by --dtype."""
  import json
  from dmpo_jax.models import hf, tokenizer as tokenizer_lib
  from tests.helpers import run_evaluate, tiny_hf
  tok = tokenizer_lib.build(str(tmp_path / "model"))
  tiny_hf(str(tmp_path / "model"), vocab=len(tok))
  monkeypatch.setattr(precision, "read_cpu_flags", lambda path="/proc/cpuinfo": PLAIN | {"amx_bf16"})
  loaded, load = [], hf.load
  monkeypatch.setattr(hf, "load", lambda path, **kw: loaded.append(kw["dtype"]) or load(path, **kw))
  argv = [f"--hf={tmp_path}/model", "--tasks=knapsack", "--num=1", "--samples=1", "--k=1",
          "--max_new_tokens=4", "--batch_prompts=1", "--style=compact"]
  for extra, dtype, reason in ((["--dtype=auto"], "bfloat16", "CPU flags amx_bf16"),
                               ([], "float32", "set explicitly by --dtype")):
    out_dir = tmp_path / f"out_{dtype}"
    code, out, err = run_evaluate(argv + extra + [f"--out={out_dir}"], capsys)
    assert code == 0, err
    assert loaded.pop() == dtype and not loaded
    requested = "auto" if extra else "float32"
    line = f"compute dtype {dtype} (--dtype={requested!r}: {reason}"
    assert out.count("compute dtype ") == 1 and line in out, out
    record = json.loads((out_dir / "eval.json").read_text())["precision"]
    # hf.load stores the weights in the compute dtype (its param_dtype default)
    assert record == {"requested": requested, "dtype": dtype, "param_dtype": dtype,
                      "reason": record["reason"]} and reason in record["reason"]
