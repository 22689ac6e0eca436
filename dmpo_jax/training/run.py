"""The run context of a training job: the config checked, the model built, its shardings,
optimizers, data stream, prompt encoder, checkpointer and writers (`Run`), and `setup`, which
makes one, takes the workdir's lock (lock.py) and restores the workdir's latest usable
checkpoint. The stages (stages.py) read everything they share from it; `Run.close` ends it
and releases the lock."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from dmpo_jax import sampling
from dmpo_jax.data import images as multimodal
from dmpo_jax.models import build as model_build
from dmpo_jax.models import lora as lora_lib
from dmpo_jax.objectives import flowrl, presets
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.parallel import sharding
from dmpo_jax.sampling import sampler as sampler_lib
from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.training import config as config_lib
from dmpo_jax.training import lock as lock_lib
from dmpo_jax.training import evaluation, perception, report
from dmpo_jax.training import rollout as rollout_lib
from dmpo_jax.training import specs as specs_lib
from dmpo_jax.training import steps as steps_lib
from dmpo_jax.training import transfer as transfer_lib
from dmpo_jax.training.evaluation import EVAL_KEYS
from dmpo_jax.data import domain, pipeline
from dmpo_jax.training import points as eval_points
from dmpo_jax.training.config import check_config, task_keys
from dmpo_jax.training.state import LOG_Z_SEED_OFFSET, TrainState, checkpoint_meta
from dmpo_jax.training.steps import make_optimizer




class TrainingError(RuntimeError):
  """The run cannot continue; the message says why (the last good checkpoint is intact)."""


class StartOutOfBounds(TrainingError):
  """The policy at the start of RL is outside config.eval.start_bounds: the run stopped before
  any RL step (stages.check_start). `record`: what stopped.json holds (bounds, measured values)."""

  def __init__(self, message: str, record: dict):
    super().__init__(message)
    self.record = record


class WorkdirLocked(TrainingError, lock_lib.LockHeld):
  """Another run holds the workdir's lock (lock.py); the message names it and the file."""


# ---------------------------------------------------------------------------
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
  if presets.needs(obj).dph_store and cfg.dph.weighting == "per_sample":
    share = cfg.dph.batch / (cfg.rl.prompts_per_step * cfg.rl.group_size)
    obj = obj.replace(div_coef=obj.div_coef * share)
  return obj


# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
  """What the stages share: config, objective, data, model graph, mesh shardings, outputs."""
  cfg: Any
  workdir: str
  obj: presets.ObjectiveConfig
  mesh: Any
  taskset: pipeline.TaskSet
  reward_cfg: domain.RewardConfig
  tok: Any
  encoder: pipeline.PromptEncoder
  graphdef: Any
  model_shape: dict
  p_sh: Any            # params' shardings
  sft_o_sh: Any        # SFT's optimizer state's (fixed at setup; `init_opt`)
  rl_o_sh: Any         # RL's (the two optimizers can differ in structure)
  data_sh: Any         # batch rows over the mesh's data x fsdp axes (a prefix for every leaf)
  rep: Any             # replicated
  sft_opt: Any
  rl_opt: Any
  ckpt: ckpt_lib.Checkpointer
  specs: specs_lib.Specs  # the config compiled: what the modules below the stages read
  vl_cfg: Any = None   # a vision-language policy's VLConfig (None: a text model)
  processor: Any = None  # its VLProcessor (saved with the HF export)
  lock: Any = None     # the workdir's lock.Lock, on process 0 (released by `close`)
  writer: Any = None
  progress: Any = None
  times: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(
      ("sft", "rollout", "reward", "update", "eval", "dph"), 0.0))
  held_out: Any = None  # its evaluation.HeldOut (one sampler, one instance set), made once
  transfer: Any = None  # its transfer.Transfer (config.eval.transfer), made once
  truncated: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(
      ("prompt_truncated", "sft_truncated"), 0))  # this process's cuts (results.json)
  # {log-prob pass: "forward (why)"} (`note_forward`; saved in checkpoints, in results.json)
  forwards: dict = dataclasses.field(default_factory=dict)

  @property
  def prompt_len(self) -> int:
    return self.cfg.model.max_prompt_len

  @property
  def completion_len(self) -> int:
    return self.cfg.model.max_new_tokens

  @property
  def prefix_shared(self) -> bool | None:
    """config.rl.prefix_shared as `steps.make_logprob_fn`'s prefix_shared (None: "auto")."""
    return config_lib.PREFIX_SHARED[self.cfg.rl.prefix_shared]

  def note_forward(self, name: str, seqs, group_size=None) -> None:
    """Record which forward the log-prob pass `name` runs on seqs (`steps.forward_path`, the
    function make_logprob_fn decides by) and print it the first time, or when it changes:
    with config.rl.prefix_shared="auto" a pass that cannot share prompts says why."""
    path = steps_lib.forward_path(self.prefix_shared, seqs, self.prompt_len, group_size)
    said = f"{path[0]} ({path[1]})"
    if self.forwards.get(name) != said:
      self.forwards[name] = said
      if dist.is_main():
        print(f"log-probs, {name}: {said}", flush=True)

  def init_opt(self, stage: str, params):
    """A fresh optimizer state of `stage` ("sft" or "rl") on the mesh, placed by that stage's
    shardings (`sft_o_sh`, `rl_o_sh`: moments sharded like their params, counts replicated)."""
    opt, o_sh = (self.sft_opt, self.sft_o_sh) if stage == "sft" else (self.rl_opt, self.rl_o_sh)
    return jax.jit(opt.init, out_shardings=o_sh)(params)

  def sampling_config(self, num_samples: int, temperature: float, top_p: float = 1.0):
    return sampler_lib.SamplingConfig(max_new_tokens=self.completion_len, num_samples=num_samples,
                                      temperature=temperature, top_p=top_p,
                                      eos_id=self.tok.eos_token_id, pad_id=self.encoder.pad,
                                      stop_ids=self.encoder.stop_ids)

  def sampler(self, scfg):
    return sampling.make_sampler(self.graphdef, scfg, self.p_sh, self.data_sh, self.rep)

  def rollout_spec(self) -> rollout_lib.RolloutSpec:
    """What every RL step's rollouts share (`collect_rollouts`): config.rl's group size and
    chunks, the lengths, rewards, objective, collapse scoring and image inputs."""
    rl = self.cfg.rl
    return rollout_lib.RolloutSpec(
        group_size=rl.group_size, chunks=rl.rollout_chunks, prompt_len=self.prompt_len,
        completion_len=self.completion_len, reward_cfg=self.reward_cfg, objective=self.obj,
        data_sh=self.data_sh, collapse=self.taskset.collapse,
        images=None if self.vl_cfg is None else self.images)

  def held_out_eval(self, name: str, state: TrainState) -> dict:
    """eval_{name}.json: the held-out evaluation of `state`'s policy (evaluation.HeldOut)."""
    if self.held_out is None:
      spec = self.specs.eval
      self.held_out = evaluation.HeldOut(
          spec, self.workdir, self.taskset, self.encoder, self.prompt_len, self.reward_cfg,
          lambda: self.sampler(self.sampling_config(spec.samples, spec.temperature)),
          None if self.vl_cfg is None else self.images)
    return self.held_out(name, state.params, state.eval_key())

  def transfer_eval(self, name: str, state: TrainState) -> dict | None:
    """eval_transfer_{name}.json: the reasoning-gym transfer tasks' evaluation of `state`'s
    policy (transfer.py); None without config.eval.transfer."""
    if self.transfer is None:
      spec = specs_lib.transfer_spec(self.cfg)
      if not spec.keys:
        return None
      scfg = self.sampling_config(spec.samples, spec.temperature)
      model_cfg = nnx.merge(self.graphdef, state.params["model"]).cfg
      self.transfer = transfer_lib.Transfer(
          spec, self.workdir, self.encoder.tok, self.cfg.prompt_style, self.cfg.chat_template,
          self.reward_cfg, lambda n: self.sampler(dataclasses.replace(scfg, max_new_tokens=n)),
          context=getattr(model_cfg, "text", model_cfg).max_position_embeddings)
    return self.transfer(name, state.params, state.eval_key())

  def points(self, start_params) -> eval_points.Points:
    """The evaluation points along RL (points.py), against the policy `start_params`."""
    spec = self.specs.points
    return eval_points.Points(
        spec, self.workdir, self.taskset, start_params, encoder=self.encoder,
        prompt_len=self.prompt_len, reward_cfg=self.reward_cfg,
        make_sampler=lambda g: self.sampler(self.sampling_config(g, spec.temperature, spec.top_p)),
        make_kl_logprobs=lambda: eval_points.make_kl_logprobs(
            self.graphdef, spec.temperature, shardings=(self.p_sh, self.rep, self.data_sh)),
        rep=self.rep, timed=self.timed)

  def perception_batch(self, step: int) -> dict:
    """The perception stage's batch at `step` (perception.py)."""
    return perception.batch(self.specs.perception, self.taskset, self.encoder, self.prompt_len,
                            self.images, step)

  def perception_eval(self, state: TrainState) -> dict:
    """perception.json of `state`'s policy (perception.py)."""
    return perception.evaluate(self.specs.perception, self.workdir, self.taskset, self.encoder,
                               state.params, state.eval_key(), prompt_len=self.prompt_len,
                               make_sampler=self.sampler, images=self.images)

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
    state.counters["logprob_forward"] = self.forwards
    self.ckpt.save(state.step, state.params, state.opt_state,
                   checkpoint_meta(state, stage, config_lib.config_json(self.cfg),
                                   self.model_shape, self.specs.precision.record()))

  def maybe_stop(self, state: TrainState, stage: str, stop) -> bool:
    """On a signal or at config.stop_at_step: save and report True (all processes agree)."""
    if not dist.agree(stop.received is not None or state.step == self.cfg.stop_at_step):
      return False
    stop.received = stop.received or f"config.stop_at_step={self.cfg.stop_at_step}"
    self.save(state, stage)
    print(f"\n{stop.received}: saved checkpoint at step {state.step}; rerun the same command to "
          "resume", flush=True)
    return True

  def close(self) -> None:
    """End the run: progress bar, writers and checkpointer closed, then the workdir's lock
    released (last: nothing of this run writes after it). Callers of `setup` call it."""
    try:
      if self.progress:
        self.progress.close()
      if self.writer:
        self.writer.close()
      self.ckpt.close()
    finally:
      self.release()

  def release(self) -> None:
    """Release the workdir's lock (idempotent; `train` calls it however the run ends)."""
    if self.lock is not None:
      self.lock.release()

  def close_stopped(self, state: TrainState) -> dict:
    self.close()
    return {"stopped": True, "step": state.step}

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
  `config_lib.check_resume`, and that no other run holds its lock), build mesh, data, model
  and optimizers; take the workdir's lock; restore the workdir's newest complete checkpoint if
  there is one. Nothing is written before the checks pass. The run holds the lock until
  `Run.close` (`stages.train` closes it however the run ends; other callers close it)."""
  config_lib.check_fields(cfg)  # before the objective and the mesh read the fields
  obj = objective_from_config(cfg)
  mesh = sharding.make_mesh(dict(cfg.mesh))
  check_config(cfg, obj, mesh)
  write_config = config_lib.check_resume(cfg, workdir, allow_config_change)
  specs_lib.check_points(cfg)
  specs = specs_lib.compile(cfg)
  if dist.is_main():  # once per run: what model.dtype computes in here, and why
    p = specs.precision
    print(f"compute dtype {p.dtype} (model.dtype={p.requested!r}: {p.reason}); parameters and "
          f"optimizer state {cfg.model.param_dtype}", flush=True)
  lock_workdir(workdir, take=False)  # a run there now: refused before the model is built
  taskset = specs_lib.taskset(cfg, task_keys(cfg))
  reward_cfg = domain.RewardConfig(**dict(cfg.rl.reward))

  model, tok = model_build.build(specs.model)
  processor, vl_cfg = (tok, model.cfg) if model_build.is_vlm(model) else (None, None)
  encoder = multimodal.make_run_encoder(specs.encoder, tok, processor)
  tok = encoder.tok
  graphdef, model_state = nnx.split(model)
  lora = lora_lib.has_adapters(model_state)  # config.model.lora: only the adapters are trained
  params = {"model": model_state}
  if presets.needs(obj).log_z:
    params["log_z"] = flowrl.init_log_z_head(jax.random.key(cfg.seed + LOG_Z_SEED_OFFSET),
                                             model_build.shape(model)["hidden_size"])
  rep = sharding.replicated(mesh)
  p_sh = {"model": sharding.param_shardings(model_state, mesh)}
  if "log_z" in params:
    p_sh["log_z"] = jax.tree.map(lambda _: rep, params["log_z"])
  params = jax.tree.map(lambda x, s: dist.to_global(np.asarray(x), s), params, p_sh)
  sft_opt = make_optimizer(cfg.sft.lr, cfg.sft.steps, cfg.sft.warmup, 1.0,
                           **vision_optimizer_opts(cfg, "sft", vl_cfg),
                           lead=specs.perception.lead, lora=lora)
  rl_opt = make_optimizer(cfg.rl.lr, cfg.rl.steps, 0, cfg.rl.max_grad_norm,
                          **vision_optimizer_opts(cfg, "rl", vl_cfg), lora=lora)

  # Every check passed: from here on the workdir is written, under its lock.
  lock = lock_workdir(workdir)
  try:
    run = Run(cfg=cfg, workdir=workdir, obj=obj, mesh=mesh, taskset=taskset, reward_cfg=reward_cfg,
              tok=tok, encoder=encoder, graphdef=graphdef, model_shape=model_build.shape(model),
              p_sh=p_sh, sft_o_sh=sharding.opt_state_shardings(sft_opt, params, p_sh, mesh),
              rl_o_sh=sharding.opt_state_shardings(rl_opt, params, p_sh, mesh),
              data_sh=sharding.batch_sharding(mesh, 1), rep=rep, sft_opt=sft_opt, rl_opt=rl_opt,
              ckpt=ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=cfg.checkpoint.keep),
              specs=specs, vl_cfg=vl_cfg, processor=processor, lock=lock)
    return run, open_workdir(run, params, write_config)
  except BaseException:
    if lock is not None:
      lock.release()
    raise


def open_workdir(run: Run, params, write_config: bool) -> TrainState:
  """The run's state: the workdir's newest usable checkpoint restored (a fresh state without
  one); config.json, the metrics writer and the progress bar."""
  cfg, workdir = run.cfg, run.workdir
  latest = run.ckpt.usable_step(set_aside=dist.is_main())  # damaged newer steps: moved aside
  # The optimizer of the stage the run is in (a checkpoint at step sft.steps is SFT's; the
  # two can differ in structure when one stage freezes the vision tower).
  in_sft = cfg.sft.steps and (latest is None or latest <= cfg.sft.steps)
  opt_state = run.init_opt("sft" if in_sft else "rl", params)
  state = TrainState(params=params, opt_state=opt_state, step=0, key=jax.random.key(cfg.seed))

  if latest is not None:
    params, opt_state, meta = run.ckpt.restore(latest, params, opt_state, run.model_shape)
    if meta["seed"] != cfg.seed:
      raise TrainingError(f"{workdir} holds a run with seed {meta['seed']}, config has {cfg.seed}")
    check_precision(meta.get("precision"), run.specs.precision, workdir)
    state = dataclasses.replace(state, params=params, opt_state=opt_state, step=meta["step"],
                                counters=meta["counters"])
    print(f"resumed {workdir} at step {state.step} ({meta['stage']})", flush=True)
  if write_config and dist.is_main():  # the contract, once the checkpoint is known to fit
    report.write_json(config_lib.config_json(cfg), os.path.join(workdir, "config.json"))
  run.times.update(state.counters.get("times", {}))
  run.forwards.update(state.counters.get("logprob_forward", {}))
  run.writer = (report.MetricsWriter(workdir, cfg.log.tensorboard,
                                     resume_step=state.step if latest is not None else None)
                if dist.is_main() else report.NullWriter(workdir))
  if cfg.log.progress and dist.is_main():
    from tqdm import tqdm
    run.progress = tqdm(total=cfg.sft.steps + cfg.rl.steps, initial=state.step, desc="train",
                        unit="step", dynamic_ncols=True)
  return state


def check_precision(saved: dict | None, now, workdir: str) -> None:
  """A resumed run computes in the dtype its checkpoint was trained in (`saved`: the meta's
  "precision"; None for a checkpoint written before it was recorded). An explicit model.dtype
  cannot change (config.json's contract); "auto" (`models.precision`) can, on other hardware,
  and a run that changed its compute dtype half-way would not be the run it resumes."""
  if saved is not None and saved.get("dtype") != now.dtype:
    raise TrainingError(
        f"{workdir}'s checkpoint was trained in {saved.get('dtype')} (model.dtype="
        f"{saved.get('requested')!r}: {saved.get('reason')}) but model.dtype={now.requested!r} "
        f"computes in {now.dtype} here ({now.reason}); resume it where it resolves to "
        f"{saved.get('dtype')}, or start another --workdir")


# ---------------------------------------------------------------------------
# The workdir's lock (lock.py): process 0 holds it, for every process of the run.
def lock_workdir(workdir: str, take: bool = True) -> lock_lib.Lock | None:
  """Take workdir's lock for this run (take=False: only check that no other run holds it);
  the Lock on process 0, None on the others. A refusal is a WorkdirLocked on every process
  together, so that none waits in a collective the others have left."""
  lock, why = None, None
  if dist.is_main():
    try:
      lock = lock_lib.acquire(workdir) if take else lock_lib.check(workdir)
    except lock_lib.LockHeld as e:
      why = e
  if dist.agree(why is not None):
    raise WorkdirLocked(str(why) if why else f"{workdir}: process 0 could not use its lock "
                        "(process 0's error names the holder)",
                        lock_lib.lock_path(workdir), getattr(why, "holder", None))
  if take and jax.process_count() > 1:
    check_shared_lock(workdir, lock)
  return lock


def check_shared_lock(workdir: str, lock: lock_lib.Lock | None) -> None:
  """Every process checks that the lock file holds process 0's token (broadcast): the lock
  is this run's, in a workdir they all share. Any refusal is every process's."""
  from jax.experimental import multihost_utils
  words = np.frombuffer(bytes.fromhex(lock.token), np.uint32) if lock else np.zeros(2, np.uint32)
  token = np.asarray(multihost_utils.broadcast_one_to_all(words), np.uint32).tobytes().hex()
  seen = np.asarray(multihost_utils.process_allgather(np.int32(lock_lib.holds(workdir, token))))
  if not seen.all():
    if lock is not None:
      lock.release()
    blind = [int(i) for i in np.flatnonzero(seen.ravel() == 0)]
    raise WorkdirLocked(f"processes {blind} do not find this run's lock (token {token}) in "
                        f"{lock_lib.lock_path(workdir)}: every process must see the same workdir "
                        "(a shared filesystem)", lock_lib.lock_path(workdir), None)


# ---------------------------------------------------------------------------
