"""The config compiled: at setup, each part of the trainer below the stage layer gets its
settings as a small typed, frozen spec, built here by one function from the config. Below the
stage layer nothing reads the config or a `Run` (docs/ARCHITECTURE.md, "The stage layer";
tests/test_layering.py checks it).

    spec            built from                               used by
    EvalSpec        config.eval, log.progress                training/evaluation.py: HeldOut
    PointsSpec      config.eval.points..., start_bounds,     training/points.py: Points
                    rl, sft.steps
    DPHSpec         config.dph, model lengths, rl, eval      training/dph.py: presample
    PerceptionSpec  config.perception, sft, eval             training/perception.py
    ModelSpec       config.model (lora, vision), image, seed models/build.py: build
    EncoderSpec     config.prompt_style, chat_template,      data/images.py: make_run_encoder
                    model.max_prompt_len, image
    Collapse        config.collapse                          data/pipeline.py: TaskSet
    InstancesSpec   config.sft, rl, eval (counts, transfer)  data/instances.py: rows (--dry_run)

and the run's data stream, `taskset` (config.tasks, level, seed, rl.curriculum, collapse,
sft.gym_tasks).
"""

from __future__ import annotations

import dataclasses

from dmpo_jax.data import images as multimodal
from dmpo_jax.data import domain, instances, pipeline
from dmpo_jax.models import build as model_build
from dmpo_jax.models import precision as precision_lib
from dmpo_jax.training import dph, perception
from dmpo_jax.training import points as eval_points
from dmpo_jax.training.evaluation import EvalSpec


def eval_spec(cfg) -> EvalSpec:
  """The held-out evaluation (eval_<name>.json) of config.eval."""
  e = cfg.eval
  modalities = e.get("modalities", None)
  return EvalSpec(samples=e.samples, temperature=e.temperature, k=e.k, pass_ks=tuple(e.pass_ks),
                  batch_prompts=e.batch_prompts, num_per_task=e.num_per_task,
                  progress=cfg.log.progress,
                  modalities=None if modalities is None else tuple(modalities))


def points_spec(cfg) -> eval_points.PointsSpec:
  """The evaluation points along RL (config.eval.points) at the RL sampling settings."""
  e = cfg.eval
  return eval_points.PointsSpec(
      n=e.points, rl_steps=cfg.rl.steps, rl_start=cfg.sft.steps,
      samples=e.points_samples or e.samples, temperature=cfg.rl.temperature, top_p=cfg.rl.top_p,
      k=e.k, pass_ks=tuple(e.pass_ks), batch_prompts=e.batch_prompts, num_per_task=e.num_per_task,
      start_bounds=e.start_bounds, kl_samples=e.points_kl_samples)


def check_points(cfg) -> None:
  """config.eval.points (>= 0), eval.points_samples (its sets, by config.collapse's regime)
  and eval.start_bounds (their sets and metrics, and a point at RL step 0), checked before
  anything is built rather than when RL reaches the first point."""
  c = cfg.get("collapse") or {}
  spec = points_spec(cfg)
  names = eval_points.set_names(bool(c.get("splits") or c.get("split_file")), bool(c.get("pool")))
  eval_points.check(spec.n, spec.samples, names)
  eval_points.start_bounds(spec, names, collapse_spec(cfg) is not None)


def dph_spec(cfg) -> dph.DPHSpec:
  """DPH-RL's pre-sampling (config.dph): its prompts are sampled config.eval.batch_prompts at a
  time, at the model's prompt and completion lengths."""
  d = cfg.dph
  return dph.DPHSpec(num_prompts=d.num_prompts, samples=d.samples, pef_threshold=d.pef_threshold,
                     correct=d.correct, prompts_per_step=cfg.rl.prompts_per_step,
                     prompt_len=cfg.model.max_prompt_len, completion_len=cfg.model.max_new_tokens,
                     chunk=cfg.eval.batch_prompts, batch=d.batch)


def perception_spec(cfg) -> perception.PerceptionSpec:
  """An image policy's perception stage (config.perception; steps 0 without the block)."""
  if "perception" not in cfg:
    return perception.PerceptionSpec(num_per_task=cfg.eval.num_per_task,
                                     batch_prompts=cfg.eval.batch_prompts)
  p = cfg.perception
  n = int(p.steps)
  length = p.get("max_new_tokens")
  return perception.PerceptionSpec(
      steps=n, lr=float(p.lr) if n else 0.0, warmup=int(p.warmup) if n else 0,
      max_new_tokens=int(length) if length is not None else 0, batch_size=cfg.sft.batch_size,
      num_per_task=cfg.eval.num_per_task, batch_prompts=cfg.eval.batch_prompts)


def model_precision(cfg) -> precision_lib.Precision:
  """config.model.dtype resolved on this machine's devices: "auto" is bfloat16 compute where
  they compute it natively, float32 elsewhere (models/precision.py); an explicit dtype as it is."""
  return precision_lib.resolve(cfg.model.dtype)


def model_spec(cfg, precision: precision_lib.Precision | None = None) -> model_build.ModelSpec:
  """The policy (config.model, the run's seed; the compute dtype `precision`'s, by default
  `model_precision(cfg)`'s); with config.model.vision, the from-scratch tower's settings (and
  config.image's pixel range, which its processor uses)."""
  m = cfg.model
  vision = None
  if m.get("vision"):
    im = cfg.image
    vision = model_build.VisionSpec(
        tower=tuple(dict(m.vision).items()), mrope_section=m.mrope_section,
        min_pixels=im.min_pixels, max_pixels=im.max_pixels, mean=im.get("mean"), std=im.get("std"),
        patch_budget=im.patch_budget)
  return model_build.ModelSpec(
      init=m.init, tokenizer=m.tokenizer, dtype=(precision or model_precision(cfg)).dtype,
      param_dtype=m.param_dtype, remat=m.remat,
      seed=cfg.seed, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
      num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
      head_dim=m.head_dim, rope_theta=m.rope_theta,
      max_position_embeddings=m.max_prompt_len + m.max_new_tokens,
      lora=model_build.lora_config(m.get("lora")),
      lora_export=(m.get("lora") or {}).get("export"), vision=vision)


def encoder_spec(cfg) -> multimodal.EncoderSpec:
  """The run's prompts (config.prompt_style, chat_template, model.max_prompt_len); for an image
  style, config.image's render size and cache."""
  image = cfg.prompt_style in domain.IMAGE_STYLES
  return multimodal.EncoderSpec(
      style=cfg.prompt_style, max_len=cfg.model.max_prompt_len, chat=cfg.chat_template,
      image_size=int(cfg.image.size) if image else 0,
      image_cache=int(cfg.image.cache) if image else 0)


def collapse_spec(cfg) -> pipeline.Collapse | None:
  """The mode-collapse testbed's settings: None unless the config has a `collapse` block with
  `enabled` (default True)."""
  c = cfg.get("collapse")
  if c is None or not c.get("enabled", True):
    return None
  out = pipeline.Collapse(limit=int(c.get("limit", 64)), time_limit=float(c.get("time_limit", 10.0)),
                          min_optima=int(c.get("min_optima", 2)), max_optima=c.get("max_optima", 16))
  if out.limit < 1 or out.min_optima < 0 or (out.max_optima is not None and out.max_optima < out.min_optima):
    raise ValueError(f"config.collapse: need limit >= 1 and 0 <= min_optima <= max_optima, got {out}")
  return out


def sft_gym_keys(cfg) -> tuple[str, ...]:
  """config.sft.gym_tasks' keys, registered (the reasoning-gym tasks SFT mixes in)."""
  from dmpo_jax.data import gym
  from dmpo_jax.training import transfer
  keys = transfer.parse(cfg.sft.get("gym_tasks", ""))
  gym.register_keys(keys)
  return keys


def taskset(cfg, keys) -> pipeline.TaskSet:
  """The trainer's TaskSet for config.tasks `keys` (config.collapse's pool and splits), with
  config.sft.gym_tasks for SFT only, whose first config.eval.transfer_num_per_task held-out
  instances (the transfer evaluation's) SFT does not draw."""
  c = cfg.get("collapse") or {}
  return pipeline.TaskSet(keys, cfg.level, cfg.seed,
                          pipeline.parse_curriculum(cfg.rl.curriculum, cfg.level),
                          collapse=collapse_spec(cfg), pool=int(c.get("pool", 0)),
                          splits=c.get("splits", ()), split_file=c.get("split_file", ""),
                          sft_from=c.get("sft_from", "A"), rl_from=c.get("rl_from", "AB"),
                          held_out_per_task=int(cfg.eval.num_per_task),
                          sft_only=sft_gym_keys(cfg),
                          sft_only_reserved=int(cfg.eval.get("transfer_num_per_task", 6)))


def instances_spec(cfg) -> instances.InstancesSpec:
  """The rows of a dry run (`instances.rows`): config.sft's, rl's and eval's counts."""
  return instances.InstancesSpec(
      sft_steps=cfg.sft.steps, sft_prompts=cfg.sft.batch_size // cfg.sft.solutions_per_instance,
      rl_steps=cfg.rl.steps, rl_prompts=cfg.rl.prompts_per_step,
      eval_per_task=cfg.eval.num_per_task, transfer_keys=transfer_keys(cfg),
      transfer_per_task=cfg.eval.get("transfer_num_per_task", 6))


def transfer_keys(cfg) -> tuple[str, ...]:
  """config.eval.transfer's keys, registered."""
  from dmpo_jax.data import gym
  from dmpo_jax.training import transfer
  keys = transfer.parse(cfg.eval.get("transfer", ""))
  gym.register_keys(keys)
  return keys


@dataclasses.dataclass(frozen=True)
class Specs:
  """Every spec of a run's config (`compile`)."""
  eval: EvalSpec
  points: eval_points.PointsSpec
  dph: dph.DPHSpec
  perception: perception.PerceptionSpec
  model: model_build.ModelSpec
  encoder: multimodal.EncoderSpec
  precision: precision_lib.Precision  # model.dtype resolved (model.dtype: its `dtype`)


def compile(cfg) -> Specs:  # noqa: A001 (the config is compiled once, at setup)
  prec = model_precision(cfg)
  return Specs(eval=eval_spec(cfg), points=points_spec(cfg), dph=dph_spec(cfg),
               perception=perception_spec(cfg), model=model_spec(cfg, prec),
               encoder=encoder_spec(cfg), precision=prec)


def transfer_spec(cfg):
  """The reasoning-gym transfer evaluation (config.eval.transfer*; training/transfer.py): at
  config.eval's temperature, k, pass_ks and batch size; no tasks: no evaluation."""
  from dmpo_jax.training import transfer
  e = cfg.eval
  return transfer.TransferSpec(
      keys=transfer.parse(e.get("transfer", "")), level=cfg.level,
      num_per_task=e.get("transfer_num_per_task", 6), samples=e.get("transfer_samples", 4),
      temperature=e.temperature, k=e.k, pass_ks=tuple(e.pass_ks), batch_prompts=e.batch_prompts,
      max_prompt_len=e.get("transfer_max_prompt_len", 0),
      max_new_tokens=e.get("transfer_max_new_tokens", 0) or cfg.model.max_new_tokens,
      progress=cfg.log.progress)
