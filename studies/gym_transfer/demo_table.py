"""The transfer demonstration's table (studies/gym_transfer/demo.py): per label, NP-Bench and the
transfer tasks before SFT, before RL and after RL, and how strong each label's regulariser was.

    python -m studies.gym_transfer.demo_table runs/gym_demo [--seed 0]

Reads each `<out>/<label>/seed<N>/results.json` (the run's `before`, `after` and `transfer`)
and its metrics.jsonl's RL rows with `grad_ratio` (the regulariser's gradient norm over the
policy gradient's, logged every `rl.log_term_grads` steps). A run that has not finished is
named and left out; nothing is filled in for it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

STAGES = ("zero_shot", "before", "after")


def read_run(folder: str) -> dict | None:
  """The numbers of one finished run, or None (no results.json: not finished). A sweep run
  made before the runner shared the zero-shot evaluations (dmpo_jax/experiments/sweep.py
  SHARED_EVALS) lacks "zero_shot": it is read from the seed's SFT stage, `<out>/_sft/seed<N>/`,
  which made it."""
  path = os.path.join(folder, "results.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    res = json.load(f)
  sft = os.path.join(os.path.dirname(os.path.dirname(folder)), "_sft", os.path.basename(folder))
  if "zero_shot" not in res and os.path.exists(os.path.join(sft, "eval_zero_shot.json")):
    with open(os.path.join(sft, "eval_zero_shot.json")) as f:
      res["zero_shot"] = {"overall": json.load(f)["overall"]}
  t = res.get("transfer") or {}
  if t and not t.get("zero_shot") and os.path.exists(os.path.join(sft, "eval_transfer_zero_shot.json")):
    with open(os.path.join(sft, "eval_transfer_zero_shot.json")) as f:
      t["zero_shot"] = json.load(f)["transfer"]
  ratios = []
  with open(os.path.join(folder, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if row.get("stage") == "rl" and isinstance(row.get("grad_ratio"), (int, float)):
        ratios.append(float(row["grad_ratio"]))
  return {"results": res, "grad_ratios": [r for r in ratios if math.isfinite(r)]}


def np_overall(res: dict, stage: str) -> dict:
  """NP-Bench's overall SR@k and QR@k at one evaluation ({} when the stage is absent)."""
  ev = res.get(stage) or {}
  return ev.get("overall", {}) if isinstance(ev, dict) else {}


def table(out: str, seed: int) -> tuple[str, list[str]]:
  """The markdown table and the labels left out."""
  rows, missing = [], []
  labels = sorted(d for d in os.listdir(out) if not d.startswith("_")
                  and os.path.isdir(os.path.join(out, d, f"seed{seed}")))
  for label in labels:
    run = read_run(os.path.join(out, label, f"seed{seed}"))
    if run is None:
      missing.append(label)
      continue
    res, ratios = run["results"], run["grad_ratios"]
    ratio = (f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}, n={len(ratios)})"
             if ratios else "not logged")
    t = res.get("transfer") or {}
    for stage in STAGES:
      np_ = np_overall(res, stage)
      cells = [label if stage == "zero_shot" else "", stage,
               _fmt(np_.get("SR@3")), _fmt(np_.get("QR@3"))]
      for task in t.get("tasks", []):
        s = (t.get(stage) or {}).get(task) or {}
        cells.append(f"{_fmt(s.get('full_rate'))} / {_fmt(s.get('score_mean'))}")
      cells.append(ratio if stage == "after" else "")
      rows.append(cells)
  if not rows:
    return "", missing
  tasks = next(read_run(os.path.join(out, l, f"seed{seed}"))["results"].get("transfer", {}).get("tasks", [])
               for l in labels if l not in missing)
  head = (["label", "evaluation", "NP SR@3", "NP QR@3"]
          + [f"{task} full rate / mean score" for task in tasks] + ["reg / pg gradient norm (median, range)"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines), missing


def _fmt(x) -> str:
  return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("out", help="the demo's sweep folder")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  if not os.path.isdir(args.out):
    print(f"error: {args.out}: no such folder", file=sys.stderr)
    return 2
  text, missing = table(args.out, args.seed)
  for label in missing:
    print(f"{label}/seed{args.seed}: not finished (no results.json), left out")
  if not text:
    print("error: no finished run", file=sys.stderr)
    return 2
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
