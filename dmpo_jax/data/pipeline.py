"""Host-side data flow of training: instances -> prompt ids -> (sampler) -> texts -> rewards.

Everything here is deterministic in (seed, step): row i of stage `stage` at
step s is generated from a hash of (seed, stage, s, i) below 1,000,000, so a
resumed run sees exactly the data it would have seen (the data position is
the step). Evaluation instances use seeds from 1,000,000 (the TFDS test
split's), so training never sees them.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib

import numpy as np

from dmpo_jax import tasks as tasks_lib
from dmpo_jax.models import chat
from dmpo_jax.tasks import diversity, optima
from dmpo_jax.tasks import rewards as rewards_lib
from dmpo_jax.tasks import scoring
from dmpo_jax.data import splits as splits_lib

EVAL_SEED0 = 1_000_000
MAX_REDRAWS = 1000  # instance filter: attempts per row before giving up


@dataclasses.dataclass(frozen=True)
class Collapse:
  """The mode-collapse testbed's settings (config.collapse, built by
  `training.specs.collapse_spec`; docs/COLLAPSE.md).

  limit, time_limit: of each instance's enumeration (Task.optimal_solutions);
  min_optima..max_optima: the instance filter (complete enumerations only)."""
  limit: int = 64
  time_limit: float = 10.0
  min_optima: int = 2
  max_optima: int | None = 16

  def optima(self, key: str, q: dict):
    """The instance's Optima, or None for a task without enumeration."""
    if not tasks_lib.get(key).has_optima:
      return None
    return tasks_lib.get(key).optimal_solutions(q, limit=self.limit, time_limit=self.time_limit)

  def accepts(self, key: str, q: dict) -> bool:
    """Whether the filter keeps the instance (tasks without enumeration: always)."""
    if not tasks_lib.get(key).has_optima:
      return True
    return optima.optima_in_range(tasks_lib.get(key), q, self.min_optima, self.max_optima,
                                  limit=self.limit, time_limit=self.time_limit) is not None


def _seed(*parts) -> int:
  h = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
  return int.from_bytes(h[:4], "little") % EVAL_SEED0  # train seeds stay below eval seeds


def parse_curriculum(spec: str, default_level: str) -> list[tuple[int, str]]:
  """'easy:0,medium:200' -> [(0, 'easy'), (200, 'medium')] (RL steps at which a level starts)."""
  if not spec:
    return [(0, default_level)]
  out = []
  for part in spec.split(","):
    level, _, start = part.partition(":")
    if level not in tasks_lib.LEVELS or not start.strip().isdigit():
      raise ValueError(f"config.rl.curriculum: bad entry {part!r}; expected level:step with level "
                       f"in {tasks_lib.LEVELS}")
    out.append((int(start), level))
  out.sort()
  if out[0][0] != 0:
    raise ValueError("config.rl.curriculum must start at step 0")
  return out


@dataclasses.dataclass
class TaskSet:
  keys: list[str]
  level: str
  seed: int
  curriculum: list[tuple[int, str]] | None = None
  collapse: Collapse | None = None  # with it, instances are filtered by their number of optima
  # pool > 0: every training stage draws from a fixed pool of `pool` instances per task, the
  # first `pool` held-out ones, and evaluation is on the same instances (the regime of RLVR on
  # a fixed prompt set, where collapse is measured on the prompts trained on); 0: a fresh
  # stream of instances, never repeated and never evaluated on.
  pool: int = 0
  # splits (A, B, C) per task > (): the disjoint sets of `splits.py`. Evaluation
  # (`held_out`) is on C; sft_from "A" draws SFT rows from A, "stream" from fresh instances
  # that are not in B or C; rl_from "AB" draws RL (and DPH) rows from A + B, "stream" from
  # fresh instances not in C. split_file: fixed lists in place of drawn ones.
  splits: tuple = ()
  split_file: str = ""
  sft_from: str = "A"
  rl_from: str = "AB"
  # Without splits or a pool: the evaluation's instances per task (config.eval.num_per_task).
  # The random training streams redraw those instances, so that evaluation is disjoint from
  # training by content (at `tiny`, different seeds often give the same instance).
  held_out_per_task: int = 0
  # Tasks that SFT cycles through after `keys` and nothing else draws (config.sft.gym_tasks: RL,
  # DPH and the held-out evaluation stay on `keys`). The SFT stream redraws the first
  # `sft_only_reserved` held-out instances of each (`held_out_items`: the transfer evaluation's),
  # so that an evaluation of them is disjoint from SFT by content.
  sft_only: tuple = ()
  sft_only_reserved: int = 0

  def __post_init__(self):
    for k in (*self.keys, *self.sft_only):
      tasks_lib.get(k)  # unknown names list the choices
    self.sft_only = tuple(self.sft_only)
    if self.sft_only and (self.pool or self.splits or self.split_file):
      raise ValueError(f"config.sft.gym_tasks={','.join(self.sft_only)!r} draws SFT rows from a "
                       "fresh stream; config.collapse.pool and config.collapse.splits (fixed SFT "
                       "sets) cannot be combined with it")
    both = [k for k in self.sft_only if k in self.keys]
    if both:
      raise ValueError(f"config.sft.gym_tasks: {both} are in config.tasks as well (trained in SFT "
                       "and RL already); name each task in one of them")
    if self.level not in tasks_lib.LEVELS:
      raise ValueError(f"config.level={self.level!r}; choose from {tasks_lib.LEVELS}")
    if self.pool < 0:
      raise ValueError(f"config.collapse.pool={self.pool} must be >= 0")
    if self.pool and any(lv != self.level for _, lv in self.curriculum or []):
      raise ValueError("config.collapse.pool (a fixed instance pool) and config.rl.curriculum "
                       "(levels that change) cannot be combined")
    self._pool_items = None
    self._splits = None
    self._held_out_ids = None
    self.splits = splits_lib.parse_sizes(self.splits)
    if self.split_file and not self.splits:
      self.splits = splits_lib.DEFAULT_SIZES  # sizes come from the file
    if self.splits:
      if self.pool:
        raise ValueError("config.collapse.pool and config.collapse.splits cannot be combined: "
                         "splits replace the pool (RL trains on A + B)")
      if self.sft_from not in ("A", "stream") or self.rl_from not in ("AB", "stream"):
        raise ValueError(f"config.collapse: sft_from={self.sft_from!r} (choose 'A' or 'stream'), "
                         f"rl_from={self.rl_from!r} (choose 'AB' or 'stream')")
      if any(lv != self.level for _, lv in self.curriculum or []):
        raise ValueError("config.collapse.splits (fixed sets at one level) and config.rl.curriculum "
                         "(levels that change) cannot be combined")
      if self.rl_from == "AB":
        self.pool = self.splits[0] + self.splits[1]  # a fixed RL pool: DPH reads it as one

  def level_at(self, step: int) -> str:
    level = self.level
    for start, lv in self.curriculum or []:
      if step >= start:
        level = lv
    return level

  def train(self, stage: str, step: int, n: int) -> list[tuple[str, dict]]:
    """n (task key, instance) pairs for a stage ('sft', 'rl', 'dph') and step; tasks cycle."""
    if self.splits and stage == "sft":
      if self.sft_from == "A":
        a = self.split_sets().A
        return [a[self.pool_id(stage, step, i, n)] for i in range(n)]
    elif self.pool:
      pool = self.pool_items()
      return [pool[self.pool_id(stage, step, i, n)] for i in range(n)]
    level = self.level_at(step) if stage == "rl" else self.level
    exclude = self.stream_exclude(stage)
    keys = [*self.keys, *self.sft_only] if stage == "sft" else self.keys
    out = []
    for i in range(n):
      key = keys[(step * n + i) % len(keys)]
      seeds = (_seed(self.seed, stage, step, i, *(("redraw", a) if a else ())) for a in range(MAX_REDRAWS))
      out.append((key, self._draw(key, seeds, level, f"{stage} step {step} row {i}", exclude)[1]))
    return out

  def split_sets(self) -> splits_lib.Splits:
    """The sets A, B, C (config.collapse.splits): from the split file, or per task the first
    distinct instances of the held-out seeds that the collapse filter accepts."""
    if not self.splits:
      raise ValueError("this TaskSet has no splits (config.collapse.splits)")
    if self._splits is None:
      if self.split_file:
        self._splits = splits_lib.load(self.split_file, self.keys)
      else:
        self._splits = splits_lib.draw(
            self.keys, self.splits, lambda k, seeds: self._draw(k, seeds, self.level, "split instance"),
            lambda start: range(start or EVAL_SEED0, (start or EVAL_SEED0) + MAX_REDRAWS))
    return self._splits

  def stream_exclude(self, stage: str) -> frozenset:
    """Instance ids a random stream redraws: C, and for SFT also B; without splits, the
    evaluation's instances (held_out(held_out_per_task)), and for SFT also the reserved
    instances of the SFT-only tasks."""
    if not self.splits:
      if self._held_out_ids is None:
        self._held_out_ids = frozenset(splits_lib.instance_id(k, q)
                                       for k, q in self.held_out(self.held_out_per_task))
        self._reserved_ids = frozenset(splits_lib.instance_id(k, q) for k, q in held_out_items(
            self.sft_only, self.sft_only_reserved, self.level))
      return self._held_out_ids | self._reserved_ids if stage == "sft" else self._held_out_ids
    return frozenset(self.split_sets().ids(*(("B", "C") if stage == "sft" else ("C",))))

  def pool_items(self) -> list[tuple[str, dict]]:
    """The fixed pool (pool > 0): held_out(pool), task by task; pool_id indexes it. With
    splits: A then B, each round-robin over the tasks (so that DPH's first num_prompts
    candidates cover every task)."""
    if self._pool_items is None:
      if self.splits:
        sp = self.split_sets()
        self._pool_items = [it for name in ("A", "B") for it in _round_robin(getattr(sp, name), self.keys)]
      else:
        self._pool_items = self.held_out(self.pool)
    return self._pool_items

  def pool_id(self, stage: str, step: int, i: int, n: int) -> int:
    """Pool index of row i of n at a stage's step: the task cycles as in the stream, the
    instance is a hash of (seed, stage, step, row) modulo the pool size."""
    t = (step * n + i) % len(self.keys)
    if self.splits:  # an index into split_sets().A (SFT) or pool_items() (A + B)
      rows = (self.split_sets().A if stage == "sft" and self.sft_from == "A" else self.pool_items())
      choices = [j for j, (k, _) in enumerate(rows) if k == self.keys[t]]
      return choices[_seed(self.seed, stage, step, i) % len(choices)]
    return t * self.pool + _seed(self.seed, stage, step, i) % self.pool

  def held_out(self, num_per_task: int, level: str | None = None) -> list[tuple[str, dict]]:
    """num_per_task instances per task: the first distinct ones of seeds EVAL_SEED0, +1, ...
    (that the collapse filter accepts, with one). With splits (at the config's level): the
    set C, whatever num_per_task."""
    level = level or self.level
    if self.splits and level == self.level:
      return list(self.split_sets().C)
    out = []
    for k in self.keys:
      start, seen = EVAL_SEED0, set()
      for j in range(num_per_task):
        seeds = range(start, start + MAX_REDRAWS)
        # Repeats are skipped: at `tiny`, seeds repeat instances.
        seed, q = self._draw(k, seeds, level, f"held-out instance {j}", frozenset(seen))
        start = seed + 1
        seen.add(splits_lib.instance_id(k, q))
        out.append((k, q))
    return out

  def _draw(self, key: str, seeds, level: str, what: str, exclude=frozenset()) -> tuple[int, dict]:
    """(seed, instance): the first instance of `seeds` the collapse filter accepts (the first
    one without it) whose id (`splits.instance_id`) is not in `exclude`."""
    task = tasks_lib.get(key)
    for seed in seeds:
      q = task.generate(seed, level)
      if exclude and splits_lib.instance_id(key, q) in exclude:
        continue
      if self.collapse is None or self.collapse.accepts(key, q):
        return seed, q
    c = self.collapse
    if c is None:
      raise ValueError(f"no {key} instance at level {level} outside the {len(exclude)} excluded ones "
                       f"(evaluation or split instances) in {MAX_REDRAWS} draws ({what}); lower "
                       "config.eval.num_per_task or use a larger level")
    raise ValueError(f"config.collapse: no {key} instance at level {level} with {c.min_optima}.."
                     f"{c.max_optima} optima in {MAX_REDRAWS} draws ({what}); widen min_optima/max_optima")


def held_out_items(keys, num_per_task: int, level: str) -> list[tuple[str, dict]]:
  """The first num_per_task distinct held-out instances of each task (seeds from EVAL_SEED0, no
  instance filter): the transfer evaluation's, and what `TaskSet.sft_only_reserved` reserves."""
  if not keys or num_per_task < 1:
    return []
  return TaskSet(list(keys), level, 0).held_out(num_per_task, level)


def _round_robin(items, keys) -> list:
  """Task-major (key, instance) rows interleaved: task 0's first, task 1's first, ..."""
  per = [[it for it in items if it[0] == k] for k in keys]
  return [col[j] for j in range(max(map(len, per), default=0)) for col in per if j < len(col)]


class PromptEncoder:
  """Task instance -> prompt token ids, and completion ids -> text to verify.

  Nothing is cut silently: a prompt longer than max_prompt_len loses its first tokens and
  an SFT answer longer than the completion length its last ones, and each cut is counted in
  `truncated` ("prompt", "answer"), which the training loop logs (`take_truncated`).

  Prompt and answer text is encoded as text (models/chat.py): a special token spelt in it is
  not that token, except those in `kept_tokens`, which the encoder's own code writes (an image
  span: data/images.py)."""
  kept_tokens: tuple[str, ...] = ()

  def __init__(self, tokenizer, style: str, max_prompt_len: int, chat_template: bool = False):
    if style not in tasks_lib.PROMPT_STYLES:
      raise ValueError(f"config.prompt_style={style!r}; choose from {tasks_lib.PROMPT_STYLES}")
    self.tok, self.style, self.max_len, self.chat = tokenizer, style, max_prompt_len, chat_template
    self.bos = getattr(tokenizer, "bos_token_id", None)
    self.eos = tokenizer.eos_token_id
    self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    # In the chat format an answer ends with the template's end-of-turn token (sampling
    # stops there, SFT targets end with it), which need not be the tokenizer's EOS.
    self.stop_ids = chat.end_of_turn_ids(tokenizer) if chat_template else ()
    self.end = self.stop_ids[0] if self.stop_ids else self.eos
    self.truncated = collections.Counter()
    self._warned = set()  # the first cut of each kind is also printed

  def prompt_text(self, key: str, q: dict) -> str:
    return tasks_lib.get(key).prompt(q, self.style)

  def encode(self, key: str, q: dict) -> list[int]:
    return self.encode_text(key, self.prompt_text(key, q))

  def encode_text(self, key: str, text: str) -> list[int]:
    """Prompt ids of a prompt text of task `key` (the chat template, BOS and the cut of an
    overlong prompt as in `encode`)."""
    if self.chat:  # a control token spelt in the text is text: a prompt cannot forge a turn
      ids = chat.encode_chat(self.tok, text, keep=self.kept_tokens)
    else:
      ids = chat.encode_text(self.tok, text, keep=self.kept_tokens)
      if self.bos is not None:
        ids = [self.bos] + ids
    if len(ids) > self.max_len and self.style in tasks_lib.IMAGE_STYLES:
      # a cut would separate image placeholder tokens from the image's patches
      raise ValueError(f"prompt of {key} has {len(ids)} tokens > config.model.max_prompt_len="
                       f"{self.max_len}; raise it or use a smaller level")
    if len(ids) > self.max_len:
      # Keep the end (the answer format and, in the chat format, the assistant header the
      # answer follows) and a leading BOS; the instance's first tokens are lost.
      if "prompt" not in self._warned:
        self._warned.add("prompt")
        print(f"warning: a prompt of {key} has {len(ids)} tokens > config.model.max_prompt_len="
              f"{self.max_len}; its first tokens are cut (counted as prompt_truncated)", flush=True)
      self.truncated["prompt"] += 1
      head = ids[:1] if not self.chat and self.bos is not None else []
      ids = head + ids[len(ids) - self.max_len + len(head):]
    return ids

  def answer_text(self, key: str, solution) -> str:
    """The text an SFT target writes: the formatted answer, after 'Answer: ' in the
    `npbench` style (the compact prompt already ends with it), so that the strict verifier
    reads it back from `texts` in every style."""
    text = tasks_lib.get(key).format_answer(solution)
    return text if self.style in ("compact", "image") else f"Answer: {text}"

  def answer_ids(self, key: str, solution, max_len: int | None = None) -> list[int]:
    """SFT target: `answer_text` then EOS (the end-of-turn token in the chat format); with
    max_len, cut to it and counted in truncated["answer"] (the end token is then lost)."""
    ids = chat.encode_text(self.tok, self.answer_text(key, solution)) + [self.end]
    if max_len is not None and len(ids) > max_len:
      if "answer" not in self._warned:
        self._warned.add("answer")
        print(f"warning: an SFT answer of {key} has {len(ids)} tokens > config.model."
              f"max_new_tokens={max_len}; it is cut (counted as sft_truncated)", flush=True)
      self.truncated["answer"] += 1
      ids = ids[:max_len]
    return ids

  def take_truncated(self) -> dict[str, int]:
    """{"prompt_truncated", "sft_truncated"}: the cuts since the last call (then reset)."""
    out = {"prompt_truncated": self.truncated["prompt"], "sft_truncated": self.truncated["answer"]}
    self.truncated = collections.Counter()
    return out

  def texts(self, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
    """Completion rows -> the text the verifier reads."""
    out = []
    prefix = "Answer: " if self.style in ("compact", "image") else ""  # the prompt ends with it
    for row, m in zip(tokens, mask):
      ids = [int(t) for t, v in zip(row, m) if v and t != self.eos and t not in self.stop_ids]
      out.append(prefix + self.tok.decode(ids, skip_special_tokens=True))
    return out


def pad_right(rows: list[list[int]], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
  tokens = np.full((len(rows), length), pad, np.int32)
  mask = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    r = r[:length]
    tokens[i, :len(r)] = r
    mask[i, :len(r)] = 1
  return tokens, mask


def prompt_id(key: str, q: dict) -> str:
  """A stable id of an instance (task key and content): the same instance, the same id."""
  return hashlib.sha256(f"{key}/{q!r}".encode()).hexdigest()[:16]  # instances are rebuilt alike


def answer_id(solution) -> int:
  """A stable non-negative int32 id of a verdict's canonical solution; -1 for none."""
  if solution is None:
    return -1
  return int.from_bytes(hashlib.sha256(repr(solution).encode()).digest()[:4], "little") & 0x7FFFFFFF


def proven_optimum(key: str, q: dict, time_limit: float = 10.0):
  """The instance's proven optimum (None when not proven in time), memoised on the problem."""
  task = tasks_lib.get(key)
  problem = task.problem(q)
  memo = getattr(problem, "_proven_optimum", None)
  if memo is None or memo[0] != time_limit:
    memo = (time_limit, task.optimal_value(q, time_limit=time_limit))
    problem._proven_optimum = memo
  return memo[1]


def sft_solutions(key: str, q: dict, n: int, *, seed: int, optimal: bool, collapse: Collapse) -> list:
  """Up to n distinct SFT target solutions of an instance: drawn uniformly from its enumerated
  optima (optimal=True; collapse's limit and time limit) or the task's sampled feasible
  solutions of varied quality."""
  task = tasks_lib.get(key)
  if optimal:
    return task.sample_optimal_solutions(q, n, seed=seed, limit=collapse.limit,
                                         time_limit=collapse.time_limit)
  return task.sample_solutions(q, n, seed=seed)


def score_groups(items, texts: list[str], group: int, reward_cfg: rewards_lib.RewardConfig,
                 ground_truths: list[float] | None = None, collapse: Collapse | None = None,
                 correct: str | None = None, answers: bool = False):
  """Rewards [P, G] and per-group stats for P instances with G texts each (row-major).

  With `collapse`, also the collapse metrics of each group against the instance's
  enumerated optima (`collapse_stats`). correct ("optimal" | "feasible"): also
  stats["correct"] [P, G], the verifier's flag (optimal: the value equals the proven
  optimum; where none is proven, feasible). answers: also stats["answer"] [P, G], the
  `answer_id` of each verdict's canonical solution."""
  p = len(items)
  rewards = np.zeros((p, group), np.float32)
  ratios = np.zeros((p, group), np.float32)
  feasible = np.zeros((p, group), bool)
  if correct not in (None, "optimal", "feasible"):
    raise ValueError(f"objective.correct={correct!r}; choose 'optimal' or 'feasible'")
  distinct, entropy, groups, answer_ids, flags = [], [], [], [], []
  for i, (key, q) in enumerate(items):
    task = tasks_lib.get(key)
    gt = ground_truths[i] if ground_truths is not None else rewards_lib.ground_truth(task, q, reward_cfg)
    group_texts = texts[i * group:(i + 1) * group]
    r, verdicts = rewards_lib.score(task, q, group_texts, reward_cfg, gt=gt)
    rewards[i] = r
    feasible[i] = [v.feasible for v in verdicts]
    ratios[i] = [scoring.ratio(v.value, gt, task.direction) if v.feasible else 0.0 for v in verdicts]
    sols = [v.solution for v in verdicts]
    distinct.append(scoring.distinct_solutions(sols))
    entropy.append(scoring.solution_entropy(sols))
    if collapse is not None:
      groups.append(collapse_stats(collapse, key, q, group_texts, verdicts, reward_cfg.compat))
    if answers:
      answer_ids.append([answer_id(v.solution) for v in verdicts])
    if correct == "optimal":
      opt = proven_optimum(key, q, reward_cfg.exact_time_limit)
      flags.append(feasible[i] if opt is None else
                   diversity.optimal_mask([v.value if v.feasible else None for v in verdicts], opt))
    elif correct is not None:
      flags.append(feasible[i])
  stats = {"ratio": ratios, "feasible": feasible, "distinct": np.asarray(distinct, np.float32),
           "solution_entropy": np.asarray(entropy, np.float32)}
  if answers:
    stats["answer"] = np.asarray(answer_ids, np.int32).reshape(p, group)
  if correct is not None:
    stats["correct"] = np.asarray(flags, bool).reshape(p, group)
  if collapse is not None:
    stats.update({k: np.asarray([g[k] for g in groups], bool if k == "optimal" else np.float32)
                  for k in COLLAPSE_STATS + ("optimal",)})
  return rewards, stats


COLLAPSE_STATS = ("optimal_rate", "distinct_optimal", "coverage", "entropy_optimal")


def collapse_stats(collapse: Collapse, key: str, q: dict, texts, verdicts, compat: str) -> dict:
  """One group's collapse metrics (`diversity.group_metrics`) from strict verdicts (the
  verdicts are re-verified strictly when the rewards use other rules), and which samples
  are optimal ("optimal" [G]).
  A task without enumeration whose optimum is known without a search (`known_optimum`: a
  reasoning-gym task's full score, 1) has every metric but coverage, which needs the set of
  every optimum: its coverage is NaN here and `evaluation.collapse_scores` leaves it out. Any
  other task without enumeration: NaN metrics, no sample optimal."""
  task = tasks_lib.get(key)
  opt = collapse.optima(key, q)
  optimum = opt.value if opt is not None else getattr(task, "known_optimum", None)
  if opt is None and optimum is None:
    return {**dict.fromkeys(COLLAPSE_STATS, np.nan), "optimal": np.zeros(len(texts), bool)}
  if compat != "strict":
    verdicts = scoring.VERDICTS.verify_group(task, q, texts, "strict")  # memoised, exact
  sols = [v.solution if v.feasible else None for v in verdicts]
  values = [v.value if v.feasible else None for v in verdicts]
  m = diversity.group_metrics(sols, values, optimum, None if opt is None else opt.solutions)
  out = {k: float(m.get(k, np.nan)) for k in COLLAPSE_STATS}
  out["optimal"] = diversity.optimal_mask(values, optimum) & np.asarray([s is not None for s in sols])
  return out
