"""Run the default config with several presets and seeds; write docs/RESULTS.md and a plot.

    python scripts/results.py --out=runs/results                # grpo dmpo dph_f dph_js x 3 seeds
    python scripts/results.py --out=runs/results --report_only  # rebuild the report

The SFT stage depends only on the seed, so it runs once per seed (stopping at
the end of SFT) and each preset resumes from a copy of that checkpoint: the
presets of one seed start from the same policy. Every run is an ordinary
workdir (`python -m dmpo_jax.evaluate --workdir=...` works on it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METRICS = ("SR@3", "QR@3", "SR_mean", "QR_mean", "pass@1", "pass@8", "distinct", "solution_entropy",
           "length")


def run(workdir: str, arg: str, extra: list[str]):
  cmd = [sys.executable, "-m", "dmpo_jax.train", f"--config=configs/nphard.py:{arg}",
         f"--workdir={workdir}", "--config.log.progress=False"] + extra
  print("+", " ".join(cmd), flush=True)
  subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="runs/results")
  ap.add_argument("--algos", default="grpo,dmpo,dph_f,dph_js")
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--report_only", action="store_true")
  ap.add_argument("--doc", default=os.path.join(REPO, "docs", "RESULTS.md"))
  ap.add_argument("extra", nargs="*", help="extra --config.* flags for every run")
  args = ap.parse_args()
  algos, seeds = args.algos.split(","), [int(s) for s in args.seeds.split(",")]
  sys.path.insert(0, os.path.join(REPO, "configs"))
  import nphard
  sft_steps = nphard.get_config().sft.steps

  if not args.report_only:
    for seed in seeds:
      base = os.path.join(args.out, f"sft_s{seed}")
      if not os.path.exists(os.path.join(base, "checkpoints", str(sft_steps))):
        run(base, f"seed={seed},algo=grpo", [f"--config.stop_at_step={sft_steps}"] + args.extra)
      for algo in algos:
        wd = os.path.join(args.out, f"{algo}_s{seed}")
        if os.path.exists(os.path.join(wd, "results.json")):
          continue
        if not os.path.exists(wd):
          shutil.copytree(base, wd)
        run(wd, f"seed={seed},algo={algo}", args.extra)

  rows = {}
  for algo in algos:
    res = [json.load(open(os.path.join(args.out, f"{algo}_s{s}", "results.json"))) for s in seeds]
    rows[algo] = res
  write_report(rows, seeds, args.doc, args.out)


def fmt(vals):
  v = np.asarray(vals, float)
  return f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0:.3f}"


def write_report(rows, seeds, doc, out):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  algos = list(rows)
  first = rows[algos[0]][0]
  lines = ["| preset | stage | " + " | ".join(METRICS) + " |", "|---|---|" + "---|" * len(METRICS)]
  before = {m: [r["before"]["overall"][m] for r in rows[algos[0]]] for m in METRICS}
  lines.append("| (SFT policy) | before RL | " + " | ".join(fmt(before[m]) for m in METRICS) + " |")
  for a in algos:
    after = {m: [r["after"]["overall"][m] for r in rows[a]] for m in METRICS}
    lines.append(f"| `{a}` | after RL | " + " | ".join(fmt(after[m]) for m in METRICS) + " |")
  per_task = ["| task | " + " | ".join(f"{a} QR@3" for a in algos) + " | " +
              " | ".join(f"{a} distinct" for a in algos) + " |",
              "|---|" + "---|" * (2 * len(algos))]
  for t in first["after"]["per_task"]:
    q = [fmt([r["after"]["per_task"][t]["QR@3"] for r in rows[a]]) for a in algos]
    d = [fmt([r["after"]["per_task"][t]["distinct"] for r in rows[a]]) for a in algos]
    per_task.append(f"| {t} | " + " | ".join(q + d) + " |")
  times = {a: np.mean([sum(r["times_s"][k] for k in ("rollout", "reward", "update")) for r in rows[a]])
           for a in algos}
  keep = {a: (np.nanmean([np.nanmean([v["keep_rate"] for v in r["keep_exploration"].values()]) for r in rows[a]]),
              np.nanmean([np.nanmean([v["exploration_rate"] for v in r["keep_exploration"].values()]) for r in rows[a]]))
          for a in algos}

  fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
  for ax, m in zip(axes, ("QR@3", "QR_mean", "pass@8", "distinct")):
    vals = [[r["after"]["overall"][m] for r in rows[a]] for a in algos]
    b = [r["before"]["overall"][m] for r in rows[algos[0]]]
    ax.bar(range(len(algos) + 1), [np.mean(b)] + [np.mean(v) for v in vals],
           yerr=[np.std(b)] + [np.std(v) for v in vals], color=["gray"] + ["C0"] * len(algos), capsize=3)
    ax.set_xticks(range(len(algos) + 1), ["SFT"] + algos, fontsize=8)
    ax.set_title(f"overall {m} (mean ± sd over {len(seeds)} seeds)", fontsize=9)
  fig.tight_layout()
  png = os.path.join(os.path.dirname(doc), "results.png")
  fig.savefig(png, dpi=110)

  text = RESULTS_TEMPLATE.format(
      seeds=", ".join(map(str, seeds)), out=out, table="\n".join(lines), per_task="\n".join(per_task),
      times=", ".join(f"`{a}` {t / 60:.1f} min" for a, t in times.items()),
      keep=", ".join(f"`{a}` keep {k:.2f} / exploration {e:.2f}" for a, (k, e) in keep.items()))
  with open(doc + ".generated", "w") as f:
    f.write(text)
  print(text)


RESULTS_TEMPLATE = """<!-- tables generated by scripts/results.py; see docs/RESULTS.md for the reading -->
Seeds {seeds}; runs in `{out}`.

### Overall (mean of the five category means), held-out `tiny` instances, 8 samples at T = 0.7

{table}

### Per task after RL (QR@3 and distinct feasible solutions per group of 8)

{per_task}

RL time (rollout + reward + update) per run: {times}.
Keep / exploration rates (mean over tasks and seeds): {keep}.
"""


if __name__ == "__main__":
  main()
