"""The training config's schema: every field's type and range, the cross-field checks, and the
resume contract.

A config is a file in configs/ (`get_config(arg)` returning a locked `ConfigDict`); every value
lives there, and this module says what each field may hold. `check_config` runs before anything
is built or written, so bad input costs nothing: each refusal is one line that names the field,
the value and what is allowed (`ConfigError`; the CLIs print it and exit with status 2). Its
last check is the memory estimate of every stage (training/memory.py), which refuses sizes a
device cannot hold; `check_memory = False` skips it.

The resume contract: a workdir's `config.json` is the config its checkpoints, metrics and
evaluations were made under. A rerun whose config differs in a field that changes the result
is refused with the differing fields listed (`check_resume`); the fields in `SAFE_TO_CHANGE`
(logging, checkpoint cadence, the mesh) may change when the rerun names them
(`--allow_config_change=log.every,checkpoint.keep`). `stop_at_step` and `check_memory` are
instructions to one invocation, not part of the run, and are never compared.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from typing import Any, Callable

from dmpo_jax.data import domain
from dmpo_jax.data import gym
from dmpo_jax.data import images as multimodal
from dmpo_jax.data import transcripts
from dmpo_jax.models.config import LORA_INITS, LORA_TARGETS
from dmpo_jax.models.precision import AUTO
from dmpo_jax.objectives import presets
from dmpo_jax.parallel import sharding
from dmpo_jax.training import memory
from dmpo_jax.training import steps
from dmpo_jax.training import transfer


class ConfigError(ValueError):
  """Bad input in the config or the command line; the message is one line naming the field."""


# ---------------------------------------------------------------------------
# Field specs.
@dataclasses.dataclass(frozen=True)
class Spec:
  """A field's type (`kind`) and range (`ok`); `allowed` says both in words for the message.
  optional: the field may be absent (it belongs to some configs only, e.g. configs/collapse.py)."""
  kinds: tuple
  allowed: str
  ok: Callable[[Any], bool] = lambda v: True
  optional: bool = False


def _is(v, kinds) -> bool:
  if isinstance(v, bool):  # bool is an int in Python; an int field must not take True
    return bool in kinds
  return isinstance(v, kinds)


def Int(lo: int | None = None, hi: int | None = None, *, optional=False, extra=()) -> Spec:
  words = ("an int" + (f" >= {lo}" if lo is not None else "") + (f" and <= {hi}" if hi is not None else ""))
  return Spec((int,), words + "".join(f" or {e}" for e in extra),
              lambda v: v in extra or ((lo is None or v >= lo) and (hi is None or v <= hi)), optional)


def Float(lo: float | None = None, *, open_lo=True, hi: float | None = None, optional=False) -> Spec:
  words = "a finite number" + ("" if lo is None else f" {'>' if open_lo else '>='} {lo}") + (
      "" if hi is None else f" and <= {hi}")
  return Spec((int, float), words, lambda v: math.isfinite(v) and (
      lo is None or (v > lo if open_lo else v >= lo)) and (hi is None or v <= hi), optional)


def Bool(optional=False) -> Spec:
  return Spec((bool,), "True or False", optional=optional)


def Str(optional=False) -> Spec:
  return Spec((str,), "a string", optional=optional)


def Choice(names, optional=False) -> Spec:
  """One of `names`: a sequence, or a function listing them when a value is checked (a
  registry that may grow after import, as the presets do)."""
  listing = names if callable(names) else (lambda fixed=tuple(names): fixed)
  return Spec((str,), Listing(listing), lambda v: v in listing(), optional)


class Listing:
  """"one of [...]" of the names a function lists, spelt when a message is made."""

  def __init__(self, names: Callable[[], Any]):
    self.names = names

  def __str__(self):
    return f"one of {list(self.names())}"


def Ints(lo: int = 1, optional=False) -> Spec:
  return Spec((tuple, list), f"a non-empty list of ints >= {lo}", lambda v: len(v) > 0 and all(
      _is(x, (int,)) and x >= lo for x in v), optional)


def Strs(names, optional=False) -> Spec:
  names = tuple(names)
  return Spec((tuple, list), f"a non-empty list of {list(names)}",
              lambda v: len(v) > 0 and all(x in names for x in v), optional)


ANY = Spec((object,), "anything")
PREFIX_SHARED = steps.PREFIX_SHARED  # config.rl.prefix_shared -> make_logprob_fn's prefix_shared
DTYPES = ("float32", "bfloat16", "float16")
# model.dtype may also be "auto": bfloat16 where the backend computes it natively, else float32
# (models/precision.py; resolved once at setup, training/specs.py: model_precision)
MESH_AXIS = Int(1, extra=(-1,))  # -1: all remaining devices

# Every field of every config in configs/, with its type and range. Values live in configs/;
# cross-field rules are in `check_config`.
SCHEMA: dict[str, Spec] = {
    "seed": Int(0),
    "tasks": Str(),
    "level": Choice(domain.LEVELS),
    "prompt_style": Choice(domain.PROMPT_STYLES + domain.IMAGE_STYLES),
    "chat_template": Bool(),
    "stop_at_step": Int(-1),
    "check_memory": Bool(optional=True),  # False: skip the memory check (training/memory.py)
    "model.init": Spec((str,), "'scratch', a local Hugging Face folder or a .gguf file",
                       lambda v: v == "scratch" or os.path.isdir(v) or (v.endswith(".gguf") and os.path.isfile(v))),
    "model.tokenizer": Str(),
    "model.hidden_size": Int(1), "model.intermediate_size": Int(1), "model.num_layers": Int(1),
    "model.num_heads": Int(1), "model.num_kv_heads": Int(1), "model.head_dim": Int(1),
    "model.rope_theta": Float(0), "model.dtype": Choice(DTYPES + (AUTO,)),
    "model.param_dtype": Choice(DTYPES),
    "model.max_prompt_len": Int(1), "model.max_new_tokens": Int(1), "model.remat": Bool(),
    "model.vision": Spec((dict, object), "a dict of vision-tower sizes", optional=True),
    "model.mrope_section": Ints(1, optional=True),
    # low-rank adapters (models/lora.py, docs/TRAINING.md "LoRA"); absent or None: full fine-tuning
    "model.lora": Spec((type(None),), "None, or a block of rank, alpha, targets, init, export",
                       optional=True),
    "model.lora.rank": Int(1, optional=True), "model.lora.alpha": Float(0, optional=True),
    "model.lora.targets": Strs(LORA_TARGETS, optional=True),
    "model.lora.init": Choice(LORA_INITS, optional=True),
    "model.lora.export": Choice(("merged", "adapter"), optional=True),
    "sft.steps": Int(0), "sft.batch_size": Int(1), "sft.lr": Float(0), "sft.warmup": Int(0),
    "sft.solutions_per_instance": Int(1), "sft.targets": Choice(("sampled", "optimal")),
    "sft.freeze_vision": Bool(), "sft.vision_lr_scale": Float(0),
    # reasoning-gym tasks mixed into SFT only, never RL (training/transfer.py: sft_error; docs/GYM.md)
    "sft.gym_tasks": Spec((str,), transfer.Allowed(), lambda v: not transfer.unknown(v)),
    "dph.num_prompts": Int(1), "dph.samples": Int(1),
    "dph.correct": Choice(("feasible", "optimal")), "dph.pef_threshold": Float(0, hi=1.0),
    "dph.batch": Int(1), "dph.weighting": Choice(("separate", "per_sample")),
    "rl.algo": Choice(presets.preset_names), "rl.steps": Int(0), "rl.prompts_per_step": Int(1),
    "rl.group_size": Int(1), "rl.lr": Float(0), "rl.temperature": Float(0),
    "rl.top_p": Float(0, hi=1.0), "rl.max_grad_norm": Float(0), "rl.curriculum": Str(),
    "rl.rollout_chunks": Int(1), "rl.micro_batches": Int(0), "rl.nonfinite_patience": Int(1),
    "rl.check_recompile": Bool(), "rl.freeze_vision": Bool(), "rl.vision_lr_scale": Float(0),
    "rl.log_term_grads": Int(0),
    # the update's and reference pass's forward: each prompt once per group (steps.py
    # make_logprob_fn): "auto" where it applies, "on" required (refused where it cannot
    # apply), "off" per row
    "rl.prefix_shared": Choice(PREFIX_SHARED),
    "rl.objective.*": ANY,  # each checked by presets.objective_config, which names it
    "rl.reward.format_bonus": Float(0, open_lo=False), "rl.reward.cap": Float(0),
    "rl.reward.ground_truth": Choice(("reference", "optimal")),
    "rl.reward.compat": Choice(domain.COMPAT),
    "eval.num_per_task": Int(1), "eval.samples": Int(1), "eval.k": Int(1),
    "eval.temperature": Float(0), "eval.pass_ks": Ints(1), "eval.batch_prompts": Int(1),
    "eval.modalities": Strs(multimodal.CONTROLS, optional=True),
    "eval.zero_shot": Bool(),  # also evaluate the initial policy (before SFT)
    # reasoning-gym tasks scored on held-out instances beside the held-out evaluation, never
    # trained on (training/transfer.py, docs/GYM.md): instances and samples per task, prompt
    # length (0: the longest prompt) and completion length (0: model.max_new_tokens)
    "eval.transfer": Spec((str,), transfer.Allowed(), lambda v: not transfer.unknown(v)),
    "eval.transfer_num_per_task": Int(1), "eval.transfer_samples": Int(1),
    "eval.transfer_max_prompt_len": Int(0), "eval.transfer_max_new_tokens": Int(0),
    # configs/mm_nphard.py: the perception stage of an image policy (training/perception.py)
    "perception.steps": Int(0, optional=True), "perception.lr": Float(0, optional=True),
    "perception.warmup": Int(0, optional=True), "perception.max_new_tokens": Int(1, optional=True),
    "checkpoint.every": Int(1), "checkpoint.keep": Int(1), "checkpoint.export_hf": Bool(),
    "mesh.data": MESH_AXIS, "mesh.fsdp": MESH_AXIS, "mesh.tensor": MESH_AXIS,
    "log.every": Int(1), "log.tensorboard": Bool(), "log.plots": Bool(), "log.progress": Bool(),
    # configs/collapse.py only (the section is absent elsewhere: no collapse metrics)
    "collapse.limit": Int(1, optional=True), "collapse.time_limit": Float(0, optional=True),
    "collapse.min_optima": Int(0, optional=True), "collapse.max_optima": Int(1, optional=True),
    "collapse.keep_k": Int(1, optional=True),
    "collapse.correct": Strs(("feasible", "optimal"), optional=True),
    "collapse.pool": Int(0, optional=True),
    "collapse.splits": Spec((tuple, list), "() or three ints (A, B, C instances per task)",
                            lambda v: len(v) == 0 or (len(v) == 3 and all(_is(x, (int,)) and x >= 0
                                                                          for x in v)), True),
    "collapse.split_file": Str(optional=True),
    "collapse.sft_from": Choice(("A", "stream"), optional=True),
    "collapse.rl_from": Choice(("AB", "stream"), optional=True),
    # evaluation points along RL (training/points.py; configs/collapse.py)
    "eval.points": Int(0), "eval.points_samples": Str(), "eval.points_kl_samples": Int(0),
    # the start's pre-registered bounds at RL step 0, "B:pass_optimal@64<=0.95,...": a start
    # outside them stops the run before RL (points.parse_bounds; checked by specs.check_points)
    "eval.start_bounds": Str(),
    # image prompts (configs/mm_nphard*.py only)
    "image.size": Int(128, optional=True), "image.min_pixels": Int(1, optional=True),
    "image.max_pixels": Int(1, optional=True), "image.patch_budget": Int(1, optional=True),
    "image.cache": Int(0, optional=True),
    "image.mean": Spec((tuple, list), "three floats (per channel, pixels in [0, 1])",
                       lambda v: len(v) == 3 and all(_is(x, (int, float)) and math.isfinite(x)
                                                     for x in v), True),
    "image.std": Spec((tuple, list), "three floats > 0 (per channel)",
                      lambda v: len(v) == 3 and all(_is(x, (int, float)) and math.isfinite(x) and x > 0
                                                    for x in v), True),
}

# Fields a resume may change when --allow_config_change names them: they change how a run is
# logged, saved or laid out on devices, not what it computes.
SAFE_TO_CHANGE = ("log.every", "log.tensorboard", "log.plots", "log.progress", "checkpoint.every",
                  "checkpoint.keep", "checkpoint.export_hf", "mesh.data", "mesh.fsdp", "mesh.tensor",
                  "rl.check_recompile", "rl.nonfinite_patience", "rl.prefix_shared")
# rl.prefix_shared is among them: like the mesh, it changes the order of the same float32
# sums (log-probs within 1e-5 of the per-row forward's, tests/test_prefix_shared.py), not what
# is computed.
# Instructions to this invocation, not part of the run.
NEVER_COMPARED = ("stop_at_step", "check_memory")


def flatten(d: dict, prefix: str = "") -> dict:
  """{"rl.lr": 3e-4, ...} of a nested dict (a ConfigDict's to_dict(), or config.json)."""
  out = {}
  for k, v in d.items():
    path = prefix + str(k)
    if isinstance(v, dict) and path != "model.vision":  # model.vision is one value
      out.update(flatten(v, path + "."))
    else:
      out[path] = v
  return out


def spec_of(path: str) -> Spec | None:
  if path in SCHEMA:
    return SCHEMA[path]
  parent = path.rsplit(".", 1)[0] + ".*"
  return SCHEMA.get(parent)


def suggest(name: str, options) -> str:
  close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
  return f"; did you mean {close[0]!r}?" if close else ""


def check_fields(cfg) -> None:
  """Each field against SCHEMA: present (unless optional), of its type, in its range; no
  undeclared fields."""
  flat = flatten(cfg.to_dict())
  for path, value in flat.items():
    spec = spec_of(path)
    if spec is None:
      raise ConfigError(f"config.{path}={value!r} is not a known field{suggest(path, SCHEMA)} "
                        "(a new field is declared in dmpo_jax/training/config.py SCHEMA)")
    if spec is ANY:
      continue
    if not _is(value, spec.kinds) or not spec.ok(value):
      raise ConfigError(f"config.{path}={value!r}: must be {spec.allowed}")
  for path, spec in SCHEMA.items():
    if not spec.optional and not path.endswith(".*") and path not in flat:
      raise ConfigError(f"config.{path} is missing (must be {spec.allowed}; configs/nphard.py "
                        "declares every field)")


def task_keys(cfg) -> list[str]:
  """config.tasks: "all", or task keys separated by "," or "+"."""
  if cfg.tasks == "all":  # registered gym keys (eval.transfer, sft.gym_tasks) are not "all"
    return [k for k in domain.names() if not k.startswith(gym.PREFIX)]
  keys = [k.strip() for k in cfg.tasks.replace("+", ",").split(",") if k.strip()]
  gym.register_keys(keys)  # "gym-<name>": a reasoning-gym task with its default config
  return keys


def check_tasks(cfg) -> list[str]:
  """config.tasks' keys: at least one, each a task, none twice."""
  keys = task_keys(cfg)
  choose = f"choose 'all' or keys of {domain.names()}"
  if not keys:
    raise ConfigError(f"config.tasks={cfg.tasks!r} names no task; {choose}")
  unknown = [k for k in keys if k not in domain.names()]
  if unknown:
    raise ConfigError(f"config.tasks={cfg.tasks!r}: unknown task(s) {unknown}"
                      f"{suggest(unknown[0], domain.names())}; {choose}")
  twice = sorted({k for k in keys if keys.count(k) > 1})
  if twice:
    raise ConfigError(f"config.tasks={cfg.tasks!r} names {twice} more than once (each held-out "
                      "instance would be evaluated twice); name each task once")
  return keys


def points_samples_max(cfg) -> int:
  """The most samples per instance of the evaluation points along RL (config.eval.points,
  points_samples: "64" or "A:32,B:64"); 0 without points."""
  if not cfg.eval.points:
    return 0
  spec = str(cfg.eval.points_samples or cfg.eval.samples)
  try:
    return max(int(part.rpartition(":")[2]) for part in spec.split(","))
  except ValueError:
    raise ConfigError(f"config.eval.points_samples={spec!r}: expected N or SET:N,SET:N") from None


def check_perception(cfg, keys) -> None:
  """The perception stage (configs/mm_nphard.py): a complete block, within the SFT stage, on
  image prompts of tasks whose instances have transcripts."""
  if "perception" not in cfg:
    return
  p = cfg.perception
  missing = [f for f in ("steps", "lr", "warmup", "max_new_tokens") if f not in p]
  if missing:
    raise ConfigError(f"config.perception lacks {missing} (configs/mm_nphard.py declares them)")
  if p.steps and cfg.prompt_style not in domain.IMAGE_STYLES:
    raise ConfigError(f"config.perception.steps={p.steps} needs image prompts; config.prompt_style="
                      f"{cfg.prompt_style!r} is not one of {domain.IMAGE_STYLES}")
  if p.steps > cfg.sft.steps:
    raise ConfigError(f"config.perception.steps={p.steps} exceeds config.sft.steps={cfg.sft.steps}: "
                      "the perception stage is the first steps of the SFT stage")
  unreadable = [k for k in keys if k not in transcripts.READERS]
  if p.steps and unreadable:
    raise ConfigError(f"config.perception.steps={p.steps}: tasks {unreadable} have no transcript "
                      f"(config.tasks); supported: {sorted(transcripts.READERS)}")


def check_config(cfg, obj: presets.ObjectiveConfig, mesh) -> None:
  """Every field's type and range (SCHEMA), then the rules between fields; a ConfigError names
  the first field that is wrong. Runs before anything is built or written."""
  check_fields(cfg)
  keys = check_tasks(cfg)
  check_perception(cfg, keys)
  sft_gym = cfg.sft.gym_tasks
  why = (transfer.sft_error(sft_gym, keys, cfg.prompt_style, cfg.sft.targets == "optimal")
         or transfer.config_error(cfg.eval.transfer, keys, cfg.prompt_style, transfer.parse(sft_gym)))
  if why:
    raise ConfigError(why)
  m = cfg.model
  if m.num_heads % m.num_kv_heads:
    raise ConfigError(f"config.model.num_kv_heads={m.num_kv_heads} must divide "
                      f"config.model.num_heads={m.num_heads}")
  g = cfg.rl.group_size
  need = presets.needs(obj)
  group_error = need.group_error(g)  # a std or L_DM over one sample, Pass@k's k <= G, ...
  if group_error:
    raise ConfigError(group_error)
  rows = sharding.batch_rows(mesh)
  for name, n in (("rl.prompts_per_step", cfg.rl.prompts_per_step), ("sft.batch_size", cfg.sft.batch_size),
                  ("eval.batch_prompts", cfg.eval.batch_prompts), ("dph.batch", cfg.dph.batch)):
    if n % rows:
      raise ConfigError(f"config.{name}={n} must divide by the mesh's data x fsdp size ({rows})")
  if cfg.eval.k > cfg.eval.samples:
    raise ConfigError(f"config.eval.k={cfg.eval.k} exceeds config.eval.samples={cfg.eval.samples}")
  # pass@k needs k <= samples; an evaluation reports the ks its own sample count allows, so a k
  # is refused only when no evaluation (the final ones, the points along RL) samples enough.
  most = max(cfg.eval.samples, points_samples_max(cfg))
  big = [k for k in cfg.eval.pass_ks if k > most]
  if big:
    where = (f"config.eval.samples={cfg.eval.samples}" if most == cfg.eval.samples else
             f"the {most} samples of config.eval.points_samples")
    raise ConfigError(f"config.eval.pass_ks={tuple(cfg.eval.pass_ks)}: {big} exceed {where} "
                      "(pass@k needs k <= samples)")
  if cfg.sft.batch_size % cfg.sft.solutions_per_instance:
    raise ConfigError(f"config.sft.batch_size={cfg.sft.batch_size} must divide by "
                      f"config.sft.solutions_per_instance={cfg.sft.solutions_per_instance}")
  chunks = cfg.rl.rollout_chunks
  if cfg.rl.prompts_per_step % chunks or (cfg.rl.prompts_per_step // chunks * g) % rows:
    raise ConfigError(f"config.rl.rollout_chunks={chunks} must divide rl.prompts_per_step="
                      f"{cfg.rl.prompts_per_step}, and each piece's rows by the mesh's data x fsdp ({rows})")
  mb = cfg.rl.micro_batches
  if mb > 0 and (cfg.rl.prompts_per_step % mb or (cfg.rl.prompts_per_step // mb) % rows or (
      need.dph_store and cfg.dph.batch % mb)):
    raise ConfigError(f"config.rl.micro_batches={mb} must be 0 (auto) or divide rl.prompts_per_step="
                      f"{cfg.rl.prompts_per_step} (and dph.batch), leaving slices divisible by the "
                      f"mesh's data x fsdp size ({rows})")
  why = prefix_shared_error(cfg, need)
  if why:
    raise ConfigError(why)
  if "collapse" in cfg:
    c = cfg.collapse
    if c.max_optima < c.min_optima:
      raise ConfigError(f"config.collapse.max_optima={c.max_optima} is below "
                        f"config.collapse.min_optima={c.min_optima}")
    if c.pool and cfg.eval.num_per_task > c.pool:
      raise ConfigError(f"config.eval.num_per_task={cfg.eval.num_per_task} exceeds config.collapse.pool="
                        f"{c.pool}: with a pool, evaluation is on the pool's instances")
  if cfg.sft.targets == "optimal":
    missing = [k for k in keys if not domain.get(k).has_optima]
    if missing:
      raise ConfigError(f"config.sft.targets='optimal' needs optimal-solution enumeration, which "
                        f"{missing} lack (config.tasks); supported: {domain.with_optima()}")
  why = memory.refusal(cfg, obj, mesh, most)  # last: it sizes the run by the fields checked above
  if why:
    raise ConfigError(why)


def prefix_shared_error(cfg, need) -> str | None:
  """Why config.rl.prefix_shared="on" (the prefix-shared forward required: steps.py
  `forward_path`) cannot apply to this config's log-prob passes; None when it can, or with
  "auto" / "off"."""
  if cfg.rl.prefix_shared != "on":
    return None
  why = None
  if "vision" in cfg.model or cfg.prompt_style in domain.IMAGE_STYLES:
    why = (f"a vision-language policy (config.model.vision, config.prompt_style="
           f"{cfg.prompt_style!r}) runs image prompts per row")
  elif need.dph_store:
    why = f"{cfg.rl.algo}'s stored D_pef responses are single rows, one per prompt"
  elif cfg.rl.group_size < 2:
    why = f"config.rl.group_size={cfg.rl.group_size}: groups of one share nothing"
  elif cfg.model.max_new_tokens < 2:
    why = f"config.model.max_new_tokens={cfg.model.max_new_tokens}: one-token completions"
  return None if why is None else (f"config.rl.prefix_shared='on' cannot apply: {why}; use "
                                   "'auto' (prefix-shared where it applies) or 'off'")


# ---------------------------------------------------------------------------
# The resume contract.
def saved_config(workdir: str) -> dict | None:
  """The workdir's config.json as a dict; None when there is none (a new run)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigError(f"{path} is damaged ({type(e).__name__}: {e}); it is this workdir's contract: "
                      "restore it (a checkpoint's meta holds the config) or use another --workdir") from e
  if not isinstance(saved, dict):
    raise ConfigError(f"{path} holds a {type(saved).__name__}, not a config object")
  return saved


def transcript_targets(workdir: str) -> tuple:
  """(encoder, held-out instances, transcript length) of the image policy of the workdir's
  config.json, without building the model: what `perception.bounds` scores (for a
  perception.json written before the bound was; `with_bounds`)."""
  from ml_collections import config_dict
  from dmpo_jax.models import build
  from dmpo_jax.training import specs
  saved = saved_config(workdir)
  if saved is None:
    raise FileNotFoundError(f"{workdir} has no config.json to compute the blind bounds from")
  cfg = config_dict.ConfigDict(saved)
  _, processor = build.vlm_config(specs.model_spec(cfg))
  items = specs.taskset(cfg, task_keys(cfg)).held_out(cfg.eval.num_per_task)
  return (multimodal.make_encoder(specs.encoder_spec(cfg), processor), items,
          int(cfg.perception.max_new_tokens))


def with_bounds(res: dict, workdir: str) -> dict:
  """A perception.json's result with its `blind_bound`s (`perception.bounds`), computed from
  the workdir's config.json when the file predates them (`transcript_targets`)."""
  if "blind_bound" not in res["overall"]:
    from dmpo_jax.training import perception
    b = perception.bounds(*transcript_targets(workdir))
    res["overall"]["blind_bound"] = b["overall"]
    for key, v in b["per_task"].items():
      res["per_task"][key]["blind_bound"] = v
  return res


def config_json(cfg) -> dict:
  """The config as config.json holds it (JSON types: tuples become lists)."""
  return json.loads(cfg.to_json_best_effort())


# Fields declared after runs were saved without them, with the value their absence meant: a
# workdir whose config.json lacks one resumes unchanged when the config has that value.
ADDED_FIELDS = {"sft.gym_tasks": "", "eval.zero_shot": False, "eval.points": 0, "eval.points_samples": "",
                "eval.transfer": "", "eval.transfer_num_per_task": 6, "eval.transfer_samples": 4,
                "eval.transfer_max_prompt_len": 0, "eval.transfer_max_new_tokens": 0,
                "eval.start_bounds": "", "eval.points_kl_samples": 0,
                "rl.prefix_shared": "off"}  # runs before the field ran every forward per row


def config_changes(saved: dict, cfg) -> dict:
  """{path: (workdir's value, this config's)} for every compared field that differs."""
  old, new = flatten(saved), flatten(config_json(cfg))
  for p, meant in ADDED_FIELDS.items():
    if p not in old and new.get(p) == meant:
      old[p] = meant
  missing = object()
  return {p: (old.get(p, "<absent>"), new.get(p, "<absent>"))
          for p in sorted(set(old) | set(new))
          if p not in NEVER_COMPARED and old.get(p, missing) != new.get(p, missing)}


def check_allow(allow) -> tuple[str, ...]:
  """--allow_config_change's names: each a field in SAFE_TO_CHANGE."""
  allow = tuple(a.strip().removeprefix("config.") for a in allow if a.strip())
  for a in allow:
    if a not in SAFE_TO_CHANGE:
      what = ("changes the result" if spec_of(a) is not None else
              f"is not a config field{suggest(a, SCHEMA)}")
      raise ConfigError(f"--allow_config_change={a}: {a} {what}; a resume may change only "
                        f"{list(SAFE_TO_CHANGE)} (use another --workdir for another run)")
  return allow


def check_resume(cfg, workdir: str, allow=()) -> bool:
  """Refuse a rerun of `workdir` whose config differs from its config.json, except in fields
  `allow` names (each in SAFE_TO_CHANGE). Returns True when config.json is to be (re)written:
  a new run, or allowed changes."""
  allow = check_allow(allow)
  saved = saved_config(workdir)
  if saved is None:
    return True
  changes = config_changes(saved, cfg)
  refused = {p: v for p, v in changes.items() if p not in allow}
  if refused:
    detail = "; ".join(f"{p}: {a!r} -> {b!r}" for p, (a, b) in refused.items())
    safe = [p for p in refused if p in SAFE_TO_CHANGE]
    hint = (f" ({', '.join(safe)} may change with --allow_config_change={','.join(safe)})"
            if safe else "")
    raise ConfigError(f"{workdir} holds a run with another config ({len(refused)} field(s) differ: "
                      f"{detail}); rerun with its config.json's values or use another --workdir{hint}")
  return bool(changes)


# ---------------------------------------------------------------------------
# Command-line errors.
def flag_error(e: BaseException, argv) -> str:
  """One line for an exception raised while absl parsed the command line: config_flags raises
  AttributeError for an unknown --config.<field> (its suggestion on a second line), and wraps a
  config file's own error in a traceback."""
  raw = str(e).replace("\\n", "\n").replace("\\'", "'")
  if isinstance(e, (AttributeError, KeyError)):
    line = unknown_field(raw, argv)
    if line:
      return line
  if "Traceback" in raw:  # the config file's own error is the traceback's last line
    last = [l.strip() for l in raw.splitlines() if l.strip()][-1]
    flag = ([a for a in argv if a.startswith("--config=")] or ["--config"])[-1]  # absl: the last wins
    return f"{flag}: {re.sub(r'^[A-Za-z_.]*(Error|Exception): ', '', last)}"
  text = " ".join(raw.split())
  return re.sub(r"^flag (--\S+)", r"\1", text)


def known_fields() -> list[str]:
  """Every field path a config may hold (SCHEMA's, with rl.objective's spelt out)."""
  objective = [f"rl.objective.{name}" for name in presets.field_names()]
  return [p for p in SCHEMA if not p.endswith(".*")] + objective


def unknown_field(raw: str, argv) -> str | None:
  """The line for an unknown --config.<path>: absl names only the unknown component ('lora'
  of model.lora.rank, with its own suggestion when it has one); the line names the flag, the
  path up to that component, and the nearest field."""
  name = re.match(r"\W*(\w+)", raw)
  flags = [a.split("=", 1)[0] for a in argv if a.startswith("--config.")]
  for flag in flags if name else []:
    parts = flag[len("--config."):].split(".")
    if name.group(1) not in parts:
      continue
    i = parts.index(name.group(1))
    hint = re.search(r'Did you mean "(\w+)"', raw)
    near = ".".join(parts[:i] + [hint.group(1)] + parts[i + 1:]) if hint else ""
    tip = f"; did you mean {near!r}?" if near in known_fields() else suggest(".".join(parts), known_fields())
    return f"{flag}: config has no field {'.'.join(parts[:i + 1])!r}{tip}"
  return None


# ---------------------------------------------------------------------------
# Config files (configs/*.py): `get_config(arg)` files loaded by path, as absl's --config does.
def parse_config_args(arg: str | None, known, name: str) -> dict:
  """A config's argument string, "algo=grpo,seed=3,smoke" -> {"algo": "grpo", "seed": "3",
  "smoke": True}; an argument not in `known` is refused, naming the file `name`."""
  out = {}
  for part in filter(None, (arg or "").split(",")):
    k, eq, v = part.partition("=")
    out[k.strip()] = v.strip() if eq else True
  unknown = set(out) - set(known)
  if unknown:
    raise ValueError(f"{name}: unknown argument(s) {sorted(unknown)}; valid: {sorted(known)}")
  return out


def load_config_module(path: str):
  """The config file at `path` as a module (its own name, not on sys.path), whatever the
  working directory: how one config builds on another (`sibling`)."""
  import importlib.util
  path = os.path.abspath(path)
  name = "dmpo_jax_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None or not os.path.isfile(path):
    raise ConfigError(f"{path}: no such config file")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def sibling(config_file: str, name: str):
  """The config `name`.py beside `config_file` (a config's __file__), as a module."""
  return load_config_module(os.path.join(os.path.dirname(os.path.abspath(config_file)), name + ".py"))


def load_config(path: str, arg: str | None = None):
  """get_config(arg) of the config file at `path` (what --config=path:arg gives)."""
  return load_config_module(path).get_config(arg)
