"""Evaluate a policy on NP task instances: SR/QR (best-of-k and mean), pass@k, diversity, length.

``sample_fn(prompt_tokens [Bp, P], prompt_mask [Bp, P], rng) -> (tokens, mask)``, both
``[Bp * samples, T]`` with each prompt's samples adjacent, is any sampler (the training
loop's jitted one, or one built from a HF folder). The next chunk's sample_fn is called before
this chunk's results are read, so an asynchronously dispatched sampler works while the host
scores (verdicts are memoised: `scoring.VERDICTS`).
Each instance gets ``samples`` completions at ``temperature`` (NP-Bench: 3 at
0.7); SR@k/QR@k use the first k of them, the means use all of them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax
import numpy as np

from dmpo_jax.parallel import distributed as dist
from dmpo_jax.data import images as multimodal
from dmpo_jax.data import domain, pipeline
from dmpo_jax.tasks import diversity, scoring
from dmpo_jax import sampling
from dmpo_jax.training import report

SUCCESS = ("feasible", "positive_ratio")
EVAL_KEYS = ("per_task", "categories", "overall", "solved")  # an eval_*.json that lacks one is damaged


def table_metrics(k: int = 3) -> tuple[str, ...]:
  """The table's columns: SR@k and QR@k at the evaluation's k, the means, diversity, length."""
  return (f"SR@{k}", f"QR@{k}", "SR_mean", "QR_mean", "distinct", "length")


TABLE_METRICS = table_metrics(3)  # NP-Bench's k


@dataclasses.dataclass(frozen=True)
class ScoreSpec:
  """One `evaluate` call's settings: how many completions of each instance, in which chunks
  and prompt shape, and how they are scored. Built per call from a config spec (`EvalSpec`,
  `points.PointsSpec`, `transfer.TransferSpec`) and the run's prompt length and rewards, or
  from the flags of `python -m dmpo_jax.evaluate`.

  success: what makes a sample count toward SR: "feasible" (ours), or "positive_ratio"
  (NP-Bench's evaluation: feasible with a quality ratio above 0, so a feasible answer of
  value 0 on a maximisation task is a failure).
  collapse: also the collapse metrics of each problem's samples against its enumerated
  optima (strict verdicts; `collapse_scores`): a reasoning-gym task's against its full
  score, without coverage; NaN for other tasks without enumeration.
  images: for a vision-language policy, images(items, prompt_tokens, prompt_mask) -> the
  chunk's image inputs, passed to sample_fn as a fourth argument."""
  samples: int                        # completions per instance
  batch_prompts: int                  # instances per sample_fn call (one shape: one compilation)
  prompt_len: int                     # P: the prompts' padded length (tokens)
  reward_cfg: Any                     # the verifier's rewards (`domain.RewardConfig`)
  k: int = 3                          # SR@k and QR@k use the first k samples
  pass_ks: tuple[int, ...] = (1, 3)   # pass@k at those <= samples
  success: str = "feasible"           # SUCCESS: what counts toward SR
  collapse: pipeline.Collapse | None = None
  progress: bool = False              # a progress bar over the chunks
  images: Callable | None = None

  def __post_init__(self):
    if self.success not in SUCCESS:
      raise ValueError(f"success={self.success!r}; choose one of {SUCCESS}")
    if not 1 <= self.k <= self.samples or any(p < 1 for p in self.pass_ks):
      raise ValueError(f"k={self.k} must lie in 1..samples={self.samples} and "
                       f"pass_ks={tuple(self.pass_ks)} be >= 1")


def evaluate(sample_fn, encoder: pipeline.PromptEncoder, items, *, spec: ScoreSpec, rng,
             ground_truths: list[float] | None = None) -> dict:
  """Score ``items`` ([(task key, question)]) at `spec`'s settings, sampled from `rng`; returns
  per-task, category and overall means. ground_truths: each item's reference value, the
  denominator of its quality ratio (None: computed per instance by spec.reward_cfg's
  ground_truth rule)."""
  samples, k, batch_prompts, collapse = spec.samples, spec.k, spec.batch_prompts, spec.collapse
  success = spec.success
  # pass@k needs k <= samples: an evaluation reports the ks its own sample count allows (the
  # config check refuses a k that no evaluation of the run samples enough for).
  pass_ks = tuple(p for p in spec.pass_ks if p <= samples)
  problems, correct = [], []
  cut0 = encoder.truncated["prompt"]  # this evaluation's cuts are its own, not the training's
  starts = list(range(0, len(items), batch_prompts))
  chunks = starts
  if spec.progress:
    from tqdm import tqdm
    chunks = tqdm(starts, desc="eval", unit="batch", leave=False)
  # Every chunk's key is derived now: one derived later would wait behind the device's queue
  # (a sampler reads its key on the host) and the chunks would run in turn, not overlapped.
  keys = jax.block_until_ready({c0: jax.random.fold_in(rng, c0) for c0 in starts})
  launch = lambda c0: _launch(sample_fn, encoder, items, c0, spec, keys[c0])
  pending = launch(starts[0]) if starts else None
  for n, c0 in enumerate(chunks):
    tokens, mask = pending
    if n + 1 < len(starts):
      # Dispatched before this chunk's results are read: the device samples the next chunk
      # while the host decodes and verifies this one (the same keys and shapes as in turn).
      pending = launch(starts[n + 1])
    chunk = items[c0:c0 + batch_prompts]
    real = len(chunk)
    tokens, mask = dist.to_host(tokens), dist.to_host(mask)
    texts = encoder.texts(tokens, mask)
    gts = ground_truths[c0:c0 + real] if ground_truths is not None else None
    _, stats = pipeline.score_groups(chunk, texts[:real * samples], samples, spec.reward_cfg, gts,
                                     collapse=collapse)
    lengths = mask.sum(-1).reshape(batch_prompts, samples)[:real]
    for i, (key, _) in enumerate(chunk):
      ok = stats["feasible"][i] & (stats["ratio"][i] > 0 if success == "positive_ratio" else True)
      s = scoring.problem_scores(list(stats["ratio"][i]), list(ok), k=k,
                                 pass_ks=pass_ks)
      s["distinct"] = float(stats["distinct"][i])
      s["solution_entropy"] = float(stats["solution_entropy"][i])
      s["length"] = float(lengths[i].mean())
      if collapse is not None:
        s.update(collapse_scores(stats, i, key, pass_ks))
        correct.append((key, stats["feasible"][i].tolist(), stats["optimal"][i].tolist()))
      problems.append((key, s))
  out = summarize(problems, k)
  out["prompt_truncated"] = encoder.truncated["prompt"] - cut0
  encoder.truncated["prompt"] = cut0
  if collapse is not None:  # per task, per problem, per sample: keep / exploration after RL
    out["correct"] = {name: {t: [c[j] for c in correct if c[0] == t] for t in out["per_task"]}
                      for j, name in ((1, "feasible"), (2, "optimal"))}
  return out


def _launch(sample_fn, encoder, items, c0: int, spec: ScoreSpec, key):
  """sample_fn on the chunk of items starting at c0 with its key, padded to spec.batch_prompts
  prompts with its last item and to spec.prompt_len tokens (fixed shapes: no recompilation);
  returns what sample_fn returns (device arrays, still being computed when dispatch is
  asynchronous)."""
  chunk = items[c0:c0 + spec.batch_prompts]
  padded = chunk + [chunk[-1]] * (spec.batch_prompts - len(chunk))
  ids = [encoder.encode(key, q) for key, q in padded]
  pt, pm = sampling.pad_prompts(ids, spec.prompt_len, encoder.pad)
  extra = () if spec.images is None else (spec.images(padded, pt, pm),)
  return sample_fn(pt, pm, key, *extra)


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """The held-out evaluation's settings (config.eval; compiled by training/specs.py)."""
  samples: int                   # completions per instance
  temperature: float             # their sampling temperature
  k: int = 3                     # SR@k and QR@k use the first k samples
  pass_ks: tuple[int, ...] = (1, 3)
  batch_prompts: int = 8         # instances per sampler call (one shape: one compilation)
  num_per_task: int = 1          # held-out instances per task
  progress: bool = False         # a progress bar over the chunks
  modalities: tuple[str, ...] | None = None  # an image policy's (None: the encoder's default)


class HeldOut:
  """A run's held-out evaluations, eval_{name}.json in `workdir`: the held-out instances of
  `taskset` sampled at `spec`'s settings, every modality for an image policy (a finished
  evaluation is read back, not redone). One sampler (one compilation; `make_sampler()`, called
  when first needed) and one instance set serve every evaluation of the run.
  images: an image policy's images(items, prompt_tokens, prompt_mask, encoder) (None: text)."""

  def __init__(self, spec: EvalSpec, workdir: str, taskset: pipeline.TaskSet,
               encoder: pipeline.PromptEncoder, prompt_len: int, reward_cfg, make_sampler,
               images=None):
    self.spec, self.workdir, self.taskset, self.encoder = spec, workdir, taskset, encoder
    self.prompt_len, self.reward_cfg, self.images = prompt_len, reward_cfg, images
    self.make_sampler, self.made = make_sampler, None

  def __call__(self, name: str, params, rng) -> dict:
    """eval_{name}.json of the policy `params`, sampled from `rng`."""
    path = os.path.join(self.workdir, f"eval_{name}.json")
    if dist.agree(os.path.exists(path)):  # every process takes the same branch
      res, why = report.read_result(path, EVAL_KEYS)
      if res is not None:
        return res
      print(f"warning: {path} is damaged ({why}); evaluating again", flush=True)
    spec = self.spec
    if self.made is None:  # one sampler (one compilation) and one instance set for all
      items = self.taskset.held_out(spec.num_per_task)
      self.made = (self.make_sampler(), items, [domain.get(k).reference_value(q) for k, q in items])
    sampler, items, ground_truths = self.made
    one = lambda encoder, prompt_len, images: evaluate(
        lambda pt, pm, rng, *im: sampler(params, pt, pm, rng, *im)[:2], encoder, items,
        spec=ScoreSpec(samples=spec.samples, batch_prompts=spec.batch_prompts,
                       prompt_len=prompt_len, reward_cfg=self.reward_cfg, k=spec.k,
                       pass_ks=spec.pass_ks, collapse=self.taskset.collapse,
                       progress=spec.progress, images=images),
        rng=rng, ground_truths=ground_truths)
    if self.images is None:
      res = one(self.encoder, self.prompt_len, None)
    else:  # every modality on the same instances; the first one is the run's result
      modalities = (spec.modalities if spec.modalities is not None
                    else multimodal.default_modalities(self.encoder))
      res = multimodal.evaluate_modalities(one, self.encoder, items, modalities, self.images,
                                           self.prompt_len)
    if dist.is_main():
      report.write_json(res, path)
    return res


def collapse_scores(stats: dict, i: int, key: str, pass_ks) -> dict:
  """Problem i's collapse metrics: optimal_rate, distinct_optimal, coverage, entropy_optimal
  (pipeline.COLLAPSE_STATS) and unbiased pass@k with correct = optimal (`pass_optimal@k`) and
  = feasible (`pass_feasible@k`, by the reward's verification rules, whatever SR counts),
  and `best_qr@k`, the unbiased expected best quality ratio of k samples
  (`diversity.max_at_k`), k in pass_ks."""
  # Coverage needs the set of every optimum: a task without enumeration (a reasoning-gym
  # task, meeting-schedule) has none, so the metric is left out (not NaN); a category or
  # overall mean has it only when every task under it does (`scoring.aggregate`).
  out = {k: float(stats[k][i]) for k in pipeline.COLLAPSE_STATS
         if k != "coverage" or domain.get(key).has_optima}
  ks = tuple(k for k in pass_ks if k <= stats["feasible"].shape[1])
  supported = not np.isnan(stats["optimal_rate"][i])  # enumerated, or a known optimum
  opt = diversity.pass_at_k_curve(stats["optimal"][i][None], ks) if supported else [np.nan] * len(ks)
  feas = diversity.pass_at_k_curve(stats["feasible"][i][None], ks)
  for k, o, f in zip(ks, opt, feas):
    out[f"pass_optimal@{k}"], out[f"pass_feasible@{k}"] = float(o), float(f)
    out[f"best_qr@{k}"] = diversity.max_at_k(stats["ratio"][i], k)
  return out


def summarize(problems, k: int = 3) -> dict:
  keys = [k for k, _ in problems]
  scores = [s for _, s in problems]
  per_task = {}
  for key in dict.fromkeys(keys):
    rows = [s for k, s in problems if k == key]
    per_task[key] = {m: float(np.mean([r[m] for r in rows])) for m in rows[0]}
  agg = scoring.aggregate(scores, [domain.get(k).category for k in keys])
  return {"per_task": per_task, "categories": agg["categories"], "overall": agg["overall"],
          "num_problems": len(problems), "k": k,
          # per task, whether each problem was solved (SR@k): keep/exploration rates
          "solved": {t: [bool(s[f"SR@{k}"]) for kk, s in problems if kk == t] for t in per_task}}


def format_table(results: dict, before: dict | None = None, metrics=None) -> str:
  """A text table per task and overall (default columns: `table_metrics` at the results' k);
  with `before`, cells read 'before -> after'."""
  metrics = metrics or table_metrics(report.best_of_k(results))
  head = f"{'task':24s}" + "".join(f"{m:>18s}" for m in metrics)
  lines = [head, "-" * len(head)]
  rows = list(results["per_task"].items()) + [("overall (category mean)", results["overall"])]
  for name, vals in rows:
    ref = before["per_task"].get(name) if before and name in before["per_task"] else (
        before["overall"] if before and name.startswith("overall") else None)
    cells = []
    for m in metrics:
      v = vals.get(m, float("nan"))
      cells.append(f"{ref.get(m, float('nan')):7.3f} -> {v:6.3f}" if ref else f"{v:18.3f}")
    lines.append(f"{name:24s}" + "".join(f"{c:>18s}" for c in cells))
  return "\n".join(lines)
