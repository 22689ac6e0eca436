"""Seed-paired statistics (dmpo_jax/experiments/stats.py) against hand-computed values."""

import math

import numpy as np
import pytest

from dmpo_jax.experiments import stats

# Two-sided 95% Student-t critical values, from printed tables.
T975 = {1: 12.7062, 2: 4.3027, 4: 2.7764, 5: 2.5706, 9: 2.2622, 29: 2.0452}


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_tables(df):
  assert stats.t_quantile(0.975, df) == pytest.approx(T975[df], abs=1e-4)
  assert stats.t_quantile(0.025, df) == pytest.approx(-T975[df], abs=1e-4)


def test_mean_ci_hand_computed():
  # mean 3, deviations -2..2: sum of squares 10, s = sqrt(10/4), half = 2.7764 * s / sqrt(5)
  iv = stats.mean_ci([1, 2, 3, 4, 5])
  half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
  assert (iv.mean, iv.n) == (3.0, 5)
  assert iv.std == pytest.approx(math.sqrt(2.5))
  assert iv.low == pytest.approx(3 - half, abs=1e-5) and iv.high == pytest.approx(3 + half, abs=1e-5)
  assert iv.half_width == pytest.approx(half, abs=1e-5)
  assert iv.excludes_zero() and not stats.mean_ci([-1, 1, -2, 2, 0]).excludes_zero()
  assert str(iv) == f"3.000 ± {half:.3f} (n=5)"


def test_wider_at_higher_confidence_and_zero_width_for_constant_values():
  a, b = stats.mean_ci([1, 2, 4, 8, 9], 0.9), stats.mean_ci([1, 2, 4, 8, 9], 0.99)
  assert b.half_width > a.half_width and a.mean == b.mean
  c = stats.mean_ci([0.5] * 6)
  assert (c.low, c.high) == (0.5, 0.5)


def test_paired_difference_pairs_by_seed():
  base = {0: 0.40, 1: 0.50, 2: 0.30, 3: 0.60, 4: 0.45}
  new = {4: 0.47, 3: 0.62, 2: 0.33, 1: 0.51, 0: 0.44}  # order differs; pairing is by seed
  d = stats.paired_difference(new, base)
  diffs = [0.04, 0.01, 0.03, 0.02, 0.02]
  mean = sum(diffs) / 5
  s = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 4)
  assert d.mean == pytest.approx(mean) and d.std == pytest.approx(s)
  assert d.half_width == pytest.approx(2.776445 * s / math.sqrt(5), rel=1e-5)
  assert d.excludes_zero()  # each seed improves: paired, the gain is clear...
  # ...while unpaired the seed spread swamps it: the two intervals overlap.
  assert stats.mean_ci(new).low < stats.mean_ci(base).mean < stats.mean_ci(new).mean


def test_compare_table():
  res = {"grpo": {0: 1.0, 1: 2.0, 2: 3.0}, "dmpo": {0: 2.0, 1: 2.5, 2: 4.5}}
  out = stats.compare(res, "grpo")
  assert out["grpo"]["diff"] is None
  assert out["dmpo"]["mean"].mean == pytest.approx(3.0)
  assert out["dmpo"]["diff"].mean == pytest.approx(1.0)  # diffs 1, 0.5, 1.5
  assert out["dmpo"]["diff"].std == pytest.approx(0.5)


def test_bad_input_named():
  with pytest.raises(ValueError, match="needs >= 2 seeds"):
    stats.mean_ci([1.0])
  with pytest.raises(ValueError, match="dmpo: non-finite"):
    stats.mean_ci([1.0, float("nan")], what="dmpo")
  with pytest.raises(ValueError, match=r"only in values \[5\]"):
    stats.paired_difference({0: 1, 5: 2}, {0: 1, 1: 2})
  with pytest.raises(ValueError, match="pair them by seed"):
    stats.paired_difference([1, 2, 3], [1, 2])
  with pytest.raises(KeyError, match="baseline 'grpo'"):
    stats.compare({"dmpo": {0: 1, 1: 2}}, "grpo")


# The confirmatory pre-registration's power figures (docs/COLLAPSE.md, "Seeds: 100-119"): a
# paired two-sided t-test at alpha = 0.05 / 13, SD 0.040 (tier 1's pooled SD) and 0.053 (its
# one-sided 95% upper bound).
ALPHA13 = 0.05 / 13


@pytest.mark.parametrize("n, sd, percent", [(15, 0.040, 89), (15, 0.053, 59), (20, 0.040, 98), (20, 0.053, 80)])
def test_paired_power_reproduces_the_preregistered_figures(n, sd, percent):
  assert round(100 * stats.paired_power(0.05, sd, n, ALPHA13)) == percent


@pytest.mark.parametrize("sd, mde", [(0.040, 0.038), (0.053, 0.050)])
def test_min_detectable_reproduces_the_preregistered_figures(sd, mde):
  d = stats.min_detectable(sd, 20, ALPHA13)
  assert round(d, 3) == mde
  assert stats.paired_power(d, sd, 20, ALPHA13) == pytest.approx(0.8, abs=1e-8)  # the inverse


def test_paired_power_against_simulation():
  # 40,000 simulated 15-seed experiments at a true difference of 0.05, SD 0.04: the share
  # whose paired t-test rejects at 0.05/13 (Monte Carlo SE about 0.0016)
  rng = np.random.default_rng(0)
  n, reps = 15, 40_000
  d = 0.05 + 0.04 * rng.standard_normal((reps, n))
  t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
  rate = float((np.abs(t) > stats.t_quantile(1 - ALPHA13 / 2, n - 1)).mean())
  assert stats.paired_power(0.05, 0.04, n, ALPHA13) == pytest.approx(rate, abs=0.008)
  # no difference: the test rejects at its level; the sign of the difference does not matter
  assert stats.paired_power(0.0, 0.04, n, ALPHA13) == pytest.approx(ALPHA13)
  assert stats.paired_power(-0.05, 0.04, n, ALPHA13) == stats.paired_power(0.05, 0.04, n, ALPHA13)
  # fewer seeds, more SD: less power; a few seeds need a large difference
  assert stats.min_detectable(0.04, 3, ALPHA13) > stats.min_detectable(0.04, 10, ALPHA13) > 0.04
  with pytest.raises(ValueError, match="n >= 2"):
    stats.paired_power(0.05, 0.04, 1)


def test_pooled_sd_hand_computed():
  # [1, 2, 3]: 2 squares about the mean, 2 df; [2, 4]: 2, 1 df; [7]: nothing -> sqrt(4 / 3)
  assert stats.pooled_sd([[1, 2, 3], [2, 4], [7]]) == pytest.approx(math.sqrt(4 / 3))
  assert stats.pooled_sd([[0.5, 0.5]]) == 0.0
  assert math.isnan(stats.pooled_sd([[1.0], []]))
