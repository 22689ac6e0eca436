r"""Score a policy on NP tasks: a training workdir's checkpoint or a Hugging Face folder.

    python -m dmpo_jax.evaluate --workdir=runs/default --out=runs/default/eval_easy --level=easy
    python -m dmpo_jax.evaluate --hf=/models/Qwen2.5-1.5B-Instruct --style=npbench --chat \
        --tasks=TSP,knapsack --level=easy --num=20 --samples=3 --out=eval/qwen
    python -m dmpo_jax.evaluate --hf=runs/default/hf --npbench_file=bench.json --out=eval/file
    python -m dmpo_jax.evaluate --workdir=runs/default --gym=countdown,graph_color --out=eval/gym

Writes eval.json (per task, category, overall: SR@k, QR@k, SR/QR means,
pass@k, distinct feasible solutions, length), table.txt and eval.png to
--out, and prints the table. Instances come from the generators (seeds from
1,000,000, the held-out range) or from an NP-Bench file (--npbench_file: its
keyed NP_Bench.json shape, a JSON list or JSONL; see tasks/data.py).

With --npbench_file the NP-Bench protocol is the default and is printed:
each level (read from the record key) is scored separately, 3 samples per
problem at temperature 0.7, SR@3 / QR@3 against the file's ground_truth,
NP-Bench's own verdicts (--compat=npbench). With --style=npbench each
record's own ``prompt`` is used as it is (in the chat template with --chat);
with --style=compact the prompt is rebuilt from the record's ``question``.
The prompt length is sized from the longest prompt unless given. Flags set
explicitly override the protocol, and the printed line says so.
NP-Bench counts a problem as solved when a sample's ratio is above 0; SR
here counts feasible samples, which differs only for a feasible answer of
value 0 on a maximisation task (an empty independent set or schedule).

Bad input (a flag out of range, --k above --samples, a file record whose question,
ground truth, prompt or key is wrong, a prompt longer than the model's context) is
refused before anything is sampled or written: one line naming the flag, or the file,
record and field, and exit status 2 (--verbose adds the traceback). A record's question
is checked in full before the model loads (`Task.validate`, the checks the verifiers
apply: an edge to a missing vertex, a self-loop, a one-sided edge, a float where an int is
summed), as is its ground truth (our reference's, found then, where the file has none).
With --skip_invalid such records are left out instead, their count and the first ten
printed, and eval.json's "skipped" lists them all. With --chat a control token a prompt
spells (`<|im_end|>`) is encoded as text, so a record cannot forge a chat turn
(models/chat.py).

The compute dtype: an --hf model's is --dtype (float32 by default; "auto" is bfloat16 where
this machine computes it natively, float32 elsewhere, resolved by models/precision.py as a
training config's model.dtype = "auto" is); a --workdir's is its config's model.dtype ("auto"
resolved here). It is printed once (what was asked for, what it resolved to, why) and recorded
in eval.json as "precision" ({"requested", "dtype", "reason", "param_dtype"}, the record of
training's results.json). A .gguf file given to --hf takes --dtype the same way.

A vision-language policy (a Qwen2.5-VL folder, or a workdir of configs/mm_nphard.py)
is scored on the same instances in each of --modalities (default for such a policy:
image,blank,text): "image" draws the instance (--style image or npbench_image; the
workdir's, else npbench_image), "blank" is the same prompt with a white image of the
same size (the control: a policy that reads the image does worse there), "text" writes
the instance out (compact or npbench, matching the image style). eval.json holds the
first modality's scores plus "modalities": {name: scores}; table.txt adds one line per
modality. Not with --npbench_file, whose records are text.

    python -m dmpo_jax.evaluate --workdir=runs/mm --out=runs/mm/eval_modalities
    python -m dmpo_jax.evaluate --hf=/models/Qwen2.5-VL-3B-Instruct --chat --level=easy \
        --modalities=image,blank --image_size=448 --out=eval/qwen_vl
"""

from __future__ import annotations

import os
import sys

import jax
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_dict

from dmpo_jax.models import build as model_build
from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.training import config as config_lib
from dmpo_jax.training import evaluation, report, transfer
from dmpo_jax.data import pipeline
from dmpo_jax.data import images as multimodal
from dmpo_jax import tasks as tasks_lib
from dmpo_jax.models import hf
from dmpo_jax.models import precision as precision_lib
from dmpo_jax.objectives import presets
from dmpo_jax.sampling import sampler as sampler_lib
from dmpo_jax.tasks import base as tasks_base
from dmpo_jax.tasks import data as data_lib
from dmpo_jax.tasks import rewards as rewards_lib

flags.DEFINE_string("workdir", None, "a training workdir (its latest checkpoint and config)")
flags.DEFINE_string("hf", None, "a local Hugging Face model folder")
flags.DEFINE_string("out", None, "output folder")
flags.DEFINE_string("tasks", "all", "comma-separated task keys or 'all'")
flags.DEFINE_list("gym", None, "reasoning-gym tasks to score (transfer evaluation; docs/GYM.md), e.g. "
                  "countdown,chain_sum:min_terms=2:max_terms=2: held-out instances of each, with the "
                  "task's default config or the fields after its name (':'-separated, data/gym.py "
                  "parse_key), in place of the NP tasks unless --tasks is given too. Alone, it "
                  "scores them as a training run's transfer tasks (training/transfer.py): eval.json "
                  "adds \"transfer\" (mean score, full-score pass@k, distinct correct answers per "
                  "task) and \"task_configs\", and the prompt length is the longest gym prompt's "
                  "unless --max_prompt_len is given")
flags.DEFINE_string("level", None, "level (default: the workdir's, else easy)")
flags.DEFINE_integer("num", 12, "instances per task")
flags.DEFINE_string("npbench_file", None, "score an NP-Bench file (NP_Bench.json, JSON list or JSONL) "
                    "with NP-Bench's protocol, per task and level")
flags.DEFINE_integer("samples", 8, "samples per instance (with --npbench_file: 3 unless set)")
flags.DEFINE_integer("k", 3, "best-of-k for SR@k / QR@k (NP-Bench: 3)")
flags.DEFINE_float("temperature", 0.7, "sampling temperature (NP-Bench: 0.7)")
flags.DEFINE_integer("max_new_tokens", None, "default: the workdir's, else 1024")
flags.DEFINE_integer("max_prompt_len", None, "default: the workdir's, else the longest prompt")
flags.DEFINE_string("style", None, "prompt style: compact | npbench (default: workdir's, else npbench)")
flags.DEFINE_bool("chat", False, "wrap prompts in the tokenizer's chat template")
flags.DEFINE_string("compat", "strict", "verification rules: strict | npbench "
                    "(with --npbench_file: npbench unless set)")
flags.DEFINE_integer("batch_prompts", 8, "prompts per sampler call")
flags.DEFINE_string("dtype", "float32", "compute dtype of an --hf model (folder or .gguf file): "
                    "float32, bfloat16, float16, or auto (bfloat16 where this machine computes it "
                    "natively, else float32; models/precision.py). Printed and recorded in "
                    "eval.json's \"precision\". A --workdir computes in its config's model.dtype")
flags.DEFINE_integer("seed", 0, "sampling seed")
flags.DEFINE_list("modalities", None, "vision-language policies: any of image,blank,text,shuffled "
                  "(shuffled: another instance's image; default: the workdir's, else image,blank,text)")
flags.DEFINE_integer("image_size", None, "render size in pixels (default: the workdir's, else 448)")
flags.DEFINE_integer("patch_budget", None, "image patches per prompt (default: the workdir's, "
                     "else the largest image's)")
flags.DEFINE_bool("skip_invalid", False, "with --npbench_file: leave out (and count and list) the "
                  "records that fail their checks, instead of refusing the file")
flags.DEFINE_bool("verbose", False, "print the traceback of an error, not only its message")
FLAGS = flags.FLAGS
USAGE = 2  # the exit status of bad input (one line on stderr; the traceback with --verbose)


def check_flags() -> dict | None:
  """The flags' ranges, before a model is loaded or a file written; a UsageError names the flag.
  Returns --npbench_file's checked records (`read_file`), else None."""
  samples = FLAGS.samples if (FLAGS["samples"].present or not FLAGS.npbench_file) else 3
  for name, lo in (("samples", 1), ("k", 1), ("num", 1), ("batch_prompts", 1)):
    if FLAGS[name].value < lo:
      raise app.UsageError(f"--{name}={FLAGS[name].value} must be >= {lo}")
  if FLAGS.k > samples:
    raise app.UsageError(f"--k={FLAGS.k} exceeds --samples={samples} (best-of-k needs k <= samples)")
  if not (FLAGS.temperature > 0 and FLAGS.temperature < float("inf")):
    raise app.UsageError(f"--temperature={FLAGS.temperature} must be a finite number > 0")
  for name in ("max_new_tokens", "max_prompt_len", "image_size", "patch_budget"):
    if FLAGS[name].value is not None and FLAGS[name].value < 1:
      raise app.UsageError(f"--{name}={FLAGS[name].value} must be >= 1")
  dtypes = config_lib.DTYPES + (precision_lib.AUTO,)
  if FLAGS.dtype not in dtypes:
    raise app.UsageError(f"--dtype={FLAGS.dtype!r}: choose one of {list(dtypes)}")
  if FLAGS["dtype"].present and FLAGS.workdir:
    raise app.UsageError("--dtype applies to --hf models; a --workdir computes in its config's "
                         "model.dtype")
  if FLAGS.compat not in tasks_base.COMPAT:
    raise app.UsageError(f"--compat={FLAGS.compat!r}: choose one of {tasks_base.COMPAT}")
  styles = tasks_base.PROMPT_STYLES + tasks_base.IMAGE_STYLES
  if FLAGS.style is not None and FLAGS.style not in styles:
    raise app.UsageError(f"--style={FLAGS.style!r}: choose one of {styles}")
  if FLAGS.level is not None and FLAGS.level not in tasks_base.LEVELS:
    raise app.UsageError(f"--level={FLAGS.level!r}: choose one of {tasks_base.LEVELS}")
  unknown = [k for k in FLAGS.tasks.split(",") if FLAGS.tasks != "all" and k not in tasks_lib.names()]
  if unknown:
    raise app.UsageError(f"--tasks: unknown task(s) {unknown}; choose 'all' or keys of {tasks_lib.names()}")
  if FLAGS.gym:
    from dmpo_jax.data import gym
    bad = [n for n in FLAGS.gym if gym.task_name(gym.PREFIX + n) not in gym.wrapped()]
    if bad:
      raise app.UsageError(f"--gym: {bad} not wrapped; choose from {gym.wrapped()}")
    for n in FLAGS.gym:  # each task's fields, and its dataset built, before the model loads
      try:
        gym.register_keys([gym.PREFIX + n])
      except (ImportError, ValueError) as e:
        raise app.UsageError(f"--gym={n}: {e}") from None
    if FLAGS.npbench_file:
      raise app.UsageError("--gym and --npbench_file score different instances; give one")
  if FLAGS.skip_invalid and not FLAGS.npbench_file:
    raise app.UsageError("--skip_invalid applies to --npbench_file's records")
  return read_file() if FLAGS.npbench_file else None  # every record checked before the model loads


def read_file() -> dict:
  """--npbench_file's records, each checked as the verifiers check it (tasks/data.py), with its
  ground truth (the file's, else our reference, found here): {"records", "names", "gts",
  "skipped"}. A bad record raises a DataError naming the file and the record, or with
  --skip_invalid is left out and listed in "skipped" ({"record", "index", "error"})."""
  path = FLAGS.npbench_file
  checked = data_lib.read_npbench_checked(path, skip_invalid=FLAGS.skip_invalid)
  skipped = checked.skipped
  out = {"records": [], "names": [], "gts": [], "skipped": skipped}
  for name, i, r in zip(checked.names, checked.indices, checked.records):
    try:
      gt = reference_ground_truth(r) if r.get("ground_truth") is None else float(r["ground_truth"])
    except data_lib.DataError as e:
      message = f"{path}: record {name}: {e}{data_lib.record_context(i, checked.total, name, r)}"
      if not FLAGS.skip_invalid:
        raise data_lib.DataError(message) from None
      skipped.append({"record": name, "index": i, "error": message})
      continue
    out["records"].append(r)
    out["names"].append(name)
    out["gts"].append(gt)
  if not out["records"]:
    raise data_lib.DataError(f"{path}: none of its records is valid (first: {skipped[0]['error']})")
  if skipped:
    print(f"skipped {len(skipped)} invalid record(s) of {path} (--skip_invalid); kept "
          f"{len(out['records'])}:", flush=True)
    for s in skipped[:10]:
      print(f"  {s['error']}", flush=True)
    if len(skipped) > 10:
      print(f"  ... and {len(skipped) - 10} more (eval.json's \"skipped\" lists them all)", flush=True)
  return out


def reference_ground_truth(record: dict) -> float:
  """Our reference value of a record without a ground truth; an instance our reference cannot
  solve (a subset sum no subset reaches, a graph with no cycle) is a DataError."""
  try:
    return tasks_lib.get(record["task_type"]).reference_value(record["question"])
  except (RuntimeError, AssertionError) as e:
    raise data_lib.DataError(f"no ground_truth, and our reference finds no solution ({e})") from None


def load_policy():
  """(graphdef, params, tokenizer, defaults) from --workdir or --hf."""
  if bool(FLAGS.workdir) == bool(FLAGS.hf):
    raise app.UsageError("give exactly one of --workdir and --hf")
  if FLAGS.hf:
    prec = precision_lib.resolve(FLAGS.dtype, field="--dtype")
    model, tok = hf.load(FLAGS.hf, dtype=prec.dtype)
    if tok is None:
      raise app.UsageError(f"{FLAGS.hf} has no tokenizer files")
    graphdef, state = nnx.split(model)
    return graphdef, state, tok, {"precision": precision_record(prec, "--dtype", model)}
  from dmpo_jax.training import run as run_lib, specs
  saved = config_lib.saved_config(FLAGS.workdir)
  if saved is None:
    raise app.UsageError(f"{FLAGS.workdir} is not a training workdir (no config.json)")
  cfg = config_dict.ConfigDict(saved)
  prec = specs.model_precision(cfg)  # the workdir's model.dtype, "auto" resolved here
  model, tok = model_build.build(specs.model_spec(cfg, prec))
  graphdef, state = nnx.split(model)
  if not os.path.isdir(os.path.join(FLAGS.workdir, "checkpoints")):
    raise app.UsageError(f"{FLAGS.workdir} has no checkpoint yet")
  ck = ckpt_lib.Checkpointer(os.path.join(FLAGS.workdir, "checkpoints"))
  step = ck.usable_step(set_aside=False)  # read only: a damaged newer step is reported, not moved
  if step is None:
    raise app.UsageError(f"{FLAGS.workdir} has no checkpoint yet")
  params = {"model": state}
  obj = run_lib.objective_from_config(cfg)
  if presets.needs(obj).log_z:
    from dmpo_jax.objectives import flowrl
    params["log_z"] = flowrl.init_log_z_head(jax.random.key(0), model.cfg.hidden_size)
  params, meta = ck.restore_params(step, params, model_build.shape(model))
  print(f"loaded {FLAGS.workdir} step {step} ({meta['stage']})")
  image = cfg.get("image") or {}
  return graphdef, params["model"], tok, {
      "level": cfg.level, "style": cfg.prompt_style, "max_new_tokens": cfg.model.max_new_tokens,
      "max_prompt_len": cfg.model.max_prompt_len, "chat": cfg.chat_template,
      "image_size": image.get("size"), "patch_budget": image.get("patch_budget"),
      "modalities": (cfg.get("eval") or {}).get("modalities"),
      "precision": precision_record(prec, "the workdir's model.dtype", model)}


def precision_record(prec: precision_lib.Precision, source: str, model) -> dict:
  """eval.json's "precision" (as training's results.json records it: the compute dtype asked
  for, what it resolved to and why, and the weights' param_dtype), printed once."""
  param_dtype = getattr(model.cfg, "text", model.cfg).param_dtype  # a VLConfig: its text model's
  print(f"compute dtype {prec.dtype} ({source}={prec.requested!r}: {prec.reason}); parameters "
        f"{param_dtype}", flush=True)
  return dict(prec.record(), param_dtype=param_dtype)


class FilePromptEncoder(pipeline.PromptEncoder):
  """Encodes a file's records by their own ``prompt`` text (NP-Bench style, used as is)."""

  def __init__(self, tokenizer, style, max_prompt_len, chat_template, prompts: dict):
    super().__init__(tokenizer, style, max_prompt_len, chat_template)
    self.prompts = prompts  # id(question) -> the record's prompt text

  def prompt_text(self, key: str, q: dict) -> str:
    text = self.prompts.get(id(q))
    if text is None or self.style != "npbench":
      return super().prompt_text(key, q)
    return text


RECORD_NAMES: dict = {}  # id(question) -> the file's record name, for messages


def prompt_lengths(encoder, groups: dict, max_new_tokens: int, context: int) -> int:
  """The longest prompt's length in tokens; a UsageError names the first record (or task)
  whose prompt and completion do not fit the model's context (max_position_embeddings)."""
  longest = 0
  for items, _, _ in groups.values():
    for k, q in items:
      n = len(encoder.encode(k, q))
      if n + max_new_tokens > context:
        where = (f"{FLAGS.npbench_file}: record {RECORD_NAMES[id(q)]}: prompt"
                 if id(q) in RECORD_NAMES else f"a {k} prompt")
        raise app.UsageError(f"{where} has {n} tokens; with --max_new_tokens={max_new_tokens} "
                             f"that exceeds the model's context of {context} positions")
      longest = max(longest, n)
  return longest


def file_protocol(style: str, default_level: str, loaded: dict | None = None) -> tuple[dict, dict]:
  """The NP-Bench protocol for --npbench_file: {level: (items, ground truths, prompts)} and
  a description of the settings used (explicit flags override NP-Bench's). loaded: the file
  as `read_file` returned it (read here when None)."""
  loaded = read_file() if loaded is None else loaded  # each record checked
  groups: dict = {}
  for name, r, gt in zip(loaded["names"], loaded["records"], loaded["gts"]):
    items, gts, prompts = groups.setdefault(r.get("level") or default_level, ([], [], {}))
    items.append((r["task_type"], r["question"]))
    gts.append(gt)
    if style == "npbench" and isinstance(r.get("prompt"), str):
      prompts[id(r["question"])] = r["prompt"]
    RECORD_NAMES[id(r["question"])] = name
  proto = {"samples": FLAGS.samples if FLAGS["samples"].present else 3,
           "k": FLAGS.k, "temperature": FLAGS.temperature,
           "compat": FLAGS.compat if FLAGS["compat"].present else "npbench",
           "ground_truth": "the file's ground_truth (our reference where absent)",
           "success": "feasible with quality ratio > 0, as NP-Bench counts SR",
           "prompts": "the file's own prompt" if style == "npbench" else "compact, rebuilt from question"}
  npbench = proto["samples"] == 3 and proto["k"] == 3 and proto["temperature"] == 0.7 and \
      proto["compat"] == "npbench"
  proto["name"] = "NP-Bench" if npbench else "NP-Bench with overrides"
  return groups, proto


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS.out:
    raise app.UsageError("--out is required")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    loaded = check_flags()
    run(loaded)
  except (app.UsageError, data_lib.DataError, config_lib.ConfigError, ckpt_lib.CheckpointError,
          ValueError, KeyError) as e:  # the project's own errors name what is wrong
    if FLAGS.verbose:
      import traceback
      traceback.print_exception(e)
    print(f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr, flush=True)
    sys.exit(USAGE)


def run(loaded: dict | None = None):
  """Load the policy, sample and score; loaded: --npbench_file's checked records (`read_file`)."""
  graphdef, params, tok, d = load_policy()
  vl = hasattr(tok, "image_processor")  # a VLProcessor: a vision-language policy
  if vl:
    return evaluate_vlm(graphdef, params, tok, d)
  style = FLAGS.style or d.get("style", "npbench")
  level = FLAGS.level or d.get("level", "easy")
  chat = FLAGS.chat or d.get("chat", False)
  samples, compat, proto = FLAGS.samples, FLAGS.compat, None
  if FLAGS.npbench_file:
    groups, proto = file_protocol(style, level, loaded)
    samples, compat = proto["samples"], proto["compat"]
    print(f"protocol: {proto['name']} -- {samples} samples per problem at temperature "
          f"{FLAGS.temperature}, SR@{FLAGS.k}/QR@{FLAGS.k} per task and level, compat={compat}, "
          f"ground truth from the file, prompts: {proto['prompts']}")
  else:
    keys = eval_task_keys()
    ts = pipeline.TaskSet(keys, level, 0)
    items = ts.held_out(FLAGS.num, level)
    groups = {level: (items, [tasks_lib.get(k).reference_value(q) for k, q in items], {})}
  # --gym alone: scored as a training run's transfer tasks are (training/transfer.py), with the
  # full-score metrics; prompts sized to the longest gym prompt, not the workdir's NP prompts.
  gym_only = bool(FLAGS.gym) and not FLAGS.npbench_file and not FLAGS["tasks"].present
  prompts = {i: t for _, _, p in groups.values() for i, t in p.items()}
  probe = FilePromptEncoder(tok, style, 10**9, chat, prompts)
  new_tokens = FLAGS.max_new_tokens or d.get("max_new_tokens", 1024)
  longest = prompt_lengths(probe, groups, new_tokens, nnx.merge(graphdef, params).cfg.max_position_embeddings)
  plen = FLAGS.max_prompt_len or (None if gym_only else d.get("max_prompt_len")) or longest
  if longest > plen:
    raise app.UsageError(f"the longest prompt has {longest} tokens > --max_prompt_len={plen}")
  encoder = FilePromptEncoder(tok, style, plen, chat, prompts)
  scfg = sampler_lib.SamplingConfig(max_new_tokens=new_tokens,
                                    num_samples=samples, temperature=FLAGS.temperature, eos_id=tok.eos_token_id,
                                    pad_id=encoder.pad, stop_ids=encoder.stop_ids)
  sample = jax.jit(lambda p, pt, pm, rng: sampler_lib.generate_padded(graphdef, p, pt, pm, rng, scfg))
  def sample_fn(pt, pm, rng):
    r = sample(params, pt, pm, rng)
    return r.tokens, r.mask
  results = {}
  for lv, (items, gts, _) in groups.items():
    results[lv] = (transfer.score if gym_only else evaluation.evaluate)(
        sample_fn, encoder, items, rng=jax.random.key(FLAGS.seed), ground_truths=gts,
        spec=evaluation.ScoreSpec(
            samples=samples, batch_prompts=FLAGS.batch_prompts, prompt_len=plen,
            reward_cfg=rewards_lib.RewardConfig(compat=compat), k=FLAGS.k,
            pass_ks=tuple(sorted({1, FLAGS.k, samples})),
            success="positive_ratio" if proto is not None else "feasible", progress=True))
  if proto is None:
    res = results[level]
    table = evaluation.format_table(res)
    if gym_only:
      table += "\n\nfull = a full score (a correct answer):\n" + transfer.format_table(res["transfer"])
    plots = {"eval.png": res}
  else:  # per level, as NP-Bench reports
    skipped = (loaded or {}).get("skipped", [])
    res = {"protocol": proto, "levels": results,
           "num_problems": sum(r["num_problems"] for r in results.values()),
           "skipped": {"count": len(skipped), "records": skipped}}
    table = "\n\n".join(f"level {lv}\n{evaluation.format_table(r)}" for lv, r in results.items())
    if skipped:
      table += (f"\n\nskipped {len(skipped)} invalid record(s) of {FLAGS.npbench_file} "
                "(--skip_invalid; eval.json's \"skipped\" lists them)")
    plots = {("eval.png" if len(results) == 1 else f"eval_{lv}.png"): r for lv, r in results.items()}
  write_outputs(res, table, plots, d["precision"])


def eval_task_keys() -> list[str]:
  """The generated instances' task keys: --tasks (NP tasks), or the --gym tasks ("gym-<name>"
  with the fields given, registered here), or both when --tasks is given explicitly beside --gym."""
  np_keys = tasks_lib.names() if FLAGS.tasks == "all" else FLAGS.tasks.split(",")
  np_keys = [k for k in np_keys if not k.startswith("gym-")]
  if not FLAGS.gym:
    return np_keys
  from dmpo_jax.data import gym
  gym_keys = [gym.PREFIX + n for n in FLAGS.gym]
  gym.register_keys(gym_keys)
  return (np_keys if FLAGS["tasks"].present else []) + gym_keys


def write_outputs(res: dict, table: str, plots: dict, precision: dict) -> None:
  """eval.json (with the policy's `precision_record`) and table.txt (atomically), then the
  plots: a plot that fails is a warning."""
  report.write_json(dict(res, precision=precision), os.path.join(FLAGS.out, "eval.json"))
  data_lib.atomic_write(os.path.join(FLAGS.out, "table.txt"), lambda f: f.write(table + "\n"))
  for name, r in plots.items():
    report.plot_or_warn(report.plot_before_after, None, r, os.path.join(FLAGS.out, name))
  print(table)
  print(f"wrote {FLAGS.out}/eval.json, table.txt and plots")


def evaluate_vlm(graphdef, params, processor, d: dict) -> None:
  """--modalities of the same held-out instances for a vision-language policy."""
  if FLAGS.npbench_file:
    raise app.UsageError("--npbench_file holds text prompts; score a vision-language policy on "
                         "generated instances (--tasks, --level, --num)")
  style = FLAGS.style or d.get("style") or "npbench_image"
  if style not in tasks_lib.IMAGE_STYLES:
    raise app.UsageError(f"--style={style}: a vision-language policy takes an image style "
                         f"{tasks_lib.IMAGE_STYLES} (its text counterpart is the 'text' modality)")
  modalities = FLAGS.modalities or d.get("modalities") or multimodal.MODALITIES
  level = FLAGS.level or d.get("level", "easy")
  keys = tasks_lib.names() if FLAGS.tasks == "all" else FLAGS.tasks.split(",")
  items = pipeline.TaskSet(keys, level, 0).held_out(FLAGS.num, level)
  gts = [tasks_lib.get(k).reference_value(q) for k, q in items]
  cache = multimodal.ImageCache(processor, FLAGS.image_size or d.get("image_size") or 448)
  encoder = multimodal.ImagePromptEncoder(processor, style, 10**9, FLAGS.chat or d.get("chat", False),
                                          cache=cache)
  budget = FLAGS.patch_budget or d.get("patch_budget") or max(
      len(encoder.images(k, q)["pixel_values"]) for k, q in items)
  vl_cfg = nnx.merge(graphdef, params).cfg
  scfg = sampler_lib.SamplingConfig(max_new_tokens=FLAGS.max_new_tokens or d.get("max_new_tokens", 1024),
                                    num_samples=FLAGS.samples, temperature=FLAGS.temperature,
                                    eos_id=processor.tokenizer.eos_token_id, pad_id=encoder.pad,
                                    stop_ids=encoder.stop_ids)
  sample = jax.jit(lambda p, pt, pm, rng, im: sampler_lib.generate_padded(graphdef, p, pt, pm, rng, scfg, im))

  def run_eval(enc, plen, images):
    def sample_fn(pt, pm, rng, im):
      r = sample(params, pt, pm, rng, im)
      return r.tokens, r.mask
    return evaluation.evaluate(
        sample_fn, enc, items, rng=jax.random.key(FLAGS.seed), ground_truths=gts,
        spec=evaluation.ScoreSpec(
            samples=FLAGS.samples, batch_prompts=FLAGS.batch_prompts, prompt_len=plen,
            reward_cfg=rewards_lib.RewardConfig(compat=FLAGS.compat), k=FLAGS.k,
            pass_ks=tuple(sorted({1, FLAGS.k, FLAGS.samples})), progress=True, images=images))

  images_fn = lambda chunk, pt, pm, enc: multimodal.image_inputs(vl_cfg, enc, chunk, pt, pm, budget)
  res = multimodal.evaluate_modalities(run_eval, encoder, items, modalities, images_fn,
                                       FLAGS.max_prompt_len or d.get("max_prompt_len"))
  print(f"render + preprocessing: {cache.ms_per_instance:.1f} ms per instance ({cache.misses} drawn, "
        f"{cache.hits} cache hits)")
  table = (f"{evaluation.format_table(res)}\n\nthe same instances by modality (table above: "
           f"{res['modality']}):\n{report.format_modalities(res)}")
  write_outputs(res, table, {"eval.png": res}, d["precision"])


if __name__ == "__main__":
  app.run(main)
