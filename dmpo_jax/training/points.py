"""Evaluation points along RL: the curve each run traces, and its KL to the start policy.

At `PointsSpec.n` (config.eval.points) evenly spaced RL steps (4: start, 1/3, 2/3, end), the policy is
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
`PointsSpec.kl_samples` (config.eval.points_kl_samples) > 0 estimates the KL on the first
kl_samples of each instance's samples only (they are as random as any others), and the point
records it; the other metrics use every sample. The KL's forward (two policies) then costs
kl_samples / samples of its full cost; the estimate's variance grows by samples / kl_samples.

Both log-probs come from `completion_logprobs`: each prompt's keys and values are computed once
and shared by its samples (as the sampler decodes them), so a point does not run the P prompt
slots once per sample; both policies in one jitted call (`make_kl_logprobs`). It equals the
update's full forward (`steps.make_logprob_fn`) up to float32 rounding, and the same function
for both policies gives KL = 0 exactly where they are equal (tests/training/test_eval_speed.py;
docs/PERFORMANCE.md, issue 38: about 4x faster than that forward run for each policy).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dmpo_jax.data import pipeline
from dmpo_jax.models import lora, positions
from dmpo_jax.objectives import common
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training import evaluation, report

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


def completion_logprobs(graphdef, params, prompt_tokens, prompt_mask, tokens, temperature: float):
  """Token log-probs [B, T] (float32, at `temperature`) of completions `tokens` [B, T] of the
  left-padded prompts [Bp, P] (mask [Bp, P]), each prompt's B / Bp samples adjacent: the
  sampler's layout. The prompts run once (a prefill), their keys and values are repeated into
  each sample's cache ahead of its completion slots, and the completions run as one call over
  that cache: the positions, visibility and attention are the full forward's, without its
  B x P prompt slots. A text policy (the points sample text prompts)."""
  model = nnx.merge(graphdef, params["model"])
  (bp, p), (b, t) = prompt_tokens.shape, tokens.shape
  r = b // bp
  offsets = positions.left_pad_offsets(prompt_mask)  # [Bp]
  x, prefix = model.hidden(prompt_tokens, offsets=offsets, cache=model.init_cache(bp, p),
                           cache_index=0)
  first = jnp.repeat(x[:, -1:], r, axis=0)  # the last prompt slot predicts completion token 0
  if t == 1:
    h = first
  else:
    cache = tuple({"k": jnp.pad(jnp.repeat(c["k"], r, 0), ((0, 0), (0, 0), (0, 0), (0, t - 1))),
                   "v": jnp.pad(jnp.repeat(c["v"], r, 0), ((0, 0), (0, 0), (0, t - 1), (0, 0)))}
                  for c in prefix)
    rest, _ = model.hidden(tokens[:, :-1], offsets=jnp.repeat(offsets, r), cache=cache,
                           cache_index=p)  # slots P .. P+T-2, after the prompt's P
    h = jnp.concatenate([first, rest], axis=1)
  return common.token_logprobs(model.unembed(h), tokens, temperature=temperature)


def make_kl_logprobs(graphdef, temperature: float, *, shardings=None):
  """Jitted (params, start_params, prompt_tokens [Bp, P], prompt_mask [Bp, P], tokens [B, T])
  -> (logp, logp0), each [B, T]: `completion_logprobs` under both policies in one call.
  shardings: (params', prompts' (replicated), rows') shardings."""
  def run(params, start, prompt_tokens, prompt_mask, tokens):
    lp = lambda p: completion_logprobs(graphdef, p, prompt_tokens, prompt_mask, tokens, temperature)
    return lp(params), lp(start)

  if shardings is None:
    return jax.jit(run)
  p_sh, rep, data_sh = shardings
  return jax.jit(run, in_shardings=(p_sh, p_sh, rep, rep, data_sh), out_shardings=(data_sh, data_sh))


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


def set_row(point: dict, split: str, overall: str = "overall_instance") -> dict | None:
  """A point's metrics on one set ("A"), or on a union of sets ("AB": the mean over the
  instances of A and B, each set weighted by its number of instances); None if absent."""
  sets = point.get("sets", {})
  if split in sets:
    return sets[split][overall]
  parts = [sets.get(c) for c in split]
  if len(split) < 2 or any(p is None for p in parts):
    return None
  w = [sum(p.get("num_per_task", {"_": 1}).values()) for p in parts]
  keys = set.intersection(*(set(p[overall]) for p in parts))
  return {k: sum(wi * p[overall][k] for wi, p in zip(w, parts)) / sum(w) for k in keys}


# ---------------------------------------------------------------------------
# The start's pre-registered bounds (config.eval.start_bounds): a collapse experiment needs a
# start with headroom (docs/COLLAPSE.md), so a start outside them stops the run before RL.
BOUNDS_FIELD = "config.eval.start_bounds"
BOUND_OPS = ("<=", ">=")
_BOUND = re.compile(r"^(?P<set>[^:]*):(?P<metric>.*?)(?P<op><=|>=)(?P<value>.*)$")


@dataclasses.dataclass(frozen=True)
class Bound:
  """One bound on the start: `metric` (overall_instance's, the mean over instances) on `set`
  (a set of the points, or a union such as "AB") `op` `value`."""
  set: str
  metric: str
  op: str
  value: float

  def holds(self, measured: float) -> bool:
    """Whether a measured value is within the bound (NaN never is)."""
    return measured <= self.value if self.op == "<=" else measured >= self.value

  def __str__(self):
    return f"{self.set}:{self.metric}{self.op}{self.value:g}"


def metric_names(samples: int, k: int, pass_ks, collapse: bool) -> list[str]:
  """The metrics a point records on a set of `samples` per instance (its "overall_instance"
  keys; `Points._one`): SR@k and QR@k at min(k, samples), the means, pass@k for the ks of
  pass_ks up to samples, diversity, length and KL; with the collapse metrics
  (config.collapse), the optimal-set ones and pass@k / best QR@k both ways. "coverage" is left
  out of a task that cannot enumerate its optima (evaluation.collapse_scores)."""
  k = min(k, samples)
  ks = [p for p in pass_ks if p <= samples]
  names = [f"SR@{k}", f"QR@{k}", "SR_mean", "QR_mean", *(f"pass@{p}" for p in ks), "distinct",
           "solution_entropy", "length", *KL_KEYS]
  if collapse:
    names += list(pipeline.COLLAPSE_STATS)
    names += [f"{m}@{p}" for p in ks for m in ("pass_optimal", "pass_feasible", "best_qr")]
  return names


def bound_metrics(samples: dict, k: int, pass_ks, collapse: bool) -> dict:
  """{set: its metric names} of the sets a bound may name: each set evaluated at the points
  (samples {set: count}, 0: not evaluated), and each union of two or more of A, B, C
  (`set_row`; "AB": the RL prompts) with the metrics its sets share."""
  out = {s: metric_names(g, k, pass_ks, collapse) for s, g in samples.items() if g}
  letters = [s for s in "ABC" if s in out]
  for n in range(2, len(letters) + 1):
    for combo in itertools.combinations(letters, n):
      shared = set.intersection(*(set(out[c]) for c in combo))
      out["".join(combo)] = [m for m in out[combo[0]] if m in shared]
  return out


def parse_bounds(text: str, metrics: dict) -> tuple[Bound, ...]:
  """config.eval.start_bounds, "B:pass_optimal@64<=0.95,AB:pass_optimal@1<=0.8": comma-
  separated `<set>:<metric><op><value>`, op "<=" or ">="; "" (the default): none. metrics:
  {set: metric names} of the sets a bound may name (`bound_metrics`). A malformed item, an
  unknown set or metric, or a value that is not a finite number is refused, naming the field,
  the item and the choices."""
  out = []
  for item in (p.strip() for p in str(text).split(",")):
    if not item:
      continue
    m = _BOUND.match(item.replace(" ", ""))
    where = f"{BOUNDS_FIELD}={text!r}: item {item!r}"
    if m is None or not m["set"] or not m["metric"]:
      raise ValueError(f"{where} is not <set>:<metric><op><value> with op one of {list(BOUND_OPS)} "
                       "(e.g. 'B:pass_optimal@64<=0.95')")
    try:
      value = float(m["value"])
    except ValueError:
      value = math.nan
    if not math.isfinite(value):
      raise ValueError(f"{where}: {m['value']!r} is not a finite number")
    if m["set"] not in metrics:
      raise ValueError(f"{where}: set {m['set']!r} is not among the points' sets {list(metrics)}")
    if m["metric"] not in metrics[m["set"]]:
      raise ValueError(f"{where}: metric {m['metric']!r} is not recorded on set {m['set']!r} at the "
                       f"points; choose from {_listing(metrics[m['set']])}")
    out.append(Bound(m["set"], m["metric"], m["op"], value))
  return tuple(out)


def _listing(names) -> str:
  """Metric names for a message, the pass@k families once each: "SR@3, ..., pass@k,
  pass_optimal@k (k in 1..64)"."""
  plain, ks = [], []
  for n in names:
    base, at, k = n.partition("@")
    if at and base not in ("SR", "QR"):  # SR@k / QR@k: one k, the evaluation's
      plain += [f"{base}@k"] if f"{base}@k" not in plain else []
      ks += [int(k)] if int(k) not in ks else []
    else:
      plain.append(n)
  ks.sort()
  run = len(ks) > 3 and ks == list(range(ks[0], ks[-1] + 1))
  return ", ".join(plain) + (f" (k in {f'{ks[0]}..{ks[-1]}' if run else ks})" if ks else "")


def outside(bounds, point: dict) -> tuple[dict, list[str]]:
  """({"<set>:<metric>": measured} of every bound, [one line per bound the point is outside])
  at the evaluation point `point` (a points/rl<step>.json). A bound whose metric the point
  lacks (a task without enumerated optima has no coverage) counts as outside: unmeasured is
  not within."""
  measured, lines = {}, []
  for b in bounds:
    row = set_row(point, b.set) or {}
    v = row.get(b.metric)
    key = f"{b.set}:{b.metric}"
    measured[key] = None if v is None else float(v)
    if v is None:
      lines.append(f"{b.set} {b.metric} is not in the point (bound {b})")
    elif not b.holds(float(v)):
      beyond = (">" if b.op == "<=" else "<") if math.isfinite(v) else "is not " + b.op
      lines.append(f"{b.set} {b.metric} = {float(v):.3f} {beyond} {b.value:g} (bound)")
  return measured, lines


@dataclasses.dataclass(frozen=True)
class PointsSpec:
  """The evaluation points' settings (config.eval.points ...; compiled by training/specs.py)."""
  n: int                  # points along RL (0: none)
  rl_steps: int           # RL's steps, over which the points are spread
  rl_start: int           # the global step RL starts at (config.sft.steps)
  samples: Any            # per instance: N, "N", "SET:N,..." or {set: N} (`parse_samples`)
  temperature: float      # the RL sampling temperature (the policy RL trains)
  top_p: float = 1.0
  k: int = 3              # SR@k / QR@k (at most a set's samples)
  pass_ks: tuple[int, ...] = (1, 3)
  batch_prompts: int = 8  # instances per sampler call
  num_per_task: int = 1   # held-out instances per task (without splits or a pool)
  start_bounds: str = ""  # the start's bounds at RL step 0 (`parse_bounds`; "": none)
  kl_samples: int = 0     # KL to the start on the first kl_samples of each instance's samples (0: all)


def check(n, samples, names) -> None:
  """config.eval.points (n >= 0) and its samples per set (`parse_samples` over the sets `names`
  evaluated), checked before anything is built rather than when RL reaches the first point."""
  if not isinstance(n, int) or n < 0:
    raise ValueError(f"config.eval.points={n!r}: the number of evaluation points along RL (>= 0)")
  if n:
    parse_samples(samples, names)


def kl_rows(tokens, mask, prompts: int, g: int, s: int):
  """The first s of each prompt's g sample rows of tokens / mask [prompts * g, T] (the
  sampler's layout, a prompt's samples adjacent), as [prompts * s, T]; all when s is 0 or >= g."""
  if not s or s >= g:
    return tokens, mask
  pick = lambda x: x.reshape(prompts, g, *x.shape[1:])[:, :s].reshape(prompts * s, *x.shape[1:])
  return pick(tokens), pick(mask)


def start_bounds(spec: PointsSpec, names, collapse: bool) -> tuple[Bound, ...]:
  """spec.start_bounds parsed (`parse_bounds`) over the points' sets `names` (their samples:
  spec.samples) and metrics (collapse: with config.collapse's); () without bounds. Bounds
  need the point at RL step 0 (config.eval.points >= 2 and RL steps): refused without it."""
  if not spec.start_bounds.strip():
    return ()
  if 0 not in point_steps(spec.rl_steps, spec.n):
    raise ValueError(f"{BOUNDS_FIELD}={spec.start_bounds!r} needs the evaluation point at RL step 0, "
                     f"which config.eval.points={spec.n} over config.rl.steps={spec.rl_steps} does not "
                     "give (eval.points >= 2 and rl.steps >= 1 do)")
  samples = parse_samples(spec.samples, list(names))
  return parse_bounds(spec.start_bounds, bound_metrics(samples, spec.k, spec.pass_ks, collapse))


def set_names(splits: bool, pool: bool) -> list[str]:
  """The instance sets evaluated at each point: A, B, C with splits, else the pool or held-out."""
  return ["A", "B", "C"] if splits else (["pool"] if pool else ["held_out"])


def sets_of(taskset, num_per_task: int) -> dict:
  """The instance sets evaluated at each point: A, B, C (splits), else the pool or held-out."""
  if taskset.splits:
    sp = taskset.split_sets()
    return {"A": list(sp.A), "B": list(sp.B), "C": list(sp.C)}
  if taskset.pool:
    return {"pool": taskset.pool_items()}
  return {"held_out": taskset.held_out(num_per_task)}


class Points:
  """spec.n evaluation points of one run (files under workdir); `maybe(state)` evaluates when
  the state sits at one whose file is missing. start_params: the policy at the start of RL.
  The run's parts they use: `taskset`, `encoder`, `prompt_len`, `reward_cfg`; make_sampler(g)
  -> the sampler of g samples per instance at spec's temperature and top_p, and
  make_kl_logprobs() -> `make_kl_logprobs`'s function on the run's mesh (each made once, when
  first needed); rep: the replicated sharding the prompts take there; timed(name, fn, *args):
  the run's timer of an evaluation."""

  def __init__(self, spec: PointsSpec, workdir: str, taskset, start_params, *, encoder=None,
               prompt_len: int = 0, reward_cfg=None, make_sampler=None, make_kl_logprobs=None,
               rep=None, timed=None):
    self.spec, self.workdir, self.start = spec, workdir, start_params
    self.encoder, self.prompt_len, self.reward_cfg, self.rep = encoder, prompt_len, reward_cfg, rep
    self.make_sampler, self.make_kl_logprobs = make_sampler, make_kl_logprobs
    self.timed = timed or (lambda name, fn, *args: fn(*args))
    self.collapse = taskset.collapse if taskset is not None else None
    self.steps = point_steps(spec.rl_steps, spec.n)
    self.sets = sets_of(taskset, spec.num_per_task) if self.steps else {}
    self.samples = (parse_samples(spec.samples, list(self.sets))
                    if self.steps else {})  # eval.points = 0: a per-set spec names no set here
    self.bounds = start_bounds(spec, list(self.sets), self.collapse is not None) if self.steps else ()
    self._samplers, self._logprob = {}, None

  @property
  def enabled(self) -> bool:
    return bool(self.steps)

  def path(self, rl_step: int) -> str:
    return os.path.join(self.workdir, DIR, f"rl{rl_step}.json")

  def done(self, rl_step: int) -> bool:
    """Whether the point's file exists at this run's settings (a copied start point of a
    run with another temperature or sample count is redone)."""
    p = self.path(rl_step)
    if not os.path.exists(p):
      return False
    old = report.read_json(p)
    return (old.get("temperature") == self.spec.temperature and old.get("samples") == self.samples
            and old.get("kl_samples", 0) == self.spec.kl_samples)

  def read(self, rl_step: int) -> dict:
    """The point's file (points/rl<step>.json)."""
    return report.read_json(self.path(rl_step))

  def maybe(self, state) -> dict | None:
    rl_step = state.step - self.spec.rl_start
    if rl_step not in self.steps or dist.agree(self.done(rl_step)):
      return None
    return self.timed("eval", self.evaluate, state, rl_step)

  def evaluate(self, state, rl_step: int) -> dict:
    if self._logprob is None:  # one log-prob function, one sampler per sample count
      self._logprob = self.make_kl_logprobs()
    out = {"rl_step": rl_step, "step": state.step, "temperature": self.spec.temperature,
           "samples": self.samples, "kl_estimator": "k1 (mean sequence log-ratio); k3 beside", "sets": {}}
    if self.spec.kl_samples:  # absent: every sample (the files of runs before the field)
      out["kl_samples"] = self.spec.kl_samples
    for i, (name, items) in enumerate(self.sets.items()):
      g = self.samples[name]
      if g:
        out["sets"][name] = self._one(state, items, g, self.sampler_for(g), self._logprob,
                                      self.set_key(state, i))
    if dist.is_main():
      os.makedirs(os.path.dirname(self.path(rl_step)), exist_ok=True)
      report.write_json(out, self.path(rl_step))
    return out

  def sampler_for(self, g: int):
    """The points' sampler of g samples per instance at the RL temperature (one each)."""
    if g not in self._samplers:
      self._samplers[g] = self.make_sampler(g)
    return self._samplers[g]

  @staticmethod
  def set_key(state, i: int):
    """The sampling key of the i-th instance set at a point."""
    return jax.random.fold_in(state.eval_key(), 7919 + i)

  def _one(self, state, items, g: int, sampler, kl_logprobs, rng) -> dict:
    spec = self.spec
    bp = spec.batch_prompts
    start = lora.reference_params(self.start, state.params)  # LoRA: the base, adapters off
    pending = []  # device arrays of each chunk, read once every chunk is dispatched

    s = min(spec.kl_samples or g, g)  # the KL's samples per instance: the first s of its g

    def sample_fn(pt, pm, key):
      tokens, mask, _ = sampler(state.params, pt, pm, key)
      kt, km = kl_rows(tokens, mask, pt.shape[0], g, s)
      pending.append(kl_logprobs(state.params, start, dist.to_global(pt, self.rep),
                                 dist.to_global(pm, self.rep), kt) + (km,))
      return tokens, mask

    res = evaluation.evaluate(
        sample_fn, self.encoder, items, rng=rng,
        spec=evaluation.ScoreSpec(samples=g, batch_prompts=bp, prompt_len=self.prompt_len,
                                  reward_cfg=self.reward_cfg, k=min(spec.k, g),
                                  pass_ks=tuple(spec.pass_ks), collapse=self.collapse))
    terms = [kl_terms(*(dist.to_host(x) for x in chunk)) for chunk in pending]
    per_sample = {k: np.concatenate([t[k] for t in terms])[:len(items) * s].reshape(len(items), s)
                  for k in KL_KEYS}
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
