"""The SmolLM2 collapse demonstration's table and figure (docs/RESULTS.md, section 4): pass@k
to k = 256 (optimal and feasible) and distinct optima, before RL and after each preset's RL,
from a sweep folder of `configs/smollm2_nphard.py:demo`.

    python -m studies.collapse_frontier.sweep --config=configs/smollm2_nphard.py:demo \
        --out=runs/smollm2_demo --presets=grpo,dmpo,dph_f --seeds=0
    python -m studies.smollm2_demo.tables runs/smollm2_demo docs/images/smollm2_demo_passk.png

(The sweep uses the runner with the collapse frontier's label table: its `grpo`, `dmpo` and `dph_f`.)

Prints a markdown table (overall: the mean over the demo's tasks of each task's mean over its
held-out instances) and writes the figure.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KS = tuple(2 ** i for i in range(9))


def load(folder: str, seed: int = 0) -> dict:
  """{"before": eval dict, label: eval dict after RL, ...}, the walls in "_wall"."""
  out, wall = {}, {}
  for label in sorted(os.listdir(folder)):
    run = os.path.join(folder, label, f"seed{seed}")
    if label.startswith("_") or not os.path.exists(os.path.join(run, "results.json")):
      continue
    if "before" not in out:
      out["before"] = json.load(open(os.path.join(run, "eval_before.json")))
    out[label] = json.load(open(os.path.join(run, "eval_after.json")))
    wall[label] = json.load(open(os.path.join(run, "results.json"))).get("wall_s")
  out["_wall"] = wall
  return out


def rows(evals: dict) -> list[str]:
  lines = ["| policy | optimal pass@1 | pass@16 | pass@64 | pass@256 | feasible pass@1 | pass@256 | "
           "distinct optima / 256 | coverage of optima | distinct answers / 256 | length |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for name, e in evals.items():
    if name.startswith("_"):
      continue
    o = e["overall"]
    lines.append(f"| {'SFT start (before RL)' if name == 'before' else name} | "
                 f"{o['pass_optimal@1']:.3f} | {o['pass_optimal@16']:.3f} | {o['pass_optimal@64']:.3f} | "
                 f"{o['pass_optimal@256']:.3f} | "
                 f"{o['pass_feasible@1']:.3f} | {o['pass_feasible@256']:.3f} | {o['distinct_optimal']:.2f} | "
                 f"{o['coverage']:.3f} | {o['distinct']:.2f} | {o['length']:.1f} |")
  return lines


def per_task(evals: dict) -> list[str]:
  names = [n for n in evals if not n.startswith("_")]
  tasks = sorted(evals["before"]["per_task"])
  lines = ["| task | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
  for t in tasks:
    cells = []
    for n in names:
      r = evals[n]["per_task"][t]
      cells.append(f"{r['pass_optimal@1']:.2f} / {r['pass_optimal@256']:.2f} / {r['distinct_optimal']:.1f}")
    lines.append(f"| {t} | " + " | ".join(cells) + " |")
  return lines


def figure(evals: dict, path: str) -> None:
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for ax, kind in zip(axes, ("optimal", "feasible")):
    styles = iter([("o", "-"), ("s", ":"), ("^", "-."), ("v", "-"), ("D", ":")])
    for name, e in evals.items():
      if name.startswith("_"):
        continue
      o = e["overall"]
      marker, ls = ("o", "--") if name == "before" else next(styles)
      ax.plot(KS, [o[f"pass_{kind}@{k}"] for k in KS], marker=marker, ms=4, ls=ls,
              label="SFT start" if name == "before" else name,
              color="black" if name == "before" else None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per instance, T = 1.0)")
    ax.set_ylabel(f"pass@k, {kind}")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
  axes[0].legend(title="(overlapping lines: equal values)")
  fig.suptitle("SmolLM2-135M-Instruct, one seed: pass@k before and after 20 RL steps")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main(argv):
  if len(argv) < 2:
    sys.exit(__doc__)
  evals = load(argv[1])
  if len(evals) < 2:
    sys.exit(f"{argv[1]}: no finished run")
  print("\n".join(rows(evals)))
  print()
  print("Per task: optimal pass@1 / pass@256 / distinct optima per 256 samples")
  print("\n".join(per_task(evals)))
  print("\nwall (s):", json.dumps(evals["_wall"]))
  if len(argv) > 2:
    figure(evals, argv[2])
    print("wrote", argv[2])


if __name__ == "__main__":
  main(sys.argv)
