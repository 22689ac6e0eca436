"""The confirmatory analysis (dmpo_jax/experiments/confirm.py) on synthetic curves with known
answers, and the confirmatory design (studies/collapse_confirm/design.py)."""

import math

import numpy as np
import pytest

from dmpo_jax.experiments import confirm, frontier, stats, sweep
from studies.collapse_confirm import design
from studies.collapse_frontier import design as frontier_design


def point(pass1_ab, cov_a, n=16):
  """An evaluation point whose A and B both hold pass@1 = pass1_ab (so A+B does too), and
  coverage cov_a on A."""
  row = lambda p, c: {"overall_instance": {"pass_optimal@1": p, "coverage": c}, "num_per_task": {"t": n}}
  return {"sets": {"A": row(pass1_ab, cov_a), "B": row(pass1_ab, 0.5)}}


def curve(steps, xs, ys):
  return {s: point(x, y) for s, x, y in zip(steps, xs, ys)}


STEPS = (0, 10, 20, 30)


def test_per_seed_matching_four_cases():
  # target = 0.40 + 0.03 = 0.43 on every seed (all labels start at 0.40)
  runs = {
      # a crossing between points: 0.42 at step 10 (y 0.9), 0.44 at 20 (y 0.7) -> halfway, 0.8
      "cross": {0: curve(STEPS, (0.40, 0.42, 0.44, 0.46), (1.0, 0.9, 0.7, 0.6))},
      # never reaches 0.43 -> NaN
      "never": {0: curve(STEPS, (0.40, 0.41, 0.42, 0.425), (1.0, 1.0, 1.0, 1.0))},
      # a downward crossing: up to 0.45 at step 10 (y 0.5), down through 0.43 at step 20 (y 0.1).
      # The first point at or above the target counts (interpolated on the way up:
      # 0.40 -> 0.45 reaches 0.43 at w = 0.6, y = 1.0 + 0.6 (0.5 - 1.0) = 0.7); the way down never.
      "down": {0: curve(STEPS, (0.40, 0.45, 0.42, 0.40), (1.0, 0.5, 0.1, 0.0))},
  }
  targets = confirm.seed_targets(runs, 0.03, "AB", "pass_optimal@1")
  assert targets == {0: pytest.approx(0.43)}
  got = {l: confirm.matched_values(by_seed, targets, "AB", "pass_optimal@1", "A", "coverage")[0]
         for l, by_seed in runs.items()}
  assert got["cross"] == pytest.approx(0.8)
  assert math.isnan(got["never"])
  assert got["down"] == pytest.approx(0.7)
  # a start above the target (a negative gain asked for): matched at the start's value
  above = confirm.matched_values(runs["cross"], {0: 0.39}, "AB", "pass_optimal@1", "A", "coverage")
  assert above[0] == 1.0


def test_seed_targets_refuse_labels_with_different_starts():
  runs = {"a": {3: curve(STEPS, (0.40, 0.5, 0.5, 0.5), (1, 1, 1, 1))},
          "b": {3: curve(STEPS, (0.41, 0.5, 0.5, 0.5), (1, 1, 1, 1))}}
  with pytest.raises(ValueError, match="seed 3"):
    confirm.seed_targets(runs, 0.03)


def test_holm_with_m_fixed_counts_a_method_that_never_reaches():
  seeds = range(10)
  rng = np.random.default_rng(0)
  ref = {s: 0.80 + 0.01 * rng.standard_normal() for s in seeds}
  values = {
      "ref": ref,
      "better": {s: ref[s] + 0.10 + 0.01 * rng.standard_normal() for s in seeds},
      "same": {s: ref[s] + 0.01 * rng.standard_normal() for s in seeds},
      "never": {s: math.nan for s in seeds},
      "sometimes": {s: (ref[s] + 0.2 if s < 7 else math.nan) for s in seeds},  # 70% reach
  }
  rows = {r["remedy"]: r for r in confirm.registered_family(values, ["better", "same", "never", "sometimes"],
                                                            "ref", m=13)}
  assert rows["never"]["reading"] == "not estimable" and rows["never"]["reach"] == 0.0
  assert rows["sometimes"]["reading"] == "not estimable" and rows["sometimes"]["reach"] == 0.7
  assert rows["sometimes"]["n"] == 7  # its differences are still reported
  assert math.isnan(rows["sometimes"]["p"])
  # m = 13 although only two contrasts are testable: the smallest p is multiplied by 13
  p_better = rows["better"]["p"]
  assert rows["better"]["p_holm"] == pytest.approx(min(1.0, 13 * p_better))
  assert rows["better"]["reading"] == "keeps more"
  assert rows["same"]["reading"] == "cannot be told apart"
  # with m = the number of testable contrasts the adjustment is smaller
  free = {r["remedy"]: r for r in confirm.registered_family(values, ["better", "same"], "ref")}
  assert free["better"]["p_holm"] < rows["better"]["p_holm"]
  with pytest.raises(ValueError, match="m = 1"):
    confirm.registered_family(values, ["better", "same"], "ref", m=1)


def test_reading_of_fewer():
  seeds = range(8)
  ref = {s: 0.8 + 0.001 * s for s in seeds}
  worse = {s: ref[s] - 0.1 - 0.002 * (s % 3) for s in seeds}
  (row,) = confirm.registered_family({"ref": ref, "worse": worse}, ["worse"], "ref", m=13)
  assert row["reading"] == "keeps fewer" and row["mean"] < 0


def test_sensitivity_values_unreached_runs_at_their_last_point():
  runs = {"ref": {s: curve(STEPS, (0.40, 0.42, 0.44, 0.46), (1.0, 0.9, 0.7, 0.6)) for s in range(4)},
          "slow": {s: curve(STEPS, (0.40, 0.41, 0.42, 0.425), (1.0, 1.0, 0.95, 0.9 + 0.01 * s))
                   for s in range(4)}}
  targets = confirm.seed_targets(runs, 0.03)
  rows = confirm.sensitivity(runs, ["slow"], "ref", targets, "AB", "pass_optimal@1", "A", "coverage", m=13)
  (row,) = rows
  assert row["reach"] == 1.0 and row["n"] == 4
  assert row["mean"] == pytest.approx(np.mean([0.9 + 0.01 * s for s in range(4)]) - 0.8)
  strict = confirm.registered_family(
      {l: confirm.matched_values(b, targets, "AB", "pass_optimal@1", "A", "coverage") for l, b in runs.items()},
      ["slow"], "ref", m=13)
  assert strict[0]["reading"] == "not estimable"


def test_design_confirmatory_seeds_are_fresh_and_labels_exist():
  assert not set(design.CONFIRM_SEEDS) & set(design.EXPLORE_SEEDS)
  assert min(design.CONFIRM_SEEDS) > 4 and len(design.CONFIRM_SEEDS) >= design.MIN_CONFIRM_SEEDS >= 15
  assert len(design.REMEDIES) == 13
  assert {len(v) for v in design.CANDIDATES.values()} == {4}  # the same number of labels per family
  for labels in design.CANDIDATES.values():
    for label in labels:
      assert label in frontier_design.SETTINGS, label
  assert design.REFERENCE in frontier_design.SETTINGS and design.FULL_GRPO in frontier_design.SETTINGS
  assert len(design.stage1_labels()) == 4 * 13 - len(design.RAN_IN_TIER1) == 40
  # the sweep plan of stage 2 holds no exploration seed
  chosen = {f: labels[0] for f, labels in design.CANDIDATES.items()}
  base = sweep.load_config("configs/collapse.py", smoke=True)
  runs = sweep.plan(base, design.confirm_labels(chosen), list(design.CONFIRM_SEEDS),
                    {"eval.points": design.EVAL_POINTS}, log=lambda *_: None, settings=frontier_design.SETTINGS)
  assert runs and not {r.seed for r in runs} & set(range(5))
  assert len(runs) == 15 * len(design.CONFIRM_SEEDS)


def test_choose_strength_rule():
  fam = "rkl"
  a, b, c, d = design.CANDIDATES[fam]
  up = lambda y: curve(STEPS, (0.40, 0.42, 0.44, 0.46), (1.0, y + 0.1, y - 0.1, y - 0.2))  # reaches at y
  flat = curve(STEPS, (0.40, 0.40, 0.41, 0.41), (1.0, 1.0, 1.0, 1.0))                    # never
  runs = {a: {s: up(0.70) for s in range(5)},
          b: {s: up(0.90) if s < 3 else flat for s in range(5)},   # best, but reaches on 3 of 5
          c: {s: up(0.80) for s in range(5)},
          d: {s: flat for s in range(5)}}
  best, table = design.choose_strength(runs, fam)
  assert best == c and table[b][0] == 3 and table[c][1] == pytest.approx(0.80)
  # nothing reaches on 4 of 5: the most reaching label
  runs = {a: {s: flat for s in range(5)}, b: runs[b], c: {s: flat for s in range(5)}, d: {s: flat for s in range(5)}}
  assert design.choose_strength(runs, fam)[0] == b


def test_stage1_reads_points_csv(tmp_path):
  from studies.collapse_confirm import stage1
  a, b, c, d = design.CANDIDATES["rkl"]
  rows = ["label,seed,rl_step,set,pass_optimal@1,coverage"]
  for s in range(5):
    for label, cov_at_10 in ((a, 0.6), (b, 0.9)):  # both reach 0.43 at step 10 (0.40 -> 0.46)
      rows += [f"{label},{s},0,A,0.40,1.0", f"{label},{s},0,B,0.40,0.5",
               f"{label},{s},10,A,0.46,{cov_at_10}", f"{label},{s},10,B,0.46,0.5"]
  (tmp_path / "points.csv").write_text("\n".join(rows) + "\n")
  pts = stage1.load([str(tmp_path / "points.csv")])
  best, table = design.choose_strength(pts, "rkl")
  # halfway between the points: 1.0 + 0.5 (0.9 - 1.0) = 0.95 beats 1.0 + 0.5 (0.6 - 1.0) = 0.8
  assert best == b and table[b] == (5, pytest.approx(0.95)) and table[a][1] == pytest.approx(0.8)
  lines = stage1.table(pts)
  assert any(l.startswith("| rkl | `" + b) for l in lines)


def test_registered_family_bonferroni_interval_and_sd_hand_computed():
  # differences 0.02, 0.04, 0.06, 0.08, 0.10: mean 0.06, squares about it 0.004, s = sqrt(0.004 / 4);
  # Bonferroni at 1 - 0.05/13: half width t_{1 - 0.05/26, 4} s / sqrt(5)
  ref = {s: 0.5 for s in range(5)}
  rem = {s: 0.5 + 0.02 * (s + 1) for s in range(5)}
  (row,) = confirm.registered_family({"ref": ref, "rem": rem}, ["rem"], "ref", m=13)
  s = math.sqrt(0.004 / 4)
  half95 = stats.t_quantile(0.975, 4) * s / math.sqrt(5)
  half_b = stats.t_quantile(1 - 0.05 / 26, 4) * s / math.sqrt(5)
  assert row["sd"] == pytest.approx(s)
  assert row["confidence_bonferroni"] == pytest.approx(1 - 0.05 / 13)
  assert (row["low"], row["high"]) == (pytest.approx(0.06 - half95), pytest.approx(0.06 + half95))
  assert (row["low_bonferroni"], row["high_bonferroni"]) == (pytest.approx(0.06 - half_b),
                                                             pytest.approx(0.06 + half_b))
  assert half_b > 2 * half95  # t_{0.998, 4} = 6.6 against 2.78
  # not estimable: no interval of either kind, no SD
  (row,) = confirm.registered_family({"ref": ref, "rem": {s: math.nan for s in range(5)}}, ["rem"], "ref", m=13)
  assert all(math.isnan(row[k]) for k in ("low_bonferroni", "high_bonferroni", "sd"))


def test_holm_family_joins_two_families_into_one_step_down():
  # p = 0.001 and 0.002 in a family of m = 25. As one family: 25 x 0.001 = 0.025 and
  # max(0.025, 24 x 0.002) = 0.048 < 0.05: both keep more. Each alone with m = 25: the second
  # gets 25 x 0.002 = 0.05, not below 0.05.
  row = lambda p: {"p": p, "mean": 0.1, "estimable": True}
  joined = confirm.holm_family([row(0.001), row(0.002)], m=25)
  assert [r["p_holm"] for r in joined] == [pytest.approx(0.025), pytest.approx(0.048)]
  assert [r["reading"] for r in joined] == ["keeps more", "keeps more"]
  alone = confirm.holm_family([row(0.002)], m=25)
  assert alone[0]["p_holm"] == pytest.approx(0.05) and alone[0]["reading"] == "cannot be told apart"
  with pytest.raises(ValueError, match="m = 1"):
    confirm.holm_family([row(0.1), row(0.2)], m=1)
