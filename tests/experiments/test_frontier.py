"""The collapse experiment's infrastructure: splits that hold, the KL estimator, matched
interpolation, Holm's correction, and the sweep report's per-seed CSV (docs/COLLAPSE.md)."""

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from dmpo_jax.experiments import frontier, report as sweep_report, stats, sweep
from dmpo_jax.training import points, report, specs
from dmpo_jax.data import instances, pipeline, splits
from dmpo_jax.models import precision
from studies.collapse_frontier import design
from tests.helpers import REPO, smoke

CONFIG = os.path.join(REPO, "configs", "collapse.py")


# ---------------------------------------------------------------------------
# Splits.
def test_instance_id_is_content_not_key_order():
  a = {"1": [0], "0": [1]}
  b = {"0": [1], "1": [0]}
  assert splits.instance_id("GCP-D", a) == splits.instance_id("GCP-D", b) == 'GCP-D:{"0":[1],"1":[0]}'
  assert splits.instance_id("GCP-D", a) != splits.instance_id("maximum-set", a)


def test_overlapping_sets_are_refused_naming_the_instances():
  q, r = {"0": [1], "1": [0]}, {"0": [], "1": []}
  with pytest.raises(splits.SplitError, match=r'GCP-D:\{"0":\[1\],"1":\[0\]\} at A\[0\], C\[1\]'):
    splits.Splits(A=[("GCP-D", q)], B=[("GCP-D", r)], C=[("GCP-D", {"0": [], "1": [1]}), ("GCP-D", q)])
  with pytest.raises(splits.SplitError, match=r"at B\[0\], B\[1\]"):  # a repeat within one set
    splits.Splits(A=[("GCP-D", q)], B=[("GCP-D", r), ("GCP-D", r)], C=[])


def test_a_config_whose_split_file_overlaps_is_refused(tmp_path):
  cfg = sweep.load_config(CONFIG, smoke=True)
  ts = specs.taskset(cfg, ["GCP-D"])
  sp = ts.split_sets()
  bad = {"A": [list(x) for x in sp.A], "B": [list(x) for x in sp.B],
         "C": [list(x) for x in sp.C] + [list(sp.A[0])]}  # an A instance also in C
  path = tmp_path / "split.json"
  path.write_text(json.dumps(bad))
  cfg.collapse.split_file = str(path)
  cfg.tasks = "GCP-D"
  with pytest.raises(splits.SplitError, match=r"at A\[0\], C\[1\]"):
    instances.write(specs.instances_spec(cfg), specs.taskset(cfg, ["GCP-D"]),
                    str(tmp_path / "dry"))
  path.write_text(json.dumps({"A": bad["A"], "B": bad["B"], "C": bad["C"][:1]}))  # the fixed lists
  out = instances.write(specs.instances_spec(cfg), specs.taskset(cfg, ["GCP-D"]),
                        str(tmp_path / "dry"))
  assert out["checks"]["disjoint"] and out["splits"]["C"] == bad["C"][:1]


def test_split_sets_are_distinct_and_training_draws_from_the_right_sets():
  ts = pipeline.TaskSet(["GCP-D", "subset-sum"], "tiny", 0, splits=(3, 2, 2))
  sp = ts.split_sets()
  assert [len(sp.by_task(n, "GCP-D")) for n in "ABC"] == [3, 2, 2]
  a, ab, c = sp.ids("A"), sp.ids("A", "B"), sp.ids("C")
  sft = {splits.instance_id(k, q) for s in range(30) for k, q in ts.train("sft", s, 4)}
  rl = {splits.instance_id(k, q) for s in range(30) for k, q in ts.train("rl", s, 4)}
  assert sft == a and rl == ab  # 120 draws reach every instance of its set, and nothing else
  for stage in ("sft", "rl"):  # the tasks cycle as in the stream
    assert [k for k, _ in ts.train(stage, 3, 4)] == ["GCP-D", "subset-sum"] * 2
  assert {splits.instance_id(k, q) for k, q in ts.held_out(99)} == c
  # DPH's candidates (the pool, A then B) cover every task in its first rows
  assert [k for k, _ in ts.pool_items()[:2]] == ["GCP-D", "subset-sum"]


def test_random_streams_redraw_instances_of_c_and_for_sft_of_b():
  """At `tiny` a stream repeats instances constantly; B and C are taken from what the free
  stream draws, so without the redraw they would occur in it."""
  key = "maximum_clique_problem"
  free = pipeline.TaskSet([key], "tiny", 0)
  draws = lambda ts, stage: [splits.canonical(q) for s in range(40) for _, q in ts.train(stage, s, 4)]
  free_sft, free_rl = draws(free, "sft"), draws(free, "rl")
  b = max(set(free_rl), key=free_rl.count)  # B: the RL stream's most frequent instance
  c = max(set(free_sft) - {b}, key=free_sft.count)  # C: the SFT stream's most frequent other one
  assert b in free_sft or free_rl.count(b) > 1
  ts = pipeline.TaskSet([key], "tiny", 0, sft_from="stream", rl_from="stream", splits=(1, 1, 1))
  ts._splits = splits.Splits(A=[], B=[(key, json.loads(b))], C=[(key, json.loads(c))])
  sft, rl = draws(ts, "sft"), draws(ts, "rl")
  assert c not in sft and b not in sft and c not in rl
  assert rl.count(b) == free_rl.count(b)  # RL keeps B's rows: only C is held out from it
  assert len(sft) == len(free_sft) == 160


@pytest.mark.slow
def test_dry_run_is_disjoint_for_the_shipped_configs(tmp_path):
  """The CLI end to end on the default config, and the stream regime in process."""
  wd = tmp_path / "dry"
  r = subprocess.run([sys.executable, "-m", "dmpo_jax.train", f"--config={CONFIG}", f"--workdir={wd}",
                      "--dry_run"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  out = json.loads((wd / "instances.json").read_text())
  ids = {k: [splits.instance_id(t, q) for t, q in out[k]] for k in ("sft", "rl", "eval")}
  b = {splits.instance_id(t, q) for t, q in out["splits"]["B"]}
  assert len(ids["eval"]) == len(set(ids["eval"])) == 4 * 8
  assert not set(ids["eval"]) & (set(ids["sft"]) | set(ids["rl"]))
  ab = b | {splits.instance_id(t, q) for t, q in out["splits"]["A"]}
  assert not set(ids["sft"]) & b and set(ids["rl"]) & b and set(ids["rl"]) <= ab
  assert len(set(ids["sft"])) == 4 * 16 and len(ab) == 4 * 32
  assert out["checks"]["disjoint"]
  cfg = sweep.load_config(CONFIG + ":regime=stream,sft_steps=200")
  res = instances.write(specs.instances_spec(cfg), specs.taskset(cfg, cfg.tasks.split(",")),
                        str(tmp_path / "stream"))
  assert res["checks"] == {"eval_distinct": True, "sft_eval_shared": 0, "rl_eval_shared": 0, "sft_in_B": 0,
                           "disjoint": True}


# ---------------------------------------------------------------------------
# KL(pi || pi_start).
def test_kl_estimators_match_the_exact_kl_of_a_tiny_categorical():
  p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
  q = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
  exact = float(np.sum(p * np.log(p / q)))
  lr = np.log(p) - np.log(q)
  # unbiased: the expectations under p of the per-sample terms are the exact KL
  for name, term in (("k1", lr), ("k3", np.expm1(-lr) + lr)):
    assert math.isclose(float(np.sum(p * term)), exact, rel_tol=1e-12), name
  # and the estimate from samples y ~ p is within 4 standard errors of it
  y = np.random.default_rng(0).choice(5, size=200_000, p=p)
  est = points.kl_estimate(lr[y])
  for k in ("kl_k1", "kl_k3"):
    se = np.std((lr if k == "kl_k1" else np.expm1(-lr) + lr)[y]) / math.sqrt(len(y))
    assert abs(est[k] - exact) < 4 * se, (k, est[k], exact)


def test_kl_terms_sum_the_completion_tokens_only():
  """Sequences of two tokens from p(a) p(b|a) against q: the sequence log-ratio is the sum of
  the masked tokens' log-ratios, and its mean under p is the exact KL of the joints."""
  rng = np.random.default_rng(1)
  p1, q1 = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3))
  p2, q2 = rng.dirichlet(np.ones(3), 3), rng.dirichlet(np.ones(3), 3)
  seqs = [(a, b) for a in range(3) for b in range(3)]
  lp = np.array([[np.log(p1[a]), np.log(p2[a, b]), -3.0] for a, b in seqs])  # 3rd token: padding
  lq = np.array([[np.log(q1[a]), np.log(q2[a, b]), 5.0] for a, b in seqs])
  mask = np.array([[1, 1, 0]] * len(seqs))
  w = np.array([p1[a] * p2[a, b] for a, b in seqs])
  exact = float(np.sum(w * np.log(w / np.array([q1[a] * q2[a, b] for a, b in seqs]))))
  t = points.kl_terms(lp, lq, mask)
  assert math.isclose(float(np.sum(w * t["kl_k1"])), exact, rel_tol=1e-9)
  assert math.isclose(float(np.sum(w * t["kl_k3"])), exact, rel_tol=1e-9)
  assert np.all(t["kl_k3"] >= 0)


def test_point_steps():
  assert points.point_steps(100, 4) == [0, 33, 67, 100]
  assert points.point_steps(3, 4) == [0, 1, 2, 3]
  assert points.point_steps(2, 4) == [0, 1, 2]
  assert points.point_steps(0, 4) == [] and points.point_steps(10, 0) == []


# ---------------------------------------------------------------------------
# Matched interpolation and the frontier.
def test_interpolation_at_matched_x_on_synthetic_curves():
  xs = [0.5, 0.6, 0.7, 0.8]
  ys = [1 - 2 * (x - 0.5) for x in xs]  # y = 2 - 2x along the run
  assert math.isclose(frontier.interpolate(xs, ys, 0.65), 0.7)
  assert frontier.interpolate(xs, ys, 0.6) == pytest.approx(0.8)  # on a point
  assert math.isnan(frontier.interpolate(xs, ys, 0.85))  # never reached
  # a trajectory that goes back: the first crossing counts
  assert math.isclose(frontier.interpolate([0.5, 0.9, 0.6], [1.0, 0.2, 0.9], 0.7), 0.6)
  # a start already at or above x has reached it at step 0, whatever comes after
  assert frontier.interpolate([0.8, 0.5, 0.9], [0.3, 0.1, 0.2], 0.7) == 0.3
  assert frontier.interpolate([0.7, 0.9], [0.4, 0.2], 0.7) == 0.4
  # a point with a NaN is skipped, not a wall: the crossing is bracketed across it
  assert math.isclose(frontier.interpolate([0.3, float("nan"), 0.6], [1.0, 0.5, 0.4], 0.45), 0.7)
  assert math.isclose(frontier.interpolate([0.3, 0.5, 0.6], [1.0, float("nan"), 0.4], 0.45), 0.7)
  # the frontier: the best label that reaches x; a label that does not is left out
  trajs = {"weak": ([0.5, 0.55, 0.6], [1.0, 0.99, 0.98]), "mid": ([0.5, 0.6, 0.7], [1.0, 0.9, 0.8]),
           "strong": ([0.5, 0.7, 0.9], [1.0, 0.7, 0.4])}
  assert math.isclose(frontier.frontier(trajs, 0.65), max(0.85, 0.775))
  assert math.isnan(frontier.frontier({"weak": trajs["weak"]}, 0.65))


def synthetic_points(slope: float, reach: float, kl_per_gain: float = 1.0, start=0.5):
  """A run's evaluation points on sets A and B (the same values): pass@1 from `start` up to
  `reach`, coverage falling by `slope` per unit of pass@1 gained, KL growing with the gain."""
  out = {}
  for i, x in enumerate(np.linspace(start, reach, 4)):
    o = {"pass_optimal@1": float(x), "coverage": float(0.9 - slope * (x - start)),
         "kl_k1": float(kl_per_gain * (x - start)), "pass_optimal@64": 0.9}
    out[[0, 33, 67, 100][i]] = {"sets": {n: {"overall_instance": o, "overall": o, "per_task": {"t1": o, "t2": o}}
                                         for n in "AB"}}
  return out


def test_matched_families_and_contrasts_on_synthetic_curves():
  # per seed: "keep" keeps coverage (slope 0.5), "grpo" loses it (slope 2); both reach 0.8
  pts = {"grpo": {s: synthetic_points(2.0, 0.8 + 0.01 * s) for s in range(5)},
         "keep-a": {s: synthetic_points(0.5, 0.8) for s in range(5)},
         "keep-b": {s: synthetic_points(0.5, 0.6) for s in range(5)}}  # does not reach 0.7
  fam = {"grpo-less-rl": ["grpo"], "keep": ["keep-a", "keep-b"]}
  vals = frontier.matched(pts, fam, "A", "pass_optimal@1", "coverage", 0.7)
  assert vals["grpo-less-rl"] == pytest.approx({s: 0.9 - 2.0 * 0.2 for s in range(5)})
  assert vals["keep"] == pytest.approx({s: 0.9 - 0.5 * 0.2 for s in range(5)})
  (row,) = frontier.contrasts(vals, [("keep", "grpo-less-rl")])
  assert row["mean"] == pytest.approx(0.3) and row["n"] == 5 and row["p"] == 0.0
  few = {f: {s: v for s, v in d.items() if s < 2} for f, d in vals.items()}  # 2 seeds: not estimable
  (row,) = frontier.contrasts(few, [("keep", "grpo-less-rl")])
  assert row["n"] == 2 and all(math.isnan(row[k]) for k in ("p", "mean", "low", "high", "low_bonferroni"))
  assert row["diffs"] == pytest.approx({0: 0.3, 1: 0.3})
  # the Bonferroni interval is at 1 - 0.05 / m for the family's m, not the list's length
  noisy = {"keep": {s: 0.5 + 0.1 * ((-1) ** s) * (s + 1) for s in range(5)}, "grpo-less-rl": {s: 0.4 for s in range(5)}}
  (r2,) = frontier.contrasts(noisy, [("keep", "grpo-less-rl")], m=2)
  (r12,) = frontier.contrasts(noisy, [("keep", "grpo-less-rl")], m=12)
  wide = stats.paired_test(noisy["keep"], noisy["grpo-less-rl"], 1 - 0.05 / 12)
  assert r12["low_bonferroni"] == pytest.approx(wide["low"]) and r12["low_bonferroni"] < r2["low_bonferroni"]
  assert r12["p_holm"] == pytest.approx(min(1.0, 12 * r12["p"]))
  # the rule's target: start 0.5 + half of grpo's mean gain (its mean end is 0.82)
  tg = frontier.targets(pts, "grpo", design.ANALYSIS)
  assert tg[("AB", "pass_optimal@1")] == tg[("A", "pass_optimal@1")] == pytest.approx(0.5 + 0.5 * 0.32)
  assert tg[("AB", "kl_k1")] == pytest.approx(0.5 * 0.32)
  # a seed whose own start is already above the target: named, and matched at its start
  high = dict(pts, grpo={**pts["grpo"], 5: synthetic_points(2.0, 0.9, start=0.7)})
  res = frontier.analyse(high, fam, [("keep", "grpo-less-rl")], "grpo", design.ANALYSIS)
  assert res["start_at_target"]["AB/pass_optimal@1"] == [5]
  assert res["matched"]["A/coverage@AB/pass_optimal@1"]["grpo-less-rl"][5] == pytest.approx(0.9)
  flat = {"grpo": {s: synthetic_points(2.0, 0.51) for s in range(5)}}  # a gain below MIN_GAIN
  assert ("AB", "pass_optimal@1") not in frontier.targets(flat, "grpo", design.ANALYSIS)
  # targets given by hand (an exploratory analysis): the rule's own give the same result;
  # another target moves the matched values; a spec left out has no target
  same = lambda r: json.dumps(r, sort_keys=True)  # NaN-tolerant equality
  assert same(frontier.analyse(pts, fam, [("keep", "grpo-less-rl")], "grpo", design.ANALYSIS, given_targets=tg)) == \
      same(frontier.analyse(pts, fam, [("keep", "grpo-less-rl")], "grpo", design.ANALYSIS))
  at = frontier.analyse(pts, fam, [("keep", "grpo-less-rl")], "grpo", design.ANALYSIS,
                        given_targets={("AB", "pass_optimal@1"): 0.7})
  assert at["targets"] == {"AB/pass_optimal@1": 0.7}
  assert at["matched"]["A/coverage@AB/pass_optimal@1"]["keep"] == pytest.approx(vals["keep"])
  assert len(at["primary"]) == 2 and "exploratory: A/coverage at AB/kl_k1" in at["no_target"]


def test_union_of_sets_weighs_instances():
  a = {"overall_instance": {"pass_optimal@1": 0.2}, "num_per_task": {"x": 1, "y": 2}}
  b = {"overall_instance": {"pass_optimal@1": 0.8}, "num_per_task": {"x": 1}}
  row = frontier.set_row({"sets": {"A": a, "B": b}}, "AB")
  assert row["pass_optimal@1"] == pytest.approx((3 * 0.2 + 0.8) / 4)
  assert frontier.set_row({"sets": {"A": a}}, "AB") is None
  # x on one set, y on another
  pts = {0: {"sets": {"A": {"overall_instance": {"p": 0.1}}, "B": {"overall_instance": {"c": 0.9}}}}}
  assert frontier.trajectory(pts, "A", "p", "c", y_split="B") == ([0.1], [0.9])


# ---------------------------------------------------------------------------
# Statistics.
def test_holm_against_a_hand_computed_case():
  # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> 0.06, monotone)
  got = stats.holm([0.01, 0.04, 0.03, 0.005])
  assert got == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert stats.holm([0.5, 0.4]) == pytest.approx([0.8, 0.8])  # capped at 1 only above
  got = stats.holm([0.01, float("nan"), 0.02])  # NaN: not counted in m
  assert got[0] == pytest.approx(0.02) and math.isnan(got[1]) and got[2] == pytest.approx(0.02)
  assert stats.holm([0.3, 0.9]) == pytest.approx([0.6, 0.9])
  # a family of 4 registered tests of which one could not be run: m stays 4
  got = stats.holm([0.01, float("nan"), 0.02], m=4)
  assert got[0] == pytest.approx(0.04) and math.isnan(got[1]) and got[2] == pytest.approx(0.06)
  with pytest.raises(ValueError, match="m = 1"):
    stats.holm([0.01, 0.02], m=1)


def test_paired_test_is_the_paired_t_test():
  from scipy import stats as scipy_stats
  a = {0: 0.5, 1: 0.61, 2: 0.47, 3: 0.55, 4: 0.58, 5: float("nan")}
  b = {0: 0.45, 1: 0.5, 2: 0.49, 3: 0.5, 4: 0.51, 5: 0.4}
  r = stats.paired_test(a, b)
  ref = scipy_stats.ttest_rel([a[s] for s in range(5)], [b[s] for s in range(5)])
  assert r["n"] == 5 and r["p"] == pytest.approx(ref.pvalue)
  assert r["low"] < r["mean"] < r["high"]


# ---------------------------------------------------------------------------
# The sweep report's CSV.
def fake_run(out, label, seed, pts):
  wd = os.path.join(out, label, f"seed{seed}")
  os.makedirs(os.path.join(wd, "points"))
  report.write_json({"sft": {"steps": 3}, "rl": {"steps": 100}, "collapse": {"splits": [16, 16, 8]}},
                    os.path.join(wd, "config.json"))
  after = {"SR_mean": 0.5, "coverage": 0.3 + 0.01 * seed}
  report.write_json({"overall": after}, os.path.join(wd, "eval_after.json"))
  report.write_json({"overall": after}, os.path.join(wd, "eval_before.json"))
  report.write_json({"after": {"overall": after}, "steps": {"sft": 3, "rl": 100}, "wall_s": 5.0},
                    os.path.join(wd, "results.json"))
  for step, p in pts.items():
    report.write_json(p, os.path.join(wd, "points", f"rl{step}.json"))


def test_report_csv_holds_one_row_per_seed_and_label(tmp_path):
  out = str(tmp_path)
  labels = {"grpo": 2.0, "rkl-0.01": 1.0, "dmpo-20-a1_15": 0.5}
  for label, slope in labels.items():
    for seed in range(3):
      fake_run(out, label, seed, synthetic_points(slope, 0.8))
  # a grpo run stopped part-way (no results.json): its last point (step 33, far above the
  # others' end) must neither set the target nor enter a method's matched values
  part = synthetic_points(2.0, 3.0)
  fake_run(out, "grpo", 3, {k: v for k, v in part.items() if k <= 33})
  os.remove(os.path.join(out, "grpo", "seed3", "results.json"))
  os.makedirs(os.path.join(out, "grpo", "seed3", "checkpoints"))
  report.write_json({"labels": list(labels), "seeds": [0, 1, 2, 3], "baseline": "grpo",
                     "families": {"grpo-less-rl": ["grpo"], "rkl": ["rkl-0.01"], "dmpo": ["dmpo-20-a1_15"]},
                     "contrasts": [["dmpo", "rkl"], ["dmpo", "grpo-less-rl"]],
                     "sessions": [{"commit": "abc", "machine": "cpu", "wall_s": 12.0}]},
                    os.path.join(out, "sweep.json"))
  sweep_report.write_report(out, plots=False, analysis=design.ANALYSIS)
  with open(os.path.join(out, "per_seed.csv")) as f:
    rows = list(csv.DictReader(f))
  assert sorted((r["label"], r["seed"]) for r in rows) == sorted((l, str(s)) for l in labels for s in range(4))
  assert {r["label"]: r["status"] for r in rows if r["seed"] == "3"} == {
      "grpo": "partial", "rkl-0.01": "not started", "dmpo-20-a1_15": "not started"}
  r = next(r for r in rows if r["label"] == "grpo" and r["seed"] == "2")
  assert float(r["final_coverage"]) == pytest.approx(0.32)
  assert float(r["A_coverage"]) == pytest.approx(0.9 - 2.0 * 0.3)  # the last point's
  with open(os.path.join(out, "points.csv")) as f:
    assert len(list(csv.DictReader(f))) == 3 * 3 * 4 * 2  # labels x seeds x points x sets
  with open(os.path.join(out, "per_task.csv")) as f:  # finished runs x points x sets x tasks
    assert len(list(csv.DictReader(f))) == 3 * 3 * 4 * 2 * 2
  md = open(os.path.join(out, "frontier.md")).read()
  assert "The start (RL step 0" in md and "mean of category means (exploratory)" in md and "| t1 | t2 |" in md
  with open(os.path.join(out, "matched.csv")) as f:
    m = [r for r in csv.DictReader(f) if r["comparison"] == "A/coverage@AB/pass_optimal@1"]
  assert sorted((r["method"], r["seed"]) for r in m) == sorted(
      (f, str(s)) for f in ("grpo-less-rl", "rkl", "dmpo") for s in range(3))
  md = open(os.path.join(out, "report.md")).read()
  assert "evaluated on set C" in md and "commit `abc`" in md
  fr = json.load(open(os.path.join(out, "frontier.json")))
  assert fr["targets"]["AB/pass_optimal@1"] == pytest.approx(0.5 + 0.5 * 0.3)  # finished grpo runs only
  assert sorted(fr["incomplete"]) == ["dmpo-20-a1_15/seed3 (not started)", "grpo/seed3 (partial)",
                                      "rkl-0.01/seed3 (not started)"]
  assert "Left out (not finished): " in open(os.path.join(out, "frontier.md")).read()
  assert all(set(d) == {"0", "1", "2"} for v in fr["matched"].values() for d in v.values())
  first, second, *on_b = fr["primary"]  # coverage on A, then pass@64 on B (equal: diff 0)
  assert [r["mean"] for r in on_b] == pytest.approx([0.0, 0.0]) and len(on_b) == 2
  assert first["contrast"] == "dmpo - rkl" and first["mean"] == pytest.approx((1.0 - 0.5) * 0.15)
  assert second["contrast"] == "dmpo - grpo-less-rl" and second["mean"] == pytest.approx((2.0 - 0.5) * 0.15)


def test_without_a_study_analysis_the_report_has_no_contrasts(tmp_path):
  """The library holds no pre-registered analysis: without a study's, frontier.md has the
  tables and no targets or contrasts."""
  out = str(tmp_path)
  for label, slope in (("grpo", 2.0), ("dmpo", 0.5)):
    for seed in range(3):
      fake_run(out, label, seed, synthetic_points(slope, 0.8))
  report.write_json({"labels": ["grpo", "dmpo"], "seeds": [0, 1, 2], "baseline": "grpo",
                     "families": {"g": ["grpo"], "d": ["dmpo"]}, "contrasts": [["d", "g"]]},
                    os.path.join(out, "sweep.json"))
  sweep_report.write_report(out, plots=False)
  md = open(os.path.join(out, "frontier.md")).read()
  assert "No pre-registered analysis" in md and "Pre-registered contrasts" not in md
  assert "The start (RL step 0" in md
  fr = json.load(open(os.path.join(out, "frontier.json")))
  assert fr["targets"] == {} and fr["primary"] == [] and fr["exploratory"] == []
  sweep_report.write_report(out, plots=False, analysis=design.ANALYSIS)
  assert "Pre-registered contrasts" in open(os.path.join(out, "frontier.md")).read()


def test_points_samples_per_set():
  assert points.parse_samples(64, ["A", "B", "C"]) == {"A": 64, "B": 64, "C": 64}
  assert points.parse_samples("8", ["pool"]) == {"pool": 8}
  assert points.parse_samples("A:32,B:64", ["A", "B", "C"]) == {"A": 32, "B": 64, "C": 0}
  with pytest.raises(ValueError, match=r"\['D'\]"):
    points.parse_samples("D:8", ["A", "B", "C"])
  cfg = sweep.load_config(CONFIG, smoke=True)
  specs.check_points(cfg)
  cfg.eval.points_samples = "A:8,pool:8"  # the splits regime has no pool
  with pytest.raises(ValueError, match="points_samples"):
    specs.check_points(cfg)


def test_cpu_kind_tells_apart_two_cpus_of_one_name(tmp_path):
  """Two machines named "AMD EPYC" (one AVX2, one AVX-512 with avx512_bf16) get different kinds,
  so a sweep's sessions say which one ran a chunk."""
  def cpuinfo(name, family, model, flags):
    p = tmp_path / name
    p.write_text(f"processor\t: 0\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: AMD EPYC\n"
                 f"flags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    return str(p)
  zen3 = frontier.cpu_kind(cpuinfo("zen3", 25, 1, "avx2 fma bmi2"))
  zen4 = frontier.cpu_kind(cpuinfo("zen4", 25, 17, "avx2 fma avx512f avx512_bf16"))
  assert zen3 == "family 25 model 1: avx2 fma"
  assert zen4 == "family 25 model 17: avx2 fma avx512f avx512_bf16"
  assert frontier.cpu_kind(str(tmp_path / "absent")) == "unknown"
  assert precision.cpuinfo_field("model name", cpuinfo("x", 6, 143, "amx_bf16")) == "AMD EPYC"
