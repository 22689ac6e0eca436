r"""Bit-identity check of a behaviour-neutral change: smoke runs of presets with the code of two
source trees, compared file by file (issue 42: "smoke metrics and results must be bit-identical
before and after, for every preset, in float32 on one machine").

    python scripts/identity_check.py --before=/path/to/old/checkout [--after=.] \
        [--cache=/tmp/identity_before] [--cases=grpo,dmpo,...]

Each case is one `python -m dmpo_jax.train ... --smoke`-config run (configs/collapse.py:smoke,
which has 2 evaluation points along RL; `mm` is configs/mm_nphard.py:smoke with one perception
step) with PYTHONPATH and the working directory set to the tree. The "before" outputs are
computed once and kept under --cache/<case>/ (delete it to recompute). Compared: every row of
metrics.jsonl, results.json, eval_*.json, points/*.json, perception.json and the arrays of
dph_store.npz, ignoring wall-clock fields (keys ending in "_s", "times_s", "wall_s"). Prints
each differing field and, last, the count; exits 1 when any differ.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np

COLLAPSE = "configs/collapse.py:smoke,algo={}"
# name -> (config, extra --config.<field>=<value> overrides)
CASES = {
    "grpo": (COLLAPSE.format("grpo"), ()),
    "dmpo": (COLLAPSE.format("dmpo"), ()),
    "dph_f": (COLLAPSE.format("dph_f"), ()),                  # the DPH stage (its store is
                                                              # empty at smoke size)
    "rkl": (COLLAPSE.format("rkl"), ()),                      # KL to the reference policy
    "kl_cov": (COLLAPSE.format("kl_cov"), ()),
    "passk": (COLLAPSE.format("passk"), ()),
    "outcome_ucb": (COLLAPSE.format("outcome_ucb"), ()),      # host reward-shaping state
    "mm": ("configs/mm_nphard.py:smoke", ("--config.perception.steps=1",)),  # image prompts
}
FAST = ("--config.log.tensorboard=False", "--config.log.plots=False",
        "--config.checkpoint.export_hf=False", "--config.log.progress=False")
TIME_KEYS = {"times_s", "wall_s", "time", "elapsed"}


def run_case(tree: str, name: str, out: str) -> None:
  """The case's smoke run with `tree`'s code into `out` (replaced)."""
  config, extra = CASES[name]
  shutil.rmtree(out, ignore_errors=True)
  env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), JAX_PLATFORMS="cpu")
  cmd = ["nice", "-n", "15", sys.executable, "-m", "dmpo_jax.train", f"--config={config}",
         f"--workdir={os.path.abspath(out)}", *FAST, *extra]
  r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
  if r.returncode:
    raise SystemExit(f"{name} in {tree} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def is_time(key: str) -> bool:
  return key in TIME_KEYS or key.endswith("_s")


def diff(a, b, where: str, out: list) -> None:
  """Append 'where: a != b' for every differing leaf (wall-clock keys skipped)."""
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b), key=str):
      if is_time(str(k)):
        continue
      if k not in a or k not in b:
        out.append(f"{where}.{k}: only in {'after' if k in b else 'before'}")
      else:
        diff(a[k], b[k], f"{where}.{k}", out)
  elif isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b):
      out.append(f"{where}: length {len(a)} != {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
      diff(x, y, f"{where}[{i}]", out)
  elif isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
    pass
  elif a != b or type(a) is not type(b):
    out.append(f"{where}: {a!r} != {b!r}")


def outputs(workdir: str) -> dict:
  """{relative file: content} of the compared files of a run's workdir."""
  got = {}
  for rel in ["results.json", "perception.json"] + sorted(
      os.path.relpath(p, workdir) for p in glob.glob(os.path.join(workdir, "eval_*.json")) +
      glob.glob(os.path.join(workdir, "points", "*.json"))):
    p = os.path.join(workdir, rel)
    if os.path.exists(p):
      got[rel] = json.load(open(p))
  p = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(p):
    got["metrics.jsonl"] = [json.loads(line) for line in open(p) if line.strip()]
  p = os.path.join(workdir, "dph_store.npz")
  if os.path.exists(p):
    z = np.load(p)
    got["dph_store.npz"] = {k: z[k].tolist() for k in z.files}
  return got


def compare(before: str, after: str) -> list[str]:
  a, b = outputs(before), outputs(after)
  out = []
  diff(a, b, "", out)
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--before", required=True, help="source tree of the reference code")
  p.add_argument("--after", default=".", help="source tree of the changed code")
  p.add_argument("--cache", default="/tmp/identity_before", help="the before runs (kept)")
  p.add_argument("--work", default="/tmp/identity_after", help="the after runs (replaced)")
  p.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
  args = p.parse_args(argv)
  total = 0
  for name in args.cases.split(","):
    ref = os.path.join(args.cache, name)
    if not os.path.exists(os.path.join(ref, "results.json")):
      run_case(args.before, name, ref)
    new = os.path.join(args.work, name)
    run_case(args.after, name, new)
    found = compare(ref, new)
    files = sorted(outputs(new))
    print(f"{name}: {len(found)} differing fields ({', '.join(files)})", flush=True)
    for line in found[:50]:
      print("  " + line)
    total += len(found)
  print(f"total: {total} differing fields")
  return 1 if total else 0


if __name__ == "__main__":
  sys.exit(main())
