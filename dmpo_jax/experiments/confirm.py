"""The confirmatory analysis: each remedy against the "less RL" reference at a per-seed target.

A remedy keeps more optima than GRPO either by keeping optima at the same gain or by moving
the policy less. The confirmatory design (docs/COLLAPSE.md, "Confirmatory pre-registration")
matches every run at the same gain *of its own seed*: the target on seed s is the seed's
start (RL step 0, shared by all of its labels) plus a gain fixed in advance,

    t_s = x_s(0) + delta,        x = optimal pass@1 on the RL prompts (A + B),

and a run's matched value is y (coverage of A, optimal pass@64 of B) where its trajectory first
reaches t_s: the first evaluation point at or above t_s, linear between it and the point
before (`frontier.interpolate`). A trajectory that rises past t_s and falls back has reached it
at the rise; one that only comes down through t_s (a start above it) has its start's value.

* `seed_targets`: t_s per seed, from the seed's RL-step-0 point (refused when two labels of a
  seed disagree about their start: they would not share it).
* `matched_values`: {seed: y at t_s} of one label, NaN where the run never reaches t_s.
* `registered_family`: seed-paired contrasts of each remedy against the reference, with
  reach rates, the 80% reach rule, the 95% and Bonferroni (1 - 0.05/m) intervals, Holm over
  the family with m fixed in advance (a contrast that cannot be estimated still counts, as
  p = 1), and the reading of each contrast.
* `holm_family`: Holm and the readings over the rows of several `registered_family` calls
  taken as one family (the secondary family: two references, one m).
* `sensitivity`: the same family with a never-reached run valued at its last point (what it
  kept by the end of RL), so that the reach rule's effect on the answer is visible.

Statistics: `stats.paired_test` (seed-paired t-test and interval) and `stats.holm`.
Entry point of the confirmatory stage: studies/collapse_confirm/stage2.py.
"""

from __future__ import annotations

import math

from dmpo_jax.experiments import frontier, stats

MIN_REACH = 0.8  # a method that reaches its seed's target on fewer seeds is not estimable
ALPHA = 0.05


def start_value(points: dict, split: str, x: str, overall: str = "overall_instance") -> float | None:
  """x on `split` at RL step 0 of one run ({rl_step: point json}); None without a step-0 point."""
  if 0 not in points:
    return None
  xs, _ = frontier.trajectory({0: points[0]}, split, x, x, overall)
  return float(xs[0]) if xs else None


def seed_targets(runs_points: dict, delta: float, split: str = "AB", x: str = "pass_optimal@1",
                 overall: str = "overall_instance", tol: float = 1e-9) -> dict:
  """{seed: start + delta} from {label: {seed: points}}; every label of a seed must report the
  same start (they share its SFT stage), else ValueError naming the seed and labels."""
  starts: dict = {}
  for label, by_seed in runs_points.items():
    for seed, pts in by_seed.items():
      v = start_value(pts, split, x, overall)
      if v is None:
        continue
      if seed in starts and abs(starts[seed][0] - v) > tol:
        raise ValueError(f"seed {seed}: labels {starts[seed][1]!r} and {label!r} start at "
                         f"{split}/{x} = {starts[seed][0]:.6f} and {v:.6f}; a seed's labels share one start")
      starts.setdefault(seed, (v, label))
  return {seed: v + delta for seed, (v, _) in sorted(starts.items())}


def matched_values(by_seed: dict, targets: dict, split: str, x: str, y_split: str, y: str,
                   overall: str = "overall_instance") -> dict:
  """{seed: y on y_split where x on split first reaches the seed's target} of one label (NaN
  where it never does); seeds without a target are left out."""
  out = {}
  for seed, pts in by_seed.items():
    if seed in targets:
      xs, ys = frontier.trajectory(pts, split, x, y, overall, y_split=y_split)
      out[seed] = frontier.interpolate(xs, ys, targets[seed])
  return out


def last_values(by_seed: dict, y_split: str, y: str, overall: str = "overall_instance") -> dict:
  """{seed: y on y_split at the run's last evaluation point} (the sensitivity analysis' value
  of a run that never reaches its target)."""
  out = {}
  for seed, pts in by_seed.items():
    _, ys = frontier.trajectory(pts, y_split, y, y, overall)
    out[seed] = float(ys[-1]) if ys else math.nan
  return out


def reach_rate(values: dict) -> float:
  """The share of seeds whose run reached its target (a finite matched value)."""
  return sum(math.isfinite(v) for v in values.values()) / len(values) if values else 0.0


def reading(row: dict, alpha: float = ALPHA) -> str:
  """The answer a contrast gives, in the pre-registered words."""
  if not row["estimable"]:
    return "not estimable"
  if row["p_holm"] < alpha:
    return "keeps more" if row["mean"] > 0 else "keeps fewer"
  return "cannot be told apart"


def registered_family(values: dict, remedies: list, reference: str, m: int | None = None,
                      min_reach: float = MIN_REACH, confidence: float = 0.95) -> list[dict]:
  """Each remedy - reference on {method: {seed: matched value}}, seed-paired on the seeds where
  both reached their targets. A contrast is estimable when both reach on >= min_reach of their
  seeds and at least frontier.MIN_SEEDS seeds pair; otherwise it keeps its n, reach rates and
  differences but gets no mean, interval, SD or p, and counts as p = 1 in Holm's m, which is
  the size of the registered family (len(remedies) unless given). Each row: the t-interval at
  `confidence` ("low", "high"), the Bonferroni interval at 1 - (1 - confidence) / m
  ("low_bonferroni", "high_bonferroni", "confidence_bonferroni"), "sd" of the differences."""
  m = len(remedies) if m is None else m
  if m < len(remedies):
    raise ValueError(f"registered_family: m = {m} is smaller than the {len(remedies)} contrasts")
  ref = values.get(reference, {})
  level = 1 - (1 - confidence) / m
  rows = []
  for r in remedies:
    v = values.get(r, {})
    t = stats.paired_test(v, ref, confidence)
    tb = stats.paired_test(v, ref, level)
    row = dict(t, contrast=f"{r} - {reference}", remedy=r, reference=reference, reach=reach_rate(v),
               reach_reference=reach_rate(ref), seeds=len(v), low_bonferroni=tb["low"],
               high_bonferroni=tb["high"], confidence_bonferroni=level,
               sd=stats.pooled_sd([list(t["diffs"].values())]))
    row["estimable"] = (row["reach"] >= min_reach and row["reach_reference"] >= min_reach
                        and t["n"] >= frontier.MIN_SEEDS)
    if not row["estimable"]:
      row.update(mean=math.nan, low=math.nan, high=math.nan, p=math.nan, low_bonferroni=math.nan,
                 high_bonferroni=math.nan, sd=math.nan)
    rows.append(row)
  return holm_family(rows, m)


def holm_family(rows: list[dict], m: int | None = None, alpha: float = ALPHA) -> list[dict]:
  """Sets "p_holm" (Holm over the rows' p as one family of m, len(rows) unless given; a NaN
  p counts as 1) and "reading" on rows of `registered_family`, in place; returns them. Rows of
  several calls joined (each with the same m) become one family: Holm's step-down runs over
  all of their p-values, not over each call's."""
  m = len(rows) if m is None else m
  if m < len(rows):
    raise ValueError(f"holm_family: m = {m} is smaller than the {len(rows)} contrasts")
  for row, ph in zip(rows, stats.holm([row["p"] for row in rows], m=m)):
    row["p_holm"] = float(ph)
    row["reading"] = reading(row, alpha)
  return rows


def sensitivity(runs_points: dict, remedies: list, reference: str, targets: dict, split: str, x: str,
                y_split: str, y: str, m: int | None = None, overall: str = "overall_instance") -> list[dict]:
  """The registered family with every run that never reaches its target valued at its last
  point (no reach rule: each method then has a value on every seed it ran)."""
  values = {}
  for label in [reference] + list(remedies):
    by_seed = runs_points.get(label, {})
    matched = matched_values(by_seed, targets, split, x, y_split, y, overall)
    last = last_values(by_seed, y_split, y, overall)
    values[label] = {s: (v if math.isfinite(v) else last.get(s, math.nan)) for s, v in matched.items()}
  return registered_family(values, remedies, reference, m=m, min_reach=0.0)
