"""The perception stage's regime search (docs/MULTIMODAL.md): which settings make a
from-scratch vision tower read `tiny` instances, judged by transcription accuracy from the
image against the blank-image control on held-out instances.

    python -m studies.perception_search.search --out=runs/perception_search               # every regime
    python -m studies.perception_search.search --out=runs/perception_search --regimes=base,wide
    python -m studies.perception_search.search --out=runs/perception_search --table_only  # rebuild search.md

Each regime is `configs/mm_nphard.py` with the perception stage only (perception.steps =
sft.steps = --steps, no RL) and the overrides below; one workdir per regime under
--out (a finished one, with perception.json, is skipped; an interrupted one resumes). The
table (search.md) gives, per regime and per task, the greedy transcription's token accuracy
and the share read back exactly, from the image and from a blank image, the blind bound (the
best a transcription that ignores the image can score) and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from dmpo_jax.training import config as config_lib

CONFIG = "configs/mm_nphard.py"

# name -> --config overrides (beyond the perception-only stage). The default tower: two
# blocks of width 64, 14-pixel patches, 224-pixel renders, tower at the language model's LR,
# pixels normalised with white at 0 (config.image.mean/std). The regimes of the first search
# (docs/MULTIMODAL.md) ran with the CLIP statistics: `clip` and `clip_*` restore them.
CLIP = ["--config.image.mean=(0.48145466,0.4578275,0.40821073)",
        "--config.image.std=(0.26862954,0.26130258,0.27577711)"]
REGIMES: dict[str, list[str]] = {
    "base": [],
    "clip": CLIP,
    "clip_frozen": CLIP + ["--config.sft.freeze_vision=True"],
    "frozen": ["--config.sft.freeze_vision=True"],   # the tower stays at its random init
    "tower_lr0.1": ["--config.sft.vision_lr_scale=0.1"],
    "lr5e-4": ["--config.perception.lr=5e-4"],
    "wide": ["--config.model.vision.hidden_size=128", "--config.model.vision.intermediate_size=256",
             "--config.model.vision.num_heads=4"],
    "deep": ["--config.model.vision.depth=4", "--config.model.vision.fullatt_block_indexes=(1,3)"],
    # Bigger type: drawn at 128 px (fonts keep their 8-px floor) and scaled up to the same
    # 224-px grid by the processor, so a digit is about 12 px tall: about one patch, not half.
    "big_type": ["--config.image.size=128"],
    "big_type_frozen": ["--config.image.size=128", "--config.sft.freeze_vision=True"],
}


def run_regime(name: str, args) -> dict:
  workdir = os.path.join(args.out, name)
  path = os.path.join(workdir, "perception.json")
  if os.path.exists(path):
    return json.load(open(path))
  cmd = [sys.executable, "-m", "dmpo_jax.train", f"--config={CONFIG}" + (f":{args.arg}" if args.arg else ""),
         f"--workdir={workdir}", f"--config.perception.steps={args.steps}",
         f"--config.sft.steps={args.steps}", "--config.rl.steps=0",
         "--config.log.progress=False"] + REGIMES[name] + args.extra
  print(f"[{name}] {' '.join(cmd)}", flush=True)
  t0 = time.time()
  subprocess.run(cmd, check=True)
  res = json.load(open(path))
  res["wall_s"] = time.time() - t0
  res["overrides"] = REGIMES[name] + args.extra
  with open(path + ".tmp", "w") as f:
    json.dump(res, f, indent=1)
  os.replace(path + ".tmp", path)
  return res


def table(results: dict) -> str:
  lines = ["| regime | task | token accuracy, image | blank | blind bound | image - bound | "
           "read exactly, image | blank | wall |",
           "|---|---|---|---|---|---|---|---|---|"]
  for name, res in results.items():
    rows = [("overall", res["overall"])] + sorted(res["per_task"].items())
    for task, r in rows:
      i, b, bound = r["image"], r["blank"], r["blind_bound"]
      wall = f"{res['wall_s'] / 60:.1f} min" if task == "overall" and "wall_s" in res else ""
      lines.append(f"| {name if task == 'overall' else ''} | {task} | {i['token_accuracy']:.3f} | "
                   f"{b['token_accuracy']:.3f} | {bound:.3f} | {i['token_accuracy'] - bound:+.3f} | "
                   f"{i['exact']:.2f} | {b['exact']:.2f} | {wall} |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True)
  ap.add_argument("--regimes", default=",".join(REGIMES))
  ap.add_argument("--steps", type=int, default=1500)
  ap.add_argument("--arg", default="", help="the config's argument (e.g. tasks=subset-sum+knapsack)")
  ap.add_argument("--table_only", action="store_true")
  args, extra = ap.parse_known_args(argv)
  args.extra = extra  # further --config.* overrides for every regime
  names = args.regimes.split(",")
  unknown = [n for n in names if n not in REGIMES]
  if unknown:
    ap.error(f"unknown regimes {unknown}; choose from {sorted(REGIMES)}")
  os.makedirs(args.out, exist_ok=True)
  results = {}
  for name in names:
    path = os.path.join(args.out, name, "perception.json")
    if args.table_only:
      if os.path.exists(path):
        results[name] = config_lib.with_bounds(json.load(open(path)), os.path.join(args.out, name))
      continue
    try:
      results[name] = config_lib.with_bounds(run_regime(name, args), os.path.join(args.out, name))
    except subprocess.CalledProcessError as e:
      print(f"[{name}] failed (exit status {e.returncode}); the search goes on", flush=True)
      continue
    with open(os.path.join(args.out, "search.md"), "w") as f:
      f.write(table(results))
  print(table(results))


if __name__ == "__main__":
  main()
