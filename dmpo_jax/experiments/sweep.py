r"""Run presets x settings x seeds of one config, one folder per run, then one report.

The runner is generic: what to sweep is a study's `Design` (run labels -> config overrides,
families, pre-registered contrasts, tiers, the matched analysis), which the study's entry
point passes to `main` (studies/<study>/design.py; this module imports no study):

    python -m studies.collapse_frontier.sweep --config=configs/collapse.py --out=runs/sweep    # every label x 5 seeds
    python -m studies.collapse_frontier.sweep --config=configs/collapse.py --out=runs/sweep \
        --presets=grpo,dmpo-2-a1_15 --seeds=0-4 --set=rl.steps=120
    python -m studies.collapse_frontier.sweep --config=configs/collapse.py --out=/tmp/sw --smoke --presets=grpo,dmpo --seeds=0,1
    python -m studies.collapse_frontier.sweep --out=runs/sweep --report_only                     # rebuild the report

Run directly, without a study, it sweeps the config as it is: one label, "config" (seeds, and
--set for every run), and its report has no pre-registered contrasts:

    python -m dmpo_jax.experiments.sweep --config=configs/nphard.py --out=runs/seeds --seeds=0-2

Layout of --out: `<label>/seed<k>/` (an ordinary training workdir per run),
`_sft/seed<k>/` (the shared SFT stage and evaluation before RL of seed k),
`_jax_cache/` (compiled functions, reused by later runs and later sweeps),
`sweep.json` (what was asked), `report.md`, `report.json`, `*.png`
(dmpo_jax.experiments.report).

Resuming: rerun the same command. A finished run (results.json and every
evaluation point its config.json plans) is skipped; an interrupted one resumes
from its own checkpoint (the trainer's resume). A run with a missing point and
a newer checkpoint or results.json resumes from its last checkpoint at or before
that point (`rewind`: what came after moves to `<run>/superseded/<n>/`). A
first Ctrl-C lets the trainer save and stops the sweep; the report is written
for what has finished.

The start's bounds (config.eval.start_bounds, e.g. --set=eval.start_bounds=B:pass_optimal@64<=0.95):
a run whose policy at RL step 0 is outside them stops before RL (its stopped.json holds the
measured values), and so does the sweep: every label of a seed starts from that policy. The
report marks the run "out_of_bounds"; it is never analysed. The exit status is then 1.

Several processes (--processes=N): N workers of the same command share --out, each pinned to
a core with single-threaded XLA and given whole seeds (dmpo_jax/experiments/workers.py); the
parent writes sweep.json and the report once.

Merging (--merge_from): another sweep folder's finished runs move in when its
recorded base config (sweep.json "config": the config after --set) gives each of
its labels the same run config as ours, up to fields that do not change a result
(`merge_differences`); else nothing moves and the differences are listed.

Sharing: the SFT stage depends on the seed and on the config's non-RL fields
only, so it runs once per seed (stopping at the end of SFT) and each run's
folder starts as a copy of its final checkpoint and metrics; the first run of
a seed evaluates the SFT policy and its eval_before.json is copied to the
seed's later runs. A run then equals an unshared one step for step
(tests/experiments/test_sweep.py). A setting that changes a field outside SHARE_SAFE
trains its own SFT stage.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import sys
import time
import traceback

from dmpo_jax.experiments import workers
from dmpo_jax.training import config as config_lib


@dataclasses.dataclass(frozen=True)
class Design:
  """What a study sweeps (its folder's design.py builds one; the runner imports no study).

  settings: run label -> overrides of config fields ({"rl.algo": "dmpo", "rl.lr": 1e-4}),
    applied after the config file and --smoke; --set overrides apply to every run.
  families: methods of the matched comparison, each a list of labels along one strength axis.
  contrasts: the pre-registered (family, family) pairs, Holm-corrected together.
  tiers: named label lists that --presets accepts beside labels ("tier1": [...]).
  baseline: the label the report's paired differences are against (and the matching reference).
  analysis: the pre-registered matched analysis (frontier.Analysis) the report runs; None: none.
  settings, families, contrasts and baseline are recorded in sweep.json."""
  settings: dict
  families: dict = dataclasses.field(default_factory=dict)
  contrasts: list = dataclasses.field(default_factory=list)
  tiers: dict = dataclasses.field(default_factory=dict)
  baseline: str = "grpo"
  analysis: object = None


AS_IS = "config"  # without a study: the one label, the config file as it is (with --set)


def as_is() -> Design:
  """The design of a sweep without a study: seeds of the config as it is."""
  return Design(settings={AS_IS: {}}, baseline=AS_IS)

# Fields a setting may change while still sharing the seed's SFT stage and evaluation before RL
# (a prefix ending in "." covers a whole group). Everything else (model, SFT, tasks, level,
# evaluation, rewards, curriculum, mesh) shapes the SFT policy or its evaluation.
SHARE_SAFE = ("rl.algo", "rl.objective.", "rl.steps", "rl.prompts_per_step", "rl.group_size", "rl.lr",
              "rl.temperature", "rl.top_p", "rl.max_grad_norm", "rl.rollout_chunks",
              "rl.micro_batches", "rl.nonfinite_patience", "rl.check_recompile", "rl.log_term_grads",
              "rl.prefix_shared", "dph.",
              "stop_at_step", "check_memory", "log.", "checkpoint.")
SFT_DIR = "_sft"
# Evaluations that every run of a seed shares: of the initial policy (config.eval.zero_shot,
# made by the SFT stage; without them a run's results.json would lack "zero_shot"), of the SFT
# policy before RL (NP-Bench and the transfer tasks), and the first evaluation point along RL
# (training/points.py; redone where a run's temperature differs).
SHARED_EVALS = ("eval_zero_shot.json", "eval_transfer_zero_shot.json", "eval_before.json",
                "eval_transfer_before.json", "points/rl0.json")
CACHE_DIR = "_jax_cache"
SUPERSEDED = "superseded"  # in a run folder: what a rewind moved aside (`rewind`)


class SweepError(ValueError):
  """Bad sweep input (a label, a seed list, an override); the message names it."""


# ---------------------------------------------------------------------------
# Input: config file, seeds, overrides.
def load_config(spec: str, smoke: bool = False):
  """A config from `path.py[:args]` (the file's get_config(args)); --smoke adds `smoke`."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise SweepError(f"--config={spec!r}: no file {path!r}")
  if smoke:
    arg = ",".join(filter(None, [arg, "smoke"]))
  return config_lib.load_config(path, arg or None)


def parse_seeds(text: str) -> list[int]:
  """'0-4' -> [0..4]; '0,2,7' -> [0, 2, 7]; ranges and items mix ('0-2,9')."""
  seeds = []
  for part in filter(None, (p.strip() for p in str(text).split(","))):
    lo, dash, hi = part.partition("-")
    try:
      seeds.extend(range(int(lo), int(hi) + 1) if dash else [int(part)])
    except ValueError:
      raise SweepError(f"--seeds={text!r}: {part!r} is not an integer or a range like 0-4") from None
  if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
    raise SweepError(f"--seeds={text!r}: need distinct non-negative seeds")
  return seeds


def parse_value(text: str):
  """A --set value: a Python literal (number, bool, tuple, None) or else the string itself."""
  import ast
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def parse_sets(items) -> dict:
  out = {}
  for item in items or ():
    key, eq, value = item.partition("=")
    if not eq or not key.strip():
      raise SweepError(f"--set={item!r}: expected field.path=value, e.g. rl.steps=120")
    out[key.strip()] = parse_value(value.strip())
  return out


def apply_overrides(cfg, overrides: dict, what: str):
  """A copy of cfg with `overrides` ({"rl.group_size": 16}) set; unknown fields name themselves."""
  cfg = copy.deepcopy(cfg)
  for path, value in overrides.items():
    node = cfg
    *parents, leaf = path.split(".")
    for i, p in enumerate(parents):
      if p not in node:
        raise SweepError(f"{what}: config has no field {'.'.join(parents[:i + 1])!r} (in {path!r})")
      node = node[p]
    if leaf not in node:
      raise SweepError(f"{what}: config has no field {path!r}; fields there: {sorted(node.keys())}")
    try:
      node[leaf] = value
    except TypeError as e:
      raise SweepError(f"{what}: {path}={value!r}: {e}") from None
  return cfg


def share_safe(path: str) -> bool:
  """Whether a config field ("rl.lr") is in SHARE_SAFE (itself or a group it belongs to)."""
  return any(path == s or (s.endswith(".") and path.startswith(s)) for s in SHARE_SAFE)


def sft_key(cfg) -> str:
  """The config with the SHARE_SAFE fields removed: runs with equal keys share the SFT stage."""
  def walk(d, prefix):
    out = {}
    for k, v in d.items():
      path = prefix + k
      if share_safe(path):
        continue
      out[k] = walk(v, path + ".") if isinstance(v, dict) else v
    return out
  return json.dumps(walk(cfg.to_dict(), ""), sort_keys=True, default=repr)


@dataclasses.dataclass
class Run:
  label: str
  seed: int
  cfg: object
  shared: bool  # starts from the seed's shared SFT stage

  @property
  def name(self) -> str:
    return f"{self.label}/seed{self.seed}"


def check_objective(cfg) -> str | None:
  """None if the run's objective builds, else the reason (e.g. an unregistered policy loss)."""
  from dmpo_jax.objectives import presets
  overrides = {k: v for k, v in cfg.rl.objective.items() if v is not None}
  try:
    presets.objective_config(cfg.rl.algo, **overrides)
  except (ValueError, KeyError, TypeError) as e:
    return str(e)
  return None


def plan(base, labels, seeds, sets: dict, share: bool = True, log=print, *, settings: dict) -> list[Run]:
  """The runs, label-major (settings: a design's label -> overrides); labels whose objective
  cannot be built are skipped with a message."""
  unknown = [l for l in labels if l not in settings]
  if unknown:
    raise SweepError(f"--presets: unknown label(s) {unknown}; choose from {list(settings)}")
  base = apply_overrides(base, sets, "--set")
  runs = []
  for label in labels:
    cfg = apply_overrides(base, settings[label], f"setting {label!r}")
    why = check_objective(cfg)
    if why is not None:
      log(f"skipping {label}: its objective cannot be built here ({why})")
      continue
    shared = share and cfg.sft.steps > 0 and sft_key(cfg) == sft_key(base)
    if share and not shared:
      log(f"{label}: changes a field outside SHARE_SAFE (or has no SFT); it trains its own SFT stage")
    for seed in seeds:
      c = copy.deepcopy(cfg)
      c.seed = seed
      runs.append(Run(label, seed, c, shared))
  return runs


# ---------------------------------------------------------------------------
# Running.
def enable_compile_cache(directory: str) -> None:
  """JAX's persistent compilation cache: a run's jitted functions are loaded from disk when an
  earlier run (in this process or another) compiled the same program."""
  import jax
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", os.path.abspath(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def is_finished(workdir: str) -> bool:
  """results.json and every evaluation point the run's config.json plans (the report's
  "finished"); a damaged config.json is not finished (the trainer names it)."""
  from dmpo_jax.experiments import report as sweep_report
  from dmpo_jax.training import report
  if not os.path.exists(os.path.join(workdir, "results.json")):
    return False
  path = os.path.join(workdir, "config.json")
  config, _ = report.read_result(path) if os.path.exists(path) else ({}, None)
  return config is not None and not sweep_report.missing_points(workdir, config)


def checkpoint_steps(workdir: str) -> list[int]:
  """The step folders under <workdir>/checkpoints, ascending."""
  d = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(d):
    return []
  return sorted(int(n) for n in os.listdir(d) if n.isdigit() and os.path.isdir(os.path.join(d, n)))


def superseded_dir(workdir: str) -> str:
  """A new, numbered folder <workdir>/superseded/<n>/ (1, 2, ...: one per rewind)."""
  root = os.path.join(workdir, SUPERSEDED)
  taken = [int(n) for n in os.listdir(root) if n.isdigit()] if os.path.isdir(root) else []
  d = os.path.join(root, str(max(taken, default=0) + 1))
  os.makedirs(d)
  return d


def rewind_plan(workdir: str) -> tuple[list[str], int | None, list[int]] | None:
  """What `rewind` moves ([paths relative to the workdir]), the checkpoint the rerun resumes
  from (None: none is left) and the missing points' RL steps; None when nothing is to move:
  every planned point is there, or the trainer reaches the first missing one anyway (no
  results.json and no checkpoint past it)."""
  from dmpo_jax.experiments import report as sweep_report
  from dmpo_jax.training import lock as lock_lib
  from dmpo_jax.training import points
  config = config_lib.saved_config(workdir)
  missing = sweep_report.missing_points(workdir, config) if config is not None else []
  if not missing:
    return None
  sft = int(config.get("sft", {}).get("steps") or 0)
  first = sft + missing[0]
  steps = checkpoint_steps(workdir)
  finished = os.path.exists(os.path.join(workdir, "results.json"))
  if not finished and all(st <= first for st in steps):
    return None
  keep = [st for st in steps if st <= first]
  if not keep:  # from the start: everything but the run's contract (and the lock)
    return [n for n in sorted(os.listdir(workdir)) if n not in ("config.json", SUPERSEDED)
            and not n.startswith(lock_lib.LOCK_FILE)], None, missing
  resume = max(keep)
  later = [os.path.join(points.DIR, f"rl{st}.json") for st in sweep_report.planned_points(config)
           if sft + st > resume]
  moves = ([os.path.join("checkpoints", str(st)) for st in steps if st > resume] + later
           + ["results.json", "eval_after.json"])
  return [m for m in moves if os.path.exists(os.path.join(workdir, m))], resume, missing


def rewind(workdir: str, log=print) -> str | None:
  """Before a rerun of a run with a missing evaluation point and a newer checkpoint or
  results.json (killed between a checkpoint and its point under an older trainer, or a file
  lost): move what came after the point into <workdir>/superseded/<n>/ (newer checkpoints,
  later points, results.json, eval_after.json; a copy of metrics.jsonl, whose rows after the
  checkpoint the resume cuts off) so that the trainer resumes from the last checkpoint at or
  before the point and computes it. Without such a checkpoint everything but config.json
  moves: a shared run is then seeded again from its SFT stage (`execute`), an unshared one
  trains from scratch. Nothing is deleted. It holds the run's lock while it moves (LockHeld:
  another process trains the run). Returns what was done, None when nothing was."""
  from dmpo_jax.training import lock as lock_lib
  if rewind_plan(workdir) is None:
    return None
  with lock_lib.acquire(workdir, log=log):
    plan_ = rewind_plan(workdir)  # again, under the lock
    return None if plan_ is None else move_aside(workdir, *plan_)


def move_aside(workdir: str, moves: list[str], resume: int | None, missing: list[int]) -> str:
  """`rewind`'s moves into a new superseded folder, with why.txt; returns what was done."""
  aside = superseded_dir(workdir)
  if resume is not None and os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    shutil.copyfile(os.path.join(workdir, "metrics.jsonl"), os.path.join(aside, "metrics.jsonl"))
  for m in moves:
    os.makedirs(os.path.dirname(os.path.join(aside, m)), exist_ok=True)
    shutil.move(os.path.join(workdir, m), os.path.join(aside, m))
  start = f"checkpoint {resume}" if resume is not None else "the start (no checkpoint at or before it)"
  what = (f"no evaluation point at RL step {', '.join(map(str, missing))}: rerun from {start}; "
          f"moved aside into {aside}: {', '.join(moves) or 'nothing'}")
  with open(os.path.join(aside, "why.txt"), "w") as f:
    f.write(what + "\n")
  return what


def _copy_file(src: str, dst: str) -> None:
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  tmp = dst + ".tmp"
  shutil.copyfile(src, tmp)
  os.replace(tmp, dst)


class Stopped(Exception):
  """The trainer saved and stopped on a signal: the sweep stops (rerun to resume)."""


def call_train(train_fn, cfg, workdir: str) -> dict:
  res = train_fn(cfg, workdir)
  if res.get("stopped") and res.get("step") != cfg.stop_at_step:
    raise Stopped(f"{workdir} stopped at step {res.get('step')}")
  return res


def prepare_sft(train_fn, run: Run, out: str, log=print, poll_s: float = 30.0) -> str:
  """The seed's shared SFT folder, trained (once) up to the end of SFT. While another
  process holds its workdir lock (a second sweep process on the same seed, or one on another
  host), this one waits, polling every poll_s seconds, and uses that stage's checkpoint once
  it exists (or trains what the other left undone)."""
  from dmpo_jax.training import lock as lock_lib
  d = os.path.join(out, SFT_DIR, f"seed{run.seed}")
  steps = run.cfg.sft.steps
  done = lambda: os.path.isdir(os.path.join(d, "checkpoints", str(steps)))
  waiting_for = None
  while not done():
    try:
      lock_lib.check(d)  # before train_fn builds the model
      if done():  # the holder finished between our first look and its release
        break
      log(f"SFT stage of seed {run.seed} -> {d}")
      cfg = copy.deepcopy(run.cfg)
      cfg.stop_at_step = steps
      res = call_train(train_fn, cfg, d)
    except lock_lib.LockHeld as e:
      if e.holder is None:  # not a lock record: waiting would never end
        raise
      if e.holder != waiting_for:
        log(f"SFT stage of seed {run.seed}: waiting ({e})")
        waiting_for = e.holder
      time.sleep(poll_s)
      continue
    if not done():
      raise RuntimeError(f"the SFT stage in {d} ended ({res}) without a checkpoint at step {steps}")
  return d


def _link_or_copy(src: str, dst: str) -> None:
  try:
    os.link(src, dst)
  except OSError:  # another file system, or links not allowed
    shutil.copy2(src, dst)


def seed_run_folder(sft_dir: str, workdir: str, sft_steps: int) -> None:
  """A new run folder as a copy of the SFT stage (checkpoint at sft_steps, SFT metrics, and the
  evaluation before RL once some run of the seed has made it); built aside, then renamed. A
  LoRA stage's frozen base (checkpoints/base, written once and never changed) is hard-linked
  where the file system allows, else copied."""
  tmp = workdir + ".partial"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(os.path.join(tmp, "checkpoints"))
  shutil.copytree(os.path.join(sft_dir, "checkpoints", str(sft_steps)),
                  os.path.join(tmp, "checkpoints", str(sft_steps)))
  from dmpo_jax.training import checkpoint  # orbax: imported where a run folder is made
  base = os.path.join(sft_dir, "checkpoints", checkpoint.BASE)
  if os.path.isdir(base):
    shutil.copytree(base, os.path.join(tmp, "checkpoints", checkpoint.BASE), copy_function=_link_or_copy)
  for f in ("metrics.jsonl",) + SHARED_EVALS:
    if os.path.exists(os.path.join(sft_dir, f)):
      os.makedirs(os.path.dirname(os.path.join(tmp, f)), exist_ok=True)
      shutil.copyfile(os.path.join(sft_dir, f), os.path.join(tmp, f))
  if os.path.isdir(workdir):  # e.g. only a sweep_error.txt from an earlier failed attempt
    shutil.copytree(tmp, workdir, dirs_exist_ok=True)
    shutil.rmtree(tmp)
  else:
    os.makedirs(os.path.dirname(workdir), exist_ok=True)
    os.rename(tmp, workdir)


def execute(run: Run, out: str, train_fn, log=print) -> dict:
  """One run: share the SFT stage if it can, rewind past a missing evaluation point
  (`rewind`), train (or resume), share eval_before back."""
  wd = os.path.join(out, run.label, f"seed{run.seed}")
  if os.path.exists(os.path.join(wd, "sweep_error.txt")):
    os.remove(os.path.join(wd, "sweep_error.txt"))  # an earlier failure, retried now
  sft_dir = prepare_sft(train_fn, run, out, log) if run.shared else None
  if sft_dir and os.path.isdir(os.path.join(wd, "checkpoints")):
    for f in SHARED_EVALS:  # before the rewind: a shared point is copied, not recomputed
      if not os.path.exists(os.path.join(wd, f)) and os.path.exists(os.path.join(sft_dir, f)):
        _copy_file(os.path.join(sft_dir, f), os.path.join(wd, f))
  what = rewind(wd, log) if os.path.isdir(wd) else None
  if what:
    log(f"{run.name}: {what}")
  if sft_dir and not os.path.isdir(os.path.join(wd, "checkpoints")):
    seed_run_folder(sft_dir, wd, run.cfg.sft.steps)
  try:
    return call_train(train_fn, run.cfg, wd)
  finally:
    for f in SHARED_EVALS if sft_dir else ():
      if os.path.exists(os.path.join(wd, f)) and not os.path.exists(os.path.join(sft_dir, f)):
        _copy_file(os.path.join(wd, f), os.path.join(sft_dir, f))


def write_manifest(out: str, args: dict, runs: list[Run], sessions: list | None = None,
                   config: dict | None = None, *, design: Design) -> None:
  """sweep.json: what was asked (with "config", the base config after --set as config.json
  holds it, which --merge_from compares; the design's settings of its labels, families,
  contrasts and baseline), and each invocation ("sessions": commit, machine, start, wall time;
  a resumed sweep adds one)."""
  from dmpo_jax.training import report
  path = os.path.join(out, "sweep.json")
  old = report.read_json(path) if os.path.exists(path) else {}
  labels = list(dict.fromkeys(old.get("labels", []) + [r.label for r in runs]))
  seeds = sorted(set(old.get("seeds", [])) | {r.seed for r in runs})
  report.write_json({"args": args, "labels": labels, "seeds": seeds, "baseline": design.baseline,
                     "settings": {l: design.settings.get(l, old.get("settings", {}).get(l)) for l in labels},
                     "families": design.families, "contrasts": design.contrasts,
                     "config": config if config is not None else old.get("config"),
                     "sessions": sessions if sessions is not None else old.get("sessions", [])},
                    path)


# Fields two merged sweeps may differ in: what changes how a run is logged, saved or laid
# out, not its result (a resume may change them too), and the base seed (each run sets its own).
MERGE_IGNORED = config_lib.SAFE_TO_CHANGE + config_lib.NEVER_COMPARED + ("seed",)


def read_manifest(folder: str, flag: str) -> dict:
  """A sweep folder's sweep.json; a SweepError naming the flag and folder when the folder is
  missing, holds no sweep.json, or that file is damaged."""
  from dmpo_jax.training import report
  if not os.path.isdir(folder):
    raise SweepError(f"{flag}={folder}: no such folder")
  path = os.path.join(folder, "sweep.json")
  if not os.path.exists(path):
    raise SweepError(f"{flag}={folder}: not a sweep folder (no sweep.json)")
  manifest, why = report.read_result(path, ("labels", "seeds", "settings"))
  if manifest is None:
    raise SweepError(f"{flag}={folder}: {path} is damaged ({why})")
  return manifest


def config_differences(ours: dict, theirs: dict) -> dict:
  """{field: (ours, theirs)} of two flat configs, outside MERGE_IGNORED (a field added to
  the schema later counts as its ADDED_FIELDS value where absent)."""
  a, b = dict(ours), dict(theirs)
  for p, meant in config_lib.ADDED_FIELDS.items():
    a.setdefault(p, meant)
    b.setdefault(p, meant)
  absent = "<absent>"
  return {p: (a.get(p, absent), b.get(p, absent)) for p in sorted(set(a) | set(b))
          if p not in MERGE_IGNORED and a.get(p, absent) != b.get(p, absent)}


def merge_differences(a: dict, b: dict, out: str, other: str) -> dict:
  """The fields in which sweep `other` (manifest b) ran other experiments than `out` (a):
  for each of b's labels, its run config (the recorded base config with the label's
  settings) against ours with the same settings, and the bases' fields that shape the shared
  SFT stage (outside SHARE_SAFE). A base field that every label sets may differ."""
  for manifest, folder in ((a, out), (b, other)):
    if not isinstance(manifest.get("config"), dict):
      raise SweepError(f"--merge_from: {folder}/sweep.json records no config (a sweep from before "
                       "sweeps recorded theirs); rerun its sweep command with --max_runs=0 to "
                       "record it, then merge")
  base_a, base_b = (config_lib.flatten(m["config"]) for m in (a, b))
  diffs = {p: v for p, v in config_differences(base_a, base_b).items() if not share_safe(p)}
  for label in b["labels"]:
    over = b["settings"].get(label) or {}
    diffs.update(config_differences({**base_a, **over}, {**base_b, **over}))
  return diffs


def merge(out: str, other: str) -> list[str]:
  """Move the finished runs of sweep folder `other` (run on other seeds or labels, e.g. in a
  second process) into `out`, with their seeds' shared SFT stages; `other`'s invocations are
  added to out's sweep.json sessions (each with "merged_from"). A run unfinished in `other`
  stays there. Refused, before anything moves, when either folder is not a sweep folder, a
  label's settings differ between the two, the two ran other configs (`merge_differences`,
  listed field by field, ours vs theirs), or a finished run exists in both. Returns the moved
  runs' "label/seed<k>"."""
  from dmpo_jax.training import report
  a, b = read_manifest(out, "--out"), read_manifest(other, "--merge_from")
  clash = [l for l in b["labels"] if l in a["settings"] and a["settings"][l] != b["settings"][l]]
  if clash:
    raise SweepError(f"--merge_from: labels {clash} have other settings in {other} than in {out}")
  diffs = merge_differences(a, b, out, other)
  if diffs:
    detail = "; ".join(f"{p}: {x!r} vs {y!r}" for p, (x, y) in sorted(diffs.items()))
    raise SweepError(f"--merge_from: {other} ran another config than {out} ({len(diffs)} field(s) "
                     f"differ, ours vs theirs: {detail}); nothing was moved")
  moves = []
  for label in b["labels"]:
    for seed in b["seeds"]:
      src, dst = (os.path.join(d, label, f"seed{seed}") for d in (other, out))
      if is_finished(src):
        if os.path.exists(dst):
          raise SweepError(f"--merge_from: {label}/seed{seed} exists in both {out} and {other}")
        moves.append((src, dst))
  seeds = {int(os.path.basename(s)[4:]) for s, _ in moves}
  for seed in sorted(seeds):
    src, dst = (os.path.join(d, SFT_DIR, f"seed{seed}") for d in (other, out))
    if os.path.isdir(src) and not os.path.exists(dst):
      moves.append((src, dst))
  for src, dst in moves:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.move(src, dst)
  sessions = a.get("sessions", []) + [dict(s, merged_from=os.path.abspath(other))
                                      for s in b.get("sessions", [])]
  labels = list(dict.fromkeys(a["labels"] + b["labels"]))
  report.write_json(dict(a, labels=labels, seeds=sorted(set(a["seeds"]) | set(b["seeds"])),
                         settings={**b["settings"], **a["settings"]}, sessions=sessions),
                    os.path.join(out, "sweep.json"))
  return [os.path.relpath(d, out) for s, d in moves if not os.path.relpath(d, out).startswith(SFT_DIR)]


def run_sweep(runs: list[Run], out: str, *, train_fn=None, max_runs: int | None = None,
              progress: bool = True, log=None) -> dict:
  """Run what is not finished (at most max_runs of them). Returns {"done", "skipped", "failed",
  "stopped", "out_of_bounds", "pending"} lists of run names. A run whose start is outside
  config.eval.start_bounds (the trainer raises StartOutOfBounds before RL) stops the sweep:
  the runs of its seed share that start, and the bounds are the experiment's, not the run's."""
  from dmpo_jax.training.run import StartOutOfBounds
  if train_fn is None:
    from dmpo_jax.training import stages
    train_fn = stages.train
  from tqdm import tqdm
  bar = tqdm(runs, desc="sweep", unit="run", dynamic_ncols=True, disable=not progress,
             bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} runs [{elapsed}<{remaining}]")
  log = log or bar.write
  status = {"done": [], "skipped": [], "failed": [], "stopped": [], "out_of_bounds": [], "pending": []}
  started = 0
  t0 = time.time()
  for i, run in enumerate(runs):
    wd = os.path.join(out, run.label, f"seed{run.seed}")
    bar.set_description(f"run {i + 1}/{len(runs)} {run.name}")
    if is_finished(wd):
      status["skipped"].append(run.name)
      log(f"[{i + 1}/{len(runs)}] {run.name}: finished earlier, skipped")
      bar.update(1)
      continue
    if max_runs is not None and started >= max_runs:
      status["pending"].append(run.name)
      continue
    started += 1
    log(f"[{i + 1}/{len(runs)}] {run.name}: " + ("resuming" if os.path.isdir(wd) else "starting")
        + f" (sweep elapsed {time.time() - t0:.0f} s)")
    t1 = time.time()
    try:
      res = execute(run, out, train_fn, log)
    except Stopped as e:
      status["stopped"].append(run.name)
      log(f"{e}; stopping the sweep (rerun the same command to resume)")
      status["pending"].extend(r.name for r in runs[i + 1:] if not is_finished(
          os.path.join(out, r.label, f"seed{r.seed}")))
      break
    except StartOutOfBounds as e:  # no headroom: the pre-registered regime does not hold
      status["out_of_bounds"].append(run.name)
      log(f"[{i + 1}/{len(runs)}] {run.name}: {e}; stopping the sweep (no further runs)")
      status["pending"].extend(r.name for r in runs[i + 1:] if not is_finished(
          os.path.join(out, r.label, f"seed{r.seed}")))
      break
    except Exception as e:  # a failed run is recorded; the others still run
      status["failed"].append(run.name)
      os.makedirs(wd, exist_ok=True)
      with open(os.path.join(wd, "sweep_error.txt"), "w") as f:
        f.write(traceback.format_exc())
      log(f"[{i + 1}/{len(runs)}] {run.name} FAILED: {type(e).__name__}: {e} "
          f"(traceback in {wd}/sweep_error.txt)")
    else:
      key = "done" if not res.get("stopped") else "stopped"
      status[key].append(run.name)
      log(f"[{i + 1}/{len(runs)}] {run.name}: {'finished' if key == 'done' else 'paused at step %d' % res['step']}"
          f" in {time.time() - t1:.0f} s")
    bar.update(1)
  bar.close()
  return status


def run_worker(args, runs: list[Run], train_fn=None) -> int:
  """One of --processes' workers (--worker=k/n): its share of the runs (workers.shares), its
  log lines prefixed, its status to <out>/_workers/status<k>.json; no manifest, no report
  (the parent writes them)."""
  k, n = workers.parse_worker(args.worker)
  if (args.cache_dir or "").lower() != "none":
    enable_compile_cache(args.cache_dir or os.path.join(args.out, CACHE_DIR))
  from absl import logging
  logging.set_verbosity(logging.WARNING)
  mine = workers.shares(runs, n)[k]
  log = lambda m: print(f"[worker {k}] {m}", flush=True)
  log(f"{len(mine)} runs: seeds {sorted({r.seed for r in mine})}")
  try:
    status = run_sweep(mine, args.out, train_fn=train_fn, max_runs=workers.max_runs_share(args.max_runs, k, n),
                       progress=False, log=log)
  except KeyboardInterrupt:  # a signal between two runs (inside one, the trainer saves and stops)
    status = {key: [] for key in workers.KEYS}
    status["pending"] = [r.name for r in mine if not is_finished(os.path.join(args.out, r.label, f"seed{r.seed}"))]
    log("interrupted between runs; rerun the same command to resume")
  workers.write_status(args.out, k, status)
  return 1 if status["failed"] or status["out_of_bounds"] else 0


# ---------------------------------------------------------------------------
def merge_and_report(args, design: Design | None) -> int:
  """--merge_from (then the report) and --report_only; design None: no study's (a folder
  whose sweep.json records contrasts is reported without them, with a note)."""
  from dmpo_jax.experiments import report as sweep_report
  from dmpo_jax.training import report as report_lib
  if args.merge_from:
    try:
      moved = merge(args.out, args.merge_from)
    except SweepError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    print(f"merged {len(moved)} runs from {args.merge_from} into {args.out}")
  if not os.path.isdir(args.out):
    print(f"error: --out={args.out}: no such folder", file=sys.stderr)
    return 2
  path = os.path.join(args.out, "sweep.json")
  if design is None and os.path.exists(path) and (report_lib.read_result(path)[0] or {}).get("contrasts"):
    print("note: no study's design: the report has no pre-registered contrasts (run the study's "
          "entry point, e.g. python -m studies.collapse_frontier.sweep --report_only)", file=sys.stderr)
  print(sweep_report.write_report(args.out, analysis=design and design.analysis)["summary"])
  return 0


def argument_parser(design: Design, prog: str, study: bool):
  """The sweep's flags (design: the labels and tiers --presets offers)."""
  import argparse
  ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0] + (
      "" if study else f" Without a study: one label, {AS_IS!r} (the config as it is); a study's entry "
      "point (e.g. python -m studies.collapse_frontier.sweep) has the same flags and its labels."))
  ap.add_argument("--config", default="configs/collapse.py", help="config file[:args]")
  ap.add_argument("--out", required=True, help="sweep folder (resumed when it exists)")
  tiers = f", or a tier: {' / '.join(repr(t) for t in design.tiers)}" if design.tiers else ""
  ap.add_argument("--presets", default=",".join(design.settings),
                  help=f"comma-separated labels of the design (default: all){tiers}: "
                  f"{', '.join(design.settings)}")
  ap.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,1,5")
  ap.add_argument("--smoke", action="store_true", help="the config's smoke setting (a few steps)")
  ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                  help="override a config field in every run (repeatable), e.g. --set=rl.steps=120")
  ap.add_argument("--max_runs", type=int, default=None, help="start at most this many unfinished runs")
  ap.add_argument("--seed_major", action="store_true", help="run seed by seed (every label of seed 0, "
                  "then of seed 1, ...), so that a sweep cut short holds whole seeds")
  ap.add_argument("--no_share", action="store_true", help="every run trains its own SFT stage")
  ap.add_argument("--cache_dir", default=None, help=f"compilation cache (default <out>/{CACHE_DIR}; "
                  "'none' turns it off)")
  ap.add_argument("--report_only", action="store_true", help="only (re)write the report")
  ap.add_argument("--merge_from", default=None, metavar="DIR", help="move the finished runs of "
                  "another sweep folder (other seeds, run in parallel) into --out, then report")
  ap.add_argument("--processes", type=int, default=1, help="worker processes side by side, each "
                  "pinned to a core with single-threaded XLA, sharing --out (whole seeds each; "
                  "dmpo_jax/experiments/workers.py)")
  ap.add_argument("--no_progress", action="store_true")
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # k/n: one of --processes' workers
  return ap


def main(argv=None, design: Design | None = None, prog: str = "python -m dmpo_jax.experiments.sweep",
         train_fn=None):
  """The command line. design: a study's (its entry point passes it); None: the config as it
  is, one label (AS_IS), no pre-registered analysis. prog: how the entry point is run
  (`--processes` starts its workers as `python -m <module>`). train_fn: stands in for
  stages.train (tests)."""
  study = design is not None
  design = design or as_is()
  ap = argument_parser(design, prog, study)
  argv = list(sys.argv[1:] if argv is None else argv)
  args = ap.parse_args(argv)
  from dmpo_jax.experiments import report as sweep_report

  if args.report_only or args.merge_from:
    return merge_and_report(args, design if study else None)
  try:
    base = load_config(args.config, args.smoke)
    labels = [m for l in args.presets.split(",") if l.strip()
              for m in (design.tiers.get(l.strip()) or [l.strip()])]
    sets = parse_sets(args.set)
    runs = plan(base, labels, parse_seeds(args.seeds), sets, share=not args.no_share, settings=design.settings)
    base_config = config_lib.config_json(apply_overrides(base, sets, "--set"))
    if args.seed_major:
      runs.sort(key=lambda r: r.seed)  # stable: labels keep their order within a seed
  except SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if not runs:
    print("error: nothing to run (every label was skipped)", file=sys.stderr)
    return 2
  if args.processes < 1:
    print(f"error: --processes={args.processes}: need at least 1", file=sys.stderr)
    return 2
  if args.processes > 1 and not args.worker:
    try:
      workers.module_of(prog)
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  os.makedirs(args.out, exist_ok=True)
  if args.worker:
    return run_worker(args, runs, train_fn)
  if (args.cache_dir or "").lower() != "none" and args.processes == 1:
    enable_compile_cache(args.cache_dir or os.path.join(args.out, CACHE_DIR))
  from absl import logging
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  from dmpo_jax.experiments import frontier
  from dmpo_jax.training import report as report_lib
  path = os.path.join(args.out, "sweep.json")
  sessions = (report_lib.read_json(path).get("sessions", []) if os.path.exists(path) else [])
  session = dict(frontier.provenance(), started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 wall_s=None)
  if args.processes > 1:
    session["processes"] = args.processes
  write_manifest(args.out, vars(args), runs, sessions + [session], base_config, design=design)
  t0 = time.time()
  if args.processes > 1:
    status = workers.run_parallel(argv, prog, args.processes, args.out, runs,
                                  lambda r: is_finished(os.path.join(args.out, r.label, f"seed{r.seed}")),
                                  progress=not args.no_progress)
  else:
    status = run_sweep(runs, args.out, train_fn=train_fn, max_runs=args.max_runs,
                       progress=not args.no_progress)
  session.update(wall_s=time.time() - t0, runs={k: len(v) for k, v in status.items()})
  write_manifest(args.out, vars(args), runs, sessions + [session], base_config, design=design)
  rep = sweep_report.write_report(args.out, analysis=design.analysis)
  print(rep["summary"])
  print("sweep: " + ", ".join(f"{k} {len(v)}" for k, v in status.items()) + f"; report in {args.out}/report.md")
  for name in status["out_of_bounds"]:
    rec = report_lib.read_stopped(os.path.join(args.out, name)) or {}
    print(f"stopped: {name}: start outside config.eval.start_bounds={rec.get('bounds')!r}: "
          f"{'; '.join(rec.get('outside', []))} (its stopped.json); the sweep ran no further runs",
          file=sys.stderr)
  if status["failed"]:
    print("failed: " + ", ".join(status["failed"]), file=sys.stderr)
  return 1 if status["failed"] or status["out_of_bounds"] else 0


if __name__ == "__main__":
  sys.exit(main())
