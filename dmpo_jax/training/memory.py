"""The memory check of a training config: every stage's peak per device, estimated from the
config by the memory planner (parallel/plan.py), against what a device holds.

`config.check_config` calls `refusal` last and raises its message as a ConfigError, so a run
that cannot fit is refused before anything is built or written (and `--dry_run` refuses it
too), instead of aborting inside XLA after SFT.
The stages sized (each a `plan.Workload` of the policy; `phases`):

  the SFT update        sft.batch_size rows
  the RL update         rl.prompts_per_step x rl.group_size rows (+ dph.batch for dph_*
                        presets), in rl.micro_batches slices; where the update runs the
                        prefix-shared forward (rl.prefix_shared, decided as the trainer
                        decides it: models/prefix.py `update_forward`), each group's prompt counted once
  the RL sampler        rl.prompts_per_step / rl.rollout_chunks x rl.group_size rows
  the evaluation        eval.batch_prompts x eval.samples rows (or eval.points_samples' most)
  the DPH pre-sampler   eval.batch_prompts x dph.samples rows (dph_* presets)
  the perception probe  eval.batch_prompts rows of perception.max_new_tokens

each of model.max_prompt_len + model.max_new_tokens tokens (the prefix-shared RL update: P
prompt tokens per group plus T completion tokens per row; DPH's stored rows and the SFT
update run per row). An update holds params, gradients, AdamW state, activations and logits;
a sampler params, AdamW state, its KV cache and logits; a reference policy (KL presets) adds a
copy of the params to both. The log-prob passes without a backward (the reference policy's
on each rollout piece, DPH's stored log-probs) are not sized. The policy's shape comes
from config.model alone: its sizes and the tokenizer's vocabulary for a model from scratch,
config.json or the GGUF header of a checkpoint (no weights are read).

The limit: on an accelerator its `memory_stats()["bytes_limit"]` (no check where a device
reports none); on CPU the host's available memory (MemAvailable in /proc/meminfo) shared by
the mesh's devices on this host. `config.check_memory = False` skips the check for a user who
knows better (the estimate of activations and logits is a shape estimate, not a measurement).
"""

from __future__ import annotations

import dataclasses
import os

import jax

from dmpo_jax.models import prefix
from dmpo_jax.models.config import ModelConfig
from dmpo_jax.objectives import presets
from dmpo_jax.parallel import plan
from dmpo_jax.training import steps

GIB = plan.GIB


@dataclasses.dataclass(frozen=True)
class Phase:
  """One stage's workload: what it is, the config fields that size it, and which peak of
  the plan it reaches (an update's or a sampler's)."""
  name: str
  fields: str
  work: plan.Workload
  peak: str  # "update_peak_bytes" or "sampling_peak_bytes"


def model_config(cfg):
  """The policy's ModelConfig (VLConfig for a vision-language policy) from config.model,
  without weights: a model from scratch from its sizes and tokenizer, a checkpoint from its
  config.json or GGUF header."""
  from dmpo_jax.models import build, hf
  from dmpo_jax.training import specs
  m, spec = cfg.model, specs.model_spec(cfg)
  if m.init == "scratch" and m.get("vision"):
    return build.vlm_config(spec)[0]
  if m.init == "scratch":
    return build.scratch_config(spec, build.scratch_tokenizer(spec))
  mc = hf.model_config(m.init, dtype=spec.dtype, param_dtype=m.param_dtype)  # "auto" resolved
  lora = spec.lora  # adapters: only they are trained (parallel/plan.py)
  if lora is None:
    return mc
  vl = hasattr(mc, "text")  # a VLConfig: the adapters are on its language model
  return dataclasses.replace(mc, text=mc.text.replace(lora=lora)) if vl else mc.replace(lora=lora)


def phases(cfg, obj: presets.ObjectiveConfig, micro_batches: int, backend: str,
           samples: int, *, vl: bool) -> list[Phase]:
  """The stages of a run of `cfg` that hold the most memory (see the module docstring);
  samples: the most samples per instance of an evaluation (config.points_samples_max); vl:
  the policy is a vision-language model (its prompts carry images: the update runs per row)."""
  m, rl, ev = cfg.model, cfg.rl, cfg.eval
  need = presets.needs(obj)
  seq = f"rows of model.max_prompt_len={m.max_prompt_len} + model.max_new_tokens={m.max_new_tokens} tokens"
  pb = int((cfg.get("image") or {}).get("patch_budget") or plan.Workload.patch_budget)
  base = dict(prompt_len=m.max_prompt_len, new_tokens=m.max_new_tokens, remat=m.remat,
              backend=backend, patch_budget=pb, reference=need.reference)
  frozen = lambda stage: bool(cfg[stage].get("freeze_vision", True))
  dph = need.dph_store and rl.steps > 0
  out = []
  if cfg.sft.steps:
    out.append(Phase("the SFT update", f"config.sft.batch_size={cfg.sft.batch_size} {seq}",
                     plan.Workload(prompts=cfg.sft.batch_size, group=1, train_vision=not frozen("sft"),
                                   **dict(base, reference=False)), "update_peak_bytes"))
  if rl.steps:
    extra = dph * cfg.dph.batch
    path = prefix.update_forward(rl.prefix_shared, rl.prompts_per_step, rl.group_size,
                                 m.max_prompt_len, m.max_new_tokens, images=vl)
    out.append(Phase("the RL update", f"config.rl.prompts_per_step={rl.prompts_per_step} x "
                     f"rl.group_size={rl.group_size}" + (f" + dph.batch={extra}" if extra else "")
                     + f" {seq}, rl.micro_batches={rl.micro_batches}"
                     + (f" (auto: {micro_batches})" if not rl.micro_batches else "")
                     + f", rl.prefix_shared={rl.prefix_shared!r} ({path[0]}: {path[1]})",
                     plan.Workload(prompts=rl.prompts_per_step, group=rl.group_size,
                                   micro_batches=micro_batches, extra_rows=extra,
                                   train_vision=not frozen("rl"),
                                   prefix_shared=path[0] == "prefix_shared", **base),
                     "update_peak_bytes"))
    out.append(Phase("the RL sampler", f"config.rl.prompts_per_step={rl.prompts_per_step} / "
                     f"rl.rollout_chunks={rl.rollout_chunks} x rl.group_size={rl.group_size} {seq}",
                     plan.Workload(prompts=rl.prompts_per_step // rl.rollout_chunks,
                                   group=rl.group_size, **base), "sampling_peak_bytes"))
  which = "eval.samples" if samples == ev.samples else "eval.points_samples"
  out.append(Phase("the evaluation sampler", f"config.eval.batch_prompts={ev.batch_prompts} x "
                   f"{which}={samples} {seq}",
                   plan.Workload(prompts=ev.batch_prompts, group=samples, **base), "sampling_peak_bytes"))
  if dph:
    out.append(Phase("the DPH pre-sampler", f"config.eval.batch_prompts={ev.batch_prompts} x "
                     f"dph.samples={cfg.dph.samples} {seq}",
                     plan.Workload(prompts=ev.batch_prompts, group=cfg.dph.samples, **base),
                     "sampling_peak_bytes"))
  if "perception" in cfg and cfg.perception.steps:
    t = cfg.perception.max_new_tokens
    out.append(Phase("the perception probe", f"config.eval.batch_prompts={ev.batch_prompts} rows "
                     f"of model.max_prompt_len={m.max_prompt_len} + perception.max_new_tokens={t} tokens",
                     plan.Workload(prompts=ev.batch_prompts, group=1, **dict(base, new_tokens=t)),
                     "sampling_peak_bytes"))
  return out


def host_available() -> int | None:
  """Bytes of memory this host can still give (MemAvailable; else the free pages)."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, AttributeError):
    return None


def device_limit(mesh) -> tuple[int, str] | None:
  """(bytes one device of `mesh` may use, where that figure comes from); None when it is
  unknown (no check then)."""
  local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  if not local:
    return None
  if local[0].platform == "cpu":
    avail = host_available()
    if avail is None:
      return None
    share = f" ({avail / GIB:.1f} GiB) shared by {len(local)} CPU devices" if len(local) > 1 else ""
    return avail // len(local), f"the host's available memory, MemAvailable{share}"
  try:
    stats = local[0].memory_stats() or {}
  except Exception:  # some backends do not implement memory_stats
    return None
  limit = stats.get("bytes_limit")
  return (int(limit), f"the {local[0].device_kind}'s memory_stats bytes_limit") if limit else None


def micro_batches(cfg, obj: presets.ObjectiveConfig, mesh) -> int:
  """The RL update's micro-batches: config.rl.micro_batches, or with 0 (auto)
  `steps.auto_micro_batches` of the objective, the step's prompts and the mesh's batch rows."""
  from dmpo_jax.parallel import sharding
  return cfg.rl.micro_batches or steps.auto_micro_batches(obj, cfg.rl.prompts_per_step,
                                                          sharding.batch_rows(mesh))


def estimate(cfg, obj: presets.ObjectiveConfig, mesh, samples: int) -> list[tuple[Phase, dict]]:
  """[(phase, its plan)] of every stage of `cfg` on `mesh` (bytes per device); samples: the
  most samples per instance of an evaluation."""
  backend = {"cpu": "cpu", "tpu": "tpu"}.get(mesh.devices.flat[0].platform, "gpu")
  model = model_config(cfg)
  shape = {a: int(n) for a, n in mesh.shape.items()}
  stages = phases(cfg, obj, micro_batches(cfg, obj, mesh), backend, samples,
                  vl=not isinstance(model, ModelConfig))
  try:
    return [(p, plan.plan(model, shape, p.work)) for p in stages]
  except ValueError as e:  # the one workload a model cannot take: an image patch budget
    raise ValueError(f"config.image.patch_budget: {e}") from None


def gib(b: float) -> str:
  """Bytes in GiB for a message: one decimal, two significant digits below 0.1 GiB."""
  return f"{b / GIB:.1f}" if b >= GIB / 10 else f"{b / GIB:.2g}"


def describe(phase: Phase, p: dict) -> str:
  """A stage's estimate in words: its fields, its peak and what the peak is made of."""
  g, state = gib, p["param_bytes"] + p["reference_bytes"] + p["optimizer_bytes"]
  if phase.peak == "update_peak_bytes":
    parts = (f"activations {g(p['activation_bytes'])}, logits {g(p['logit_bytes'])}, params, "
             f"gradients and optimizer state {g(state + p['grad_bytes'])}")
  else:
    parts = (f"KV cache {g(p['kv_cache_bytes'])}, logits {g(p['sampling_logit_bytes'])}, "
             f"params and optimizer state {g(state)}")
  return (f"{phase.name} ({phase.fields}; a model of {p['params']:,} params) needs "
          f"an estimated {g(p[phase.peak])} GiB per device ({parts} GiB)")


def refusal(cfg, obj: presets.ObjectiveConfig, mesh, samples: int) -> str | None:
  """Why `cfg` cannot run on `mesh` (its largest stage exceeds a device), as the one-line
  message of a refusal; None when it fits, when the limit is unknown, or with
  config.check_memory = False. samples: the most samples per instance of an evaluation."""
  if not cfg.get("check_memory", True):
    return None
  limit = device_limit(mesh)
  if limit is None:
    return None
  phase, p = max(estimate(cfg, obj, mesh, samples), key=lambda pp: pp[1][pp[0].peak])
  if p[phase.peak] <= limit[0]:
    return None
  return (f"{describe(phase, p)}, more than the {gib(limit[0])} GiB a device has ({limit[1]}); "
          "lower these sizes, spread the rows over more devices (config.mesh) or set "
          "--config.check_memory=False to run anyway")
