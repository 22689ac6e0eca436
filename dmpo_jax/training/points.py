"""Evaluation points along RL: the curve each run traces, and its KL to the start policy.

At config.eval.points evenly spaced RL steps (4: start, 1/3, 2/3, end), the policy is
sampled at the RL temperature (config.rl.temperature, so that the curves and the KL
describe the policy RL trains) on each instance set, A, B and C with splits
(`splits.py`), else the pool or the held-out set, and DIR/points/rl<step>.json holds,
per set, the evaluation (`evaluation.evaluate`: pass@k, coverage, distinct optima, ...),
"overall" per category (the mean of category means) and "overall_instance" (the mean
over instances), and the KL to the start of RL.

KL(pi || pi_start) is estimated on the same samples y ~ pi(.|x), with the sequence
log-ratio l(y) = log pi(y|x) - log pi_start(y|x) (both at the sampling temperature,
summed over the completion's tokens):

* `kl_k1`: mean of l, the plain Monte Carlo estimator (unbiased; a single term can
  be negative);
* `kl_k3`: mean of exp(-l) - 1 + l, each term >= 0 and unbiased as well, since
  E_pi[exp(-l)] = 1 when pi_start covers pi's support (the "k3" estimator of J. Schulman's
  note "Approximating KL Divergence", 2020).

k1 is the one reported; both are averaged per instance, then as the metrics are.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training import evaluation, report, steps

KL_KEYS = ("kl_k1", "kl_k3")
DIR = "points"


def point_steps(rl_steps: int, n: int) -> list[int]:
  """n evenly spaced RL steps from 0 to rl_steps, rounded (fewer when they coincide)."""
  if n <= 0 or rl_steps <= 0:
    return []
  if n == 1:
    return [rl_steps]
  return sorted({round(i * rl_steps / (n - 1)) for i in range(n)})


def kl_terms(logp, logp0, mask) -> dict:
  """Per-sample k1 and k3 terms ([B] each) from token log-probs [B, T] of pi (which sampled)
  and pi_start, over the completion mask [B, T]."""
  m = np.asarray(mask, np.float64)
  lr = np.sum((np.asarray(logp, np.float64) - np.asarray(logp0, np.float64)) * m, axis=-1)
  return {"kl_k1": lr, "kl_k3": np.expm1(-lr) + lr}


def kl_estimate(log_ratio) -> dict:
  """{kl_k1, kl_k3} from sequence log-ratios l = log pi(y) - log pi_start(y), y ~ pi."""
  lr = np.asarray(log_ratio, np.float64)
  return {"kl_k1": float(np.mean(lr)), "kl_k3": float(np.mean(np.expm1(-lr) + lr))}


def instance_mean(res: dict, counts: dict) -> dict:
  """The mean over instances of per-task means ({task: {metric: v}}), weighted by counts."""
  metrics = set.intersection(*(set(v) for v in res.values())) if res else set()
  total = sum(counts[t] for t in res)
  return {m: float(sum(counts[t] * res[t][m] for t in res) / total) for m in sorted(metrics)}


def parse_samples(value, names) -> dict:
  """config.eval.points_samples: one count for every set (int or "64"), or per set ("A:32,B:64,C:0",
  or a dict; a set left out or at 0 is not evaluated at the points)."""
  if isinstance(value, str) and ":" not in value and value.strip().isdigit():
    value = int(value)
  if isinstance(value, int):
    return dict.fromkeys(names, value)
  if isinstance(value, str):
    try:
      value = {k.strip(): int(v) for k, _, v in (p.partition(":") for p in value.split(",") if p.strip())}
    except ValueError:
      raise ValueError(f"config.eval.points_samples={value!r}: expected N or 'A:32,B:64,...'") from None
  value = dict(value)
  unknown = sorted(set(value) - set(names))
  if unknown or any(v < 0 for v in value.values()):
    raise ValueError(f"config.eval.points_samples={value!r}: sets {unknown} are not among {names}, or a "
                     "count is negative")
  return {n: int(value.get(n, 0)) for n in names}


def check_config(cfg) -> None:
  """config.eval.points (>= 0) and eval.points_samples (its sets), checked before anything is
  built rather than when RL reaches the first point."""
  n = cfg.eval.points
  if not isinstance(n, int) or n < 0:
    raise ValueError(f"config.eval.points={n!r}: the number of evaluation points along RL (>= 0)")
  if n:
    c = cfg.get("collapse") or {}
    names = ["A", "B", "C"] if c.get("splits") or c.get("split_file") else (
        ["pool"] if c.get("pool") else ["held_out"])
    parse_samples(cfg.eval.points_samples or cfg.eval.samples, names)


def sets_of(taskset, cfg) -> dict:
  """The instance sets evaluated at each point: A, B, C (splits), else the pool or held-out."""
  if taskset.splits:
    sp = taskset.split_sets()
    return {"A": list(sp.A), "B": list(sp.B), "C": list(sp.C)}
  if taskset.pool:
    return {"pool": taskset.pool_items()}
  return {"held_out": taskset.held_out(cfg.eval.num_per_task)}


class Points:
  """run.cfg.eval.points evaluation points of one run; `maybe(state)` evaluates when the
  state sits at one whose file is missing. start_params: the policy at the start of RL."""

  def __init__(self, run, start_params):
    self.run, self.start = run, start_params
    cfg = run.cfg
    self.steps = point_steps(cfg.rl.steps, cfg.eval.points)
    self.sets = sets_of(run.taskset, cfg) if self.steps else {}
    self.samples = parse_samples(cfg.eval.points_samples or cfg.eval.samples, list(self.sets))
    self._samplers, self._logprob = {}, None

  @property
  def enabled(self) -> bool:
    return bool(self.steps)

  def path(self, rl_step: int) -> str:
    return os.path.join(self.run.workdir, DIR, f"rl{rl_step}.json")

  def done(self, rl_step: int) -> bool:
    """Whether the point's file exists at this run's settings (a copied start point of a
    run with another temperature or sample count is redone)."""
    p = self.path(rl_step)
    if not os.path.exists(p):
      return False
    old = report.read_json(p)
    return old.get("temperature") == self.run.cfg.rl.temperature and old.get("samples") == self.samples

  def maybe(self, state) -> dict | None:
    rl_step = state.step - self.run.cfg.sft.steps
    if rl_step not in self.steps or dist.agree(self.done(rl_step)):
      return None
    return self.run.timed("eval", self.evaluate, state, rl_step)

  def evaluate(self, state, rl_step: int) -> dict:
    run, cfg = self.run, self.run.cfg
    if self._logprob is None:  # one log-prob function, one sampler per sample count
      self._logprob = steps.make_logprob_eval(run.graphdef, run.prompt_len, cfg.rl.temperature,
                                              shardings=(run.p_sh, run.data_sh, None))
    out = {"rl_step": rl_step, "step": state.step, "temperature": cfg.rl.temperature,
           "samples": self.samples, "kl_estimator": "k1 (mean sequence log-ratio); k3 beside", "sets": {}}
    for i, (name, items) in enumerate(self.sets.items()):
      g = self.samples[name]
      if not g:
        continue
      if g not in self._samplers:
        self._samplers[g] = run.sampler(run.sampling_config(g, cfg.rl.temperature, cfg.rl.top_p))
      out["sets"][name] = self._one(state, items, g, self._samplers[g], self._logprob,
                                    jax.random.fold_in(state.eval_key(), 7919 + i))
    if dist.is_main():
      os.makedirs(os.path.dirname(self.path(rl_step)), exist_ok=True)
      report.write_json(out, self.path(rl_step))
    return out

  def _one(self, state, items, g: int, sampler, logprob, rng) -> dict:
    run, cfg = self.run, self.run.cfg
    bp = cfg.eval.batch_prompts
    terms, offset = [], [0]

    def sample_fn(pt, pm, key):
      tokens, mask, _ = sampler(state.params, pt, pm, key)
      rows = lambda x: dist.to_global(np.repeat(x, g, 0), run.data_sh)
      seqs = {"tokens": jnp.concatenate([rows(pt), tokens], 1), "prompt_mask": rows(pm)}
      lp, lp0 = logprob(state.params, seqs), logprob(self.start, seqs)
      real = min(bp, len(items) - offset[0]) * g
      offset[0] += bp
      t = kl_terms(dist.to_host(lp), dist.to_host(lp0), dist.to_host(mask))
      terms.append({k: v[:real] for k, v in t.items()})
      return tokens, mask

    res = evaluation.evaluate(
        sample_fn, run.encoder, items, samples=g, k=min(cfg.eval.k, g), pass_ks=tuple(cfg.eval.pass_ks),
        rng=rng, batch_prompts=bp, prompt_len=run.prompt_len, reward_cfg=run.reward_cfg,
        collapse=run.taskset.collapse)
    per_sample = {k: np.concatenate([t[k] for t in terms]).reshape(len(items), g) for k in KL_KEYS}
    counts = {}
    for j, (key, _) in enumerate(items):
      counts[key] = counts.get(key, 0) + 1
      for k in KL_KEYS:
        res["per_task"][key].setdefault(k, 0.0)
        res["per_task"][key][k] += float(per_sample[k][j].mean())
    for key, n in counts.items():
      for k in KL_KEYS:
        res["per_task"][key][k] /= n
    for k in KL_KEYS:  # KL is not a per-category score: both overalls are over instances
      res["overall"][k] = float(np.mean(per_sample[k]))
    res["overall_instance"] = instance_mean(res["per_task"], counts)
    res["num_per_task"] = counts
    return {k: res[k] for k in ("per_task", "categories", "overall", "overall_instance", "num_per_task")}
