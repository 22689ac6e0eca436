"""The config compiled: at setup, each part of the trainer below the stage layer gets its
settings as a small typed, frozen spec, built here by one function from the config. Below the
stage layer nothing reads the config or a `Run` (docs/ARCHITECTURE.md, "The stage layer";
tests/test_layering.py checks it).

    spec            built from                               used by
    EvalSpec        config.eval, log.progress                training/evaluation.py: HeldOut
    PointsSpec      config.eval.points..., rl, sft.steps     training/points.py: Points
    DPHSpec         config.dph, model lengths, rl, eval      training/dph.py: presample
    PerceptionSpec  config.perception, sft, eval             training/perception.py
"""

from __future__ import annotations

import dataclasses

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
      k=e.k, pass_ks=tuple(e.pass_ks), batch_prompts=e.batch_prompts, num_per_task=e.num_per_task)


def check_points(cfg) -> None:
  """config.eval.points (>= 0) and eval.points_samples (its sets, by config.collapse's
  regime), checked before anything is built rather than when RL reaches the first point."""
  c = cfg.get("collapse") or {}
  spec = points_spec(cfg)
  eval_points.check(spec.n, spec.samples, eval_points.set_names(
      bool(c.get("splits") or c.get("split_file")), bool(c.get("pool"))))


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


@dataclasses.dataclass(frozen=True)
class Specs:
  """Every spec of a run's config (`compile`)."""
  eval: EvalSpec
  points: eval_points.PointsSpec
  dph: dph.DPHSpec
  perception: perception.PerceptionSpec


def compile(cfg) -> Specs:  # noqa: A001 (the config is compiled once, at setup)
  return Specs(eval=eval_spec(cfg), points=points_spec(cfg), dph=dph_spec(cfg),
               perception=perception_spec(cfg))


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
