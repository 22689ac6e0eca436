"""Stage 2's analysis entry point (studies/collapse_confirm/stage2.py) on synthetic runs with
known answers: which runs count, the cut rule, the readings, the registered family sizes,
the outputs; and stage 1's table, unchanged by the shared loading (sources.py)."""

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from dmpo_jax.experiments import stats
from studies.collapse_confirm import design, stage1, stage2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = list(range(0, 101, 10))
CHOSEN = {f: labels[1] for f, labels in design.CANDIDATES.items()}
R = {f: CHOSEN[f] for f in design.REMEDIES}  # family -> its chosen label
LABELS = design.confirm_labels(CHOSEN)


def curve(seed: int, kind: str) -> dict:
  """{rl_step: (A+B optimal pass@1, coverage of A, optimal pass@64 of B)} of one synthetic run.

  Every label of a seed starts at x0 = 0.40 + 0.01 (seed % 3) (so the target is x0 + 0.03).
  "ref": x rises 0.001 a step and reaches the target at step 30 exactly; coverage falls 0.005
  a step, 0.85 at step 30; pass@64 of B 0.60 + 0.002 (seed % 5) throughout.
  "more": the same x; coverage kept 0.10 + 0.001 (seed % 4) higher at every point: "keeps more";
  pass@64 of B 0.02 + 0.001 (seed % 3) higher.
  "same": identical to "ref" on every seed: differences 0, "cannot be told apart".
  "fewer": coverage 0.05 + 0.001 (seed % 3) lower: "keeps fewer".
  "never": x stays at the start: never reaches, "not estimable"; its coverage by the end, 0.95.
  "noisy": coverage off by +-0.03 alternating over seeds: no clear sign.
  """
  x0 = 0.40 + 0.01 * (seed % 3)
  out = {}
  for t in STEPS:
    x = x0 if kind == "never" else x0 + 0.001 * t
    cov = 1.0 - 0.005 * t
    cov += {"more": 0.10 + 0.001 * (seed % 4), "fewer": -0.05 - 0.001 * (seed % 3),
            "noisy": 0.03 * (-1) ** seed, "never": -0.0005 * t}.get(kind, 0.0) * (t > 0)
    out[t] = (x, cov, 0.60 + 0.002 * (seed % 5) + (0.02 + 0.001 * (seed % 3)) * (kind == "more"))
  return out


KINDS = {design.REFERENCE: "ref", design.FULL_GRPO: "more", R["dmpo"]: "more", R["dm_only"]: "same",
         R["passk"]: "never", R["pkpo"]: "fewer"}


def kind_of(label):
  return KINDS.get(label, "noisy")


def csv_rows(label, seed, pts: dict) -> list[dict]:
  rows = []
  for t, (x, cov, p64) in pts.items():
    # A and B hold the same pass@1 (so does A+B); coverage on A, pass@64 on B (A has none: 32 samples)
    rows += [{"label": label, "seed": seed, "rl_step": t, "set": "A", "pass_optimal@1": x, "coverage": cov,
              "pass_optimal@64": ""},
             {"label": label, "seed": seed, "rl_step": t, "set": "B", "pass_optimal@1": x, "coverage": 0.5,
              "pass_optimal@64": p64}]
  return rows


def write_csv(path, seeds=range(100, 115), labels=LABELS, drop=(), blank=()):
  """A points.csv of every label on every seed; `drop`: (label, seed) runs left out, or
  (label, seed, rl_step) points left out; `blank`: (label, seed, rl_step) points whose B
  optimal pass@64 cell is left empty."""
  rows = []
  for label in labels:
    for seed in seeds:
      if (label, seed) in drop:
        continue
      pts = {t: v for t, v in curve(seed, kind_of(label)).items() if (label, seed, t) not in drop}
      rows += [dict(r, **{"pass_optimal@64": ""}) if r["set"] == "B" and (label, seed, r["rl_step"]) in blank
               else r for r in csv_rows(label, seed, pts)]
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
  return str(path)


def analyse(tmp_path, **kw):
  src = write_csv(tmp_path / "points.csv", **kw)
  return stage2.run([src], CHOSEN)


def rows_by_family(rows):
  return {r["family"]: r for r in rows}


def test_registered_family_sizes_match_the_design():
  assert stage2.M_PRIMARY == len(design.REMEDIES) == 13
  assert stage2.M_SECONDARY == (len(design.REMEDIES) - 1) + len(design.REMEDIES) == 25


def test_known_answers_on_fifteen_seeds(tmp_path):
  result, notes = analyse(tmp_path)
  assert result["seeds"] == list(range(100, 115)) and not result["underpowered"]
  assert result["targets"] == {s: pytest.approx(0.43 + 0.01 * (s % 3)) for s in range(100, 115)}
  primary = rows_by_family(result["primary"])
  assert len(result["primary"]) == 13 and all(r["reference"] == design.REFERENCE for r in result["primary"])
  more = primary["dmpo"]
  assert more["reading"] == "keeps more" and more["n"] == 15 and more["reach"] == 1.0
  # matched at step 30 exactly: the difference is the offset, 0.10 + 0.001 (seed % 4)
  assert more["diffs"] == {s: pytest.approx(0.10 + 0.001 * (s % 4)) for s in range(100, 115)}
  assert more["low_bonferroni"] < more["low"] < more["mean"] < more["high"] < more["high_bonferroni"]
  assert primary["dm_only"]["reading"] == "cannot be told apart" and primary["dm_only"]["mean"] == 0.0
  assert primary["pkpo"]["reading"] == "keeps fewer"
  never = primary["passk"]
  assert never["reading"] == "not estimable" and never["reach"] == 0.0 and math.isnan(never["p_holm"])
  assert primary["rkl"]["reading"] == "cannot be told apart"
  # the sensitivity family values "never" at its last point: 1 - 0.55 = 0.45 against the
  # reference's matched 0.85 (0.005 x 30 below 1), so it keeps fewer there
  sens = rows_by_family(result["sensitivity"])
  assert sens["passk"]["mean"] == pytest.approx(0.45 - 0.85) and sens["passk"]["reading"] == "keeps fewer"
  # full GRPO: described beside, never a contrast
  assert design.FULL_GRPO not in {r["remedy"] for r in result["primary"] + result["secondary"]}
  assert result["described"][design.FULL_GRPO]["coverage_A"] == pytest.approx(
      0.85 + 0.10 + sum(0.001 * (s % 4) for s in range(100, 115)) / 15)
  # secondary: 12 against rkl on coverage of A, 13 against the reference on pass@64 of B
  sec = result["secondary"]
  assert len(sec) == 25 and [r["y"] for r in sec] == ["A/coverage"] * 12 + ["B/pass_optimal@64"] * 13
  assert {r["reference"] for r in sec[:12]} == {R["rkl"]} and R["rkl"] not in {r["remedy"] for r in sec[:12]}
  assert rows_by_family(sec[:12])["dmpo"]["reading"] == "keeps more"
  # pass@64 of B: higher for "more", the same for every other label of a seed (differences 0)
  b = rows_by_family(sec[12:])
  assert b["dmpo"]["reading"] == "keeps more"
  assert {r["reading"] for f, r in b.items() if f not in ("passk", "dmpo")} == {"cannot be told apart"}
  # Holm's step-down over all 25 p-values at once, not over each half: DMPO's pass@64 p is the
  # smallest (x 25), its coverage p against rkl the second (x 24; alone in its half, x 25)
  a = rows_by_family(sec[:12])
  assert b["dmpo"]["p"] < a["dmpo"]["p"] < min(r["p"] for r in sec if r["estimable"] and r["family"] != "dmpo")
  assert a["dmpo"]["p_holm"] == pytest.approx(24 * a["dmpo"]["p"])
  assert [r["p_holm"] for r in sec] == pytest.approx(list(stats.holm([r["p"] for r in sec], m=25)), nan_ok=True)
  text = stage2.markdown(result, notes)
  assert "Underpowered" not in text and "Seeds analysed: 100-114 (n = 15)" in text
  assert "**keeps more**" in text and "**not estimable**" in text and "Bonferroni interval (99.62%)" in text


def test_primary_holm_has_m_13_and_power_uses_the_realised_sd(tmp_path):
  result, _ = analyse(tmp_path)
  rows = result["primary"]
  ps = sorted(r["p"] for r in rows if r["estimable"])
  smallest = min((r for r in rows if r["estimable"]), key=lambda r: r["p"])
  assert smallest["p_holm"] == pytest.approx(min(1.0, 13 * ps[0]))
  pw = result["power"]
  sd = stats.pooled_sd([list(r["diffs"].values()) for r in rows if r["estimable"]])
  assert pw["sd"] == pytest.approx(sd) and pw["n"] == 15 and pw["alpha"] == pytest.approx(0.05 / 13)
  assert pw["min_detectable"] == pytest.approx(stats.min_detectable(sd, 15, 0.05 / 13))
  assert set(pw["sd_from"]) == {r["remedy"] for r in rows if r["estimable"]}


def test_cut_rule_drops_the_seed_missing_a_label_and_every_seed_above(tmp_path):
  # seed 103 lacks one label: 100-102 are analysed, 103-119 dropped (104-114 complete, still dropped)
  result, notes = analyse(tmp_path, seeds=range(100, 120), drop={(R["kl_cov"], 103)})
  assert result["seeds"] == [100, 101, 102] and result["underpowered"]
  assert notes["dropped"][103] == [R["kl_cov"]] and notes["dropped"][119] == []
  assert sorted(notes["dropped"]) == list(range(103, 120))
  assert all(r["n"] <= 3 for r in result["primary"])
  assert result["described"][design.REFERENCE]["reach"] == 1.0  # on the 3 seeds analysed
  assert set(result["targets"]) == {100, 101, 102}
  text = stage2.markdown(result, notes)
  assert "**Underpowered:** 3 seeds" in text and "seed 103 (lacks 1 label: " + R["kl_cov"] in text
  # labels are never dropped: 15 labels and 13 contrasts on the analysed seeds
  assert len(result["labels"]) == 15 and len(result["primary"]) == 13


def test_underpowered_reports_the_detectable_difference(tmp_path):
  result, notes = analyse(tmp_path, seeds=range(100, 112))
  assert result["n"] == 12 and result["underpowered"]
  pw = result["power"]
  assert pw["min_detectable"] == pytest.approx(stats.min_detectable(pw["sd"], 12, 0.05 / 13))
  assert stats.paired_power(pw["min_detectable"], pw["sd"], 12, 0.05 / 13) == pytest.approx(0.8)
  text = stage2.markdown(result, notes)
  assert f"detects with 80% power on 12 seeds is {pw['min_detectable']:.3f}" in text


def test_run_without_its_step_100_point_is_refused_by_name(tmp_path):
  result, notes = analyse(tmp_path, drop={(R["dmpo"], 105, 100)})
  assert notes["excluded"] == {R["dmpo"]: {105: "incomplete: no evaluation point at RL step 100"}}
  assert result["seeds"] == [100, 101, 102, 103, 104]  # the cut rule then stops below 105
  text = stage2.markdown(result, notes)
  assert f"`{R['dmpo']}/seed105` (incomplete: no evaluation point at RL step 100)" in text
  # a point without a metric the analysis reads is refused the same way
  src = write_csv(tmp_path / "blank.csv", blank={(R["rkl"], 100, 100)})
  with pytest.raises(SystemExit, match=r"seed 100 lacks a finished run of \['" + R["rkl"]
                     + r"'\].*RL step 100 lacks B/pass_optimal@64"):
    stage2.run([src], CHOSEN)


def sweep_folder(root, seeds, missing=()):
  """A sweep folder as the runner leaves it: per run config.json, results.json and
  points/rl<step>.json; `missing`: (label, seed, rl_step) point files not written."""
  for label in LABELS:
    for seed in seeds:
      d = root / label / f"seed{seed}"
      (d / "points").mkdir(parents=True)
      (d / "config.json").write_text(json.dumps({"rl": {"steps": 100}, "eval": {"points": 11}}))
      (d / "results.json").write_text(json.dumps({"wall_s": 1.0}))
      for t, (x, cov, p64) in curve(seed, kind_of(label)).items():
        if (label, seed, t) in missing:
          continue
        sets = {"A": {"overall_instance": {"pass_optimal@1": x, "coverage": cov}, "num_per_task": {"t": 16}},
                "B": {"overall_instance": {"pass_optimal@1": x, "pass_optimal@64": p64}, "num_per_task": {"t": 16}}}
        (d / "points" / f"rl{t}.json").write_text(json.dumps({"sets": sets}))
  return str(root)


def test_sweep_folder_uses_the_reports_check(tmp_path):
  # the report marks a run with a missing point incomplete: never analysed, named
  src = sweep_folder(tmp_path / "sweep", range(100, 104), missing={(R["outcome_ucb"], 102, 100)})
  result, notes = stage2.run([src], CHOSEN)
  assert result["seeds"] == [100, 101]
  assert notes["excluded"] == {R["outcome_ucb"]: {102: "incomplete: no evaluation point at RL step 100"}}
  # the same runs through a points.csv give the same numbers
  full = stage2.run([sweep_folder(tmp_path / "full", range(100, 104))], CHOSEN)[0]
  from_csv = stage2.run([write_csv(tmp_path / "p.csv", seeds=range(100, 104))], CHOSEN)[0]
  for a, b in zip(full["primary"], from_csv["primary"]):
    assert a["reading"] == b["reading"] and a["diffs"] == pytest.approx(b["diffs"])


def test_stage1_seeds_are_left_out_and_named(tmp_path):
  src = write_csv(tmp_path / "points.csv", seeds=list(range(5)) + list(range(100, 115)))
  result, notes = stage2.run([src], CHOSEN)
  assert result["seeds"] == list(range(100, 115))
  assert notes["other_seeds"][src][design.REFERENCE] == [0, 1, 2, 3, 4]
  assert "seeds 0-4 of 15 labels" in stage2.markdown(result, notes)
  only_stage1 = write_csv(tmp_path / "s1.csv", seeds=range(5))
  with pytest.raises(SystemExit, match="no run on the stage-2 seeds 100-119"):
    stage2.run([only_stage1], CHOSEN)
  with pytest.raises(SystemExit, match="tier 1's points are stage 1's"):
    stage2.run(["tier1:" + src], CHOSEN)


def test_chosen_strengths(tmp_path):
  text = ",".join(f"{f}={l}" for f, l in CHOSEN.items())
  assert stage2.resolve_chosen(text, None) == {f: CHOSEN[f] for f in design.REMEDIES}
  f = tmp_path / "chosen.txt"
  f.write_text("# stage 1's choice\n" + text.replace(",", "\n") + "\n")
  assert stage2.resolve_chosen(str(f), None) == stage2.resolve_chosen(text, None)
  j = tmp_path / "chosen.json"
  j.write_text(json.dumps(CHOSEN))
  assert stage2.resolve_chosen(str(j), None) == stage2.resolve_chosen(text, None)
  assert stage2.resolve_chosen(None, CHOSEN) == stage2.resolve_chosen(text, None)  # design.CHOSEN
  with pytest.raises(SystemExit, match="no chosen strengths"):
    stage2.resolve_chosen(None, None)
  with pytest.raises(SystemExit, match=r"rkl='rkl-9' is not one of the family's stage-1 labels"):
    stage2.resolve_chosen(text.replace(f"rkl={CHOSEN['rkl']}", "rkl=rkl-9"), None)
  with pytest.raises(SystemExit, match=r"no strength chosen for \['pkpo'\]"):
    stage2.resolve_chosen(text.replace(f",pkpo={CHOSEN['pkpo']}", ""), None)
  with pytest.raises(SystemExit, match=r"unknown families \['grpo'\]"):
    stage2.resolve_chosen(text + ",grpo=grpo", None)
  with pytest.raises(SystemExit, match="'dmpo' is not family=label"):
    stage2.resolve_chosen(text + ",dmpo", None)
  other = dict(CHOSEN, rkl=design.CANDIDATES["rkl"][3])
  with pytest.raises(SystemExit, match=r"disagrees with design.CHOSEN for \['rkl'\]"):
    stage2.resolve_chosen(text, other)


def test_main_writes_tables_json_and_forest_plot(tmp_path, capsys, monkeypatch):
  monkeypatch.delattr(design, "CHOSEN", raising=False)  # the synthetic choice only (--chosen)
  src = write_csv(tmp_path / "points.csv")
  out = tmp_path / "out"
  chosen = ",".join(f"{f}={l}" for f, l in CHOSEN.items())
  assert stage2.main([src, f"--chosen={chosen}", f"--out={out}"]) == 0
  text = capsys.readouterr().out
  assert "## Primary family (m = 13, Holm at 0.05)" in text and "## Secondary family (m = 25" in text
  assert "## Sensitivity" in text and "not tested" in text and "labelled exploratory" in text
  def no_nan(c):
    raise AssertionError(f"stage2.json holds {c}: not strict JSON")
  got = json.loads((out / "stage2.json").read_text(), parse_constant=no_nan)  # NaN written as null
  assert len(got["primary"]) == 13 and len(got["secondary"]) == 25 and len(got["sensitivity"]) == 13
  assert got["seeds"] == list(range(100, 115)) and got["power"]["n"] == 15
  assert (out / "stage2_forest.png").stat().st_size > 10_000


def test_stage1_reads_the_same_through_sources(tmp_path):
  # stage 1 keeps the exploration seeds only, the tier1: labels only, and refuses a clash
  rows = ["label,seed,rl_step,set,pass_optimal@1,coverage"]
  for label in (design.CANDIDATES["rkl"][0], design.CANDIDATES["passk"][0]):
    for s in (0, 4, 100):
      rows += [f"{label},{s},0,A,0.40,1.0", f"{label},{s},0,B,0.40,0.5"]
  (tmp_path / "p.csv").write_text("\n".join(rows) + "\n")
  src = str(tmp_path / "p.csv")
  pts = stage1.load(["tier1:" + src])
  assert set(pts) == {design.CANDIDATES["rkl"][0]} and set(pts[design.CANDIDATES["rkl"][0]]) == {0, 4}
  assert set(stage1.load([src])) == {design.CANDIDATES["rkl"][0], design.CANDIDATES["passk"][0]}
  with pytest.raises(SystemExit, match="appear in more than one source"):
    stage1.load([src, src])


STAGE1_SOURCES = ["tier1:docs/frontier_sweep/points.csv", "studies/collapse_confirm/stage1/2026-12-06_a/points.csv",
                  "studies/collapse_confirm/stage1/2026-12-06_b/points.csv"]
# Stage 1's table on its committed CSVs, as stage1.py printed it before its loading moved to
# sources.py (commit 45bd2a9); the first three families' rows.
STAGE1_ROWS = [
    "| dmpo | `dmpo-320-a1_15` | `dmpo-5-a1_15` 3/5, 0.755 | `dmpo-20-a1_15` 3/5, 0.838 | `dmpo-80-a1_15` 5/5, "
    "0.816 | `dmpo-320-a1_15` 5/5, 0.834 |",
    "| dm_only | `dm_only-lr0.0001` | `dm_only-lr3e-05` 0/5, — | `dm_only-lr0.0001` 5/5, 0.916 | `dm_only-2-a1_15` "
    "3/5, 0.846 | `dm_only-lr0.001` 0/5, — |",
    "| rkl | `rkl-1.25` | `rkl-0.01` 3/5, 0.818 | `rkl-0.05` 4/5, 0.805 | `rkl-0.25` 5/5, 0.861 | `rkl-1.25` 5/5, "
    "0.935 |",
]


def test_stage1_table_on_the_committed_csvs_is_unchanged():
  pts = stage1.load(["tier1:" + os.path.join(REPO, s[len("tier1:"):]) if s.startswith("tier1:")
                     else os.path.join(REPO, s) for s in STAGE1_SOURCES])
  lines = stage1.table(pts)
  assert lines[2:5] == STAGE1_ROWS
  assert len(lines) == 2 + 13


@pytest.mark.slow
def test_stage2_module_answers_help():
  r = subprocess.run([sys.executable, "-m", "studies.collapse_confirm.stage2", "--help"], cwd=REPO,
                     capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
  assert r.returncode == 0 and "--chosen" in r.stdout and "--out" in r.stdout


def test_the_committed_choice_is_the_rule_on_all_of_stage_1():
  # design.CHOSEN is what choose_strength gives on the committed stage-1 points, and every
  # candidate of every family has all 5 exploration seeds there (the choice waited for them)
  pts = stage1.load(["tier1:" + os.path.join(REPO, s[len("tier1:"):]) if s.startswith("tier1:")
                     else os.path.join(REPO, s) for s in STAGE1_SOURCES])
  for fam, labels in design.CANDIDATES.items():
    assert all(set(pts[l]) == set(design.EXPLORE_SEEDS) for l in labels), fam
  assert design.CHOSEN == {f: design.choose_strength(pts, f)[0] for f in design.REMEDIES}
  labels = design.confirm_labels(design.CHOSEN)
  assert len(labels) == len(set(labels)) == 15 and labels[:2] == [design.REFERENCE, design.FULL_GRPO]


def test_a_missing_or_malformed_source_is_named(tmp_path):
  with pytest.raises(SystemExit, match=r"source '.*nowhere.csv': no such file or sweep folder"):
    stage1.load([str(tmp_path / "nowhere.csv")])
  bad = tmp_path / "bad.csv"
  bad.write_text("label,seed,rl_step,set,pass_optimal@1,coverage\ngrpo,0,0,A,0.4,1.0\ngrpo,x,0,B,0.4,1.0\n")
  with pytest.raises(SystemExit, match=r"bad.csv, line 3: not a points.csv row \(ValueError"):
    stage1.load([str(bad)])
  bad.write_text("label,seed,set,pass_optimal@1\ngrpo,0,A,0.4\n")  # no rl_step column
  with pytest.raises(SystemExit, match=r"bad.csv, line 2: not a points.csv row \(KeyError"):
    stage1.load([str(bad)])


def test_a_seeds_prefix_keeps_those_seeds_of_its_source(tmp_path):
  # stage 2's seeds 113 and 114 were rerun whole on another CPU kind: the older source's
  # partial runs of them are left out by seeds=<list>:, and named among the seeds left out
  old = write_csv(tmp_path / "old.csv", seeds=range(100, 115))
  new = write_csv(tmp_path / "new.csv", seeds=range(113, 116))
  with pytest.raises(SystemExit, match="appear in more than one source"):
    stage2.run([old, new], CHOSEN)
  result, notes = stage2.run(["seeds=100-112:" + old, new], CHOSEN)
  assert result["seeds"] == list(range(100, 116))
  assert notes["other_seeds"]["seeds=100-112:" + old][design.REFERENCE] == [113, 114]
  for bad in ("seeds=100-x:" + old, "seeds=100-112", "seeds=100-112:"):
    with pytest.raises(SystemExit, match="error: source"):
      stage2.run([bad, new], CHOSEN)
  with pytest.raises(SystemExit, match="tier 1's points are stage 1's"):
    stage2.run(["seeds=100:tier1:" + old], CHOSEN)


def test_pareto_curves_start_at_zero_gain_and_average_the_seeds(tmp_path):
  import numpy as np
  from studies.collapse_confirm import pareto, sources as src_mod
  src = write_csv(tmp_path / "points.csv", seeds=range(100, 103))
  points, _, _ = src_mod.load([src], design.CONFIRM_SEEDS, metrics=stage2.METRICS)
  cur = pareto.curves(points, [design.REFERENCE])
  gain, cov, n = cur[design.REFERENCE]
  assert n == 3 and gain[0] == 0.0
  want = np.mean([[points[design.REFERENCE][s][t]["sets"]["A"]["overall_instance"]["coverage"]
                   for t in sorted(points[design.REFERENCE][s])] for s in (100, 101, 102)], 0)
  np.testing.assert_allclose(cov, want)
  with pytest.raises(SystemExit, match="no seed on which every label finished"):
    pareto.curves(points, [design.REFERENCE, "no-such-label"])


def test_term_grads_table_means_the_logged_steps(tmp_path):
  from studies.collapse_confirm import term_grads
  run = tmp_path / "sweep" / "dmpo-320-a1_15" / "seed100"
  run.mkdir(parents=True)
  lines = [{"step": 401, "loss": 1.0},  # a step that did not log the terms
           {"step": 404, "pg_grad_norm": 1.0, "reg_grad_norm": 10.0, "grad_ratio": 10.0},
           {"step": 408, "pg_grad_norm": 3.0, "reg_grad_norm": 14.0, "grad_ratio": 14 / 3}]
  (run / "metrics.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
  row = [l for l in term_grads.table([str(tmp_path / "sweep")]).splitlines() if "dmpo" in l][0]
  assert row == f"| `dmpo-320-a1_15` | 1 | 2 | 12 | 6 | {(10 + 14 / 3) / 2:.3g} |"
  (run / "metrics.jsonl").write_text("{not json\n")
  with pytest.raises(SystemExit, match="line 1: not JSON"):
    term_grads.table([str(tmp_path / "sweep")])
  with pytest.raises(SystemExit, match="logged its terms' gradient norms"):
    term_grads.table([str(tmp_path / "empty")])
