"""XLA:CPU's dot throughput at the update's own shapes, float32 against bfloat16, under each
XLA CPU flag set the installed jaxlib accepts, beside torch's matmul.

    nice -n 19 python benchmarks/dot_paths.py                   # every shape, set and dtype
    python benchmarks/dot_paths.py --rows 1024 --reps 1 --seconds 0.5   # a quick check

What decides whether `model.dtype = "auto"` (models/precision.py) is worth it on a CPU: a
bfloat16 dot (float32 accumulation, `preferred_element_type=float32`, as the model's) is
faster only where XLA hands it to a kernel that uses the CPU's bfloat16 instructions
(AVX512-BF16, AMX), and which kernel XLA uses depends on its flags. Each flag set runs in a
subprocess of its own, since XLA reads XLA_FLAGS once, when the backend starts; a set whose
flag the installed jaxlib does not know (XLA aborts: "Unknown flag in XLA_FLAGS") is reported
as not accepted. The kernel each dot compiled to is read from the optimised HLO ("ynn": a
YNNPACK fusion, "xnn": XNNPACK, "onednn": a oneDNN call, "dot": XLA's own dot emitter).

Shapes (rows M of tokens x [K x N] weight, M = --rows, default 8192): the SmolLM2-135M MLP
projection [576 x 1536] and its output projection (lm head) [576 x 49152], and the test
model's [256 x 512] (benchmarks/sampler.py's DEFAULT_CONFIG: hidden 256). --backward adds each
weight's two backward dots (dx = dy @ w.T, dw = x.T @ dy).

Printed per shape: GFLOP/s of each path (the best of up to --reps timed calls after one
untimed call, stopping after --seconds), its ratio to XLA's default float32 dot measured in
the same run, and its accuracy: the largest |error| over the first --check_rows rows of the
output, relative to the largest |reference|, where the reference is numpy float64 on the same
(for bfloat16: bfloat16-rounded) inputs; `exact` when that is within TOLERANCE, the same bound
for every path (float32 accumulation over K <= 576 stays near 1e-7; a bfloat16 accumulation
or a bfloat16 output is ~1e-3). `err_vs_f32_inputs` adds the inputs' own bfloat16 rounding.
torch's bfloat16 matmul returns bfloat16 (its CPU matmul has no float32 output for bfloat16
inputs), so its error includes that rounding. Last line: one JSON object.

Timings are only meaningful on otherwise idle cores: the report says nothing about contention.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

# name -> XLA_FLAGS. "default" is XLA's choice (on jaxlib 0.10: YNNPACK fusions for dots);
# the others switch one path on or off. Sets the jaxlib does not accept are reported as such.
FLAG_SETS = {
    "default": "",
    "no_ynn": "--xla_cpu_experimental_ynn_fusion_type=",  # XLA's own dot emitter
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn_dot": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot",
    "xnn_dot": "--xla_cpu_experimental_xnn_fusion_type=dot --xla_cpu_experimental_ynn_fusion_type=",
}
SHAPES = {"smollm2_mlp": (576, 1536), "smollm2_lm_head": (576, 49152), "test_model": (256, 512)}
TOLERANCE = 1e-5  # max |error| / max |reference| for "exact", every path alike
DTYPES = ("float32", "bfloat16")


def dots(k: int, n: int, backward: bool):
  """(label, fn(M) -> (lhs shape, rhs shape)) of a weight [K, N]'s dots: the forward
  x [M, K] @ w [K, N], and with `backward` dx = dy [M, N] @ w.T [N, K] and
  dw = x.T [K, M] @ dy [M, N]."""
  out = [("fwd", lambda m: ((m, k), (k, n)))]
  if backward:
    out += [("dx", lambda m: ((m, n), (n, k))), ("dw", lambda m: ((k, m), (m, n)))]
  return out


def operands(m: int, shapes, seed: int):
  """Deterministic float32 operands (unit-variance outputs), the same in every process."""
  lhs, rhs = shapes(m)
  rng = np.random.default_rng(seed)
  a = rng.standard_normal(lhs, np.float32)
  b = (rng.standard_normal(rhs, np.float32) / np.sqrt(rhs[0])).astype(np.float32)
  return a, b


def bf16_round(x):
  """float32 -> bfloat16 -> float32 (ml_dtypes, a jax dependency: no XLA backend starts)."""
  import ml_dtypes
  return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def cases(args):
  """[(case name, M, shapes fn, seed)] in the order they are printed."""
  out = []
  for i, name in enumerate(args.shapes):
    k, n = SHAPES[name]
    for j, (label, shapes) in enumerate(dots(k, n, args.backward)):
      out.append((f"{name}.{label}", args.rows, shapes, 1000 * i + j))
  return out


def references(args, folder: str) -> None:
  """float64 references of each case's first --check_rows output rows, for float32 inputs and
  for their bfloat16 rounding, saved to `folder` (made once, read by every subprocess)."""
  for name, m, shapes, seed in cases(args):
    a, b = operands(m, shapes, seed)
    r = min(args.check_rows, a.shape[0])
    for dtype in DTYPES:
      ar, br = (a[:r], b) if dtype == "float32" else (bf16_round(a[:r]), bf16_round(b))
      np.save(os.path.join(folder, f"{name}.{dtype}.npy"), ar.astype(np.float64) @ br.astype(np.float64))


def error(y, folder: str, name: str, dtype: str) -> dict:
  """The output's first rows against the float64 references (see the module docstring)."""
  out = {}
  for ref_dtype, key in ((dtype, "max_rel_err"), ("float32", "err_vs_f32_inputs")):
    ref = np.load(os.path.join(folder, f"{name}.{ref_dtype}.npy"))
    got = np.asarray(y[:ref.shape[0]], np.float64)
    out[key] = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
  out["exact"] = out["max_rel_err"] <= TOLERANCE
  return out


def timed(call, reps: int, seconds: float) -> float:
  """Best seconds of up to `reps` calls after an untimed one, stopping once `seconds` pass."""
  call()
  best, start = float("inf"), time.perf_counter()
  for _ in range(max(reps, 1)):
    t0 = time.perf_counter()
    call()
    best = min(best, time.perf_counter() - t0)
    if time.perf_counter() - start > seconds:
      break
  return best


def kernel(hlo: str) -> str:
  """Which kernel a compiled dot runs, from its optimised HLO text."""
  for marker, name in (("ynn_fusion", "ynn"), ("xnn_fusion", "xnn"), ("onednn", "onednn")):
    if marker in hlo:
      return name
  return "dot" if re.search(r"\bdot\(", hlo) else "other"


def run_xla(args, folder: str) -> dict:
  """This process's XLA (XLA_FLAGS as the parent set it): every case in both dtypes."""
  import jax
  import jax.numpy as jnp
  out = {}
  for name, m, shapes, seed in cases(args):
    a, b = operands(m, shapes, seed)
    flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    for dtype in DTYPES:
      x, w = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
      f = jax.jit(lambda x, w: jnp.matmul(x, w, preferred_element_type=jnp.float32))
      compiled = f.lower(x, w).compile()
      seconds = timed(lambda: compiled(x, w).block_until_ready(), args.reps, args.seconds)
      y = compiled(x, w)
      row = {"gflops": flops / seconds / 1e9, "seconds": seconds,
             "kernel": kernel(compiled.as_text()), "out_dtype": str(y.dtype)}
      row.update(error(y, folder, name, dtype))
      del y
      out[f"{name}/{dtype}"] = row
  return out


def run_torch(args, folder: str) -> dict:
  import torch
  out = {"threads": torch.get_num_threads()}
  for name, m, shapes, seed in cases(args):
    a, b = operands(m, shapes, seed)
    flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    for dtype in DTYPES:
      td = getattr(torch, dtype)
      x, w = torch.from_numpy(a).to(td), torch.from_numpy(b).to(td)
      with torch.inference_mode():
        seconds = timed(lambda: torch.matmul(x, w), args.reps, args.seconds)
        y = torch.matmul(x, w)
      row = {"gflops": flops / seconds / 1e9, "seconds": seconds, "kernel": "torch",
             "out_dtype": str(y.dtype).replace("torch.", "")}
      row.update(error(y.float().numpy(), folder, name, dtype))
      out[f"{name}/{dtype}"] = row
  return out


def child(path: str, args, folder: str, env: dict) -> dict:
  """Run this file as `--child path` in a fresh process with `env`; its last stdout line."""
  argv = [sys.executable, os.path.abspath(__file__), "--child", path, "--refs", folder,
          "--rows", str(args.rows), "--reps", str(args.reps), "--seconds", str(args.seconds),
          "--check_rows", str(args.check_rows), "--shapes", ",".join(args.shapes)]
  argv += ["--backward"] if args.backward else []
  run = subprocess.run(argv, env=env, capture_output=True, text=True)
  if run.returncode != 0:
    tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
    return {"error": " | ".join(tail)[-400:]}
  return json.loads(run.stdout.strip().splitlines()[-1])


def accepts(flags: str) -> tuple[bool, str]:
  """Whether the installed jaxlib starts with these XLA_FLAGS (XLA aborts on unknown flags)."""
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  run = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(2).block_until_ready()"],
                       env=env, capture_output=True, text=True)
  last = (run.stderr.strip().splitlines() or [""])[-1]
  return run.returncode == 0, last[-300:]


def report(results: dict, args) -> None:
  """The table: per case, each path's GFLOP/s, ratio to XLA default float32, accuracy."""
  for name, *_ in cases(args):
    base = results.get("xla:default", {}).get(f"{name}/float32", {}).get("gflops")
    print(f"\n{name}: [{args.rows} x {SHAPES[name.split('.')[0]][0]}] weight "
          f"{SHAPES[name.split('.')[0]]}, base = XLA default float32"
          + (f" ({base:.1f} GFLOP/s)" if base else " (not measured)"))
    print(f"  {'path':22s} {'dtype':9s} {'kernel':7s} {'GFLOP/s':>8s} {'x base':>7s} "
          f"{'rel err':>9s} {'exact':>5s} {'vs f32 in':>9s}")
    for path, res in results.items():
      for dtype in DTYPES:
        r = res.get(f"{name}/{dtype}")
        if r is None:
          continue
        ratio = f"{r['gflops'] / base:7.2f}" if base else "      -"
        print(f"  {path:22s} {dtype:9s} {r['kernel']:7s} {r['gflops']:8.1f} {ratio} "
              f"{r['max_rel_err']:9.1e} {str(r['exact']):>5s} {r['err_vs_f32_inputs']:9.1e}")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rows", type=int, default=8192, help="M: token rows of every dot")
  ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated of {list(SHAPES)}")
  ap.add_argument("--sets", default=",".join(FLAG_SETS), help=f"XLA flag sets of {list(FLAG_SETS)}")
  ap.add_argument("--reps", type=int, default=5, help="timed calls at most (best is kept)")
  ap.add_argument("--seconds", type=float, default=3.0, help="stop timing a case after this")
  ap.add_argument("--check_rows", type=int, default=128, help="output rows checked against float64")
  ap.add_argument("--backward", action="store_true", help="also dx = dy @ w.T and dw = x.T @ dy")
  ap.add_argument("--no_torch", action="store_true")
  ap.add_argument("--child", help=argparse.SUPPRESS)
  ap.add_argument("--refs", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  args.shapes = [s for s in args.shapes.split(",") if s]
  unknown = [s for s in args.shapes if s not in SHAPES]
  if unknown:
    ap.error(f"--shapes: unknown {unknown}; choose from {list(SHAPES)}")
  if args.child:  # one path, in this process
    run = run_torch if args.child == "torch" else run_xla
    print(json.dumps(run(args, args.refs)))
    return 0
  sets = [s for s in args.sets.split(",") if s]
  bad = [s for s in sets if s not in FLAG_SETS]
  if bad:
    ap.error(f"--sets: unknown {bad}; choose from {list(FLAG_SETS)}")
  if "default" not in sets:
    sets.insert(0, "default")  # the base every ratio is against
  results, notes = {}, {}
  with tempfile.TemporaryDirectory(prefix="dot_paths_") as folder:
    t0 = time.perf_counter()
    references(args, folder)
    print(f"float64 references: {time.perf_counter() - t0:.1f} s; {os.cpu_count()} CPUs", flush=True)
    for s in sets:
      ok, why = accepts(FLAG_SETS[s])
      if not ok:
        notes[s] = f"not accepted by this jaxlib: {why}"
        print(f"xla:{s} [{FLAG_SETS[s]}]: {notes[s]}", flush=True)
        continue
      env = dict(os.environ, XLA_FLAGS=FLAG_SETS[s], JAX_PLATFORMS="cpu")
      t0 = time.perf_counter()
      res = child("xla", args, folder, env)
      print(f"xla:{s} [{FLAG_SETS[s] or 'no flags'}]: {time.perf_counter() - t0:.0f} s"
            + (f", failed: {res['error']}" if "error" in res else ""), flush=True)
      (notes if "error" in res else results)[f"xla:{s}"] = res.get("error", res)
    if not args.no_torch:
      env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
      res = child("torch", args, folder, env)
      if "error" in res:
        notes["torch"] = res["error"]
        print(f"torch: failed: {res['error']}")
      else:
        results[f"torch ({res.pop('threads')} threads)"] = res
  report(results, args)
  print(json.dumps({"rows": args.rows, "jaxlib": importlib.metadata.version("jaxlib"), "tolerance": TOLERANCE,
                    "flag_sets": {s: FLAG_SETS[s] for s in sets}, "results": results, "notes": notes}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
