"""A/B: one benchmark script at two commits, runs interleaved, times compared.

    python benchmarks/ab.py --old=a8a5747 benchmarks/train_step.py
    python benchmarks/ab.py --old=HEAD~3 --pairs=5 benchmarks/sampler.py -- --reps=3

The old commit is checked out into a temporary git worktree (removed at the
end) and its copy of the script runs there; the new one is the working tree.
Runs alternate A B B A A B ... so that drift of the machine (thermal, other
load) falls on both sides alike. Each script must print one JSON object as its
last line (every benchmark here does); every numeric leaf whose key ends in
`_s` (seconds) or `_ms` (milliseconds) is a time. Printed per time: the best of each side over the pairs, and
speed = old / new of the best and of each pair (> 1: the new code is faster).
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def times(obj, prefix: str = "") -> dict[str, float]:
  """The numeric leaves of a benchmark's JSON whose key ends in `_s` or `_ms`, by dotted path,
  in seconds."""
  out = {}
  if isinstance(obj, dict):
    for k, v in obj.items():
      path = f"{prefix}.{k}" if prefix else str(k)
      if isinstance(v, dict):
        out.update(times(v, path))
      elif isinstance(v, (int, float)) and not isinstance(v, bool):
        if str(k).endswith("_s"):
          out[path] = float(v)
        elif str(k).endswith("_ms"):
          out[path] = float(v) / 1e3
  return out


def run(tree: str, script: str, args: list[str]) -> dict:
  env = dict(os.environ, PYTHONPATH=tree)
  proc = subprocess.run([sys.executable, os.path.join(tree, script), *args], cwd=tree, env=env,
                        capture_output=True, text=True)
  lines = proc.stdout.strip().splitlines()
  if proc.returncode != 0 or not lines:
    raise SystemExit(f"{script} at {tree} failed (exit {proc.returncode}):\n"
                     f"{proc.stderr[-3000:]}")
  try:
    return json.loads(lines[-1])
  except json.JSONDecodeError as e:
    raise SystemExit(f"{script} at {tree}: its last line is not JSON ({e}): {lines[-1][:200]}")


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--old", required=True, help="the commit to compare against (any git ref)")
  ap.add_argument("--pairs", type=int, default=3, help="runs of each side (interleaved)")
  ap.add_argument("--repo", default=ROOT, help="the repository (default: this one)")
  ap.add_argument("script", help="a benchmark script, relative to the repository root")
  ap.add_argument("script_args", nargs="*", help="its arguments (after --)")
  args = ap.parse_args()
  if args.pairs < 1:
    ap.error("--pairs must be >= 1")
  root = os.path.abspath(args.repo)
  if not os.path.isfile(os.path.join(root, args.script)):
    ap.error(f"no script {args.script} in {root}")
  sha = subprocess.run(["git", "-C", root, "rev-parse", "--verify", f"{args.old}^{{commit}}"],
                       capture_output=True, text=True)
  if sha.returncode != 0:
    ap.error(f"--old={args.old} is not a commit of {root}")
  sha = sha.stdout.strip()
  old_tree = tempfile.mkdtemp(prefix="ab_old_")
  subprocess.run(["git", "-C", root, "worktree", "add", "--detach", old_tree, sha], check=True,
                 capture_output=True)
  try:
    if not os.path.isfile(os.path.join(old_tree, args.script)):
      raise SystemExit(f"{args.script} does not exist at {sha[:10]}")
    res = {"old": [], "new": []}
    for i in range(args.pairs):
      order = ("old", "new") if i % 2 == 0 else ("new", "old")
      for side in order:
        tree = old_tree if side == "old" else root
        print(f"pair {i + 1}/{args.pairs}: {side}", file=sys.stderr, flush=True)
        res[side].append(times(run(tree, args.script, args.script_args)))
  finally:
    subprocess.run(["git", "-C", root, "worktree", "remove", "--force", old_tree],
                   capture_output=True)
  keys = [k for k in res["new"][0] if all(k in r for r in res["old"] + res["new"])]
  if not keys:
    raise SystemExit("the two sides' JSON share no time (`*_s`, `*_ms`) keys")
  print(f"{args.script} {' '.join(args.script_args)}: old {sha[:10]} vs the working tree, "
        f"{args.pairs} interleaved pairs; speed = old / new (> 1: new is faster)")
  print(f"  {'time':50s} {'old best':>10s} {'new best':>10s} {'speed':>6s}  per pair")
  out = {"old": sha, "pairs": args.pairs, "times": {}}
  for k in keys:
    old = [r[k] for r in res["old"]]
    new = [r[k] for r in res["new"]]
    per_pair = [o / n if n > 0 else float("nan") for o, n in zip(old, new)]
    speed = min(old) / min(new) if min(new) > 0 else float("nan")
    print(f"  {k:50s} {min(old) * 1e3:8.1f}ms {min(new) * 1e3:8.1f}ms {speed:6.3f}  "
          + " ".join(f"{s:.3f}" for s in per_pair))
    out["times"][k] = {"old_best_s": min(old), "new_best_s": min(new), "speed": speed,
                       "speed_per_pair": per_pair}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
