"""The image policy's control and the paper's comparison, small (docs/MULTIMODAL.md): tables
from a sweep of `configs/mm_nphard.py` (and, for the text side, one of `configs/nphard.py`).

    python -m studies.collapse_frontier.sweep --config=configs/mm_nphard.py --out=runs/mm_control \
        --presets=dmpo,grpo --seeds=0-4 --seed_major
    python -m studies.collapse_frontier.sweep --config=configs/nphard.py --out=runs/text_control \
        --presets=dmpo,grpo --seeds=0-4 --seed_major
    python -m studies.mm_control.tables runs/mm_control --text=runs/text_control --out=control.md

(The sweeps use the runner with the collapse frontier's label table: its `dmpo` and `grpo`.)

Written (markdown):
1. the pre-registered primary endpoint: QR@3 overall after RL of `--preset` (dmpo),
   seed-paired image - blank, mean and 95% t-interval;
2. secondary: SR@3 and QR@3 after SFT and after RL per modality (image, blank, text), the
   seed-paired image - blank and image - text, overall and per task;
3. the perception stage's transcription accuracy per task (the seeds' perception.json);
4. exploratory: `--preset` - `--baseline` (dmpo - grpo) after RL on image prompts and on
   text prompts, seed-paired, with Holm's correction over the two;
5. exploratory: the shuffled-image control (each instance shown another instance's image),
   from `--evaluate_shuffled`'s evaluations of each run.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re

from dmpo_jax.experiments import stats

METRICS = ("QR@3", "SR@3")
MODALITIES = ("image", "blank", "text")


def load(sweep: str) -> dict:
  """{label: {seed: results.json}} of the finished runs of a sweep folder."""
  out: dict = {}
  for path in sorted(glob.glob(os.path.join(sweep, "*", "seed*", "results.json"))):
    label = os.path.basename(os.path.dirname(os.path.dirname(path)))
    seed = int(re.fullmatch(r"seed(\d+)", os.path.basename(os.path.dirname(path))).group(1))
    if not label.startswith("_"):
      with open(path) as f:
        out.setdefault(label, {})[seed] = json.load(f)
  return out


def scores(res: dict, stage: str, modality: str | None = None) -> dict:
  """{"overall": {...}, "per_task": {...}} of one run at `stage` ("before" = after SFT,
  "after" = after RL) in `modality` (None: the run's own table)."""
  if modality is None:
    return res[stage]
  mods = (res.get("modalities") or {}).get(stage)
  if not mods or modality not in mods:
    raise KeyError(f"no {modality!r} scores {stage} RL in this run (eval.modalities)")
  return mods[modality]


def by_seed(runs: dict, stage: str, modality, metric: str, task: str | None = None) -> dict:
  out = {}
  for seed, res in runs.items():
    s = scores(res, stage, modality)
    out[seed] = (s["overall"] if task is None else s["per_task"][task])[metric]
  return out


def fmt_iv(iv) -> str:
  return f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def fmt_test(t: dict) -> str:
  return f"{t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]"


def primary(runs: dict) -> tuple[str, dict]:
  t = stats.paired_test(by_seed(runs, "after", "image", "QR@3"), by_seed(runs, "after", "blank", "QR@3"))
  verdict = ("holds: the interval excludes 0 on the positive side" if t["low"] > 0 else
             "not shown: the interval does not exclude 0 on the positive side")
  line = (f"**Primary endpoint** (pre-registered): QR@3 overall after RL, image - blank, seed-paired "
          f"over seeds {sorted(runs)}: **{fmt_test(t)}** (p = {t['p']:.3g}); the claim {verdict}. "
          f"Per seed: {', '.join(f'{s}: {d:+.3f}' for s, d in t['diffs'].items())}.")
  return line, t


def modality_table(runs: dict) -> str:
  lines = ["| stage | metric | image | blank | text | image - blank (paired) | image - text (paired) |",
           "|---|---|---|---|---|---|---|"]
  for stage, name in (("before", "after SFT"), ("after", "after RL")):
    for metric in METRICS:
      v = {m: by_seed(runs, stage, m, metric) for m in MODALITIES}
      lines.append(f"| {name} | {metric} | " + " | ".join(fmt_iv(stats.mean_ci(v[m])) for m in MODALITIES)
                   + f" | {fmt_test(stats.paired_test(v['image'], v['blank']))}"
                   f" | {fmt_test(stats.paired_test(v['image'], v['text']))} |")
  return "\n".join(lines)


def per_task_table(runs: dict, stage: str = "after") -> str:
  first = next(iter(runs.values()))
  tasks = sorted(scores(first, stage, "image")["per_task"])
  lines = ["| task | QR@3 image | blank | text | image - blank QR@3 | image - blank SR@3 |",
           "|---|---|---|---|---|---|"]
  for task in tasks:
    v = {m: by_seed(runs, stage, m, "QR@3", task) for m in MODALITIES}
    sr = {m: by_seed(runs, stage, m, "SR@3", task) for m in ("image", "blank")}
    lines.append(f"| {task} | " + " | ".join(f"{stats.mean_ci(v[m]).mean:.3f}" for m in MODALITIES)
                 + f" | {fmt_test(stats.paired_test(v['image'], v['blank']))}"
                 f" | {fmt_test(stats.paired_test(sr['image'], sr['blank']))} |")
  return "\n".join(lines)


def perception_table(sweep: str) -> str:
  files = sorted(glob.glob(os.path.join(sweep, "_sft", "seed*", "perception.json")))
  if not files:
    return "(no perception.json in the sweep's _sft folders)"
  from dmpo_jax.training import config as config_lib
  res = [config_lib.with_bounds(json.load(open(f)), os.path.dirname(f)) for f in files]
  rows = [("overall", [r["overall"] for r in res])]
  rows += [(t, [r["per_task"][t] for r in res]) for t in sorted(res[0]["per_task"])]
  lines = [f"{len(res)} seeds, {res[0]['steps']} perception steps; mean [95% t-interval] over seeds.",
           "blind bound: the best token accuracy any transcription that ignores the image can score "
           "on the same instances (training/perception.py: blind_bound).",
           "", "| task | token accuracy, image | blank | blind bound | image - blind bound (paired) | "
           "read back exactly, image | blank |",
           "|---|---|---|---|---|---|---|"]
  for task, rs in rows:
    acc = {m: [r[m]["token_accuracy"] for r in rs] for m in ("image", "blank")}
    ex = {m: [r[m]["exact"] for r in rs] for m in ("image", "blank")}
    bound = [r["blind_bound"] for r in rs]
    d = stats.paired_test(dict(enumerate(acc["image"])), dict(enumerate(bound)))
    ci = lambda x: fmt_iv(stats.mean_ci(x)) if len(x) > 1 else f"{x[0]:.3f}"
    lines.append(f"| {task} | {ci(acc['image'])} | {ci(acc['blank'])} | {sum(bound) / len(rs):.3f} | {fmt_test(d)} | "
                 f"{sum(ex['image']) / len(rs):.3f} | {sum(ex['blank']) / len(rs):.3f} |")
  return "\n".join(lines)


def comparison(image_runs: dict, text_runs: dict | None, preset: str, baseline: str) -> str:
  rows = []
  for name, runs, modality in (("image prompts", image_runs, "image"), ("text prompts", text_runs, None)):
    if runs is None or preset not in runs or baseline not in runs:
      continue
    for metric in METRICS:
      a = by_seed(runs[preset], "after", modality, metric)
      b = by_seed(runs[baseline], "after", modality, metric)
      rows.append((name, metric, stats.mean_ci(a), stats.mean_ci(b), stats.paired_test(a, b)))
  if not rows:
    return f"(no runs of both {preset} and {baseline})"
  lines = [f"| prompts | metric | {preset} | {baseline} | {preset} - {baseline} (paired) | p | p (Holm, QR@3 pair) |",
           "|---|---|---|---|---|---|---|"]
  qr = [r for r in rows if r[1] == "QR@3"]
  adj = dict(zip([r[0] for r in qr], stats.holm([r[4]["p"] for r in qr])))
  for name, metric, a, b, t in rows:
    holm = f"{adj[name]:.3g}" if metric == "QR@3" and not math.isnan(adj[name]) else ""
    lines.append(f"| {name} | {metric} | {fmt_iv(a)} | {fmt_iv(b)} | {fmt_test(t)} | {t['p']:.3g} | {holm} |")
  return "\n".join(lines)


SHUFFLED_DIR = "eval_shuffled"


def evaluate_shuffled(sweep: str, labels) -> None:
  """`python -m dmpo_jax.evaluate --modalities=image,shuffled,blank` of each finished run of
  `labels` (after RL) and of each seed's shared SFT folder (after SFT), into
  <workdir>/eval_shuffled/ (skipped where it exists): the same held-out instances and
  sampling settings as the run's own evaluation, one sampling seed for the three."""
  import subprocess
  import sys
  folders = []
  for wd in sorted(glob.glob(os.path.join(sweep, "_sft", "seed*"))):
    with open(os.path.join(wd, "config.json")) as f:
      sft_steps = json.load(f)["sft"]["steps"]
    if os.path.isdir(os.path.join(wd, "checkpoints", str(sft_steps))):  # its SFT has ended
      folders.append(wd)
  for label in labels:
    folders += sorted(os.path.dirname(p) for p in glob.glob(os.path.join(sweep, label, "seed*", "results.json")))
  for wd in folders:
    if os.path.exists(os.path.join(wd, SHUFFLED_DIR, "eval.json")):
      continue
    with open(os.path.join(wd, "config.json")) as f:
      ev = json.load(f)["eval"]
    cmd = [sys.executable, "-m", "dmpo_jax.evaluate", f"--workdir={wd}", f"--out={os.path.join(wd, SHUFFLED_DIR)}",
           "--modalities=image,shuffled,blank", f"--num={ev['num_per_task']}", f"--samples={ev['samples']}",
           f"--k={ev['k']}", f"--temperature={ev['temperature']}"]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def shuffled_table(sweep: str, preset: str) -> str:
  """image, shuffled and blank from the eval_shuffled/ folders: after SFT (_sft) and after RL."""
  stages = (("after SFT", os.path.join(sweep, "_sft")), ("after RL", os.path.join(sweep, preset)))
  lines = ["| stage | metric | image | shuffled | blank | image - shuffled (paired) | shuffled - blank (paired) |",
           "|---|---|---|---|---|---|---|"]
  for name, root in stages:
    runs = {}
    for path in glob.glob(os.path.join(root, "seed*", SHUFFLED_DIR, "eval.json")):
      seed = int(re.search(r"seed(\d+)", path).group(1))
      with open(path) as f:
        runs[seed] = json.load(f)["modalities"]
    if len(runs) < 2:
      lines.append(f"| {name} | (fewer than 2 seeds evaluated) | | | | | |")
      continue
    for metric in METRICS:
      v = {m: {s: r[m]["overall"][metric] for s, r in runs.items()} for m in ("image", "shuffled", "blank")}
      lines.append(f"| {name} | {metric} | " + " | ".join(fmt_iv(stats.mean_ci(v[m])) for m in v)
                   + f" | {fmt_test(stats.paired_test(v['image'], v['shuffled']))}"
                   f" | {fmt_test(stats.paired_test(v['shuffled'], v['blank']))} |")
  return "\n".join(lines)


def report(sweep: str, text: str | None, preset: str, baseline: str) -> str:
  runs = load(sweep)
  if preset not in runs:
    raise SystemExit(f"error: {sweep} has no finished {preset!r} runs (found {sorted(runs)})")
  text_runs = load(text) if text else None
  line, _ = primary(runs[preset])
  parts = [line, "", f"Secondary ({preset}; overall = mean of the five category means; mean [95% t-interval] "
           "over seeds, paired differences by seed):", "", modality_table(runs[preset]), "",
           f"Per task after RL ({preset}; means over seeds, paired differences with 95% t-intervals):", "",
           per_task_table(runs[preset]), "", "The perception stage (held-out instances, greedy transcription):",
           "", perception_table(sweep), "",
           f"Exploratory (added after the pre-registration): the shuffled-image control ({preset}; "
           "`python -m dmpo_jax.evaluate --modalities=image,shuffled,blank` of each run, one sampling "
           "seed for the three, so its image column differs from the run's own by sampling): each "
           "instance shown the image of another held-out instance of its task.", "",
           shuffled_table(sweep, preset), "",
           f"Exploratory, CPU scale, not comparable with the paper's figures: {preset} against {baseline} "
           "after RL (seed-paired):", "", comparison(runs, text_runs, preset, baseline)]
  return "\n".join(parts) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("sweep", help="a sweep folder of configs/mm_nphard.py")
  ap.add_argument("--text", default=None, help="a sweep folder of configs/nphard.py (the text side)")
  ap.add_argument("--preset", default="dmpo")
  ap.add_argument("--baseline", default="grpo")
  ap.add_argument("--out", default=None, help="also write the markdown here")
  ap.add_argument("--evaluate_shuffled", action="store_true",
                  help="first evaluate each run with the shuffled-image control (about 20 s a run)")
  args = ap.parse_args(argv)
  if args.evaluate_shuffled:
    evaluate_shuffled(args.sweep, (args.preset, args.baseline))
  md = report(args.sweep, args.text, args.preset, args.baseline)
  print(md)
  if args.out:
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
      f.write(md)
    os.replace(tmp, args.out)


if __name__ == "__main__":
  main()
