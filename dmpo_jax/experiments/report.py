"""The report of a sweep folder (finished or partial): report.md, report.json and PNG plots.

    from dmpo_jax.experiments import report as sweep_report
    sweep_report.write_report("runs/sweep", analysis=design.ANALYSIS)   # a study's analysis, or None
    # also: python -m studies.collapse_frontier.sweep --out=... --report_only

Everything is read from the run folders (`<label>/seed<k>/`: results.json,
eval_before.json, eval_after.json, metrics.jsonl, config.json, points/); nothing is
recomputed. A run counts as finished only with results.json and every evaluation point
its config.json plans (`missing_points`); one with results.json and a missing point is
"incomplete" and, like a partial run, is never analysed; nor is one whose start was outside
config.eval.start_bounds (stopped.json: "out_of_bounds"). Per label: the mean and 95%
Student-t interval over seeds of the final metrics of finished runs, and the seed-paired
difference against the baseline label (dmpo_jax.experiments.stats). A metric the trainer does not write is
reported as "not logged" (FINAL, CURVES and GRADIENTS list the names read).
"""

from __future__ import annotations

import glob
import math
import os
import re
import tempfile

import numpy as np

from dmpo_jax.training import report
from dmpo_jax.experiments import files, frontier, stats

NOT_LOGGED = "not logged"
# (name in the report, what it is): keys of the evaluation's "overall" dict after RL.
FINAL = (
    ("SR_mean", "success, feasible (share of samples)"),
    ("optimal_rate", "success, optimal (share of samples)"),
    ("QR_mean", "quality ratio (mean over samples)"),
    ("distinct_optimal", "distinct optimal solutions per instance"),
    ("coverage", "share of each instance's optimal set sampled"),
    ("pass@1", "pass@1, feasible"), ("pass@8", "pass@8, feasible"), ("pass@64", "pass@64, feasible"),
    ("pass_optimal@1", "pass@1, optimal"), ("pass_optimal@8", "pass@8, optimal"),
    ("pass_optimal@64", "pass@64, optimal"),
    ("distinct", "distinct feasible solutions per instance"),
    ("length", "answer length (tokens)"),
)
# Per-step RL rows of metrics.jsonl drawn over RL steps.
CURVES = (("distinct_optimal", "distinct optima / group"), ("distinct", "distinct feasible / group"),
          ("length", "answer length (tokens)"), ("qr_mean", "quality ratio (mean)"),
          ("coverage", "coverage of the optimal set"))
# Gradient norms of the RL terms: mean over RL steps per run, then over seeds.
GRADIENTS = (("pg_grad_norm", "policy-gradient term"), ("reg_grad_norm", "DM / divergence / KL term"),
             ("grad_ratio", "regulariser / policy gradient"))
RATIO_OF_MEANS = ("ratio_of_means", "mean regulariser norm / mean policy-gradient norm, per seed")
PASS_KEY = re.compile(r"^pass(_optimal)?@(\d+)$")


# ---------------------------------------------------------------------------
# Reading run folders.
def _read(path):
  return report.read_json(path) if os.path.exists(path) else None


def planned_points(config: dict) -> list[int]:
  """The RL steps of a run's evaluation points, from its config.json (`eval.points` over
  `rl.steps`; none when the config predates evaluation points)."""
  from dmpo_jax.training import points
  return points.point_steps(int(config.get("rl", {}).get("steps") or 0),
                            int(config.get("eval", {}).get("points") or 0))


def missing_points(workdir: str, config: dict | None = None) -> list[int]:
  """The planned RL steps (config: the run's config.json, read when not given) whose
  points/rl<step>.json is absent or damaged (not a JSON object with "sets")."""
  from dmpo_jax.training import points
  if config is None:
    config = _read(os.path.join(workdir, "config.json")) or {}
  return [s for s in planned_points(config)
          if report.read_result(os.path.join(workdir, points.DIR, f"rl{s}.json"), ("sets",))[0] is None]


def run_status(r: dict) -> str:
  """A run's status for tables: "incomplete" names its missing evaluation points,
  "out_of_bounds" the start's measured values outside config.eval.start_bounds."""
  if r["status"] == "incomplete":
    return f"incomplete: no evaluation point at RL step {', '.join(map(str, r['missing_points']))}"
  if r["status"] == "out_of_bounds":
    return ("out_of_bounds: stopped before RL, start outside config.eval.start_bounds: "
            + "; ".join(r["stopped"].get("outside", [])))
  return r["status"]


def load_run(workdir: str) -> dict:
  """What a run folder holds: status ("finished", "incomplete": results.json but a planned
  evaluation point missing, "out_of_bounds": stopped before RL, its start outside
  config.eval.start_bounds (stopped.json, kept as "stopped"), "partial", "failed", "not
  started"), the evaluations' overall dicts, the RL rows (step counted from the start of RL),
  the missing points' RL steps."""
  results = _read(os.path.join(workdir, "results.json"))
  stopped = report.read_stopped(workdir)
  config = _read(os.path.join(workdir, "config.json")) or {}
  missing = missing_points(workdir, config) if results is not None else []
  before = _read(os.path.join(workdir, "eval_before.json"))
  after = _read(os.path.join(workdir, "eval_after.json"))
  rows = report.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  sft = (results or {}).get("steps", {}).get("sft", config.get("sft", {}).get("steps", 0))
  rl = [dict(r, rl_step=r["step"] - sft) for r in rows if r.get("stage") == "rl"]
  if results is not None:
    status = "incomplete" if missing else "finished"
  elif stopped is not None:
    status = "out_of_bounds"
  elif os.path.exists(os.path.join(workdir, "sweep_error.txt")):
    status = "failed"
  elif rl or os.path.isdir(os.path.join(workdir, "checkpoints")):
    status = "partial"
  else:
    status = "not started"
  if results is not None and after is None:
    after = results.get("after")
  c = config.get("collapse") or {}
  split = ("set C (evaluation only; disjoint from SFT's A and RL's A + B)" if c.get("splits")
           else "the pool (the instances SFT and RL train on)" if c.get("pool")
           else "held-out instances")
  return {"status": status, "results": results, "before": (before or {}).get("overall"), "split": split,
          "after": (after or {}).get("overall") if status == "finished" else None, "rl": rl,
          "rl_steps_done": max((r["rl_step"] for r in rl), default=0),
          "rl_steps": config.get("rl", {}).get("steps"), "wall_s": (results or {}).get("wall_s"),
          "missing_points": missing, "stopped": stopped}


def collect(out: str) -> tuple[dict, dict]:
  """({label: {seed: run}}, manifest): labels in the manifest's order, then any other folder."""
  manifest = _read(os.path.join(out, "sweep.json")) or {}
  found = {}
  for d in sorted(glob.glob(os.path.join(out, "*", "seed*"))):
    label, seed = os.path.basename(os.path.dirname(d)), os.path.basename(d)[4:]
    if label.startswith("_") or not seed.isdigit() or not os.path.isdir(d):
      continue
    found.setdefault(label, set()).add(int(seed))
  labels = list(dict.fromkeys(manifest.get("labels", []) + sorted(found)))
  runs = {}
  for label in labels:
    seeds = sorted(set(manifest.get("seeds", [])) | found.get(label, set()))
    runs[label] = {s: load_run(os.path.join(out, label, f"seed{s}")) for s in seeds}
  return runs, manifest


# ---------------------------------------------------------------------------
# Statistics.
def _finite(v) -> bool:
  return isinstance(v, (int, float)) and math.isfinite(v)


def interval(values: dict) -> dict | None:
  """{seed: value} -> {"mean", "low", "high", "n", "values"}; low/high None with one seed."""
  vals = {s: float(v) for s, v in values.items() if _finite(v)}
  if not vals:
    return None
  if len(vals) == 1:
    (v,) = vals.values()
    return {"mean": v, "low": None, "high": None, "n": 1, "values": vals}
  iv = stats.mean_ci(list(vals.values()))
  return {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n, "values": vals}


def paired(values: dict, baseline: dict) -> dict | None:
  """Seed-paired difference on the seeds both have (finite values; `stats.paired_test`), in
  the report's form: None without a common seed, no interval with one."""
  t = stats.paired_test(values, baseline)
  if not t["n"]:
    return None
  if t["n"] == 1:
    return interval(t["diffs"])
  return {"mean": t["mean"], "low": t["low"], "high": t["high"], "n": t["n"], "values": t["diffs"]}


def fmt(iv) -> str:
  if iv is None:
    return "—"
  if iv == NOT_LOGGED:
    return NOT_LOGGED
  if iv["low"] is None:
    return f"{iv['mean']:.3f} (n=1)"
  return f"{iv['mean']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}]"


def summarize(runs: dict, baseline: str) -> dict:
  """Final metrics, paired differences, gradient figures and the SFT policy's row."""
  finished = {l: {s: r for s, r in by_seed.items() if r["status"] == "finished"} for l, by_seed in runs.items()}
  finished = {l: by_seed for l, by_seed in finished.items() if by_seed}
  logged = {l: {m for r in by_seed.values() for m in r["after"] or {}} for l, by_seed in finished.items()}
  final, diff, grads = {}, {}, {}
  for label, by_seed in finished.items():
    final[label] = {m: interval({s: r["after"].get(m) for s, r in by_seed.items()}) if m in logged[label]
                    else NOT_LOGGED for m, _ in FINAL}
    grads[label], means = {}, {}
    for m, _ in GRADIENTS:
      per = {s: float(np.mean(v)) for s, r in by_seed.items()
             if (v := [x[m] for x in r["rl"] if _finite(x.get(m))])}
      grads[label][m], means[m] = (interval(per) if per else NOT_LOGGED), per
    # The ratio of the mean norms (the mean of per-step ratios above weighs steps where the
    # policy gradient is small, e.g. all-equal groups, far more).
    pg, reg = means["pg_grad_norm"], means["reg_grad_norm"]
    ratio = {s: reg[s] / pg[s] for s in pg if s in reg and pg[s] > 0}
    grads[label][RATIO_OF_MEANS[0]] = interval(ratio) if ratio else NOT_LOGGED
  base = finished.get(baseline, {})
  for label, by_seed in finished.items():
    if label == baseline or not base:
      continue
    diff[label] = {m: paired({s: r["after"].get(m) for s, r in by_seed.items()},
                             {s: r["after"].get(m) for s, r in base.items()})
                   if m in logged[label] and m in logged[baseline] else NOT_LOGGED for m, _ in FINAL}
  before = {}  # the SFT policy of each seed (shared by every run of that seed)
  for by_seed in runs.values():
    for s, r in by_seed.items():
      if r["before"] is not None:
        before.setdefault(s, r["before"])
  before_row = {m: interval({s: b.get(m) for s, b in before.items()})
                if any(m in b for b in before.values()) else NOT_LOGGED for m, _ in FINAL}
  return {"final": final, "paired": diff, "gradients": grads, "before": before_row,
          "before_by_seed": before}


def curves(runs: dict, keys=tuple(k for k, _ in CURVES)) -> dict:
  """{label: {metric: {"step", "mean", "low", "high", "n"}}}: per RL step, over the seeds that
  logged it (finished and partial runs); low/high NaN where fewer than two seeds."""
  out = {}
  for label, by_seed in runs.items():
    out[label] = {}
    for m in keys:
      per_step = {}
      for r in by_seed.values():
        for row in r["rl"]:
          if _finite(row.get(m)):
            per_step.setdefault(row["rl_step"], []).append(float(row[m]))
      if not per_step:
        continue
      steps_ = sorted(per_step)
      mean, low, high, n = [], [], [], []
      for st in steps_:
        v = per_step[st]
        iv = stats.mean_ci(v) if len(v) >= 2 else None
        mean.append(float(np.mean(v)))
        low.append(iv.low if iv else math.nan)
        high.append(iv.high if iv else math.nan)
        n.append(len(v))
      out[label][m] = {"step": steps_, "mean": mean, "low": low, "high": high, "n": n}
  return out


def pass_curves(runs: dict, before_by_seed: dict) -> dict:
  """{"feasible"|"optimal": {label or "SFT (before RL)": {k: interval}}} from the evaluations."""
  out = {"feasible": {}, "optimal": {}}
  sources = [("SFT (before RL)", before_by_seed)] + [
      (l, {s: r["after"] for s, r in by_seed.items() if r["status"] == "finished"}) for l, by_seed in runs.items()]
  for name, by_seed in sources:
    for kind in out:
      ks = sorted({int(m.group(2)) for o in by_seed.values() for key in o
                   if (m := PASS_KEY.match(key)) and bool(m.group(1)) == (kind == "optimal")})
      if ks:
        key = "pass_optimal@%d" if kind == "optimal" else "pass@%d"
        out[kind][name] = {k: interval({s: o.get(key % k) for s, o in by_seed.items()}) for k in ks}
  return out


# ---------------------------------------------------------------------------
# Plots (matplotlib's Figure: never switches the caller's backend).
def plot_curves(cv: dict, path: str) -> None:
  from matplotlib.figure import Figure
  fig = Figure(figsize=(4.2 * len(CURVES), 3.4))
  axes = fig.subplots(1, len(CURVES))
  for ax, (m, title) in zip(axes, CURVES):
    drawn = False
    for i, (label, by_metric) in enumerate(cv.items()):
      c = by_metric.get(m)
      if not c:
        continue
      ax.plot(c["step"], c["mean"], lw=1.5, color=f"C{i % 10}", label=label)
      ax.fill_between(c["step"], c["low"], c["high"], color=f"C{i % 10}", alpha=0.15, lw=0)
      drawn = True
    if drawn:
      ax.legend(fontsize=7)
    else:
      ax.text(0.5, 0.5, NOT_LOGGED, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("RL step")
  fig.suptitle("mean over seeds, band: 95% t-interval", fontsize=9)
  fig.tight_layout()
  files.save_figure(fig, path)


def plot_pass(pc: dict, path: str) -> None:
  from matplotlib.figure import Figure
  fig = Figure(figsize=(10, 3.8))
  for ax, kind in zip(fig.subplots(1, 2), ("feasible", "optimal")):
    for i, (name, by_k) in enumerate(pc[kind].items()):
      ks = [k for k, iv in by_k.items() if iv is not None]
      if not ks:
        continue
      before = name.startswith("SFT")
      ax.plot(ks, [by_k[k]["mean"] for k in ks], marker="o", ms=3, ls="--" if before else "-",
              color="black" if before else f"C{(i - 1) % 10}", label=name)
      lo = [by_k[k]["low"] for k in ks]
      if all(v is not None for v in lo):
        ax.fill_between(ks, lo, [by_k[k]["high"] for k in ks], alpha=0.12, lw=0,
                        color="black" if before else f"C{(i - 1) % 10}")
    if not pc[kind]:
      ax.text(0.5, 0.5, NOT_LOGGED, ha="center", va="center", transform=ax.transAxes, color="gray")
    else:
      ax.set_xscale("log", base=2)
      ax.legend(fontsize=7)
    ax.set_title(f"pass@k, correct = {kind} (before: dashed; after RL: solid)", fontsize=9)
    ax.set_xlabel("k")
  fig.tight_layout()
  files.save_figure(fig, path)


# ---------------------------------------------------------------------------
def _table(head: list[str], rows: list[list[str]]) -> list[str]:
  return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(out: str, manifest: dict, runs: dict, summ: dict, baseline: str) -> str:
  rows_all = list(summ["final"].values()) + [summ["before"]]
  names = [m for m, _ in FINAL if any(r[m] != NOT_LOGGED for r in rows_all)]
  absent = [m for m, _ in FINAL if m not in names]
  n_total = sum(len(v) for v in runs.values())
  n_done = sum(r["status"] == "finished" for v in runs.values() for r in v.values())
  args = manifest.get("args", {})
  lines = [f"# Sweep report: `{out}`", "",
           f"Config `{args.get('config', '?')}`{' (smoke)' if args.get('smoke') else ''}"
           + (f", overrides {args.get('set')}" if args.get("set") else "")
           + f"; {n_done} of {n_total} runs finished. Values: mean [95% Student-t interval] over the "
           "seeds of finished runs (n=1: no interval). `not logged`: the trainer does not write this "
           "metric (docs/COLLAPSE.md, hooks).", ""]
  bounds = [f"{l}/seed{s}: " + "; ".join(r["stopped"].get("outside", []))
            for l, v in runs.items() for s, r in v.items() if r["status"] == "out_of_bounds"]
  if bounds:
    lines += ["**Stopped: a start outside config.eval.start_bounds** (" + "; ".join(bounds) + "). "
              "The sweep ran no further runs: the labels of a seed share its start.", ""]
  if n_done < n_total:
    missing = [f"{l}/seed{s} ({run_status(r)}, RL step {r['rl_steps_done']}/{r['rl_steps'] or '?'})"
               for l, v in runs.items() for s, r in v.items() if r["status"] != "finished"]
    lines += ["**Partial sweep.** Not finished: " + ", ".join(missing) + ".", ""]
  for sess in manifest.get("sessions", []):
    kind = f" ({sess['cpu_kind']})" if sess.get("cpu_kind") else ""
    lines.append(f"Run on commit `{sess.get('commit')}`, machine {sess.get('machine')}{kind}, started "
                 f"{sess.get('started')}, sweep wall time "
                 + (f"{sess['wall_s']:.0f} s" if sess.get("wall_s") is not None else "unfinished") + ".")
  splits = sorted({r["split"] for v in runs.values() for r in v.values() if r["status"] == "finished"})
  split = " / ".join(splits) or "held-out instances"
  lines += ["", f"## Final metrics after RL, evaluated on {split}", "",
            "`overall` is the mean of the category means (NP-Bench's); the mean over instances, "
            "and every evaluation point along RL on sets A, B and C, are in `frontier.md`, "
            "`points.csv` and `per_seed.csv`.", ""]
  for m, what in FINAL:
    if m in names:
      lines.append(f"- `{m}`: {what}")
  if absent:
    lines.append(f"- {NOT_LOGGED} (no run's evaluation holds them): " + ", ".join(f"`{m}`" for m in absent))
  rows = [["SFT policy (before RL)", str(len(summ["before_by_seed"]))] + [fmt(summ["before"][m]) for m in names]]
  for label, by_m in summ["final"].items():
    n = max((iv["n"] for iv in by_m.values() if isinstance(iv, dict)), default=0)
    rows.append([f"`{label}`", str(n)] + [fmt(by_m[m]) for m in names])
  lines += [""] + _table(["preset", "seeds"] + names, rows) + [""]
  lines += [f"## Paired differences against `{baseline}` (same seeds; after RL)", ""]
  if summ["paired"]:
    rows = [[f"`{l}`"] + [fmt(by_m[m]) for m in names] for l, by_m in summ["paired"].items()]
    lines += _table(["preset"] + names, rows)
  else:
    lines.append(f"No finished `{baseline}` runs to pair with.")
  lines += ["", "## Gradient norms of the RL terms (mean over RL steps)", ""]
  cols = GRADIENTS + (RATIO_OF_MEANS,)
  rows = [[f"`{l}`"] + [fmt(by_m[m]) for m, _ in cols] for l, by_m in summ["gradients"].items()]
  lines += _table(["preset"] + [f"{m} ({w})" for m, w in cols], rows)
  lines += ["", "## Plots", "", "![RL curves per preset](curves.png)", "",
            "`curves.png`: per RL step, mean over seeds with a 95% band (finished and partial runs).",
            "", "![pass@k before and after RL](pass_at_k.png)", "",
            "`pass_at_k.png`: pass@k over k for the SFT policy (dashed) and after RL, correct = feasible "
            "and = optimal.", "", "## Runs", ""]
  rows = [[f"{l}/seed{s}", run_status(r), f"{r['rl_steps_done']}/{r['rl_steps'] or '?'}",
           f"{r['wall_s']:.0f}" if r["wall_s"] is not None else "—"] for l, v in runs.items() for s, r in v.items()]
  lines += _table(["run", "status", "RL steps", "wall s (last process)"], rows)
  return "\n".join(lines) + "\n"


def write_report(out: str, baseline: str | None = None, plots: bool = True, analysis=None) -> dict:
  """Write report.md, report.json, curves.png and pass_at_k.png (plots=True) into `out`, and
  the matched comparisons (`frontier.write`; analysis: the study's pre-registered
  `frontier.Analysis`, None: no contrasts); returns report.json's content plus "summary" (the
  final-metrics table as text)."""
  if not os.path.isdir(out):
    raise FileNotFoundError(f"no sweep folder {out!r}")
  runs, manifest = collect(out)
  baseline = baseline or manifest.get("baseline", "grpo")
  summ = summarize(runs, baseline)
  cv = curves(runs)
  pc = pass_curves(runs, summ["before_by_seed"])
  if plots:
    plot_curves(cv, os.path.join(out, "curves.png"))
    plot_pass(pc, os.path.join(out, "pass_at_k.png"))
  matched = frontier.write(out, runs, manifest, plots, analysis=analysis)
  text = markdown(out, manifest, runs, summ, baseline)
  if matched:
    text += "\n## Matched comparisons\n\nSee [frontier.md](frontier.md) and `pareto.png`.\n"
  with open(os.path.join(out, "report.md"), "w") as f:
    f.write(text)
  status = {f"{l}/seed{s}": {k: r[k] for k in ("status", "rl_steps_done", "rl_steps", "wall_s",
                                                 "missing_points", "stopped")}
            for l, v in runs.items() for s, r in v.items()}
  result = {"baseline": baseline, "runs": status, "final": summ["final"], "paired": summ["paired"],
            "gradients": summ["gradients"], "before": summ["before"], "curves": cv,
            "pass_at_k": {kind: {n: {str(k): iv for k, iv in by_k.items()} for n, by_k in d.items()}
                          for kind, d in pc.items()}}
  report.write_json(files.json_safe(result), os.path.join(out, "report.json"))
  i = text.index("## Final metrics")
  result["summary"] = text[:text.index("## Paired", i)]
  return result
