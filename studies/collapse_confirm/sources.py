"""Evaluation points of the confirmatory design's runs, from sweep folders or points.csv files;
shared by stage 1 (`stage1.py`) and stage 2 (`stage2.py`).

A source is a sweep folder (its runs' points/rl<step>.json; only runs the sweep report counts
as finished, `report.collect`: results.json and every planned evaluation point) or a
points.csv written by a sweep report (`frontier.point_rows`: one row per label, seed, RL step
and set, the mean over instances; the report writes finished runs only). A source prefixed
`tier1:` contributes only the labels given for it (stage 1: `design.RAN_IN_TIER1`). A source
prefixed `seeds=<list>:` (e.g. `seeds=100-112:stage2/2026-12-06_a/points.csv`, the list as the
sweep's --seeds) contributes only those seeds; its others are listed among the seeds left out
(stage 2: a seed's runs from one CPU kind, since the SFT that the seed's 15 labels share is not
bit-identical across kinds). Labels and seeds found in several sources are refused (one run per
label and seed).
"""

from __future__ import annotations

import csv
import os

from dmpo_jax.experiments import frontier, report

METRICS = ("pass_optimal@1", "coverage")  # what stage 1 reads of a points.csv
TIER1 = "tier1:"
SEEDS = "seeds="


def split_source(src: str) -> tuple[list[int] | None, str]:
  """(the seeds a `seeds=<list>:` prefix keeps, or None; the rest of the source)."""
  if not src.startswith(SEEDS):
    return None, src
  spec, sep, rest = src[len(SEEDS):].partition(":")
  if not sep or not rest:
    raise SystemExit(f"error: source {src!r}: write seeds=<list>:<sweep folder or points.csv>")
  from dmpo_jax.experiments import sweep
  try:
    return sweep.parse_seeds(spec), rest
  except sweep.SweepError as e:
    raise SystemExit(f"error: source {src!r}: bad seed list {spec!r} ({e})")


def points_from_csv(path: str, metrics=METRICS) -> dict:
  """{label: {seed: {rl_step: point}}} from a points.csv (the sets' instance means of
  `metrics` only; an empty cell is left out)."""
  out: dict = {}
  with open(path, newline="") as f:
    for line, row in enumerate(csv.DictReader(f), start=2):
      try:
        vals = {m: float(row[m]) for m in metrics if row.get(m) not in (None, "")}
        key = row["label"], int(row["seed"]), int(row["rl_step"]), row["set"]
      except (KeyError, TypeError, ValueError) as e:
        raise SystemExit(f"error: {path}, line {line}: not a points.csv row ({type(e).__name__}: {e})")
      pt = out.setdefault(key[0], {}).setdefault(key[1], {}).setdefault(key[2], {"sets": {}})
      pt["sets"][key[3]] = {"overall_instance": vals}
  return out


def sweep_runs(out_dir: str) -> tuple[dict, dict]:
  """({label: {seed: {rl_step: point}}} of a sweep folder's finished runs, {label: {seed:
  status}} of the others, in the report's words (`report.run_status`: "incomplete: no
  evaluation point at RL step 100", "partial", "failed", "not started"))."""
  runs, _ = report.collect(out_dir)
  done = {l: {s: frontier.read_points(os.path.join(out_dir, l, f"seed{s}"))
              for s, r in by_seed.items() if r["status"] == "finished"} for l, by_seed in runs.items()}
  others = {l: {s: report.run_status(r) for s, r in by_seed.items() if r["status"] != "finished"}
            for l, by_seed in runs.items()}
  return done, {l: v for l, v in others.items() if v}


def points_from_sweep(out_dir: str) -> dict:
  """{label: {seed: {rl_step: point}}} of a sweep folder's finished runs (report's check)."""
  return sweep_runs(out_dir)[0]


def load(sources, seeds, tier1_labels=(), metrics=METRICS) -> tuple[dict, dict, dict]:
  """(points, not finished, other seeds) of `sources` merged: points {label: {seed: {rl_step:
  point}}} on `seeds` only; not finished {label: {seed: status}} of sweep folders' runs on
  `seeds` that the report does not count as finished (never in points); other seeds {source:
  {label: [seeds]}} that were left out, not being in `seeds`. A label and seed in two sources
  is refused (SystemExit naming them)."""
  merged: dict = {}
  unfinished: dict = {}
  skipped: dict = {}
  for src in sources:
    keep_seeds, rest = split_source(src)
    wanted = set(seeds) if keep_seeds is None else set(seeds) & set(keep_seeds)
    only = tier1_labels if rest.startswith(TIER1) else None
    path = rest[len(TIER1):] if only is not None else rest
    if not os.path.exists(path):
      raise SystemExit(f"error: source {src!r}: no such file or sweep folder")
    if path.endswith(".csv"):
      pts, others = points_from_csv(path, metrics), {}
    else:
      pts, others = sweep_runs(path)
    for label, by_seed in pts.items():
      if only is not None and label not in only:
        continue
      out = sorted(s for s in by_seed if s not in wanted)
      if out:
        skipped.setdefault(src, {})[label] = out
      by_seed = {s: p for s, p in by_seed.items() if s in wanted}
      clash = set(by_seed) & set(merged.get(label, {}))
      if clash:
        raise SystemExit(f"error: {label} seeds {sorted(clash)} appear in more than one source")
      merged.setdefault(label, {}).update(by_seed)
    for label, by_seed in others.items():
      if only is None or label in only:
        unfinished.setdefault(label, {}).update({s: why for s, why in by_seed.items() if s in wanted})
  # a run finished in another source (a seed rerun elsewhere) is not left out
  unfinished = {l: {s: why for s, why in v.items() if s not in merged.get(l, {})} for l, v in unfinished.items()}
  unfinished = {l: v for l, v in unfinished.items() if v}
  return merged, unfinished, skipped
