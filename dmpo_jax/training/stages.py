"""The stages of a training job, top to bottom: setup -> SFT -> evaluation before RL -> DPH
pre-sampling (dph_* presets) -> RL -> evaluation after RL -> results, plots, HF export.

`train(cfg, workdir)` runs them; one RL step is `collect_rollouts` then `update`
(docs/ARCHITECTURE.md follows it). Every stage resumes from the workdir: checkpoints hold the
train state (params, optimizer state, step, PRNG key, counters; the data position is the step)
and, for objectives that read one, the reference policy; finished evaluations and the DPH
store are files. SIGINT/SIGTERM save a checkpoint and exit cleanly.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np
from flax import nnx

from dmpo_jax import sampling
from dmpo_jax.data import images as multimodal
from dmpo_jax.models import hf, lora
from dmpo_jax.objectives import presets
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.parallel import sharding
from dmpo_jax.tasks import diversity, scoring
from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.training import dph, evaluation, report, steps
from dmpo_jax.data import pipeline
from dmpo_jax.training import memory
from dmpo_jax.training import points as eval_points
from dmpo_jax.training import transfer as transfer_lib
from dmpo_jax.training.rollout import collect_rollouts
from dmpo_jax.training.evaluation import EVAL_KEYS
from dmpo_jax.training.run import Run, StartOutOfBounds, TrainingError, setup
from dmpo_jax.training.state import TrainState
from dmpo_jax.training.steps import update


def train(cfg, workdir: str, allow_config_change=()) -> dict:
  """Run every stage; returns the results dict (also written to workdir/results.json), or
  {"stopped": True, "step": ...} when a signal or config.stop_at_step ended the run early. A
  start outside config.eval.start_bounds raises StartOutOfBounds before any RL step
  (`check_start`; workdir/stopped.json records it).
  allow_config_change: fields (of config_lib.SAFE_TO_CHANGE) a resume may change.
  The workdir's lock (setup takes it; training/lock.py) is released however the run ends."""
  t_start = time.time()
  run, state = setup(cfg, workdir, allow_config_change)
  try:
    return run_stages(run, state, t_start)
  finally:
    run.release()


def run_stages(run: Run, state: TrainState, t_start: float) -> dict:
  """SFT, evaluation before RL, RL, `finish`: `train` after setup."""
  cfg = run.cfg
  with ckpt_lib.StopSignal() as stop:
    if cfg.eval.zero_shot and cfg.sft.steps and state.step == 0:  # the initial policy
      run.timed("eval", run.held_out_eval, "zero_shot", state)
      run.timed("eval", run.transfer_eval, "zero_shot", state)  # config.eval.transfer's tasks
    state, stopped = sft_stage(run, state, stop)
    if stopped:
      return run.close_stopped(state)
    sft_end = run.sft_end_state(state)
    before = run.timed("eval", run.held_out_eval, "before", sft_end)
    run.timed("eval", run.transfer_eval, "before", sft_end)
    if cfg.rl.steps and state.step == cfg.sft.steps:  # a fresh optimizer for RL
      state = dataclasses.replace(state, opt_state=run.init_opt("rl", state.params))
    state, stopped = rl_stage(run, state, stop)
    if stopped:
      return run.close_stopped(state)
  return finish(run, state, before, t_start)


def sft_stage(run: Run, state: TrainState, stop) -> tuple[TrainState, bool]:
  """Supervised warm start on heuristic solutions; returns (state, stopped)."""
  cfg = run.cfg
  lead = run.specs.perception.steps  # the first `lead` steps transcribe images (perception.py)
  if lead and state.step == lead:  # a resume at the perception stage's end: its evaluation
    run.timed("eval", run.perception_eval, state)  # (read back when it was written)
  if state.step >= cfg.sft.steps:
    return state, False
  sft_step = steps.make_sft_step(run.graphdef, run.sft_opt, run.prompt_len, **run.vision_opts("sft"),
                                 shardings=(run.p_sh, run.sft_o_sh, run.data_sh, run.rep))
  rows = lambda s: cfg.sft.batch_size // (1 if s < lead else cfg.sft.solutions_per_instance)
  with multimodal.Prefetch(run.encoder) as prefetch:  # image prompts: the next step's renders
    while state.step < cfg.sft.steps:
      t0 = time.time()
      prefetch.wait()
      stage = "perception" if state.step < lead else "sft"
      batch = run.perception_batch(state.step) if stage == "perception" else sft_batch(run, state.step)
      if state.step + 1 < cfg.sft.steps:
        prefetch.warm(lambda s=state.step + 1: run.taskset.train("sft", s, rows(s)))
      state, m = update(state, dist.tree_to_global(batch, run.data_sh), sft_step)
      run.times["sft"] += time.time() - t0
      run.log(state, stage, {"loss": m["loss"], "grad_norm": m["grad_norm"], **run.truncations()},
              cfg.sft.steps, {"stage": stage, "loss": f"{float(m['loss']):.3f}"})
      if state.step % cfg.checkpoint.every == 0 or state.step in (lead, cfg.sft.steps):
        run.save(state, "sft")
      if lead and state.step == lead:  # the stage's end, before a stop there can end the run
        run.timed("eval", run.perception_eval, state)
      if run.maybe_stop(state, "sft", stop):
        return state, True
  return state, False


def sft_batch(run: Run, step: int) -> dict:
  """Prompts with `solutions_per_instance` answers each (host arrays): heuristic solutions
  (config.sft.targets "sampled", the default) or optimal ones drawn uniformly from the
  instance's enumerated optima ("optimal"; config.collapse's limit and time limit)."""
  cfg = run.cfg
  per = cfg.sft.solutions_per_instance
  optimal = cfg.sft.targets == "optimal"
  c = run.taskset.collapse or pipeline.Collapse()
  prompts, answers = [], []
  items = run.taskset.train("sft", step, cfg.sft.batch_size // per)
  for key, q in items:
    sols = pipeline.sft_solutions(key, q, per, seed=step, optimal=optimal, collapse=c)
    if not sols:
      raise TrainingError(f"config.sft.targets='optimal': {key} instance at SFT step {step} has no "
                          "solution to train on (config.collapse.min_optima=0 admits such instances)")
    sols = (sols * per)[:per]  # fewer distinct ones than asked: repeat
    ids = run.encoder.encode(key, q)
    for s in sols:
      prompts.append(ids)
      answers.append(run.encoder.answer_ids(key, s, run.completion_len))
  pt, pm = sampling.pad_prompts(prompts, run.prompt_len, run.encoder.pad)
  at, am = pipeline.pad_right(answers, run.completion_len, run.encoder.pad)
  seqs = {"tokens": np.concatenate([pt, at], 1), "prompt_mask": pm}
  if run.vl_cfg is not None:
    # One image input per instance (the tower once for its `per` adjacent rows) when the
    # instances split over the mesh's batch rows, else one per row.
    g = per if len(items) % sharding.batch_rows(run.mesh) == 0 else 1
    seqs["images"] = run.images([it for it in items for _ in range(per // g)], pt[::g], pm[::g])
  return {"seqs": seqs, "mask": am}


# ---------------------------------------------------------------------------
def rl_stage(run: Run, state: TrainState, stop) -> tuple[TrainState, bool]:
  """DPH pre-sampling (dph_* presets), then RL steps; returns (state, stopped)."""
  cfg = run.cfg
  total = cfg.sft.steps + cfg.rl.steps
  rl = RLSteps(run, state)
  if state.step >= total:
    return end_point(run, state), False
  state, points = rl.start(state)
  start = points.maybe(state)
  if state.step == cfg.sft.steps:  # the start of RL: its bounds (config.eval.start_bounds)
    check_start(run, points, start)
  with multimodal.Prefetch(run.encoder) as prefetch:  # image prompts: the next step's renders
    while state.step < total:
      prefetch.wait()
      rollouts, batch = rl.collect(state)
      if state.step + 1 < total:
        prefetch.warm(lambda s=state.step + 1: rl.items(s))
      state, row = rl.update(state, rollouts, batch)
      run.log(state, "rl", row, total, rl.progress(row))
      # The point first, then the checkpoint: a checkpoint never exists whose due point is
      # missing (a kill in between redoes the step, and the point file is found done).
      points.maybe(state)
      if state.step % cfg.checkpoint.every == 0 or state.step == total:
        run.save(state, "rl")
      if run.maybe_stop(state, "rl", stop):
        return state, True
  return state, False


class RLSteps:
  """The parts of an RL step (`rl_stage` loops over them), made once: the sampler, the rollout
  spec, DPH's store (pre-sampled at construction), then (`start`) the two compiled updates
  (with and without the terms' gradient norms) and the reference policy. A step is `collect`
  (the instances, rollouts and batch) then `update` (the update, its checks, the metrics row)."""

  def __init__(self, run: Run, state: TrainState):
    cfg = run.cfg
    self.run = run
    self.sampler = run.sampler(run.sampling_config(cfg.rl.group_size, cfg.rl.temperature,
                                                   cfg.rl.top_p))
    self.logprob_eval = steps.make_logprob_eval(run.graphdef, run.prompt_len, cfg.rl.temperature,
                                                shardings=(run.p_sh, run.data_sh, None),
                                                prefix_shared=run.prefix_shared)
    self.store, self.dph_images = dph_presample(run, state, self.logprob_eval)
    self.spec = run.rollout_spec()

  def start(self, state: TrainState):
    """(state, points): the updates compiled, the reference policy and the evaluation points
    (`start_policies`); the checks' counters from here."""
    run, cfg = self.run, self.run.cfg
    self.every = term_grads_every(cfg)
    self.updates = tuple(
        steps.make_rl_step(run.graphdef, run.obj, run.rl_opt, run.prompt_len, cfg.rl.temperature,
                           shardings=(run.p_sh, run.rl_o_sh, run.data_sh, run.rep),
                           micro_batches=memory.micro_batches(cfg, run.obj, run.mesh),
                           term_grads=terms, prefix_shared=run.prefix_shared,
                           **run.vision_opts("rl"))
        for terms in (False, True))
    state, self.reference, points = start_policies(run, state)
    self.first, self.skipped = state.step, 0  # consecutive non-finite losses
    self.traces0 = {k: steps.TRACES[k] for k in ("rl_update", "rl_update_terms")}
    return state, points

  def items(self, step: int) -> list:
    """The (task key, instance) prompts of train step `step` (DPH's D_pef rows taken out)."""
    rl_step, prompts = step - self.run.cfg.sft.steps, self.run.cfg.rl.prompts_per_step
    return dph.rl_items(self.store, self.run.taskset, rl_step, prompts)

  def collect(self, state: TrainState) -> tuple:
    """(rollouts, the update's batch) of `state`'s step: its rollouts' rows and, for dph_*
    presets, the rehearsed D_pef rows."""
    run, rl_step = self.run, state.step - self.run.cfg.sft.steps
    ref_fn = None if self.reference is None else lambda seqs: self.reference_logprobs(state, seqs)
    rollouts = collect_rollouts(self.sampler, state.params, self.items(state.step), run.encoder,
                                spec=self.spec, rng=state.rl_key(), ref_fn=ref_fn, rl_step=rl_step,
                                shaping_state=shaping_state(state, run.obj))
    batch = rollouts.batch(run.data_sh)
    batch.update(dist.tree_to_global(
        dph.batch_part(self.store, rl_step, run.cfg.dph.batch, self.dph_images), run.data_sh))
    return rollouts, batch

  def reference_logprobs(self, state: TrainState, seqs: dict):
    """The reference policy's log-probs [B, T] of a rollout piece's flat rows (each prompt's
    G samples adjacent: prefix-shared in groups of G where it applies). A LoRA reference is
    the current params' base (lora.reference_params)."""
    g = self.run.cfg.rl.group_size
    self.run.note_forward("reference", seqs, g)
    return self.logprob_eval(lora.reference_params(self.reference, state.params), seqs, g)

  def update(self, state: TrainState, rollouts, batch: dict) -> tuple[TrainState, dict]:
    """(state, metrics row): one update on `batch` (the terms' gradient norms every
    config.rl.log_term_grads steps), checked: no recompilation, no run of non-finite losses."""
    run, cfg = self.run, self.run.cfg
    rl_step = state.step - cfg.sft.steps
    run.note_forward("update", batch["seqs"])
    if "dph_seqs" in batch:
      run.note_forward("update, DPH's stored rows", batch["dph_seqs"])
    t2 = time.time()
    state, m = update(state, batch, self.updates[bool(self.every and rl_step % self.every == 0)])
    update_s = time.time() - t2
    run.times["rollout"] += rollouts.sample_s
    run.times["reward"] += rollouts.score_s
    run.times["update"] += update_s
    traces = max(steps.TRACES[k] - n for k, n in self.traces0.items())
    if cfg.rl.check_recompile and state.step - self.first >= 2 and traces > 1:
      raise TrainingError(f"the RL update recompiled ({traces} traces); batch shapes must stay fixed")
    if int(m["prefix_layout_errors"]):
      raise TrainingError(
          f"step {state.step}: {int(m['prefix_layout_errors'])} rows of the update's batch have "
          "another prompt than their group's first row (the prefix-shared forward reads each "
          "group's prompt once, config.rl.prefix_shared): the step was skipped, not trained on. "
          "The batch's [prompts, G] layout is broken; the last good checkpoint "
          f"({run.ckpt.latest_step()}) is intact.")
    self.skipped = self.skipped + 1 if int(m["skipped"]) else 0
    if self.skipped >= cfg.rl.nonfinite_patience:
      raise TrainingError(
          f"{self.skipped} non-finite losses in a row (at step {state.step}); stopping. The last "
          f"good checkpoint ({run.ckpt.latest_step()}) is intact. Lower config.rl.lr or check rewards.")
    row = {k: float(v) for k, v in m.items() if np.ndim(v) == 0}
    row.update(rollouts.metrics(), rollout_s=rollouts.sample_s, reward_s=rollouts.score_s,
               update_s=update_s, **run.truncations())
    return state, row

  def progress(self, row: dict) -> dict:
    """The progress bar's fields of a metrics row."""
    return {"stage": f"rl/{self.run.obj.policy_loss}", "reward": f"{row['reward_mean']:.3f}",
            "qr": f"{row['qr_mean']:.3f}", "distinct": f"{row['distinct']:.2f}"}


def start_policies(run: Run, state: TrainState):
  """(state, reference, points): the reference policy of objectives that read one (set on
  the state), and the evaluation points along RL (config.eval.points), which read the policy
  at the start of RL (the reference item, saved once when RL starts)."""
  cfg = run.cfg
  if presets.needs(run.obj).reference:
    state = dataclasses.replace(state, reference=reference_policy(run.ckpt, state, cfg.sft.steps))
  reference = state.reference
  points = run.points(reference if reference is not None or not cfg.eval.points else
                      reference_policy(run.ckpt, state, cfg.sft.steps))
  return state, reference, points


def check_start(run: Run, points: eval_points.Points, point: dict | None) -> None:
  """config.eval.start_bounds: the evaluation point at RL step 0 (`point`, just computed; None:
  read from its file, a resumed run's) against the start's pre-registered bounds. Outside
  them, stopped.json records the bounds and the measured values and the run ends before any
  RL step (StartOutOfBounds: `python -m dmpo_jax.train` prints it and exits with status 2).
  Within them nothing changes: the check only reads."""
  if not points.bounds:
    return
  measured, outside = eval_points.outside(points.bounds, point if point is not None else points.read(0))
  if not dist.agree(bool(outside)):
    return
  path = os.path.relpath(points.path(0), run.workdir)
  record = {"reason": "start_bounds", "step": run.cfg.sft.steps, "rl_step": 0,
            "bounds": run.cfg.eval.start_bounds, "measured": measured, "outside": outside,
            "point": path, "over": "overall_instance (the mean over instances)"}
  if dist.is_main():
    report.write_json(record, os.path.join(run.workdir, report.STOPPED))
  run.close()
  shown = ", ".join(f"{k} = {'absent' if v is None else f'{v:.3f}'}" for k, v in measured.items())
  raise StartOutOfBounds(
      f"start outside config.eval.start_bounds={run.cfg.eval.start_bounds!r}: {'; '.join(outside)} "
      f"(measured at RL step 0, {os.path.join(run.workdir, path)}: {shown}); the run stops before "
      f"RL, recorded in {os.path.join(run.workdir, report.STOPPED)}", record)


def end_point_done(run: Run, state: TrainState) -> bool:
  """Whether a run resumed at (or past) its last step has the evaluation point due there: True
  when none is due or its file is done at this run's settings."""
  rl_step = state.step - run.cfg.sft.steps
  if rl_step not in eval_points.point_steps(run.cfg.rl.steps, run.cfg.eval.points):
    return True
  return run.points(None).done(rl_step)


def end_point(run: Run, state: TrainState) -> TrainState:
  """A run resumed at its end (killed after its last checkpoint, or one whose last point
  file went missing): the evaluation point due at this step, computed before the run
  finishes."""
  if run.cfg.eval.points and not dist.agree(end_point_done(run, state)):
    state, _, points = start_policies(run, state)
    points.maybe(state)
  return state


def dph_presample(run: Run, state: TrainState, logprob_eval) -> tuple:
  """(store, image fn) of an objective that reads DPH's stored samples: the store pre-sampled
  from the policy at the start of RL (read back from the workdir on resume); (None, None)
  otherwise."""
  cfg = run.cfg
  if not (presets.needs(run.obj).dph_store and cfg.rl.steps):
    return None, None
  dph_sampler = run.sampler(run.sampling_config(cfg.dph.samples, cfg.rl.temperature, cfg.rl.top_p))

  def noted(params, seqs, group_size=None):  # says which forward the store's log-probs ran
    run.note_forward("DPH store", seqs, group_size)
    return logprob_eval(params, seqs, group_size)
  store = run.timed("dph", dph.presample, run.specs.dph, run.workdir, run.taskset, run.encoder,
                    dph_sampler, noted, state.params, state, run.reward_cfg,
                    None if run.vl_cfg is None else run.images)
  return store, dph_image_fn(run, store)


def shaping_state(state: TrainState, obj: presets.ObjectiveConfig) -> dict | None:
  """A host reward-shaping term's state (outcome_ucb's counts): kept in the train state's
  counters, so every checkpoint saves it and a resume restores it exactly; None without one."""
  if not presets.needs(obj).host_state:
    return None
  return state.counters.setdefault("shaping", {})


def dph_image_fn(run: Run, store):
  """A vision-language policy's images of stored D_pef rows for `dph.batch_part`: the rows'
  instances rebuilt once from the store's pef_index, their images re-rendered per step
  (the render cache makes that cheap; the store holds no pixels). None for a text model
  or an empty store."""
  if run.vl_cfg is None or not len(store["pef_tokens"]):
    return None
  items = dph.prompt_items(store, run.taskset, run.encoder, run.cfg.rl.prompts_per_step)
  return lambda rows, pt, pm: run.images([items[r] for r in rows], pt, pm)


def term_grads_every(cfg) -> int:
  """config.rl.log_term_grads -> log the terms' gradient norms every this many RL steps (0:
  never). False: never; True: every step; N: every N-th step (the others skip the two extra
  backward passes of `steps.term_gradients`)."""
  v = cfg.rl.log_term_grads
  if isinstance(v, bool):
    return int(v)
  if not isinstance(v, int) or v < 0:
    raise ValueError(f"config.rl.log_term_grads={v!r}; use False, True or a step interval N >= 1")
  return v


def reference_policy(ckpt: ckpt_lib.Checkpointer, state: TrainState, rl_start: int):
  """The policy at the start of RL, which KL terms and FlowRL read: restored from the
  checkpoint's reference item on resume, else a copy of the params saved as that item
  (written once, outside the rotation of step checkpoints). A LoRA policy's is its base with
  the adapters switched off, `lora.ADAPTERS_OFF`, read from the current params at each use
  (`lora.reference_params`): no copy, no item."""
  if lora.has_adapters(state.params):
    return lora.ADAPTERS_OFF
  if dist.agree(ckpt.has_reference()):  # every process takes the same branch
    return ckpt.restore_reference(state.params)
  if state.step > rl_start:
    print(f"warning: {ckpt.reference_path} is missing (a run from before it was saved); "
          "the reference policy is the resumed one, so this run is not exact", flush=True)
  ref = jax.tree.map(jax.numpy.copy, state.params)
  ckpt.save_reference(ref)
  return ref


# ---------------------------------------------------------------------------
def finish(run: Run, state: TrainState, before: dict, t_start: float) -> dict:
  """Evaluation after RL, results.json, plots, the HF export and the printed table."""
  cfg = run.cfg
  if run.progress:
    run.progress.close()
  run.writer.close()
  after = run.timed("eval", run.held_out_eval, "after", state)
  keep = {k: scoring.keep_and_exploration(before["solved"][k], after["solved"][k])
          for k in after["solved"]}
  keep_collapse = collapse_keep_exploration(cfg, before, after)
  results = {"before": {k: before[k] for k in ("per_task", "categories", "overall")},
             "after": {k: after[k] for k in ("per_task", "categories", "overall")},
             "keep_exploration": keep, **keep_collapse, "times_s": run.times,
             "truncated": {**run.truncated, "eval_before_prompts": before.get("prompt_truncated", 0),
                           "eval_after_prompts": after.get("prompt_truncated", 0)},
             "steps": {"sft": cfg.sft.steps, "rl": cfg.rl.steps}, "algo": cfg.rl.algo,
             "seed": cfg.seed, "nonfinite_steps": state.counters["nonfinite_total"],
             "precision": dict(run.specs.precision.record(), param_dtype=cfg.model.param_dtype),
             "logprob_forward": run.forwards, "wall_s": time.time() - t_start}
  zero = (report.read_result(os.path.join(run.workdir, "eval_zero_shot.json"), EVAL_KEYS)[0]
          if cfg.eval.zero_shot else None)
  if zero is not None:  # the initial policy, before SFT
    results["zero_shot"] = {k: zero[k] for k in ("per_task", "categories", "overall")}
  if "modalities" in after:  # a vision-language policy: every modality, before and after RL
    results["modalities"] = {"before": before.get("modalities"), "after": after["modalities"]}
  transfer_after = run.timed("eval", run.transfer_eval, "after", state)
  if transfer_after is not None:  # config.eval.transfer: reasoning-gym tasks (training/transfer.py)
    results["transfer"] = transfer_lib.results(
        {"zero_shot": run.transfer.read("zero_shot"), "before": run.transfer.read("before"),
         "after": transfer_after})
  export = dist.tree_to_host(state.params["model"]) if cfg.checkpoint.export_hf else None  # all processes
  if dist.is_main():  # files are written once: the results first, so nothing after loses them
    report.write_json(results, os.path.join(run.workdir, "results.json"))
    if export is not None:
      adapter = (cfg.model.get("lora") or {}).get("export") == "adapter"  # LoRA: PEFT folder
      hf.save(nnx.merge(run.graphdef, export), run.processor or run.tok,
              os.path.join(run.workdir, "hf"), adapter_only=adapter, base=cfg.model.init)
    if cfg.log.plots:
      report.plot_or_warn(report.plot_training, report.read_metrics(run.writer.path),
                          os.path.join(run.workdir, "training.png"))
      report.plot_or_warn(report.plot_before_after, before, after,
                          os.path.join(run.workdir, "before_after.png"))
  run.ckpt.close()
  run.release()  # the workdir is complete: nothing below writes to it
  table = evaluation.format_table(after, before)
  if not dist.is_main():
    return results
  print(f"\n{cfg.rl.algo}, seed {cfg.seed}: before RL -> after RL (held-out {cfg.level} instances, "
        f"{cfg.eval.samples} samples at T={cfg.eval.temperature})")
  print(table)
  if zero is not None:
    print(f"\nzero-shot (the initial policy) -> before RL (after {cfg.sft.steps} SFT steps):")
    print(evaluation.format_table(before, zero))
  if "modalities" in after:
    print(f"\nafter RL, the same instances by modality (table above: {after['modality']}; "
          "blank = the image replaced by a white one):")
    print(report.format_modalities(after))
  if "transfer" in results:
    print("\n" + transfer_lib.format_results(results["transfer"]))
  print("time (s): " + ", ".join(f"{k} {v:.1f}" for k, v in run.times.items()) +
        f"; outputs in {run.workdir}")
  return results


def collapse_keep_exploration(cfg, before: dict, after: dict) -> dict:
  """With the collapse config: {"keep_exploration_collapse": {correct: {task: rates}}}, DPH-RL's
  keep / exploration split by the before-RL policy's pass@collapse.keep_k, for each notion of
  correct in collapse.correct ("feasible", "optimal"); {} otherwise or with too few samples."""
  keep_k = int(cfg.collapse.keep_k) if "collapse" in cfg else 0
  if not ("correct" in after and "correct" in before) or cfg.eval.samples < keep_k:
    return {}
  names = [n for n in cfg.collapse.correct if n in after["correct"]]
  return {"keep_exploration_collapse": {
      n: {t: diversity.keep_and_exploration(before["correct"][n][t], after["correct"][n][t], k=keep_k)
          for t in after["correct"][n]} for n in names}}
