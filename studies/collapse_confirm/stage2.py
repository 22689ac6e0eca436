"""Stage 2 of the confirmatory design (confirmatory): the analysis pre-registered in
docs/COLLAPSE.md ("Confirmatory pre-registration"), fixed in code before any stage-2 run.

    python -m studies.collapse_confirm.stage2 runs/confirm --chosen=dmpo=dmpo-80-a1_15,rkl=rkl-1.25,... \
        --out=runs/confirm/stage2

Sources: sweep folders or points.csv files (`sources.py`); only the stage-2 seeds
(`design.CONFIRM_SEEDS`, 100-119) are read, any other seed (stage 1's 0-4) is left out and
named. The chosen strengths (one label per remedy family, stage 1's choice) come from
`design.CHOSEN` once it is committed, or from --chosen (family=label pairs separated by commas
or new lines, or a file holding them or a JSON object); both given must agree.

1. Runs. A run counts only when it holds every planned evaluation point (RL steps 0, 10, ...,
   100) with the metrics the analysis reads (A+B optimal pass@1, coverage of A, optimal pass@64
   of B). A sweep folder's run that the report does not count as finished (`incomplete`: a
   missing point; partial; failed) is left out, and so is a points.csv run without a point;
   each is named in the output, never used.
2. Cut rule: whole seeds are dropped from the top, never labels. The analysed seeds are the
   longest run 100, 101, ..., 100 + n - 1 on which all 15 labels (`design.confirm_labels`)
   counted. With n < 15 (`design.MIN_CONFIRM_SEEDS`) the analysis still runs and is labelled
   underpowered, with the smallest difference it could detect.
3. Per seed, the target t_s = start + `design.DELTA` on A+B optimal pass@1
   (`confirm.seed_targets`); each run's matched coverage of A and optimal pass@64 of B at t_s
   (`confirm.matched_values`).
4. Primary family (m = 13, Holm): each remedy - `design.REFERENCE` on coverage of A
   (`confirm.registered_family`), with reach rates, the 95% t-interval, the Bonferroni interval
   at 1 - 0.05/13, both p-values and the reading; full GRPO's matched values beside, not tested.
5. Sensitivity (`confirm.sensitivity`): the primary family with a never-reaching run valued at
   its last point, beside the primary table.
6. Secondary family (m = 25, Holm within, `confirm.holm_family`): the 12 remedies other than
   `rkl` against `rkl` on coverage of A, and the 13 remedies against the reference on optimal
   pass@64 of B.
7. Power: the realised SD of the primary family's paired differences (pooled over its
   estimable contrasts, and per contrast) and the smallest difference a two-sided paired
   t-test at 0.05/13 detects with 80% power on the analysed seeds at that SD
   (`stats.min_detectable`).

Output: markdown tables on stdout; with --out, stage2.json (every row, the matched values and
what was left out) and stage2_forest.png (per remedy, the seed-paired differences on coverage
of A with the 95% interval; the reference at 0). Nothing here is exploratory; exploratory
analyses (matched KL, distinct optima, C, per task, other deltas) are not part of this entry
point and are labelled so wherever they are reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from dmpo_jax.experiments import confirm, files, frontier, stats
from studies.collapse_confirm import design, sources

METRICS = ("pass_optimal@1", "coverage", "pass_optimal@64")  # read from a points.csv
M_PRIMARY = 13      # the registered family sizes (docs/COLLAPSE.md); the tests check them
M_SECONDARY = 25    # against design.REMEDIES
POWER = 0.8
Y_NAMES = {design.PRIMARY: "coverage of A", design.SECONDARY: "optimal pass@64 of B"}


# ---------------------------------------------------------------------------
# The chosen strengths.
def parse_chosen(text: str) -> dict:
  """{family: label} from "family=label,..." (commas or new lines; '#' starts a comment), or
  from a file holding that or a JSON object."""
  where = "--chosen"
  if os.path.isfile(text):
    where = f"--chosen file {text}"
    with open(text) as f:
      text = f.read()
    if text.lstrip().startswith("{"):
      try:
        chosen = json.loads(text)
      except json.JSONDecodeError as e:
        raise SystemExit(f"error: {where}: not valid JSON ({e})")
      if not isinstance(chosen, dict) or not all(isinstance(v, str) for v in chosen.values()):
        raise SystemExit(f"error: {where}: expected a JSON object of family: label")
      return chosen
  chosen = {}
  for item in (p.split("#")[0].strip() for line in text.splitlines() for p in line.split(",")):
    if not item:
      continue
    fam, sep, label = (s.strip() for s in item.partition("="))
    if not sep or not fam or not label:
      raise SystemExit(f"error: {where}: {item!r} is not family=label")
    if fam in chosen and chosen[fam] != label:
      raise SystemExit(f"error: {where}: family {fam!r} chosen twice ({chosen[fam]!r}, {label!r})")
    chosen[fam] = label
  return chosen


def check_chosen(chosen: dict, where: str) -> dict:
  """`chosen` in design.REMEDIES' order, after checking that it names every remedy family
  once, and for each one of that family's stage-1 labels (design.CANDIDATES)."""
  unknown = sorted(set(chosen) - set(design.REMEDIES))
  if unknown:
    raise SystemExit(f"error: {where}: unknown families {unknown} (design.REMEDIES: {design.REMEDIES})")
  missing = [f for f in design.REMEDIES if f not in chosen]
  if missing:
    raise SystemExit(f"error: {where}: no strength chosen for {missing}")
  for fam in design.REMEDIES:
    if chosen[fam] not in design.CANDIDATES[fam]:
      raise SystemExit(f"error: {where}: {fam}={chosen[fam]!r} is not one of the family's stage-1 labels "
                       f"{design.CANDIDATES[fam]}")
  return {f: chosen[f] for f in design.REMEDIES}


def resolve_chosen(arg: str | None, registered: dict | None) -> dict:
  """The chosen strengths: design.CHOSEN (`registered`) and/or --chosen (`arg`); refused when
  neither is given or the two disagree."""
  if arg is None and registered is None:
    raise SystemExit("error: no chosen strengths: pass --chosen=family=label,... (stage 1's choice) "
                     "or commit design.CHOSEN")
  given = check_chosen(parse_chosen(arg), "--chosen") if arg is not None else None
  if registered is not None:
    registered = check_chosen(dict(registered), "design.CHOSEN")
    if given is not None and given != registered:
      differ = [f for f in design.REMEDIES if given[f] != registered[f]]
      raise SystemExit(f"error: --chosen disagrees with design.CHOSEN for {differ}")
  return given if given is not None else registered


# ---------------------------------------------------------------------------
# Which runs count, and the cut rule.
def planned_steps() -> list[int]:
  """The RL steps of the design's evaluation points: 0, 10, ..., 100."""
  from dmpo_jax.training import points
  return points.point_steps(design.RL_STEPS, design.EVAL_POINTS)


NEEDED = (design.MATCH, design.PRIMARY, design.SECONDARY)  # (set, metric) read at every point


def run_gap(pts: dict, steps) -> str | None:
  """Why a run ({rl_step: point}) cannot be analysed, or None: a planned point missing (the
  report's words), or a point without a metric the analysis reads."""
  missing = [s for s in steps if s not in pts]
  if missing:
    return f"incomplete: no evaluation point at RL step {', '.join(map(str, missing))}"
  for s in steps:
    lack = [f"{split}/{m}" for split, m in NEEDED
            if not (row := frontier.set_row(pts[s], split)) or not isinstance(row.get(m), (int, float))
            or not math.isfinite(row[m])]
    if lack:
      return f"incomplete: RL step {s} lacks {', '.join(lack)}"
  return None


def split_runs(points: dict, labels, steps) -> tuple[dict, dict]:
  """({label: {seed: points}} of the runs that count, {label: {seed: why}} of those that do
  not), for `labels` only."""
  ok, bad = {}, {}
  for label in labels:
    for seed, pts in sorted(points.get(label, {}).items()):
      why = run_gap(pts, steps)
      if why is None:
        ok.setdefault(label, {})[seed] = pts
      else:
        bad.setdefault(label, {})[seed] = why
  return ok, bad


def cut(runs: dict, labels, seeds=design.CONFIRM_SEEDS) -> tuple[list, dict]:
  """The cut rule: (the analysed seeds, the longest run seeds[0], seeds[1], ... on which every
  label has a run; {seed: [labels without one]} of the seeds above the cut that hold any run)."""
  seeds = sorted(seeds)
  lacking = {s: [l for l in labels if s not in runs.get(l, {})] for s in seeds}
  n = 0
  while n < len(seeds) and not lacking[seeds[n]]:
    n += 1
  dropped = {s: lacking[s] for s in seeds[n:] if len(lacking[s]) < len(labels)}
  return seeds[:n], dropped


# ---------------------------------------------------------------------------
# The analysis.
def _family_of(chosen: dict) -> dict:
  out = {design.REFERENCE: "reference", design.FULL_GRPO: "full GRPO"}
  out.update({label: fam for fam, label in chosen.items()})
  return out


def _tag(rows: list[dict], y: tuple, family_of: dict) -> list[dict]:
  for row in rows:
    row.update(y=f"{y[0]}/{y[1]}", family=family_of[row["remedy"]])
  return rows


def analyse(runs: dict, chosen: dict, seeds: list) -> dict:
  """Every registered table of stage 2 on `seeds` (the cut's) from {label: {seed: points}}
  (the runs that count)."""
  labels = design.confirm_labels(chosen)
  family_of = _family_of(chosen)
  pts = {l: {s: runs[l][s] for s in seeds} for l in labels}
  targets = confirm.seed_targets(pts, design.DELTA, *design.MATCH)
  matched = {y: {l: confirm.matched_values(pts[l], targets, *design.MATCH, *y) for l in labels}
             for y in (design.PRIMARY, design.SECONDARY)}
  remedies = [chosen[f] for f in design.REMEDIES]
  cov, p64 = matched[design.PRIMARY], matched[design.SECONDARY]
  primary = _tag(confirm.registered_family(cov, remedies, design.REFERENCE, m=M_PRIMARY), design.PRIMARY,
                 family_of)
  sensitivity = _tag(confirm.sensitivity(pts, remedies, design.REFERENCE, targets, *design.MATCH,
                                         *design.PRIMARY, m=M_PRIMARY), design.PRIMARY, family_of)
  rkl = chosen["rkl"]
  secondary = confirm.holm_family(
      _tag(confirm.registered_family(cov, [r for r in remedies if r != rkl], rkl, m=M_SECONDARY),
           design.PRIMARY, family_of)
      + _tag(confirm.registered_family(p64, remedies, design.REFERENCE, m=M_SECONDARY), design.SECONDARY,
             family_of), m=M_SECONDARY)
  alpha = confirm.ALPHA / M_PRIMARY
  sd = stats.pooled_sd([list(r["diffs"].values()) for r in primary if r["estimable"]])
  mde = lambda s, n: stats.min_detectable(s, n, alpha, POWER) if n >= 2 and math.isfinite(s) and s > 0 else math.nan
  for row in primary:
    row["min_detectable"] = mde(row["sd"], row["n"])
  described = {l: {"family": family_of[l], "reach": confirm.reach_rate(cov[l]),
                   "coverage_A": _mean(cov[l]), "pass_optimal@64_B": _mean(p64[l])} for l in labels}
  return {
      "seeds": list(seeds), "n": len(seeds), "underpowered": len(seeds) < design.MIN_CONFIRM_SEEDS,
      "chosen": chosen, "labels": labels, "delta": design.DELTA, "targets": targets,
      "matched": {f"{y[0]}/{y[1]}": v for y, v in matched.items()}, "described": described,
      "primary": primary, "sensitivity": sensitivity, "secondary": secondary,
      "power": {"alpha": alpha, "power": POWER, "sd": sd, "n": len(seeds), "min_detectable": mde(sd, len(seeds)),
                "sd_from": [r["remedy"] for r in primary if r["estimable"]]},
  }


def _mean(values: dict) -> float:
  """The mean of a label's matched values over the seeds where it reached (descriptive)."""
  v = [x for x in values.values() if math.isfinite(x)]
  return float(np.mean(v)) if v else math.nan


# ---------------------------------------------------------------------------
# Tables, JSON and the figure.
def _f(x, spec=".3f") -> str:
  return "—" if x is None or not math.isfinite(x) else format(x, spec)


def _iv(low, high) -> str:
  return "—" if not math.isfinite(low) else f"[{low:.3f}, {high:.3f}]"


def _p(p) -> str:
  return "—" if not math.isfinite(p) else (f"{p:.2e}" if p < 1e-3 else f"{p:.4f}")


def seed_ranges(seeds) -> str:
  """"100-104, 107" from [100, 101, 102, 103, 104, 107]."""
  seeds, out = sorted(seeds), []
  for s in seeds:
    if out and s == out[-1][1] + 1:
      out[-1][1] = s
    else:
      out.append([s, s])
  return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out) or "none"


def _table(head, rows) -> list[str]:
  return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def family_table(rows: list[dict], power: bool = False) -> list[str]:
  level = rows[0]["confidence_bonferroni"] if rows else math.nan
  head = ["y", "family", "contrast", "n", "reach", "reach (ref.)", "mean difference", "95% t-interval",
          f"Bonferroni interval ({100 * level:.2f}%)", "p", "Holm p", "reading"]
  if power:
    head += ["SD of differences", "difference detectable (80%)"]
  out = []
  for r in rows:
    cells = [Y_NAMES[tuple(r["y"].split("/"))], r["family"], f"`{r['contrast']}`", str(r["n"]),
             f"{r['reach']:.2f}", f"{r['reach_reference']:.2f}", _f(r["mean"], "+.3f"), _iv(r["low"], r["high"]),
             _iv(r["low_bonferroni"], r["high_bonferroni"]), _p(r["p"]), _p(r["p_holm"]), f"**{r['reading']}**"]
    if power:
      cells += [_f(r["sd"]), _f(r["min_detectable"])]
    out.append(cells)
  return _table(head, out)


def markdown(result: dict, notes: dict) -> str:
  n, pw = result["n"], result["power"]
  ref = design.REFERENCE
  lines = ["# Collapse confirmatory experiment, stage 2 (confirmatory)", "",
           "Pre-registered in docs/COLLAPSE.md (\"Confirmatory pre-registration\"); analysis code at "
           f"commit {notes.get('commit', 'unknown')}. Targets t_s = start + {result['delta']} on A+B optimal "
           "pass@1, per seed; matched values where each run first reaches t_s.", "",
           f"**Seeds analysed: {seed_ranges(result['seeds'])} (n = {n})**, every one of the 15 labels finished "
           "on each (the cut rule: whole seeds dropped from the top, never labels)."]
  if result["underpowered"]:
    lines += ["", f"**Underpowered:** {n} seeds, fewer than the {design.MIN_CONFIRM_SEEDS} the design asks for. "
              f"At the realised SD of the paired differences ({_f(pw['sd'])}), the smallest difference a two-sided "
              f"paired t-test at 0.05/{M_PRIMARY} detects with 80% power on {n} seeds is {_f(pw['min_detectable'])}."]
  if notes.get("dropped"):
    lines += ["", "Dropped by the cut rule (above the first seed without all 15 labels): " + "; ".join(
        f"seed {s} (lacks {len(ls)} label{'s' * (len(ls) != 1)}: {', '.join(ls)})" if ls else f"seed {s} (complete)"
        for s, ls in notes["dropped"].items()) + "."]
  if notes.get("excluded"):
    lines += ["", "Runs left out, never analysed: " + "; ".join(
        f"`{l}/seed{s}` ({why})" for l, by_seed in notes["excluded"].items() for s, why in by_seed.items()) + "."]
  if notes.get("not_started"):
    lines += ["", "Not started: " + "; ".join(f"`{l}` seeds {seed_ranges(ss)}" for l, ss in notes["not_started"].items())
              + "."]
  if notes.get("other_seeds"):
    lines += ["", "Left out, not stage-2 seeds (design.CONFIRM_SEEDS: 100-119; stage 1's seeds 0-4 are never "
              "confirmatory): " + "; ".join(
                  f"{src}: seeds {seed_ranges({s for ss in by_label.values() for s in ss})} of {len(by_label)} labels"
                  for src, by_label in notes["other_seeds"].items()) + "."]
  if notes.get("other_labels"):
    lines += ["", "Labels not among the 15, not read: " + ", ".join(f"`{l}`" for l in notes["other_labels"]) + "."]
  lines += ["", "Everything below is registered (primary, sensitivity, secondary) or descriptive (matched values). "
            "Exploratory analyses (matched KL, distinct optima, C, per task and category, stage 1's contrasts, "
            "another delta) are not part of this entry point; wherever reported, they are labelled exploratory."]
  lines += ["", "Chosen strengths (stage 1): " + ", ".join(f"{f} `{l}`" for f, l in result["chosen"].items()) + ".",
            "", "Targets: " + ", ".join(f"{s}: {t:.4f}" for s, t in result["targets"].items()) + "."]
  lines += ["", f"## Primary family (m = {M_PRIMARY}, Holm at 0.05): remedy - `{ref}` on coverage of A at t_s", "",
            "A contrast is estimable when both reach t_s on at least 80% of the seeds and at least 3 seeds pair; "
            "otherwise not estimable, counted as p = 1. \"Cannot be told apart\" is no evidence, not no effect: "
            "see the interval.", ""]
  lines += family_table(result["primary"], power=True)
  lines += ["", f"Realised SD of the paired differences (pooled over the {len(pw['sd_from'])} estimable contrasts): "
            f"{_f(pw['sd'])}; the smallest difference detectable with 80% power (two-sided paired t at "
            f"0.05/{M_PRIMARY}, {n} seeds) at that SD: {_f(pw['min_detectable'])}."]
  lines += ["", "## Sensitivity (beside the primary): every run that never reaches t_s valued at its last point, "
            "no reach rule", ""]
  lines += family_table(result["sensitivity"])
  lines += ["", f"## Matched values (descriptive; full GRPO `{design.FULL_GRPO}` reported beside, not tested)", "",
            "Means over the seeds where the run reached t_s."]
  lines += [""] + _table(["label", "family", "reach", "coverage of A", "optimal pass@64 of B"], [
      [f"`{l}`", d["family"], f"{d['reach']:.2f}", _f(d["coverage_A"]), _f(d["pass_optimal@64_B"])]
      for l, d in result["described"].items()])
  lines += ["", f"## Secondary family (m = {M_SECONDARY}, Holm within): remedies - `{result['chosen']['rkl']}` on "
            f"coverage of A, remedies - `{ref}` on optimal pass@64 of B", ""]
  lines += family_table(result["secondary"])
  return "\n".join(lines) + "\n"


def plot_forest(result: dict, path: str) -> None:
  """Per remedy: its seed-paired differences on coverage of A (dots), the mean with its 95%
  t-interval (thick) and Bonferroni interval (thin); the reference at 0."""
  from matplotlib.figure import Figure
  rows = result["primary"]
  fig = Figure(figsize=(7.5, 0.42 * len(rows) + 1.4))
  ax = fig.subplots()
  for i, r in enumerate(rows):
    y = len(rows) - 1 - i
    d = list(r["diffs"].values())
    ax.plot(d, [y + 0.18] * len(d), "o", ms=3, color="0.55", alpha=0.7, lw=0)
    if r["estimable"]:
      ax.plot([r["low_bonferroni"], r["high_bonferroni"]], [y, y], color="C0", lw=1)
      ax.plot([r["low"], r["high"]], [y, y], color="C0", lw=3.5)
      ax.plot([r["mean"]], [y], "D", color="C3" if r["reading"] != "cannot be told apart" else "C0", ms=5)
    else:
      ax.text(0.99, y, "not estimable", transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=7,
              color="0.4")
  ax.axvline(0, color="k", lw=0.8)
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels([f"{r['family']}: {r['remedy']}" for r in reversed(rows)], fontsize=7)
  ax.set_xlabel(f"coverage of A at t_s, remedy - {design.REFERENCE} (seed-paired; 0 = the reference)", fontsize=8)
  title = (f"Stage 2, primary family: seeds {seed_ranges(result['seeds'])} (n = {result['n']})"
           + (", UNDERPOWERED" if result["underpowered"] else ""))
  ax.set_title(title + f"\nthick: 95% t-interval, thin: Bonferroni 1 - 0.05/{M_PRIMARY}; dots: seeds; "
               "red: Holm p < 0.05", fontsize=8)
  fig.tight_layout()
  files.save_figure(fig, path)


def write(result: dict, notes: dict, out: str) -> None:
  from dmpo_jax.training import report
  os.makedirs(out, exist_ok=True)
  report.write_json(files.json_safe(dict(result, **notes)), os.path.join(out, "stage2.json"))
  plot_forest(result, os.path.join(out, "stage2_forest.png"))


# ---------------------------------------------------------------------------
def run(srcs, chosen: dict) -> tuple[dict, dict]:
  """(the analysis, what was left out and why) of the sources' stage-2 runs."""
  tier1 = [s for s in srcs if sources.split_source(s)[1].startswith(sources.TIER1)]
  if tier1:
    raise SystemExit(f"error: {tier1}: tier 1's points are stage 1's (seeds 0-4); stage 2 reads its own runs")
  labels = design.confirm_labels(chosen)
  points, unfinished, other_seeds = sources.load(srcs, design.CONFIRM_SEEDS, metrics=METRICS)
  if not any(points.get(l) for l in points) and not unfinished:
    raise SystemExit(f"error: no run on the stage-2 seeds {seed_ranges(design.CONFIRM_SEEDS)} in {list(srcs)}")
  runs, excluded = split_runs(points, labels, planned_steps())
  for label, by_seed in unfinished.items():
    if label in labels:
      excluded.setdefault(label, {}).update({s: w for s, w in by_seed.items() if w != "not started"})
  excluded = {l: dict(sorted(v.items())) for l, v in excluded.items() if v}
  not_started = {l: sorted(s for s, w in v.items() if w == "not started") for l, v in unfinished.items() if l in labels}
  seeds, dropped = cut(runs, labels)
  notes = {"excluded": excluded, "dropped": dropped, "other_seeds": other_seeds,
           "not_started": {l: v for l, v in not_started.items() if v},
           "other_labels": sorted(l for l in set(points) | set(unfinished) if l not in labels),
           "commit": frontier.provenance()["commit"]}
  if not seeds:
    first = min(design.CONFIRM_SEEDS)
    lack = [l for l in labels if first not in runs.get(l, {})]
    raise SystemExit(f"error: nothing to analyse: seed {first} lacks a finished run of {lack}"
                     + "".join(f"; {l}/seed{first}: {excluded[l][first]}" for l in lack if first in excluded.get(l, {})))
  return analyse(runs, chosen, seeds), notes


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m studies.collapse_confirm.stage2",
                              description="Stage 2 of the confirmatory collapse experiment: the pre-registered "
                                          "analysis (docs/COLLAPSE.md).")
  p.add_argument("sources", nargs="+", help="sweep folders or points.csv files of stage-2 runs")
  p.add_argument("--chosen", help="family=label,... (or a file of them, or of a JSON object); "
                                  "default: design.CHOSEN")
  p.add_argument("--out", help="folder for stage2.json and stage2_forest.png")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  chosen = resolve_chosen(args.chosen, getattr(design, "CHOSEN", None))
  result, notes = run(args.sources, chosen)
  print(markdown(result, notes), end="")
  if args.out:
    write(result, notes, args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
