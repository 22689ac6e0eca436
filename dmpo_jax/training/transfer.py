"""Transfer evaluation on reasoning-gym tasks (docs/GYM.md, "Transfer evaluation").

A training config lists reasoning-gym tasks (`config.eval.transfer = "gym-countdown,gym-graph_color"`;
a task's config fields follow its name, `"gym-chain_sum:min_terms=2:max_terms=2"`, gym.parse_key)
that its RL never trains on (its SFT may, on other instances: config.sft.gym_tasks, `sft_error`);
the policy is scored on held-out instances of each before RL and after RL (and before SFT with
`config.eval.zero_shot`), beside NP-Bench's evaluation:
eval_transfer_{name}.json in the workdir, and results.json's "transfer". The same scoring
serves `python -m dmpo_jax.evaluate --gym=...` (`score`): one implementation.

What a transfer task reports (`summary`), per task, over its instances and samples:
  score_mean        the mean score in [0, 1] (reasoning-gym's partial credit included)
  full_rate         the share of samples with a full score (a correct answer)
  pass_full@k       unbiased pass@k with correct = a full score, k in pass_ks <= samples
  any_credit        the share of samples with a score above 0
  distinct_correct  distinct correct answers per instance (canonical forms, docs/GYM.md)
  length            the mean completion length in tokens
Coverage (the share of an instance's enumerated optima sampled) is not reported: gym tasks
have no enumeration of every correct answer (`evaluation.collapse_scores` leaves it out).

Nothing here reads the config or a `Run`: the stage layer builds a `TransferSpec` and passes
the tokenizer, the prompt format and a sampler factory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import jax

from dmpo_jax.data import domain, gym, pipeline
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training import evaluation, report

FIELD = "config.eval.transfer"
SFT_FIELD = "config.sft.gym_tasks"
FILE = "eval_transfer_{}.json"
STREAM = 0x7A5F  # folded into the run's evaluation key: samples independent of the held-out ones
KEYS = evaluation.EVAL_KEYS + ("transfer",)  # an eval_transfer_*.json that lacks one is damaged
# (name in `summary`, the evaluation's metric)
METRICS = (("score_mean", "QR_mean"), ("full_rate", "optimal_rate"), ("any_credit", "SR_mean"),
           ("distinct_correct", "distinct_optimal"), ("length", "length"))


@dataclasses.dataclass(frozen=True)
class TransferSpec:
  """The transfer evaluation's settings (config.eval.transfer*; built by the stage layer)."""
  keys: tuple[str, ...] = ()   # "gym-<name>" task keys; () = no transfer evaluation
  level: str = "tiny"          # the held-out seeds' level (a gym task has one config at every level)
  num_per_task: int = 6        # held-out instances per task
  samples: int = 4             # completions per instance
  temperature: float = 0.7
  k: int = 3                   # SR@k / QR@k of the full evaluation (at most `samples`)
  pass_ks: tuple[int, ...] = (1, 3)  # those <= samples are reported
  batch_prompts: int = 8       # instances per sampler call
  max_prompt_len: int = 0      # 0: the longest prompt (within the model's context)
  max_new_tokens: int = 40
  progress: bool = False


# ---------------------------------------------------------------------------
# The config field.
def parse(value) -> tuple[str, ...]:
  """config.eval.transfer -> task keys: "" (none), "gym-a,gym-b:field=value:field=value" (or
  "+" between keys), or a list."""
  parts = value.replace("+", ",").split(",") if isinstance(value, str) else list(value)
  return tuple(p.strip() for p in parts if str(p).strip())


def choices() -> list[str]:
  return [gym.PREFIX + n for n in gym.wrapped()]


def unknown(value) -> list[str]:
  """The keys of config.eval.transfer that are not wrapped reasoning-gym tasks (by name; the
  fields of a key are checked by `config_error`)."""
  return [k for k in parse(value)
          if not k.startswith(gym.PREFIX) or gym.task_name(k) not in gym.wrapped()]


class Allowed:
  """What config.eval.transfer may hold, in words (the schema's message)."""

  def __str__(self):
    return (f"'' (none) or comma-separated reasoning-gym task keys of {choices()}, each with "
            f"optional config fields ('gym-chain_sum{gym.SEP}min_terms=2{gym.SEP}max_terms=2')")



def _parsed(value: str, field: str) -> tuple[list[str], str | None]:
  """A field's keys and its error, naming the field, or None: tasks with a safe scorer, each
  named once (the checks config.eval.transfer and config.sft.gym_tasks share)."""
  keys = parse(value)
  bad = unknown(value) if keys else None
  if bad:
    return keys, (f"{field}={value!r}: {bad} not reasoning-gym tasks with a safe scorer; "
                  f"choose from {choices()} (docs/GYM.md)")
  twice = sorted({k for k in keys if keys.count(k) > 1})
  if twice:
    return keys, f"{field}={value!r} names {twice} more than once; name each task once"
  return keys, None

def config_error(value, train_keys=(), style: str = "compact", sft_keys=()) -> str | None:
  """Why config.eval.transfer=value cannot run (one line naming the field), or None. Its
  keys must be wrapped reasoning-gym tasks ("gym-<name>[:<field>=<value>...]", registered here:
  unknown fields and bad values are refused, gym.parse_key), each config named once, no task
  trained on (config.tasks, at any config: the held-out instances would not be disjoint from
  the trained ones), with a text prompt style. A task of config.sft.gym_tasks (`sft_keys`,
  trained in SFT only) may be listed with the same key: the SFT stream redraws the transfer
  evaluation's instances (pipeline.TaskSet.sft_only_reserved); at another config it is refused,
  as the two configs' questions could coincide under different keys."""
  keys, err = _parsed(value, FIELD)
  if not keys or err:
    return err
  trained = [k for k in keys if k in train_keys]
  if trained:
    return (f"{FIELD}={value!r}: {trained} are trained on (config.tasks); the held-out evaluation "
            "already scores them, and transfer tasks are ones the run does not train on")
  err = _text_style(value, FIELD, style) or _registered(value, FIELD, keys)
  if err:
    return err
  tasks = {k: domain.get(k) for k in keys}
  trained = {t.name: k for k in train_keys if k in domain.names()
             for t in [domain.get(k)] if isinstance(t, gym.GymTask)}
  other = [k for k in keys if tasks[k].name in trained]
  if other:
    return (f"{FIELD}={value!r}: {other} are reasoning-gym tasks trained on at another config "
            f"({[trained[tasks[k].name] for k in other]} in config.tasks); transfer tasks are ones "
            "the run does not train on, at any config (their held-out instances could be trained on)")
  other = [(k, s) for k in keys for s in sft_keys if s != k and gym.task_name(s) == tasks[k].name]
  if other:
    return (f"{FIELD}={value!r}: {[k for k, _ in other]} are trained in SFT at another config "
            f"({[s for _, s in other]} in {SFT_FIELD}); a task trained in SFT is evaluated "
            f"with the same key (its held-out instances are kept out of SFT only then)")
  return None


def sft_error(value, train_keys=(), style: str = "compact", optimal: bool = False) -> str | None:
  """Why config.sft.gym_tasks=value cannot run (one line naming the field), or None. Its keys,
  reasoning-gym tasks trained in SFT only (never in RL), are wrapped tasks with valid fields
  (registered here), each config named once, no task of config.tasks at any config (their
  questions could be config.tasks' held-out ones), with a text prompt style and sampled SFT
  targets (a gym task enumerates no optima)."""
  keys, err = _parsed(value, SFT_FIELD)
  if not keys or err:
    return err
  names = {gym.task_name(k) for k in train_keys if k.startswith(gym.PREFIX)}
  both = [k for k in keys if gym.task_name(k) in names]
  if both:
    return (f"{SFT_FIELD}={value!r}: {both} are tasks of config.tasks (trained in SFT and RL "
            "already); name each task in one of the two fields")
  err = _text_style(value, SFT_FIELD, style)
  if err:
    return err
  if optimal:
    return (f"{SFT_FIELD}={value!r}: config.sft.targets='optimal' needs enumerated optima, which "
            "reasoning-gym tasks lack; use sft.targets='sampled' (their reference answers)")
  return _registered(value, SFT_FIELD, keys)


def _text_style(value: str, field: str, style: str) -> str | None:
  """The field's error when config.prompt_style is an image style (gym prompts are text)."""
  if style not in domain.PROMPT_STYLES:
    return (f"{field}={value!r}: reasoning-gym prompts are text; config.prompt_style="
            f"{style!r} is an image style (use {domain.PROMPT_STYLES})")
  return None


def _registered(value: str, field: str, keys) -> str | None:
  """The field's error, or None, once its keys are registered: a key reasoning-gym refuses, or
  two keys of one whole config ("gym-chain_sum" is "gym-chain_sum:min_terms=2")."""
  try:
    gym.register_keys(keys)
  except (ImportError, ValueError) as e:
    return f"{field}={value!r}: {e}"
  configs = task_configs(keys)
  same = next((ks for ks in ([k for k in keys if configs[k] == c] for c in configs.values())
               if len(ks) > 1), None)
  if same:
    return f"{field}={value!r}: {same} are one config of one task; name it once"
  return None


def task_configs(keys) -> dict:
  """{key: the task's whole reasoning-gym config} (GymTask.settings): what the results record."""
  return {k: domain.get(k).settings() for k in keys if isinstance(domain.get(k), gym.GymTask)}


# ---------------------------------------------------------------------------
# Scoring (shared with `evaluate --gym`).
class _FullScore(pipeline.Collapse):
  """The collapse metrics against a task's known optimum (a gym task's full score, 1): no
  optimum is enumerated, for any task."""

  def optima(self, key, q):
    return None


FULL_SCORE = _FullScore()


def held_out(keys, num_per_task: int, level: str = "tiny") -> tuple[list, list]:
  """(items, ground truths): the first num_per_task held-out instances of each task (seeds from
  pipeline.EVAL_SEED0, as `evaluate --gym --num` draws them); gym keys registered."""
  gym.register_keys(keys)
  items = pipeline.held_out_items(keys, num_per_task, level)
  return items, [domain.get(k).reference_value(q) for k, q in items]


def score(sample_fn, encoder, items, *, spec: evaluation.ScoreSpec, **kw) -> dict:
  """`evaluation.evaluate` of reasoning-gym items at `spec`'s settings with the full-score
  metrics (the collapse metrics against the known optimum: optimal_rate, pass_optimal@k,
  distinct_optimal; they replace spec.collapse), plus "transfer": `summary` of it. kw:
  evaluate's other arguments (rng, ground_truths)."""
  unknown = sorted({k for k, _ in items if getattr(domain.get(k), "known_optimum", None) is None})
  if unknown:
    raise ValueError(f"transfer scoring is for tasks whose full score is known (reasoning-gym "
                     f"tasks); {unknown} are not")
  res = evaluation.evaluate(sample_fn, encoder, items,
                            spec=dataclasses.replace(spec, collapse=FULL_SCORE), **kw)
  res.pop("correct", None)  # per-sample flags: for keep / exploration rates, not kept here
  res["transfer"] = summary(res)
  res["task_configs"] = task_configs(dict.fromkeys(k for k, _ in items))
  return res


def summary(res: dict) -> dict:
  """{task: {score_mean, full_rate, any_credit, distinct_correct, length, pass_full@k...}} of
  an evaluation made by `score`."""
  out = {}
  for task, s in res["per_task"].items():
    row = {name: s[m] for name, m in METRICS if m in s}
    for m, v in s.items():
      if m.startswith("pass_optimal@"):
        row["pass_full@" + m.split("@")[1]] = v
    out[task] = row
  return out


def prompt_len(longest: int, requested: int, context: int | None, max_new_tokens: int) -> int:
  """The prompt length of a transfer evaluation: `requested` (0: the longest prompt), at most
  what the model's context leaves beside max_new_tokens (longer prompts lose their start,
  counted as prompt_truncated)."""
  n = requested or longest
  if context is not None:
    room = context - max_new_tokens
    if room < 1:
      raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                       f"model's context of {context} positions")
    n = min(n, room)
  return max(n, 1)


# ---------------------------------------------------------------------------
class Transfer:
  """A run's transfer evaluations, eval_transfer_{name}.json in `workdir` (a finished one is
  read back, not redone). One sampler (`make_sampler(max_new_tokens)`, called when first
  needed: one compilation) and one instance set serve every evaluation of the run.
  tokenizer, style, chat: the run's prompt format (a text style); context: the model's
  positions (None: unbounded)."""

  def __init__(self, spec: TransferSpec, workdir: str, tokenizer, style: str, chat: bool,
               reward_cfg, make_sampler, context: int | None = None):
    self.spec, self.workdir, self.reward_cfg = spec, workdir, reward_cfg
    self.tokenizer, self.style, self.chat, self.context = tokenizer, style, chat, context
    self.make_sampler, self.made = make_sampler, None

  def path(self, name: str) -> str:
    return os.path.join(self.workdir, FILE.format(name))

  def read(self, name: str) -> dict | None:
    """The finished evaluation `name` (None when absent or damaged; a damaged one is named)."""
    path = self.path(name)
    if not dist.agree(os.path.exists(path)):  # every process takes the same branch
      return None
    res, why = report.read_result(path, KEYS)
    if res is None:
      print(f"warning: {path} is damaged ({why}); evaluating again", flush=True)
    return res

  def __call__(self, name: str, params, rng) -> dict:
    """eval_transfer_{name}.json of the policy `params`, sampled from `rng`."""
    res = self.read(name)
    if res is not None:
      return res
    spec, t0 = self.spec, time.time()
    if self.made is None:
      items, gts = held_out(spec.keys, spec.num_per_task, spec.level)
      probe = pipeline.PromptEncoder(self.tokenizer, self.style, 10**9, self.chat)
      longest = max(len(probe.encode(k, q)) for k, q in items)
      plen = prompt_len(longest, spec.max_prompt_len, self.context, spec.max_new_tokens)
      encoder = pipeline.PromptEncoder(self.tokenizer, self.style, plen, self.chat)
      self.made = (self.make_sampler(spec.max_new_tokens), encoder, plen, items, gts)
    sampler, encoder, plen, items, gts = self.made
    res = score(lambda pt, pm, key: sampler(params, pt, pm, key)[:2], encoder, items,
                spec=evaluation.ScoreSpec(samples=spec.samples, batch_prompts=spec.batch_prompts,
                                          prompt_len=plen, reward_cfg=self.reward_cfg,
                                          k=min(spec.k, spec.samples), pass_ks=spec.pass_ks,
                                          progress=spec.progress),
                rng=jax.random.fold_in(rng, STREAM), ground_truths=gts)
    res["settings"] = {"num_per_task": spec.num_per_task, "samples": spec.samples,
                       "temperature": spec.temperature, "prompt_len": plen,
                       "max_new_tokens": spec.max_new_tokens, "task_configs": res["task_configs"]}
    res["wall_s"] = time.time() - t0  # the first one includes the sampler's compilation
    if dist.is_main():
      report.write_json(res, self.path(name))
    return res


def results(evaluations: dict) -> dict:
  """results.json's "transfer": {"tasks", "settings", name: {task: summary} for each finished
  evaluation ("zero_shot", "before", "after"), "prompt_truncated": {name: count}}."""
  done = {n: r for n, r in evaluations.items() if r is not None}
  if not done:
    return {}
  first = next(iter(done.values()))
  out = {"tasks": list(first["transfer"]), "settings": first.get("settings", {})}
  out.update({n: r["transfer"] for n, r in done.items()})
  out["prompt_truncated"] = {n: r.get("prompt_truncated", 0) for n, r in done.items()}
  out["wall_s"] = {n: r.get("wall_s") for n, r in done.items()}
  return out


def format_results(res: dict) -> str:
  """The printed tables of results.json's "transfer": before RL -> after RL, and zero-shot ->
  before RL when there is one."""
  s = res.get("settings", {})
  text = (f"transfer tasks (reasoning-gym, never trained on; {s.get('num_per_task')} held-out "
          f"instances x {s.get('samples')} samples at T={s.get('temperature')}; full = a full "
          "score): before RL -> after RL\n" + format_table(res["after"], res.get("before")))
  if "zero_shot" in res and "before" in res:
    text += "\n\nzero-shot -> before RL:\n" + format_table(res["before"], res["zero_shot"])
  cut = {n: c for n, c in res.get("prompt_truncated", {}).items() if c}
  if cut:
    text += f"\n(prompts cut to fit: {cut})"
  return text


def table_metrics(rows: dict) -> list[str]:
  """score_mean, full_rate, pass_full@1, the largest pass_full@k, distinct_correct, length."""
  some = next(iter(rows.values()), {})
  ks = sorted(int(m.split("@")[1]) for m in some if m.startswith("pass_full@"))
  passes = [f"pass_full@{k}" for k in dict.fromkeys(ks[:1] + ks[-1:])]
  return ["score_mean", "full_rate", *passes, "distinct_correct", "length"]


def format_table(after: dict, before: dict | None = None) -> str:
  """A text table per transfer task ({task: summary}); with `before`, cells 'before -> after'."""
  metrics = table_metrics(after)
  head = f"{'transfer task':24s}" + "".join(f"{m:>18s}" for m in metrics)
  lines = [head, "-" * len(head)]
  for task, vals in after.items():
    ref = (before or {}).get(task)
    cells = []
    for m in metrics:
      v = vals.get(m, math.nan)
      cells.append(f"{ref.get(m, math.nan):7.3f} -> {v:6.3f}" if ref else f"{v:18.3f}")
    lines.append(f"{task:24s}" + "".join(f"{c:>18s}" for c in cells))
  return "\n".join(lines)
