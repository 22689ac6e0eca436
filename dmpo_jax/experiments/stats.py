"""Seed-paired statistics for comparing training presets.

Each preset is run on the same seeds (same SFT start, same prompt stream per
seed), so the right comparison is paired: the per-seed difference against a
baseline, whose spread is far smaller than that of either preset alone.

    iv = stats.mean_ci([0.41, 0.44, 0.39, 0.47, 0.42])      # Interval(mean, low, high, n, std)
    t = stats.paired_test({0: .5, 1: .6, ...}, {0: .4, 1: .55, ...})   # mean, low, high, p, n, diffs
    d = stats.paired_difference({0: .5, 1: .6, ...}, {0: .4, 1: .55, ...})  # strict: an Interval
    table = stats.compare({"grpo": {0: .4, ...}, "dmpo": {0: .5, ...}}, baseline="grpo")
    p_adj = stats.holm([0.01, 0.04, 0.03], m=6)
    stats.paired_power(0.05, sd=0.04, n=15, alpha=0.05 / 13)   # 0.887: a design's power
    stats.min_detectable(sd=0.04, n=20, alpha=0.05 / 13)       # 0.038: the difference found with 80%

Intervals are two-sided Student-t intervals, mean +- t_{(1+c)/2, n-1} s / sqrt(n)
with s the sample standard deviation (n - 1 in the denominator). Use at
least five seeds: with fewer, t's heavy tails make the interval wide.

`paired_test` is the one implementation of the seed-paired difference: the sweep report's
paired table (report.paired), the matched contrasts (frontier.contrasts, confirm) and
`paired_difference` all call it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Interval:
  """A mean and its confidence interval over n seeds (std: sample std, n - 1)."""
  mean: float
  low: float
  high: float
  n: int
  std: float
  confidence: float = 0.95

  @property
  def half_width(self) -> float:
    return (self.high - self.low) / 2

  def excludes_zero(self) -> bool:
    return self.low > 0 or self.high < 0

  def __str__(self):
    return f"{self.mean:.3f} ± {self.half_width:.3f} (n={self.n})"


def t_quantile(p: float, df: int) -> float:
  """The p-quantile of Student's t with df degrees of freedom."""
  from scipy import stats as scipy_stats  # a dependency of jax
  if not 0 < p < 1 or df < 1:
    raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p} df={df}")
  return float(scipy_stats.t.ppf(p, df))


def _values(values, what: str) -> np.ndarray:
  x = np.asarray(list(values.values()) if isinstance(values, Mapping) else list(values), dtype=float)
  if x.ndim != 1:
    raise ValueError(f"{what}: expected one number per seed, got shape {x.shape}")
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{what}: non-finite values {x[~np.isfinite(x)].tolist()} (a failed run?)")
  return x


def mean_ci(values: Sequence[float] | Mapping, confidence: float = 0.95, *, what: str = "values") -> Interval:
  """Mean over seeds with its two-sided Student-t confidence interval (n >= 2)."""
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  x = _values(values, what)
  n = len(x)
  if n < 2:
    raise ValueError(f"{what}: a confidence interval needs >= 2 seeds, got {n}")
  mean, std = float(x.mean()), float(x.std(ddof=1))
  half = t_quantile((1 + confidence) / 2, n - 1) * std / math.sqrt(n)
  return Interval(mean, mean - half, mean + half, n, std, confidence)


def _finite(v) -> bool:
  return isinstance(v, (int, float)) and math.isfinite(v)


def paired_test(values: Mapping, baseline: Mapping, confidence: float = 0.95) -> dict:
  """The seed-paired difference on the seeds where both are finite ({seed: value} each):
  "mean", the t-interval at `confidence` ("low", "high"), the two-sided p-value of a zero
  mean ("p"), "n" and the per-seed differences ("diffs"). With fewer than two seeds: no
  interval and no p (NaN); with none, no mean either."""
  seeds = sorted(s for s in values if s in baseline and _finite(values[s]) and _finite(baseline[s]))
  d = np.asarray([values[s] - baseline[s] for s in seeds], float)
  out = {"n": len(d), "diffs": dict(zip(seeds, d.tolist())), "mean": float(d.mean()) if len(d) else math.nan,
         "low": math.nan, "high": math.nan, "p": math.nan}
  if len(d) < 2:
    return out
  iv = mean_ci(d, confidence)
  out.update(low=iv.low, high=iv.high)
  sd = d.std(ddof=1)
  if sd == 0:
    out["p"] = 1.0 if d.mean() == 0 else 0.0
  else:
    from scipy import stats as scipy_stats
    t = d.mean() / (sd / math.sqrt(len(d)))
    out["p"] = float(2 * scipy_stats.t.sf(abs(t), len(d) - 1))
  return out


def paired_difference(values: Sequence[float] | Mapping, baseline: Sequence[float] | Mapping,
                      confidence: float = 0.95, *, what: str = "values") -> Interval:
  """Mean of (values - baseline) seed by seed, with its t interval (`paired_test`), strictly:
  every value finite, the same seeds on both sides, at least two.

  Mappings are paired by seed (both must hold the same seeds); sequences by position.
  """
  if isinstance(values, Mapping) != isinstance(baseline, Mapping):
    raise TypeError(f"{what}: pass both as {{seed: value}} mappings or both as sequences")
  if isinstance(values, Mapping):
    if set(values) != set(baseline):
      raise ValueError(f"{what}: seeds differ from the baseline's: only in values "
                       f"{sorted(set(values) - set(baseline))}, only in baseline "
                       f"{sorted(set(baseline) - set(values))}")
    seeds = sorted(values)
    values, baseline = [values[s] for s in seeds], [baseline[s] for s in seeds]
  a, b = _values(values, what), _values(baseline, f"{what} (baseline)")
  if a.shape != b.shape:
    raise ValueError(f"{what}: {len(a)} values but {len(b)} baseline values; pair them by seed")
  t = paired_test(dict(enumerate(a)), dict(enumerate(b)), confidence)
  d = np.asarray(list(t["diffs"].values()), float)
  if t["n"] < 2:
    mean_ci(d, confidence, what=f"{what} - baseline")  # raises, naming what is wrong
  return Interval(t["mean"], t["low"], t["high"], t["n"], float(d.std(ddof=1)), confidence)


def compare(results: Mapping[str, Mapping], baseline: str, confidence: float = 0.95) -> dict:
  """{name: {"mean": Interval, "diff": Interval vs baseline (None for the baseline)}}.

  results: {preset name: {seed: value}}, one metric.
  """
  if baseline not in results:
    raise KeyError(f"baseline {baseline!r} not among the results {sorted(results)}")
  out = {}
  for name, by_seed in results.items():
    out[name] = {
        "mean": mean_ci(by_seed, confidence, what=name),
        "diff": None if name == baseline else paired_difference(by_seed, results[baseline], confidence,
                                                                what=f"{name} vs {baseline}"),
    }
  return out


def holm(pvalues, m: int | None = None) -> np.ndarray:
  """Holm's step-down adjusted p-values, in the input order: sorted ascending, the i-th
  (from 0) of m is max_{j <= i} min(1, (m - j) p_(j)) (Holm, "A simple sequentially
  rejective multiple test procedure", Scand. J. Statist. 1979). NaN p-values (contrasts that
  could not be tested) stay NaN; m is the number of finite ones unless given (the size of the
  pre-registered family, so that an untestable contrast counts as p = 1)."""
  p = np.asarray(pvalues, float)
  out = np.full(p.shape, np.nan)
  ok = np.flatnonzero(np.isfinite(p))
  m = len(ok) if m is None else m
  if m < len(ok):
    raise ValueError(f"holm: m = {m} is smaller than the {len(ok)} finite p-values")
  running = 0.0
  for rank, idx in enumerate(ok[np.argsort(p[ok], kind="stable")]):
    running = max(running, min(1.0, (m - rank) * p[idx]))
    out[idx] = running
  return out


def paired_power(diff: float, sd: float, n: int, alpha: float = 0.05) -> float:
  """Power of the two-sided seed-paired t-test at level `alpha` on n seeds when the true mean
  difference is `diff` and the per-seed differences have SD `sd`: P(|T| > t_{1-alpha/2, n-1})
  with T noncentral t, n - 1 df, noncentrality diff sqrt(n) / sd. The lower tail is taken as
  the upper tail at -noncentrality (scipy's cdf returns NaN there for large noncentralities)."""
  from scipy import stats as scipy_stats
  if n < 2 or not sd > 0 or not 0 < alpha < 1:
    raise ValueError(f"paired_power needs n >= 2, sd > 0 and 0 < alpha < 1, got n={n} sd={sd} alpha={alpha}")
  df, nc = n - 1, abs(diff) * math.sqrt(n) / sd
  crit = t_quantile(1 - alpha / 2, df)
  return float(scipy_stats.nct.sf(crit, df, nc) + scipy_stats.nct.sf(crit, df, -nc))


def min_detectable(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
  """The smallest true mean difference that the two-sided seed-paired t-test at level `alpha`
  on n seeds detects with probability `power` when the differences have SD `sd`
  (`paired_power` solved for diff: Brent's method on the noncentrality, which is bracketed by
  doubling)."""
  from scipy import optimize
  if not alpha < power < 1:
    raise ValueError(f"min_detectable needs alpha < power < 1, got alpha={alpha} power={power}")
  scale = sd / math.sqrt(n)
  gap = lambda nc: paired_power(nc * scale, sd, n, alpha) - power  # also checks n, sd, alpha
  hi = 1.0
  while gap(hi) < 0:
    hi *= 2
  return float(optimize.brentq(gap, 0.0, hi, xtol=1e-10)) * scale


def pooled_sd(samples) -> float:
  """The pooled sample SD of several groups (one sequence of numbers each; e.g. the per-seed
  differences of several contrasts): sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1)); groups of
  fewer than two values add nothing. NaN when no group has two."""
  ss, df = 0.0, 0
  for i, x in enumerate(samples):
    x = _values(x, f"pooled_sd: group {i}")
    if len(x) >= 2:
      ss += float(((x - x.mean()) ** 2).sum())
      df += len(x) - 1
  return math.sqrt(ss / df) if df else math.nan
