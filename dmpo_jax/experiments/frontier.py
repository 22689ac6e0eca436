"""Matched comparisons along strength axes (the collapse experiment's analysis, docs/COLLAPSE.md).

A remedy for mode collapse can keep more optima than GRPO in two ways: by keeping
optima at the same gain, or by moving the policy less. To tell them apart, each run
traces a curve (evaluation points along RL, `training/points.py`), and methods are
compared at matched pass@1 (the same gain) and at matched KL to the start policy (the
same movement):

* `interpolate(xs, ys, x)`: a run's y (coverage, pass@64) where its trajectory first
  reaches x (pass@1, KL), linear between evaluation points; NaN when it never does.
* `frontier(...)`: per seed, a method's best y at x over its strength labels (the upper
  envelope of its trajectories; the Pareto frontier a user can pick a strength from).
* `contrasts(...)`: seed-paired tests of family pairs (`stats.paired_test`), Holm-adjusted
  over the family (`stats.holm`).
* `Analysis`: a study's pre-registered matched analysis (what is matched at which target);
  `analyse(...)` runs it.
* `write(out, ...)`: frontier.md, per_seed.csv (one row per seed and label), points.csv
  (one row per run, evaluation point and instance set) and the Pareto plots.

The methods (families of labels), the pre-registered contrasts and the `Analysis` are a
study's data, not this module's: for the collapse experiment, studies/collapse_frontier/design.py
(the sweep records the families and contrasts in sweep.json; the study's entry point passes its
analysis to the report).
"""

from __future__ import annotations

import csv
import dataclasses
import fractions
import math
import os
import platform
import re
import subprocess

import numpy as np

from dmpo_jax.experiments import files, stats
from dmpo_jax.models import precision
from dmpo_jax.training import points as points_lib

POINT_METRICS = ("pass_optimal@1", "coverage", "distinct_optimal", "pass_optimal@8", "pass_optimal@64",
                 "kl_k1", "kl_k3", "optimal_rate")


def _finite(v) -> bool:
  return isinstance(v, (int, float)) and math.isfinite(v)


# ---------------------------------------------------------------------------
# Matched interpolation.
def interpolate(xs, ys, x: float) -> float:
  """y where the trajectory (xs[i], ys[i]), in training order, first reaches x, i.e. at the
  first point with xs[i] >= x: ys[0] when the start is already there, else linear between
  that point and the one before it; NaN if it never does. Points with a non-finite x or y
  are skipped."""
  xs, ys = np.asarray(xs, float), np.asarray(ys, float)
  if len(xs) != len(ys):
    raise ValueError(f"interpolate: {len(xs)} x values, {len(ys)} y values")
  keep = np.isfinite(xs) & np.isfinite(ys)
  xs, ys = xs[keep], ys[keep]
  for i in range(len(xs)):
    if xs[i] >= x:
      if i == 0 or xs[i] == x:
        return float(ys[i])
      w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
      return float(ys[i - 1] + w * (ys[i] - ys[i - 1]))
  return math.nan


def frontier(trajectories: dict, x: float) -> float:
  """A method's best matched y at x over its labels: {label: (xs, ys)} -> max of
  `interpolate` over the labels that reach x (NaN when none does)."""
  vals = [interpolate(xs, ys, x) for xs, ys in trajectories.values()]
  vals = [v for v in vals if math.isfinite(v)]
  return max(vals) if vals else math.nan


# ---------------------------------------------------------------------------
# Reading a sweep's evaluation points.
def read_points(workdir: str) -> dict:
  """{rl_step: point json} of a run folder (points/rl<step>.json); a damaged file (not a JSON
  object with "sets") is left out, as the report's `missing_points` counts it missing."""
  from dmpo_jax.training import report
  d = os.path.join(workdir, "points")
  out = {}
  if os.path.isdir(d):
    for f in os.listdir(d):
      m = re.fullmatch(r"rl(\d+)\.json", f)
      if m and (point := report.read_result(os.path.join(d, f), ("sets",))[0]) is not None:
        out[int(m.group(1))] = point
  return dict(sorted(out.items()))


# A point's metrics on one set or a union of sets ("AB"): one definition, which the start's
# bounds (config.eval.start_bounds) read too.
set_row = points_lib.set_row


def trajectory(points: dict, split: str, x: str, y: str, overall: str = "overall_instance",
               y_split: str | None = None) -> tuple:
  """(xs, ys) of one run over its evaluation points: x on set `split`, y on `y_split` (the
  same set by default)."""
  xs, ys = [], []
  for p in points.values():
    rx, ry = set_row(p, split, overall), set_row(p, y_split or split, overall)
    if rx is not None and ry is not None and x in rx and y in ry:
      xs.append(rx[x])
      ys.append(ry[y])
  return xs, ys


def matched(runs_points: dict, families: dict, split: str, x: str, y: str, target: float,
            y_split: str | None = None, overall: str = "overall_instance") -> dict:
  """{family: {seed: frontier value at x = target}} from {label: {seed: points}}; x on set
  `split`, y on `y_split` (default: the same); `overall`: "overall_instance" (the mean over
  instances) or "overall" (the mean of category means)."""
  out = {}
  for fam, labels in families.items():
    seeds = sorted({s for l in labels for s in runs_points.get(l, {})})
    out[fam] = {s: frontier({l: trajectory(runs_points[l][s], split, x, y, overall, y_split=y_split)
                             for l in labels if s in runs_points.get(l, {})}, target) for s in seeds}
  return out


MIN_SEEDS = 3  # a contrast on fewer paired seeds is reported as not estimable (p NaN)


def contrasts(values: dict, pairs, confidence: float = 0.95, m: int | None = None) -> list[dict]:
  """Seed-paired tests of (a, b) family pairs on {family: {seed: v}}, Holm-adjusted over the
  list; intervals at the Bonferroni level 1 - (1 - confidence) / m as well, m = the size of
  the family of tests (len(pairs) unless given). Pairs with fewer than MIN_SEEDS seeds where
  both reach the target are not estimable: n and the differences only (mean, intervals and
  p NaN; they count as p = 1 in Holm's m)."""
  m = len(pairs) if m is None else m
  rows = []
  for a, b in pairs:
    r = stats.paired_test(values.get(a, {}), values.get(b, {}), confidence)
    rb = stats.paired_test(values.get(a, {}), values.get(b, {}), 1 - (1 - confidence) / max(m, 1))
    r = dict(r, contrast=f"{a} - {b}", low_bonferroni=rb["low"], high_bonferroni=rb["high"])
    if r["n"] < MIN_SEEDS:
      r.update({k: math.nan for k in ("mean", "low", "high", "p", "low_bonferroni", "high_bonferroni")})
    rows.append(r)
  for r, ph in zip(rows, stats.holm([r["p"] for r in rows], m=max(m, len(rows)))):
    r["p_holm"] = float(ph)
  return rows


# ---------------------------------------------------------------------------
# Provenance and CSVs.
def provenance(repo: str | None = None) -> dict:
  """The commit (with "+dirty" when the tree has changes), the machine's CPU model and platform."""
  repo = repo or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  def git(*a):
    try:
      return subprocess.run(["git", "-C", repo, *a], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
      return ""
  commit = git("rev-parse", "HEAD") or "unknown"
  if git("status", "--porcelain", "--untracked-files=no"):
    commit += "+dirty"
  return {"commit": commit, "machine": cpu_model(), "cpu_kind": cpu_kind(), "cpus": os.cpu_count(),
          "platform": platform.platform()}


def cpu_model() -> str:
  return precision.cpuinfo_field("model name") or platform.processor() or platform.machine()


# The flags that change a CPU's numerics or speed class here: two machines named "AMD EPYC"
# can be an AVX2 and an AVX-512 part, 3x apart in matmul rate (docs/PERFORMANCE.md).
KIND_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_kind(path: str = "/proc/cpuinfo") -> str:
  """'family F model M: <the KIND_FLAGS it has>' from /proc/cpuinfo ("unknown" without it)."""
  flags = precision.read_cpu_flags(path)
  family, model = precision.cpuinfo_field("cpu family", path), precision.cpuinfo_field("model", path)
  if flags is None and family is None:
    return "unknown"
  have = [f for f in KIND_FLAGS if f in (flags or ())]
  return f"family {family} model {model}: {' '.join(have) or 'none of ' + ' '.join(KIND_FLAGS)}"


def per_seed_rows(runs: dict, points: dict, metrics=POINT_METRICS) -> list[dict]:
  """One row per (label, seed): status, the RL steps of missing evaluation points (an
  "incomplete" run's), wall time, the final held-out metrics (C at the evaluation
  temperature; finished runs only) and the last evaluation point's metrics on every set
  (point_rl_step: which one; a run that is not finished has not reached its end there)."""
  rows = []
  for label, by_seed in runs.items():
    for seed, r in by_seed.items():
      row = {"label": label, "seed": seed, "status": r["status"], "rl_steps_done": r["rl_steps_done"],
             "missing_points": " ".join(map(str, r.get("missing_points") or ())), "wall_s": r["wall_s"]}
      for m, v in (r.get("after") or {}).items():
        if m in metrics or m in ("SR_mean", "QR_mean", "distinct"):
          row[f"final_{m}"] = v
      pts = points.get(label, {}).get(seed, {})
      if pts:
        last_step = max(pts)
        row["point_rl_step"] = last_step
        for split, res in pts[last_step]["sets"].items():
          for m in metrics:
            if m in res["overall_instance"]:
              row[f"{split}_{m}"] = res["overall_instance"][m]
      rows.append(row)
  return rows


def _point_sets(points: dict):
  """(label, seed, RL step, set, that set's results) over every evaluation point."""
  for label, by_seed in points.items():
    for seed, pts in by_seed.items():
      for step, p in pts.items():
        for split, res in p["sets"].items():
          yield label, seed, step, split, res


def point_rows(points: dict, metrics=POINT_METRICS) -> list[dict]:
  """One row per (label, seed, RL step, set), both overalls (per instance, per category)."""
  rows = []
  for label, seed, step, split, res in _point_sets(points):
    row = {"label": label, "seed": seed, "rl_step": step, "set": split}
    for m in metrics:
      row[m] = res["overall_instance"].get(m)
      row[f"{m}_by_category"] = res["overall"].get(m)
    rows.append(row)
  return rows


def per_task_rows(points: dict, metrics=POINT_METRICS) -> list[dict]:
  """One row per (label, seed, RL step, set, task): the task's metrics (mean over its instances)."""
  return [{"label": label, "seed": seed, "rl_step": step, "set": split, "task": task,
           **{k: m.get(k) for k in metrics}}
          for label, seed, step, split, res in _point_sets(points)
          for task, m in res.get("per_task", {}).items()]


def write_csv(rows: list[dict], path: str) -> None:
  cols = list(dict.fromkeys(k for r in rows for k in r))
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    w.writerows(rows)


# ---------------------------------------------------------------------------
# Pareto plots.
# (set of x, x, set of y, y, title): the gain is pass@1 on the RL prompts (A and B), as in
# the pre-registered contrasts.
PARETO = (("AB", "pass_optimal@1", "A", "coverage", "coverage on A vs optimal pass@1 on A+B"),
          ("AB", "pass_optimal@1", "B", "pass_optimal@64", "optimal pass@64 on B vs optimal pass@1 on A+B"),
          ("AB", "kl_k1", "A", "coverage", "coverage on A vs KL(pi || pi_start) (k1) on A+B"))


def plot_pareto(points: dict, families: dict, path: str, targets: dict | None = None) -> None:
  """Per-seed points (small) and each label's mean curve over seeds (line through its
  evaluation points), coloured by family; a dotted line at each matching target
  ({(set, x metric): value})."""
  from matplotlib.figure import Figure
  fig = Figure(figsize=(5.2 * len(PARETO), 4.4))
  fam_of = {l: f for f, ls in families.items() for l in ls}
  fam_color = {f: f"C{i % 10}" for i, f in enumerate(families)}
  for ax, (split, x, y_split, y, title) in zip(fig.subplots(1, len(PARETO)), PARETO):
    seen = set()
    for label, by_seed in points.items():
      color = fam_color.get(fam_of.get(label), "gray")
      trajs = [trajectory(p, split, x, y, y_split=y_split) for p in by_seed.values()]
      trajs = [t for t in trajs if t[0]]
      if not trajs:
        continue
      for xs, ys in trajs:
        ax.scatter(xs, ys, s=6, color=color, alpha=0.35, lw=0)
      n = min(len(t[0]) for t in trajs)
      mx = np.mean([t[0][:n] for t in trajs], 0)
      my = np.mean([t[1][:n] for t in trajs], 0)
      fam = fam_of.get(label, label)
      ax.plot(mx, my, color=color, lw=1.2, marker="o", ms=2.5, label=None if fam in seen else fam)
      seen.add(fam)
    if (targets or {}).get((split, x)) is not None:
      ax.axvline(targets[(split, x)], color="black", ls=":", lw=1)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"{x} ({split})")
    ax.set_ylabel(f"{y} ({y_split})")
    if seen:
      ax.legend(fontsize=7)
  fig.suptitle("each label: mean over seeds along its evaluation points (start, 1/3, 2/3, end); "
               "dots: seeds; dotted: the matching target", fontsize=9)
  fig.tight_layout()
  files.save_figure(fig, path)


# ---------------------------------------------------------------------------
# The matched analysis of a sweep folder.
MIN_GAIN = 0.02  # a reference gain in pass@1 below this leaves nothing to match (no target)


@dataclasses.dataclass(frozen=True)
class Analysis:
  """A study's pre-registered matched analysis. Each comparison is (set of x, x, set of y, y):
  y where x first reaches its target. `primary`: the pre-registered comparisons (Holm over
  all of them x the contrasts); `exploratory`: others (Holm within). Targets: the reference's
  mean start + target_fraction x its mean gain in x (none when the gain is below min_gain);
  for x = KL, target_fraction x the reference's mean end KL."""
  primary: tuple
  exploratory: tuple
  target_fraction: float
  min_gain: float = MIN_GAIN


NO_ANALYSIS = Analysis((), (), 0.0)  # a sweep without a study: no targets, no contrasts


def targets(points: dict, reference: str, analysis: Analysis, overall: str = "overall_instance") -> dict:
  """The matching targets, by the analysis' rule: for x = pass@1 on a set, the mean start
  value + frac x (the reference label's mean end value - the mean start value), none when
  that gain is below min_gain; for x = KL, frac x the reference's mean end KL (frac:
  analysis.target_fraction). Means over the reference's seeds. {(set, x): target}."""
  frac = analysis.target_fraction
  runs = points.get(reference, {})
  out = {}
  for split, x, _, _ in analysis.primary + analysis.exploratory:
    start, end = [], []
    for pts in runs.values():
      xs, _ = trajectory(pts, split, x, x, overall)
      if len(xs) >= 2 and 0 in pts:  # a run's start (RL step 0) and its end (its last point)
        start.append(xs[0])
        end.append(xs[-1])
    if start:
      s, e = float(np.mean(start)), float(np.mean(end))
      if x.startswith("kl"):
        out[(split, x)] = frac * e
      elif e - s >= analysis.min_gain:
        out[(split, x)] = s + frac * (e - s)
  return out


def analyse(points: dict, families: dict, pairs, reference: str, analysis: Analysis,
            overall: str = "overall_instance", given_targets: dict | None = None) -> dict:
  """Matched values per family and seed, and the contrasts: "primary" (analysis.primary x
  pairs, Holm over all of them) and "exploratory" (analysis.exploratory x pairs, Holm within). A spec
  without a target (too small a reference gain) is listed under "no_target".
  given_targets: {(set, x): target} in place of the pre-registered rule's (`targets`), for an
  exploratory analysis at other targets; specs whose (set, x) it lacks have no target."""
  tg = targets(points, reference, analysis, overall=overall) if given_targets is None else dict(given_targets)
  out = {"overall": overall, "targets": {f"{s}/{x}": v for (s, x), v in tg.items()}, "matched": {}, "primary": [],
         "exploratory": [], "no_target": [], "start_at_target": {}}
  for (split, x), v in tg.items():  # seeds whose start (shared by their labels) is at the target
    starts = {seed: trajectory({0: pts[0]}, split, x, x, overall)[0] for seed, pts in points.get(reference, {}).items()
              if 0 in pts}
    out["start_at_target"][f"{split}/{x}"] = sorted(seed for seed, xs in starts.items() if xs and xs[0] >= v)
  for kind, specs in (("primary", analysis.primary), ("exploratory", analysis.exploratory)):
    rows = []
    m = len(specs) * len(pairs)  # the family of tests of this kind, as registered
    for split, x, y_split, y in specs:
      if (split, x) not in tg:
        out["no_target"].append(f"{kind}: {y_split}/{y} at {split}/{x}")
        continue
      vals = matched(points, families, split, x, y, tg[(split, x)], y_split=y_split, overall=overall)
      out["matched"][f"{y_split}/{y}@{split}/{x}"] = vals
      for r in contrasts(vals, pairs, m=m):
        rows.append(dict(r, set=y_split, x=f"{split}/{x}", y=y, target=tg[(split, x)]))
    for r, ph in zip(rows, stats.holm([r["p"] for r in rows], m=max(m, len(rows)))):
      r["p_holm"] = float(ph)  # over the whole family of this kind (untestable ones: p = 1)
    out[kind] = rows
  return out


def _f(v, nd=3) -> str:
  return "—" if v is None or not _finite(v) else f"{v:.{nd}f}"


# (set, metric) columns of the start and end tables.
SUMMARY = (("AB", "pass_optimal@1"), ("A", "pass_optimal@1"), ("A", "coverage"), ("B", "pass_optimal@1"),
           ("B", "pass_optimal@64"), ("C", "pass_optimal@1"), ("C", "coverage"), ("AB", "kl_k1"))


def _value(point: dict, split: str, metric: str, overall: str) -> float:
  row = set_row(point, split, overall)
  return math.nan if row is None else row.get(metric, math.nan)


def _mean_ci(values) -> str:
  v = [x for x in values if _finite(x)]
  if len(v) < 2:
    return _f(v[0] if v else None)
  iv = stats.mean_ci(v)
  return f"{iv.mean:.3f} ± {iv.high - iv.mean:.3f}"


def summary_tables(points: dict, reference: str, overall: str) -> list[str]:
  """Markdown: the start (RL step 0) per seed, read from the reference label's points (a
  seed's labels share it), and every label at its last point, mean ± 95% half-width."""
  head = [f"{m} ({sp})" for sp, m in SUMMARY]
  lines = ["| seed | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 1)]
  starts = {s: p[0] for s, p in sorted(points.get(reference, {}).items()) if 0 in p}
  for seed, pt in starts.items():
    lines.append(f"| {seed} | " + " | ".join(_f(_value(pt, sp, m, overall)) for sp, m in SUMMARY) + " |")
  lines.append("| mean ± 95% | " + " | ".join(_mean_ci([_value(pt, sp, m, overall) for pt in starts.values()])
                                           for sp, m in SUMMARY) + " |")
  lines += ["", "Each label at the end of RL (its last evaluation point), mean ± 95% t half-width over seeds:", "",
            "| label | n | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 2)]
  for label, by_seed in points.items():
    ends = [p[max(p)] for p in by_seed.values()]
    lines.append(f"| `{label}` | {len(ends)} | " + " | ".join(
        _mean_ci([_value(pt, sp, m, overall) for pt in ends]) for sp, m in SUMMARY) + " |")
  return lines


def per_task_tables(points: dict, reference: str) -> list[str]:
  """Markdown: per task, coverage on A and optimal pass@64 on B at the start and at each
  label's end (mean over seeds)."""
  lines = []
  for split, metric in (("A", "coverage"), ("B", "pass_optimal@64"), ("AB", "pass_optimal@1")):
    parts = list(split)
    tasks = sorted({t for by_seed in points.values() for p in by_seed.values() for q in p.values()
                    for sp in parts for t in q["sets"].get(sp, {}).get("per_task", {})})
    if not tasks:
      continue
    def cell(pts_list, task):
      vals = []
      for pt in pts_list:
        v = [pt["sets"][sp]["per_task"][task].get(metric) for sp in parts
             if task in pt["sets"].get(sp, {}).get("per_task", {})]
        v = [x for x in v if _finite(x)]
        if v:
          vals.append(float(np.mean(v)))  # A and B have the same instances per task
      return _f(float(np.mean(vals)) if vals else None)
    lines += [f"{metric} on {split} per task (mean over seeds):", "",
              "| label | " + " | ".join(tasks) + " |", "|" + "---|" * (len(tasks) + 1)]
    starts = [p[0] for p in points.get(reference, {}).values() if 0 in p]
    lines.append("| start (RL step 0) | " + " | ".join(cell(starts, t) for t in tasks) + " |")
    for label, by_seed in points.items():
      lines.append(f"| `{label}` | " + " | ".join(cell([p[max(p)] for p in by_seed.values()], t)
                                                  for t in tasks) + " |")
    lines.append("")
  return lines


def contrast_table(rows: list[dict]) -> list[str]:
  head = ["contrast", "set of y", "y at matched x", "target", "n", "mean diff", "95% CI",
          "Bonferroni CI", "p", "p (Holm)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  lines += ["| " + " | ".join([f"`{r['contrast']}`", r["set"], f"{r['y']} @ {r['x']}", _f(r["target"]), str(r["n"]),
                               _f(r["mean"]), f"[{_f(r['low'])}, {_f(r['high'])}]",
                               f"[{_f(r['low_bonferroni'])}, {_f(r['high_bonferroni'])}]", _f(r["p"], 4),
                               _f(r["p_holm"], 4)]) + " |" for r in rows]
  return lines + [""]


def markdown(result: dict, manifest: dict, analysis: Analysis = NO_ANALYSIS) -> str:
  lines = ["# Matched comparisons (dmpo_jax.experiments.frontier)", ""]
  for s in manifest.get("sessions", []):
    kind = f", {s['cpu_kind']}" if s.get("cpu_kind") else ""
    lines.append(f"- run on commit `{s.get('commit')}`, machine {s.get('machine')}{kind} ({s.get('cpus')} CPUs), "
                 f"started {s.get('started')}, wall {_f(s.get('wall_s'), 0)} s")
  registered = bool(analysis.primary or analysis.exploratory)
  if registered:
    ref, frac = manifest.get("baseline", "grpo"), fractions.Fraction(analysis.target_fraction).limit_denominator(1000)
    lines += ["", f"Targets (pre-registered rule: start + {frac} of `{ref}`'s mean gain in pass@1; {frac} of "
              f"`{ref}`'s mean end KL; AB = sets A and B together, the RL prompts): " + ", ".join(f"{k} = {_f(v)}" for k, v in result["targets"].items()), ""]
  else:
    lines += ["", "No pre-registered analysis (the sweep's report was written without a study's design): "
              "no targets and no contrasts.", ""]
  at = {k: v for k, v in result.get("start_at_target", {}).items() if v}
  if at:
    lines += ["Seeds whose start is already at the target (every method's matched value there is the "
              "start's, a difference of 0): " + "; ".join(f"{k}: seeds {v}" for k, v in at.items()), ""]
  if result.get("incomplete"):
    lines += [f"Left out (not finished): {', '.join(result['incomplete'])}", ""]
  if result.get("no_target"):
    lines += [f"No target (the reference's mean pass@1 gain is below {analysis.min_gain}): "
              + "; ".join(result["no_target"]), ""]
  for kind in ("primary", "exploratory") if registered else ():
    lines += [f"## {'Pre-registered' if kind == 'primary' else 'Exploratory'} contrasts "
              f"(seed-paired; each method's best strength at the target; overall = mean over instances)", ""]
    lines += contrast_table(result[kind])
  cat = result.get("by_category")
  if cat and registered:
    lines += ["## The pre-registered contrasts with overall = the mean of category means (exploratory)", "",
              "Targets: " + ", ".join(f"{k} = {_f(v)}" for k, v in cat["targets"].items()), ""]
    lines += contrast_table(cat["primary"])
  if result.get("tables"):
    lines += ["## The start and the end of each label (overall = mean over instances)", "",
              "The start (RL step 0; a seed's labels share it), per seed:", ""] + result["tables"] + [""]
  if result.get("per_task"):
    lines += ["## Per task (exploratory)", ""] + result["per_task"]
  lines += ["## Matched values per method (mean [95% t-interval] over seeds that reach the target, n)", ""]
  fams = sorted({f for v in result["matched"].values() for f in v})
  keys = list(result["matched"])
  lines += ["| method | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 1)]
  for f in fams:
    cells = []
    for k in keys:
      v = {s: x for s, x in result["matched"][k].get(f, {}).items() if _finite(x)}
      if len(v) >= 2:
        iv = stats.mean_ci(list(v.values()))
        cells.append(f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}] n={iv.n}")
      else:
        cells.append(f"{_f(next(iter(v.values()), None))} n={len(v)}")
    lines.append(f"| `{f}` | " + " | ".join(cells) + " |")
  lines += ["", "Per-seed values: `matched.csv` (one row per comparison, method and seed), `per_seed.csv` "
            "(one row per seed and label), `points.csv` (one row per run, evaluation point and set; "
            "`*_by_category` columns: the mean of category means, the others: the mean over instances), "
            "`per_task.csv` (one row per run, evaluation point, set and task).", "",
            "![Pareto plots](pareto.png)", ""]
  return "\n".join(lines)


# What `write` derives from the finished runs' points (rewritten by every report).
ANALYSIS_FILES = ("frontier.md", "frontier.json", "points.csv", "per_task.csv", "matched.csv", "pareto.png")


def write(out: str, runs: dict, manifest: dict, plots: bool = True, analysis: Analysis | None = None) -> dict:
  """frontier.md, frontier.json, per_seed.csv, points.csv and pareto.png of a sweep folder
  (runs: sweep_report.collect's; analysis: the study's pre-registered `Analysis`, None: no
  targets and no contrasts). Without a finished run that holds points, per_seed.csv alone is
  written and an earlier report's ANALYSIS_FILES are removed."""
  from dmpo_jax.training import report
  analysis = analysis or NO_ANALYSIS
  every = {l: {s: p for s in by_seed if (p := read_points(os.path.join(out, l, f"seed{s}")))}
           for l, by_seed in runs.items()}
  write_csv(per_seed_rows(runs, every), os.path.join(out, "per_seed.csv"))
  # The analysis reads finished runs only: a run stopped part-way, or one whose evaluation
  # point is missing ("incomplete"), has no end point, and its last point would pass for one
  # (per_seed.csv's status and missing_points show the others).
  points = {l: {s: p for s, p in by_seed.items() if runs[l][s]["status"] == "finished"}
            for l, by_seed in every.items()}
  points = {l: v for l, v in points.items() if v}
  if not points:  # nothing to analyse: an earlier report's analysis would pass for this one's
    for name in ANALYSIS_FILES:
      if os.path.exists(os.path.join(out, name)):
        os.remove(os.path.join(out, name))
    return {}
  write_csv(point_rows(points), os.path.join(out, "points.csv"))
  families = {f: [l for l in ls if l in points] for f, ls in manifest.get("families", {}).items()}
  families = {f: ls for f, ls in families.items() if ls}
  pairs = [tuple(p) for p in manifest.get("contrasts", [])]
  result = analyse(points, families, pairs, manifest.get("baseline", "grpo"), analysis)
  result["incomplete"] = [f"{l}/seed{s} ({r['status']}" + (
      f": no evaluation point at RL step {', '.join(map(str, r['missing_points']))})"
      if r.get("missing_points") else ")") for l, by_seed in runs.items()
      for s, r in by_seed.items() if r["status"] != "finished"]
  reference = manifest.get("baseline", "grpo")
  by_cat = analyse(points, families, pairs, reference, analysis, overall="overall")
  result["by_category"] = {k: by_cat[k] for k in ("targets", "primary", "start_at_target")}
  result["tables"] = summary_tables(points, reference, "overall_instance")
  result["per_task"] = per_task_tables(points, reference)
  write_csv(per_task_rows(points), os.path.join(out, "per_task.csv"))
  write_csv([{"comparison": k, "method": f, "seed": seed, "value": x}
             for k, v in result["matched"].items() for f, d in v.items() for seed, x in d.items()],
            os.path.join(out, "matched.csv"))
  if plots:
    plot_pareto(points, families or {l: [l] for l in points}, os.path.join(out, "pareto.png"),
                targets(points, manifest.get("baseline", "grpo"), analysis))
  with open(os.path.join(out, "frontier.md"), "w") as f:
    f.write(markdown(result, manifest, analysis))
  safe = {k: v for k, v in result.items() if k not in ("matched", "tables", "per_task")}
  safe["matched"] = {k: {f: {str(s): x for s, x in d.items()} for f, d in v.items()}
                     for k, v in result["matched"].items()}
  report.write_json(files.json_safe(safe), os.path.join(out, "frontier.json"))
  return result
