r"""Train a policy on the NP tasks: SFT warm start, DPH pre-sampling, RL, evaluation.

    python -m dmpo_jax.train --config=configs/nphard.py --workdir=runs/default
    python -m dmpo_jax.train --config=configs/nphard.py:algo=grpo --workdir=runs/grpo \
        --config.rl.steps=100

`train` reads top to bottom: setup -> SFT -> evaluation before RL -> DPH
pre-sampling (dph_* presets) -> RL -> evaluation after RL -> table, plots,
HF export. One RL step is `training.collect_rollouts` then `training.update`
(docs/ARCHITECTURE.md follows it file by file). Every stage resumes from the
workdir: checkpoints (orbax) hold the train state (params, optimizer state,
step, PRNG key, counters; the data position is the step, since data is a
pure function of (seed, step)) and, for objectives that read one, the
reference policy; finished evaluations and the DPH store are files.
SIGINT/SIGTERM save a checkpoint and exit cleanly.
The config is checked before anything is built or written, and a rerun must
match the workdir's config.json (training/config.py; --allow_config_change for
logging and checkpoint cadence); bad input is one line and exit status 2.

Workdir: config.json, checkpoints/ (steps, and reference/), metrics.jsonl,
tb/, eval_before.json, eval_after.json, results.json, dph_store.npz,
training.png, before_after.png, hf/ (the final policy as a Hugging Face folder).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import jax
import numpy as np
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.training import config as config_lib
from dmpo_jax.training.config import ConfigError, check_config, task_keys
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training import evaluation, pipeline, report, steps
from dmpo_jax import multimodal
from dmpo_jax.parallel import sharding
from dmpo_jax import tasks as tasks_lib
from dmpo_jax.models import hf, tokenizer as tok_lib
from dmpo_jax.models.config import ModelConfig
from dmpo_jax.objectives import flowrl, presets, terms
from dmpo_jax.sampling import sampler as sampler_lib
from dmpo_jax.tasks import diversity
from dmpo_jax.tasks import rewards as rewards_lib
from dmpo_jax.training import dph
from dmpo_jax.training.rollout import collect_rollouts
from dmpo_jax.training.state import LOG_Z_SEED_OFFSET, TrainState, checkpoint_meta
from dmpo_jax.training.update import auto_micro_batches, make_optimizer, micro_batches, update
from dmpo_jax import sampling

FLAGS = flags.FLAGS
__all__ = ["train", "setup", "Run", "TrainingError", "build_model", "model_shape", "objective_from_config",
           "check_config", "make_optimizer", "micro_batches", "auto_micro_batches"]


def define_flags(fv=FLAGS, argv=None):
  """CLI flags (defined only when run as a program, so other tools can import this module;
  tests pass their own FlagValues and the argv whose --config.<field> overrides apply)."""
  config_flags.DEFINE_config_file("config", None, "Training config (a .py file).", flag_values=fv,
                                  lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "Output folder; an existing run there is resumed.", flag_values=fv)
  flags.DEFINE_list("allow_config_change", [], "fields a resume may change (logging, checkpoint "
                    "cadence, mesh: training/config.py SAFE_TO_CHANGE)", flag_values=fv)
  flags.DEFINE_bool("verbose", False, "print the traceback of an error, not only its message",
                    flag_values=fv)
  flags.DEFINE_string("coordinator_address", None, "multi-process: host:port of process 0 "
                      "(or JAX_COORDINATOR_ADDRESS; automatic on TPU pods and SLURM)", flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "multi-process: number of processes (or JAX_NUM_PROCESSES)",
                       flag_values=fv)
  flags.DEFINE_integer("process_id", None, "multi-process: this process's index (or JAX_PROCESS_ID)",
                       flag_values=fv)


EVAL_KEYS = ("per_task", "categories", "overall", "solved")  # an eval_*.json that lacks one is damaged


class TrainingError(RuntimeError):
  """The run cannot continue; the message says why (the last good checkpoint is intact)."""


# ---------------------------------------------------------------------------
def train(cfg, workdir: str, allow_config_change=()) -> dict:
  """Run every stage; returns the results dict (also written to workdir/results.json), or
  {"stopped": True, "step": ...} when a signal or config.stop_at_step ended the run early.
  allow_config_change: fields (of config_lib.SAFE_TO_CHANGE) a resume may change."""
  t_start = time.time()
  run, state = setup(cfg, workdir, allow_config_change)
  with ckpt_lib.StopSignal() as stop:
    if cfg.eval.get("zero_shot") and cfg.sft.steps and state.step == 0:  # the initial policy
      run.timed("eval", run.evaluate, "zero_shot", state)
    state, stopped = sft_stage(run, state, stop)
    if stopped:
      return run.close_stopped(state)
    before = run.timed("eval", run.evaluate, "before", run.sft_end_state(state))
    if cfg.rl.steps and state.step == cfg.sft.steps:  # a fresh optimizer for RL
      state = dataclasses.replace(state, opt_state=run.init_opt(run.rl_opt, state.params))
    state, stopped = rl_stage(run, state, stop)
    if stopped:
      return run.close_stopped(state)
  return finish(run, state, before, t_start)


def freeze_vision(cfg, stage: str, vl_cfg) -> bool:
  """config.<stage>.freeze_vision (True: the tower is not trained, gets no gradient, no update
  and no optimizer state); False for a text model (vl_cfg None)."""
  return vl_cfg is not None and bool(cfg[stage].freeze_vision)


def vision_optimizer_opts(cfg, stage: str, vl_cfg) -> dict:
  """make_optimizer's tower options of a stage: freeze_vision, and config.<stage>.
  vision_lr_scale (checked in check_config) for a trained tower; none for a text model."""
  if vl_cfg is None:
    return {}
  return {"freeze_vision": freeze_vision(cfg, stage, vl_cfg),
          "vision_lr_scale": float(cfg[stage].vision_lr_scale)}


# ---------------------------------------------------------------------------
# The objective of a config (its checks: training/config.py).
def objective_from_config(cfg) -> presets.ObjectiveConfig:
  """The preset's objective with config.rl.objective's overrides. With
  config.dph.weighting = "per_sample", eta is scaled by dph.batch / (prompts x group), so that a
  rehearsed D_pef response weighs eta times one RL sample (docs/METHODS.md, DPH-RL)."""
  overrides = {k: v for k, v in cfg.rl.objective.items() if v is not None}
  obj = presets.objective_config(cfg.rl.algo, **overrides)
  if obj.divergence is not None and cfg.dph.weighting == "per_sample":
    share = cfg.dph.batch / (cfg.rl.prompts_per_step * cfg.rl.group_size)
    obj = dataclasses.replace(obj, div_coef=obj.div_coef * share)
  return obj


def build_model(cfg):
  """(model, tokenizer) from scratch (task tokenizer) or from a local HF folder. A
  vision-language model (config.model.vision from scratch, a Qwen2.5-VL folder) comes with
  its processor (`VLProcessor`) in place of the tokenizer."""
  m = cfg.model
  if m.init == "scratch" and m.get("vision"):
    return multimodal.build_vlm(cfg)
  if m.init == "scratch":
    tok = tok_lib.load(m.tokenizer) if m.tokenizer else tok_lib.build()
    vocab = -(-len(tok) // 8) * 8
    mcfg = ModelConfig(vocab_size=vocab, hidden_size=m.hidden_size,
                       intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                       num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                       rope_theta=m.rope_theta, dtype=m.dtype, param_dtype=m.param_dtype,
                       max_position_embeddings=m.max_prompt_len + m.max_new_tokens,
                       architecture="llama", remat=m.remat)
    from dmpo_jax.models.transformer import Transformer
    return Transformer(mcfg, rngs=nnx.Rngs(cfg.seed)), tok
  model, tok = hf.load(m.init, dtype=m.dtype, param_dtype=m.param_dtype)
  if m.tokenizer and not multimodal.is_vlm(model):
    tok = tok_lib.load(m.tokenizer)
  if tok is None:
    raise ValueError(f"config.model.init={m.init!r} has no tokenizer files; set config.model.tokenizer")
  if m.remat and multimodal.is_vlm(model):
    model.language.cfg = model.language.cfg.replace(remat=True)
  elif m.remat:
    model.cfg = model.cfg.replace(remat=True)  # read when the forward is traced
  return model, tok


def model_shape(model) -> dict:
  c = model.cfg.text if multimodal.is_vlm(model) else model.cfg
  return {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                     "num_heads", "num_kv_heads", "head_dim")}


# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
  """What the stages share: config, objective, data, model graph, mesh shardings, outputs."""
  cfg: Any
  workdir: str
  obj: presets.ObjectiveConfig
  mesh: Any
  taskset: pipeline.TaskSet
  reward_cfg: rewards_lib.RewardConfig
  tok: Any
  encoder: pipeline.PromptEncoder
  graphdef: Any
  model_shape: dict
  p_sh: Any            # params' shardings
  o_sh: Any            # optimizer state's
  data_sh: Any         # batch rows over the mesh's data x fsdp axes (a prefix for every leaf)
  rep: Any             # replicated
  sft_opt: Any
  rl_opt: Any
  ckpt: ckpt_lib.Checkpointer
  vl_cfg: Any = None   # a vision-language policy's VLConfig (None: a text model)
  processor: Any = None  # its VLProcessor (saved with the HF export)
  writer: Any = None
  progress: Any = None
  times: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(
      ("sft", "rollout", "reward", "update", "eval", "dph"), 0.0))
  _eval: Any = None    # (sampler, instances, ground truths) of the held-out evaluation
  truncated: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(
      ("prompt_truncated", "sft_truncated"), 0))  # this process's cuts (results.json)

  @property
  def prompt_len(self) -> int:
    return self.cfg.model.max_prompt_len

  @property
  def completion_len(self) -> int:
    return self.cfg.model.max_new_tokens

  def init_opt(self, opt, params):
    """Optimizer state on the mesh: moments sharded like their params, counts replicated;
    its shardings become `o_sh` (SFT's and RL's optimizers can differ in structure)."""
    state, self.o_sh = sharding.init_opt_state(opt, params, self.p_sh, self.mesh)
    return state

  def sampling_config(self, num_samples: int, temperature: float, top_p: float = 1.0):
    return sampler_lib.SamplingConfig(max_new_tokens=self.completion_len, num_samples=num_samples,
                                      temperature=temperature, top_p=top_p,
                                      eos_id=self.tok.eos_token_id, pad_id=self.encoder.pad,
                                      stop_ids=self.encoder.stop_ids)

  def sampler(self, scfg):
    return sampling.make_sampler(self.graphdef, scfg, self.p_sh, self.data_sh, self.rep)

  def vision_opts(self, stage: str) -> dict:
    """The step's vision-tower option (`freeze_vision`); nothing for a text model."""
    if self.vl_cfg is None:
      return {}
    return {"freeze_vision": freeze_vision(self.cfg, stage, self.vl_cfg)}

  def images(self, items, prompt_tokens, prompt_mask, encoder=None):
    """A vision-language policy's image inputs of padded prompts (`qwen2_5_vl.prompt_images`;
    None entries for a text encoder's prompts), at config.image.patch_budget; None for a
    text model."""
    if self.vl_cfg is None:
      return None
    return multimodal.image_inputs(self.vl_cfg, encoder or self.encoder, items, prompt_tokens,
                                   prompt_mask, self.cfg.image.patch_budget)

  def truncations(self) -> dict:
    """The prompts and SFT answers cut since the last call (a metrics row's counts)."""
    cut = self.encoder.take_truncated()
    for k, v in cut.items():
      self.truncated[k] += v
    return cut

  def timed(self, name: str, fn, *args):
    t0 = time.time()
    out = fn(*args)
    self.times[name] += time.time() - t0
    return out

  def save(self, state: TrainState, stage: str) -> None:
    state.counters["times"] = self.times
    self.ckpt.save(state.step, state.params, state.opt_state,
                   checkpoint_meta(state, stage, self.cfg, self.model_shape))

  def maybe_stop(self, state: TrainState, stage: str, stop) -> bool:
    """On a signal or at config.stop_at_step: save and report True (all processes agree)."""
    if not dist.agree(stop.received is not None or state.step == self.cfg.stop_at_step):
      return False
    stop.received = stop.received or f"config.stop_at_step={self.cfg.stop_at_step}"
    self.save(state, stage)
    print(f"\n{stop.received}: saved checkpoint at step {state.step}; rerun the same command to "
          "resume", flush=True)
    return True

  def close_stopped(self, state: TrainState) -> dict:
    if self.progress:
      self.progress.close()
    self.writer.close()
    self.ckpt.close()
    return {"stopped": True, "step": state.step}

  def evaluate(self, name: str, state: TrainState) -> dict:
    """eval_{name}.json: held-out instances sampled at config.eval's settings (a finished
    evaluation is read back, not redone)."""
    path = os.path.join(self.workdir, f"eval_{name}.json")
    if dist.agree(os.path.exists(path)):  # every process takes the same branch
      res, why = report.read_result(path, EVAL_KEYS)
      if res is not None:
        return res
      print(f"warning: {path} is damaged ({why}); evaluating again", flush=True)
    cfg = self.cfg
    if self._eval is None:  # one sampler (one compilation) and one instance set for both
      items = self.taskset.held_out(cfg.eval.num_per_task)
      self._eval = (self.sampler(self.sampling_config(cfg.eval.samples, cfg.eval.temperature)),
                    items, [tasks_lib.get(k).reference_value(q) for k, q in items])
    sampler, items, ground_truths = self._eval
    run = lambda encoder, prompt_len, images: evaluation.evaluate(
        lambda pt, pm, rng, *im: sampler(state.params, pt, pm, rng, *im)[:2], encoder, items,
        samples=cfg.eval.samples, k=cfg.eval.k, pass_ks=tuple(cfg.eval.pass_ks),
        rng=state.eval_key(), batch_prompts=cfg.eval.batch_prompts, prompt_len=prompt_len,
        reward_cfg=self.reward_cfg, ground_truths=ground_truths, progress=cfg.log.progress,
        collapse=self.taskset.collapse, images=images)
    if self.vl_cfg is None:
      res = run(self.encoder, self.prompt_len, None)
    else:  # every modality on the same instances; the first one is the run's result
      res = multimodal.evaluate_modalities(run, self.encoder, items, cfg.eval.get(
          "modalities", multimodal.default_modalities(self.encoder)), self.images, self.prompt_len)
    if dist.is_main():
      report.write_json(res, path)
    return res

  def sft_end_state(self, state: TrainState) -> TrainState:
    """The state whose policy "before RL" evaluates: `state` at the end of SFT; past it (a
    resume whose eval_before.json is damaged), the params of the checkpoint at sft.steps."""
    path = os.path.join(self.workdir, "eval_before.json")
    sft_end = self.cfg.sft.steps
    if state.step <= sft_end or report.read_result(path, EVAL_KEYS)[0] is not None:
      return state
    if sft_end not in self.ckpt.mngr.all_steps():
      raise TrainingError(f"{path} is missing or damaged and the policy it scores (checkpoint "
                          f"{sft_end}, the end of SFT) is no longer kept; restore the file or "
                          "train in another --workdir")
    params, _ = self.ckpt.restore_params(sft_end, state.params, self.model_shape)
    return dataclasses.replace(state, params=params)

  def log(self, state: TrainState, stage: str, row: dict, last: int, progress: dict) -> None:
    """A metrics row every config.log.every steps and at the stage's last; the progress bar."""
    if state.step % self.cfg.log.every == 0 or state.step == last:
      self.writer.write(state.step, stage, row)
    if self.progress:
      self.progress.update(1)
      self.progress.set_postfix(**progress)


def setup(cfg, workdir: str, allow_config_change=()) -> tuple[Run, TrainState]:
  """Check the config (and, for an existing workdir, that it is the workdir's: its config.json,
  `config_lib.check_resume`), build mesh, data, model and optimizers; restore the workdir's
  newest complete checkpoint if there is one. Nothing is written before the checks pass."""
  config_lib.check_fields(cfg)  # before the objective and the mesh read the fields
  obj = objective_from_config(cfg)
  mesh = sharding.make_mesh(dict(cfg.mesh))
  check_config(cfg, obj, mesh)
  write_config = config_lib.check_resume(cfg, workdir, allow_config_change)
  taskset = pipeline.TaskSet(task_keys(cfg), cfg.level, cfg.seed,
                             pipeline.parse_curriculum(cfg.rl.curriculum, cfg.level),
                             collapse=pipeline.Collapse.from_config(cfg),
                             pool=cfg.collapse.pool if "collapse" in cfg else 0)
  reward_cfg = rewards_lib.RewardConfig(**dict(cfg.rl.reward))

  model, tok = build_model(cfg)
  processor, vl_cfg = (tok, model.cfg) if multimodal.is_vlm(model) else (None, None)
  encoder = multimodal.make_run_encoder(cfg, tok, processor)
  tok = encoder.tok
  graphdef, model_state = nnx.split(model)
  params = {"model": model_state}
  if presets.needs_log_z(obj):
    params["log_z"] = flowrl.init_log_z_head(jax.random.key(cfg.seed + LOG_Z_SEED_OFFSET),
                                             model_shape(model)["hidden_size"])
  rep = sharding.replicated(mesh)
  p_sh = {"model": sharding.param_shardings(model_state, mesh)}
  if "log_z" in params:
    p_sh["log_z"] = jax.tree.map(lambda _: rep, params["log_z"])
  params = jax.tree.map(lambda x, s: dist.to_global(np.asarray(x), s), params, p_sh)

  os.makedirs(workdir, exist_ok=True)  # every check passed: from here on the workdir is written
  run = Run(cfg=cfg, workdir=workdir, obj=obj, mesh=mesh, taskset=taskset, reward_cfg=reward_cfg,
            tok=tok, encoder=encoder, graphdef=graphdef, model_shape=model_shape(model), p_sh=p_sh,
            o_sh=None, data_sh=sharding.batch_sharding(mesh, 1), rep=rep,
            sft_opt=make_optimizer(cfg.sft.lr, cfg.sft.steps, cfg.sft.warmup, 1.0,
                                   **vision_optimizer_opts(cfg, "sft", vl_cfg)),
            rl_opt=make_optimizer(cfg.rl.lr, cfg.rl.steps, 0, cfg.rl.max_grad_norm,
                                  **vision_optimizer_opts(cfg, "rl", vl_cfg)),
            ckpt=ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=cfg.checkpoint.keep),
            vl_cfg=vl_cfg, processor=processor)
  latest = run.ckpt.usable_step(set_aside=dist.is_main())  # damaged newer steps: moved aside
  # The optimizer of the stage the run is in (a checkpoint at step sft.steps is SFT's; the
  # two can differ in structure when one stage freezes the vision tower).
  in_sft = cfg.sft.steps and (latest is None or latest <= cfg.sft.steps)
  opt_state = run.init_opt(run.sft_opt if in_sft else run.rl_opt, params)
  state = TrainState(params=params, opt_state=opt_state, step=0, key=jax.random.key(cfg.seed))

  if latest is not None:
    params, opt_state, meta = run.ckpt.restore(latest, params, opt_state, run.model_shape)
    if meta["seed"] != cfg.seed:
      raise TrainingError(f"{workdir} holds a run with seed {meta['seed']}, config has {cfg.seed}")
    state = dataclasses.replace(state, params=params, opt_state=opt_state, step=meta["step"],
                                counters=meta["counters"])
    print(f"resumed {workdir} at step {state.step} ({meta['stage']})", flush=True)
  if write_config and dist.is_main():  # the contract, once the checkpoint is known to fit
    report.write_json(config_lib.config_json(cfg), os.path.join(workdir, "config.json"))
  run.times.update(state.counters.get("times", {}))
  run.writer = (report.MetricsWriter(workdir, cfg.log.tensorboard,
                                     resume_step=state.step if latest is not None else None)
                if dist.is_main() else report.NullWriter(workdir))
  if cfg.log.progress and dist.is_main():
    from tqdm import tqdm
    run.progress = tqdm(total=cfg.sft.steps + cfg.rl.steps, initial=state.step, desc="train",
                        unit="step", dynamic_ncols=True)
  return run, state


# ---------------------------------------------------------------------------
def sft_stage(run: Run, state: TrainState, stop) -> tuple[TrainState, bool]:
  """Supervised warm start on heuristic solutions; returns (state, stopped)."""
  cfg = run.cfg
  if state.step >= cfg.sft.steps:
    return state, False
  sft_step = steps.make_sft_step(run.graphdef, run.sft_opt, run.prompt_len, **run.vision_opts("sft"),
                                 shardings=(run.p_sh, run.o_sh, run.data_sh, run.rep))
  with multimodal.Prefetch(run.encoder) as prefetch:  # image prompts: the next step's renders
    while state.step < cfg.sft.steps:
      t0 = time.time()
      prefetch.wait()
      batch = sft_batch(run, state.step)
      if state.step + 1 < cfg.sft.steps:
        n = cfg.sft.batch_size // cfg.sft.solutions_per_instance
        prefetch.warm(lambda s=state.step + 1: run.taskset.train("sft", s, n))
      state, m = update(state, dist.tree_to_global(batch, run.data_sh), sft_step)
      run.times["sft"] += time.time() - t0
      run.log(state, "sft", {"loss": m["loss"], "grad_norm": m["grad_norm"], **run.truncations()},
              cfg.sft.steps,
              {"stage": "sft", "loss": f"{float(m['loss']):.3f}"})
      if state.step % cfg.checkpoint.every == 0 or state.step == cfg.sft.steps:
        run.save(state, "sft")
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
    task = tasks_lib.get(key)
    sols = (task.sample_optimal_solutions(q, per, seed=step, limit=c.limit, time_limit=c.time_limit)
            if optimal else task.sample_solutions(q, per, seed=step))
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
  cfg, obj = run.cfg, run.obj
  rl_sampler = run.sampler(run.sampling_config(cfg.rl.group_size, cfg.rl.temperature, cfg.rl.top_p))
  logprob_eval = steps.make_logprob_eval(run.graphdef, run.prompt_len, cfg.rl.temperature,
                                         shardings=(run.p_sh, run.data_sh, None))
  store, dph_images = None, None
  if presets.needs_dph_store(obj) and cfg.rl.steps:
    dph_sampler = run.sampler(run.sampling_config(cfg.dph.samples, cfg.rl.temperature, cfg.rl.top_p))
    store = run.timed("dph", dph.presample, cfg, run.workdir, run.taskset, run.encoder, dph_sampler,
                      logprob_eval, state.params, state, run.reward_cfg,
                      None if run.vl_cfg is None else run.images)
    dph_images = dph_image_fn(run, store)
  total = cfg.sft.steps + cfg.rl.steps
  if state.step >= total:
    return state, False
  every = term_grads_every(cfg)
  rl_update, rl_update_terms = (
      steps.make_rl_step(run.graphdef, obj, run.rl_opt, run.prompt_len, cfg.rl.temperature,
                         shardings=(run.p_sh, run.o_sh, run.data_sh, run.rep),
                         micro_batches=micro_batches(cfg, obj, run.mesh), term_grads=terms,
                         **run.vision_opts("rl"))
      for terms in (False, True))
  if presets.needs_reference(obj):
    state = dataclasses.replace(state, reference=reference_policy(run.ckpt, state, cfg.sft.steps))
  reference = state.reference
  ref_fn = (lambda seqs: logprob_eval(reference, seqs)) if reference is not None else None
  consecutive, first_rl = 0, state.step
  traces0 = {k: steps.TRACES[k] for k in ("rl_update", "rl_update_terms")}
  with multimodal.Prefetch(run.encoder) as prefetch:  # image prompts: the next step's renders
    while state.step < total:
      t0 = time.time()
      prefetch.wait()
      rl_step = state.step - cfg.sft.steps
      items = dph.rl_items(store, run.taskset, rl_step, cfg.rl.prompts_per_step)
      rollouts = collect_rollouts(
          rl_sampler, state.params, items, run.encoder, key=state.rl_key(),
          group_size=cfg.rl.group_size, chunks=cfg.rl.rollout_chunks, reward_cfg=run.reward_cfg,
          objective=obj, prompt_len=run.prompt_len, completion_len=run.completion_len,
          data_sh=run.data_sh, ref_fn=ref_fn, collapse=run.taskset.collapse,
          **({} if run.vl_cfg is None else {"images": lambda pt, pm: run.images(items, pt, pm)}))
      batch = rollouts.batch(run.data_sh)
      batch.update(dist.tree_to_global(dph.batch_part(store, rl_step, cfg.dph.batch, dph_images),
                                       run.data_sh))
      if state.step + 1 < total:
        prefetch.warm(lambda s=rl_step + 1: dph.rl_items(store, run.taskset, s, cfg.rl.prompts_per_step))
      t2 = time.time()
      state, m = update(state, batch, rl_update_terms if every and rl_step % every == 0 else rl_update)
      update_s = time.time() - t2
      run.times["rollout"] += rollouts.sample_s
      run.times["reward"] += rollouts.score_s
      run.times["update"] += update_s
      traces = max(steps.TRACES[k] - n for k, n in traces0.items())
      if cfg.rl.check_recompile and state.step - first_rl >= 2 and traces > 1:
        raise TrainingError(f"the RL update recompiled ({traces} traces); batch shapes must stay fixed")
      consecutive = consecutive + 1 if int(m["skipped"]) else 0
      if consecutive >= cfg.rl.nonfinite_patience:
        raise TrainingError(
            f"{consecutive} non-finite losses in a row (at step {state.step}); stopping. The last "
            f"good checkpoint ({run.ckpt.latest_step()}) is intact. Lower config.rl.lr or check rewards.")
      row = {k: float(v) for k, v in m.items() if np.ndim(v) == 0}
      row.update(rollouts.metrics(), rollout_s=rollouts.sample_s, reward_s=rollouts.score_s,
                 update_s=update_s, **run.truncations())
      run.log(state, "rl", row, total, {"stage": f"rl/{obj.policy_loss}",
                                        "reward": f"{row['reward_mean']:.3f}",
                                        "qr": f"{row['qr_mean']:.3f}", "distinct": f"{row['distinct']:.2f}"})
      if state.step % cfg.checkpoint.every == 0 or state.step == total:
        run.save(state, "rl")
      if run.maybe_stop(state, "rl", stop):
        return state, True
  return state, False


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
  (written once, outside the rotation of step checkpoints)."""
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
  after = run.timed("eval", run.evaluate, "after", state)
  keep = {k: tasks_lib.scoring.keep_and_exploration(before["solved"][k], after["solved"][k])
          for k in after["solved"]}
  keep_collapse = collapse_keep_exploration(cfg, before, after)
  results = {"before": {k: before[k] for k in ("per_task", "categories", "overall")},
             "after": {k: after[k] for k in ("per_task", "categories", "overall")},
             "keep_exploration": keep, **keep_collapse, "times_s": run.times,
             "truncated": {**run.truncated, "eval_before_prompts": before.get("prompt_truncated", 0),
                           "eval_after_prompts": after.get("prompt_truncated", 0)},
             "steps": {"sft": cfg.sft.steps, "rl": cfg.rl.steps}, "algo": cfg.rl.algo,
             "seed": cfg.seed, "nonfinite_steps": state.counters["nonfinite_total"],
             "wall_s": time.time() - t_start}
  zero = (report.read_result(os.path.join(run.workdir, "eval_zero_shot.json"), EVAL_KEYS)[0]
          if cfg.eval.get("zero_shot") else None)
  if zero is not None:  # the initial policy, before SFT
    results["zero_shot"] = {k: zero[k] for k in ("per_task", "categories", "overall")}
  if "modalities" in after:  # a vision-language policy: every modality, before and after RL
    results["modalities"] = {"before": before.get("modalities"), "after": after["modalities"]}
  export = dist.tree_to_host(state.params["model"]) if cfg.checkpoint.export_hf else None  # all processes
  if dist.is_main():  # files are written once: the results first, so nothing after loses them
    report.write_json(results, os.path.join(run.workdir, "results.json"))
    if export is not None:
      hf.save(nnx.merge(run.graphdef, export), run.processor or run.tok,
              os.path.join(run.workdir, "hf"))
    if cfg.log.plots:
      report.plot_or_warn(report.plot_training, report.read_metrics(run.writer.path),
                          os.path.join(run.workdir, "training.png"))
      report.plot_or_warn(report.plot_before_after, before, after,
                          os.path.join(run.workdir, "before_after.png"))
  run.ckpt.close()
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
    print(multimodal.format_modalities(after))
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


# The project's own errors: bad input or a workdir that cannot be used. The CLI prints them as one
# line and exits with USAGE (the traceback with --verbose).
BAD_INPUT = (ConfigError, TrainingError, ckpt_lib.CheckpointError, ValueError, KeyError)
USAGE = 2


def fail(e: BaseException, verbose: bool = False) -> None:
  if verbose:
    import traceback
    traceback.print_exception(e)
  msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
  print(f"error: {msg}", file=sys.stderr, flush=True)
  sys.exit(USAGE)


def parse_flags(argv, fv=FLAGS):
  """absl's parser, with a bad --config.<field> (unknown, wrong type, a config argument the
  file refuses) as one line and exit status 2 instead of a traceback."""
  try:
    return fv(argv)
  except Exception as e:  # config_flags raises assorted types while it applies overrides
    fail(ConfigError(config_lib.flag_error(e, argv)), "--verbose" in argv)


def main(argv, fv=FLAGS):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if fv.config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/nphard.py")
  if not fv.workdir:
    raise app.UsageError("--workdir is required")
  if "verbosity" in fv and not fv["verbosity"].present:  # orbax logs every save at INFO
    logging.set_verbosity(logging.WARNING)
  dist.initialize(fv.coordinator_address, fv.num_processes, fv.process_id)
  try:
    train(fv.config, fv.workdir, fv.allow_config_change)
  except BAD_INPUT as e:
    fail(e, fv.verbose)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
