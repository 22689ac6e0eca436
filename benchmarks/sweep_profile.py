"""Where a collapse run's time goes (issue 38): one evaluation point's parts, the old evaluation
path against the new one, an RL step's rollout and update, and the per-run wall time of the
confirmatory design (11 points at A:32,B:64,C:0) against tier 1's (4 points at A:32,B:64,C:32).

    python benchmarks/sweep_profile.py --workdir /tmp/prof      # a configs/collapse.py run past SFT
    python benchmarks/sweep_profile.py --workdir /tmp/sft7      # no checkpoint there: SFT first (~2 min)

--workdir holds (or gets) the SFT checkpoint of --config; every measurement runs on copies of it
in a scratch folder. The points are taken at the workdir's newest RL checkpoint against its
reference policy when it has both (a short run: `--config.rl.steps=20`), else at the SFT start
(KL 0). Parts:
- point: one evaluation point, wall time, best of --reps, the old and the new path alternated in
  one process (other jobs on the machine slow both alike). Old: the path before issue 38 (the
  update's full forward over prompt + completion for each policy, the host waiting for each
  chunk's KL before scoring it, no verdict memo); new: `points.Points.evaluate` (prompt keys and
  values shared by the samples, both policies in one call, the next chunk dispatched before this
  one is scored, verdicts memoised). Both sample the same completions: the script checks that
  every non-KL metric is equal and prints the largest KL difference.
- breakdown: the new point run serially with each part timed alone (sampling, KL forward of both
  policies old and new, decoding, verification + collapse stats, metric assembly).
- rl: --rl_steps RL steps of the trainer (`stages.train`), auto micro-batches and 1; the mean
  of each step's rollout and update after the first two (those compile).
The per-run projection is SFT-free (the sweep shares SFT per seed): RL steps x step time +
points x point time + the evaluations before and after RL (measured in the RL runs). Last
line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

DESIGNS = {"tier1": ({"A": 32, "B": 64, "C": 32}, 4), "confirm": ({"A": 32, "B": 64, "C": 0}, 11)}


def load(spec: str, **sets):
  from dmpo_jax.training import config as config_lib
  path, _, arg = spec.partition(":")
  cfg = config_lib.load_config(path, arg or None)
  cfg.log.progress = False
  for k, v in sets.items():
    node = cfg
    *head, last = k.split(".")
    for h in head:
      node = node[h]
    node[last] = v
  return cfg


def sft_checkpoint(spec: str, workdir: str) -> str:
  """workdir/checkpoints/<sft.steps>, trained first (stop_at_step) when missing."""
  from dmpo_jax.training import stages
  cfg = load(spec)
  ckpt = os.path.join(workdir, "checkpoints", str(cfg.sft.steps))
  if not os.path.isdir(ckpt):
    print(f"training the SFT start in {workdir} ...", flush=True)
    stages.train(load(spec, stop_at_step=cfg.sft.steps), workdir)
  return ckpt


def scratch(ckpt: str, sft_steps: int, later: bool = False) -> str:
  """A scratch workdir holding the SFT checkpoint; later: also the source's newest RL checkpoint
  and its reference policy (the points are then taken there, against the start: KL > 0)."""
  d = tempfile.mkdtemp(prefix="sweep_profile_")
  shutil.copytree(ckpt, os.path.join(d, "checkpoints", str(sft_steps)))
  src = os.path.dirname(ckpt)
  steps = sorted(int(n) for n in os.listdir(src) if n.isdigit())
  if later and steps[-1] > sft_steps and os.path.isdir(os.path.join(src, "reference")):
    for n in (str(steps[-1]), "reference"):
      shutil.copytree(os.path.join(src, n), os.path.join(d, "checkpoints", n))
  return d


def legacy_point(run, state, pts, logprob) -> dict:
  """One point by the path before issue 38 (see the module doc); {set: evaluate's result, with
  per-sample KL terms}."""
  import jax.numpy as jnp
  from dmpo_jax.parallel import distributed as dist
  from dmpo_jax.tasks import scoring
  from dmpo_jax.training import evaluation, points
  cfg, out = run.cfg, {}
  memo, scoring.VERDICTS = scoring.VERDICTS, scoring.VerdictMemo(size=0)  # every verdict anew
  try:
    for i, (name, items) in enumerate(pts.sets.items()):
      g = pts.samples[name]
      if not g:
        continue
      sampler, terms = pts.sampler_for(g), []

      def sample_fn(pt, pm, key, g=g, sampler=sampler, terms=terms):
        tokens, mask, _ = sampler(state.params, pt, pm, key)
        rows = lambda x: dist.to_global(np.repeat(x, g, 0), run.data_sh)
        seqs = {"tokens": jnp.concatenate([rows(pt), tokens], 1), "prompt_mask": rows(pm)}
        lp, lp0 = logprob(state.params, seqs), logprob(pts.start, seqs)
        terms.append(points.kl_terms(dist.to_host(lp), dist.to_host(lp0), dist.to_host(mask)))
        return tokens, mask

      res = evaluation.evaluate(
          sample_fn, run.encoder, items, rng=pts.set_key(state, i),
          spec=evaluation.ScoreSpec(
              samples=g, batch_prompts=cfg.eval.batch_prompts, prompt_len=run.prompt_len,
              reward_cfg=run.reward_cfg, k=min(cfg.eval.k, g), pass_ks=tuple(cfg.eval.pass_ks),
              collapse=run.taskset.collapse))
      res["kl_k1"] = np.concatenate([t["kl_k1"] for t in terms])[:len(items) * g]
      out[name] = res
  finally:
    scoring.VERDICTS = memo
  return out


def compare(new: dict, old: dict) -> tuple[int, float]:
  """(non-KL metrics that differ, largest |KL difference|) of a new point against the old path's."""
  diffs, kl = 0, 0.0
  for name, res in new["sets"].items():
    for task, m in res["per_task"].items():
      for k, v in m.items():
        if k.startswith("kl_"):
          continue
        w = old[name]["per_task"][task][k]
        diffs += not (v == w or (np.isnan(v) and np.isnan(w)))
    kl = max(kl, abs(res["overall"]["kl_k1"] - float(np.mean(old[name]["kl_k1"]))))
  return diffs, kl


def time_points(run, state, reps: int) -> dict:
  """Best wall time of one point per design and path, designs and paths alternated in each
  round (the first round compiles); agreement of the two paths' metrics."""
  from dmpo_jax.training import steps
  cfg = run.cfg
  pts = run.points(start_policy(run, state))
  logprob = steps.make_logprob_eval(run.graphdef, run.prompt_len, cfg.rl.temperature,
                                    shardings=(run.p_sh, run.data_sh, None))
  best = {(d, p): np.inf for d in DESIGNS for p in ("old", "new")}
  first, res = {}, {}
  for rep in range(reps + 1):
    for design, (samples, _) in DESIGNS.items():
      pts.samples = samples
      for path in ("old", "new"):
        t0 = time.perf_counter()
        res[design, path] = (pts.evaluate(state, state.step - cfg.sft.steps) if path == "new"
                             else legacy_point(run, state, pts, logprob))
        dt = time.perf_counter() - t0
        if rep:
          best[design, path] = min(best[design, path], dt)
        else:
          first[design, path] = dt
  out = {}
  for design, (samples, _) in DESIGNS.items():
    n = sum(len(pts.sets[s]) * g for s, g in samples.items())
    old, new = best[design, "old"], best[design, "new"]
    diffs, kl = compare(res[design, "new"], res[design, "old"])
    out[design] = {"completions": n, "old_s": old, "new_s": new, "speedup": old / new,
                   "first_old_s": first[design, "old"], "first_new_s": first[design, "new"],
                   "old_per_s": n / old, "new_per_s": n / new, "non_kl_diffs": diffs,
                   "max_kl_diff": kl}
    print(f"point {design}: {n} completions, old {old:.1f} s, new {new:.1f} s ({old / new:.2f}x; "
          f"first round, with compiles: old {first[design, 'old']:.1f} s, new "
          f"{first[design, 'new']:.1f} s); non-KL metrics that differ: {diffs}, max |KL k1 "
          f"difference| {kl:.1e}", flush=True)
  return out


def start_policy(run, state):
  """The run's reference policy (the start of RL) when the workdir has one, else the state's."""
  return run.ckpt.restore_reference(state.params) if run.ckpt.has_reference() else state.params


def breakdown(run, state) -> dict:
  """The new tier-1 point run serially, each part timed alone (seconds); the old path's KL
  forward and the verification without the memo timed beside it on the same chunks. The
  second of two passes (the first compiles); the memo starts empty in each."""
  from dmpo_jax.data import pipeline
  from dmpo_jax.tasks import scoring
  from dmpo_jax.training import evaluation
  pts = run.points(start_policy(run, state))
  pts.samples = DESIGNS["tier1"][0]
  plain = {"score": pipeline.score_groups, "collapse": evaluation.collapse_scores,
           "texts": run.encoder.texts}
  fns = point_functions(run)
  for _ in range(2):
    parts = dict.fromkeys(("sample", "kl_new", "kl_old", "decode", "score", "score_no_memo",
                           "collapse_metrics"), 0.0)
    scoring.VERDICTS.clear()
    timed = lambda part, fn: timer(parts, part, fn)

    def score(*a, **kw):  # verification and collapse stats, without the memo and with it
      memo, scoring.VERDICTS = scoring.VERDICTS, scoring.VerdictMemo(size=0)
      try:
        timed("score_no_memo", plain["score"])(*a, **kw)
      finally:
        scoring.VERDICTS = memo
      return timed("score", plain["score"])(*a, **kw)

    pipeline.score_groups, run.encoder.texts = score, timed("decode", plain["texts"])
    evaluation.collapse_scores = timed("collapse_metrics", plain["collapse"])
    t0 = time.perf_counter()
    try:
      serial_point(run, state, pts, fns, timed)
    finally:
      pipeline.score_groups, evaluation.collapse_scores = plain["score"], plain["collapse"]
      run.encoder.texts = plain["texts"]
    extra = ("kl_old", "score_no_memo")  # timed beside the new point, not part of it
    total = time.perf_counter() - t0 - sum(parts[k] for k in extra)
  parts["assembly_other"] = total - sum(v for k, v in parts.items() if k not in extra)
  parts["verdict_hits"], parts["verdict_misses"] = scoring.VERDICTS.hits, scoring.VERDICTS.misses
  print("breakdown of the new tier-1 point (serial, s): " + ", ".join(
      f"{k} {v:.2f}" for k, v in parts.items()) + f"; KL forward old/new "
      f"{parts['kl_old'] / parts['kl_new']:.1f}x, verification + collapse stats without/with the "
      f"memo {parts['score_no_memo'] / parts['score']:.1f}x", flush=True)
  return parts


def timer(parts: dict, part: str, fn):
  """fn, waiting for its result and adding its seconds to parts[part]."""
  import jax

  def wrapped(*a, **kw):
    t0 = time.perf_counter()
    r = jax.block_until_ready(fn(*a, **kw))
    parts[part] += time.perf_counter() - t0
    return r
  return wrapped


def point_functions(run) -> dict:
  """The new path's KL function and the old path's log-prob function."""
  from dmpo_jax.training import points, steps
  t = run.cfg.rl.temperature
  return {"kl_new": points.make_kl_logprobs(run.graphdef, t, shardings=(run.p_sh, run.rep, run.data_sh)),
          "kl_old": steps.make_logprob_eval(run.graphdef, run.prompt_len, t,
                                            shardings=(run.p_sh, run.data_sh, None))}


def serial_point(run, state, pts, fns, timed) -> None:
  """Every set of a point, chunk by chunk, each part waited for (`timer`)."""
  import jax.numpy as jnp
  from dmpo_jax.parallel import distributed as dist
  from dmpo_jax.training import evaluation
  cfg = run.cfg
  for i, (name, items) in enumerate(pts.sets.items()):
    g = pts.samples[name]
    if not g:
      continue
    sampler = timed("sample", pts.sampler_for(g))

    def sample_fn(pt, pm, key, g=g, sampler=sampler):
      tokens, mask, _ = sampler(state.params, pt, pm, key)
      timed("kl_new", fns["kl_new"])(state.params, pts.start, dist.to_global(pt, run.rep),
                                     dist.to_global(pm, run.rep), tokens)
      rows = lambda x: dist.to_global(np.repeat(x, g, 0), run.data_sh)
      seqs = {"tokens": jnp.concatenate([rows(pt), tokens], 1), "prompt_mask": rows(pm)}
      timed("kl_old", lambda: (fns["kl_old"](state.params, seqs), fns["kl_old"](pts.start, seqs)))()
      return tokens, mask

    evaluation.evaluate(sample_fn, run.encoder, items, rng=pts.set_key(state, i),
                        spec=evaluation.ScoreSpec(
                            samples=g, batch_prompts=cfg.eval.batch_prompts,
                            prompt_len=run.prompt_len, reward_cfg=run.reward_cfg,
                            k=min(cfg.eval.k, g), pass_ks=tuple(cfg.eval.pass_ks),
                            collapse=run.taskset.collapse))


def time_rl(spec: str, ckpt: str, steps_n: int, micro_batches: int) -> dict:
  """The trainer's RL stage for steps_n steps (no points): per-step means after the first two."""
  from dmpo_jax.training import stages
  cfg = load(spec, **{"rl.steps": steps_n, "eval.points": 0, "rl.micro_batches": micro_batches})
  cfg.eval.pass_ks = tuple(k for k in cfg.eval.pass_ks if k <= cfg.eval.samples)  # no points
  wd = scratch(ckpt, cfg.sft.steps)
  try:
    res = stages.train(cfg, wd)
    rows = [json.loads(l) for l in open(os.path.join(wd, "metrics.jsonl"))]
  finally:
    shutil.rmtree(wd, ignore_errors=True)
  rl = [r for r in rows if r.get("stage") == "rl"][2:]
  mean = lambda k: float(np.mean([r[k] for r in rl]))
  out = {"rollout_s": mean("rollout_s") + mean("reward_s"), "update_s": mean("update_s"),
         "eval_before_after_s": res["times_s"]["eval"], "rows": cfg.rl.prompts_per_step * cfg.rl.group_size}
  out["step_s"] = out["rollout_s"] + out["update_s"]
  print(f"rl (micro_batches={micro_batches or 'auto'}): rollout {out['rollout_s']:.3f} s "
        f"({out['rows'] / out['rollout_s']:.0f} completions/s), update {out['update_s']:.3f} s per step; "
        f"evaluations before + after RL {out['eval_before_after_s']:.1f} s", flush=True)
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default="configs/collapse.py:algo=grpo,seed=7")
  ap.add_argument("--workdir", required=True, help="a run of --config holding its SFT checkpoint "
                  "(trained there when missing)")
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--rl_steps", type=int, default=8)
  ap.add_argument("--design_rl_steps", type=int, default=100)
  args = ap.parse_args(argv)
  from dmpo_jax.training import run as run_lib
  ckpt = sft_checkpoint(args.config, args.workdir)
  cfg = load(args.config, **{"eval.points": 11, "rl.steps": args.design_rl_steps})
  wd = scratch(ckpt, cfg.sft.steps, later=True)
  run, state = run_lib.setup(cfg, wd)
  print(f"points at step {state.step} (RL step {state.step - cfg.sft.steps}) against the start of RL",
        flush=True)
  try:
    pts = time_points(run, state, args.reps)
    parts = breakdown(run, state)
  finally:
    run.release()
    shutil.rmtree(wd, ignore_errors=True)
  rl = {mb: time_rl(args.config, ckpt, args.rl_steps, mb) for mb in (0, 1)}
  step = rl[0]
  out = {"points": pts, "breakdown_s": parts, "rl": {str(k): v for k, v in rl.items()},
         "eval_vs_rollout_per_completion": {p: step["rows"] / step["rollout_s"] / pts["tier1"][f"{p}_per_s"]
                                            for p in ("old", "new")}}
  for p in ("old", "new"):
    run_s = {d: args.design_rl_steps * step["step_s"] + n * pts[d][f"{p}_s"] + step["eval_before_after_s"]
             for d, (_, n) in DESIGNS.items()}
    out[f"run_s_{p}"] = run_s
    print(f"per run ({p} path, SFT shared): tier 1 {run_s['tier1']:.0f} s, confirmatory "
          f"{run_s['confirm']:.0f} s ({run_s['confirm'] / run_s['tier1']:.2f}x tier 1)")
  print(f"confirmatory run, old path / new path: {out['run_s_old']['confirm'] / out['run_s_new']['confirm']:.2f}x; "
        "rollout completions/s over evaluation-point completions/s: "
        + ", ".join(f"{p} {v:.1f}x" for p, v in out["eval_vs_rollout_per_completion"].items()))
  print(json.dumps(out))


if __name__ == "__main__":
  main()
