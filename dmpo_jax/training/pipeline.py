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

EVAL_SEED0 = 1_000_000
MAX_REDRAWS = 1000  # instance filter: attempts per row before giving up


@dataclasses.dataclass(frozen=True)
class Collapse:
  """The mode-collapse testbed's settings (config.collapse; docs/COLLAPSE.md).

  limit, time_limit: of each instance's enumeration (Task.optimal_solutions);
  min_optima..max_optima: the instance filter (complete enumerations only)."""
  limit: int = 64
  time_limit: float = 10.0
  min_optima: int = 2
  max_optima: int | None = 16

  @classmethod
  def from_config(cls, cfg) -> "Collapse | None":
    """None unless the config has a `collapse` block with `enabled` (default True)."""
    c = cfg.get("collapse")
    if c is None or not c.get("enabled", True):
      return None
    out = cls(limit=int(c.get("limit", 64)), time_limit=float(c.get("time_limit", 10.0)),
              min_optima=int(c.get("min_optima", 2)), max_optima=c.get("max_optima", 16))
    if out.limit < 1 or out.min_optima < 0 or (out.max_optima is not None and out.max_optima < out.min_optima):
      raise ValueError(f"config.collapse: need limit >= 1 and 0 <= min_optima <= max_optima, got {out}")
    return out

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

  def __post_init__(self):
    for k in self.keys:
      tasks_lib.get(k)  # unknown names list the choices
    if self.level not in tasks_lib.LEVELS:
      raise ValueError(f"config.level={self.level!r}; choose from {tasks_lib.LEVELS}")
    if self.pool < 0:
      raise ValueError(f"config.collapse.pool={self.pool} must be >= 0")
    if self.pool and any(lv != self.level for _, lv in self.curriculum or []):
      raise ValueError("config.collapse.pool (a fixed instance pool) and config.rl.curriculum "
                       "(levels that change) cannot be combined")
    self._pool_items = None

  def level_at(self, step: int) -> str:
    level = self.level
    for start, lv in self.curriculum or []:
      if step >= start:
        level = lv
    return level

  def train(self, stage: str, step: int, n: int) -> list[tuple[str, dict]]:
    """n (task key, instance) pairs for a stage ('sft', 'rl', 'dph') and step; tasks cycle."""
    if self.pool:
      pool = self.pool_items()
      return [pool[self.pool_id(stage, step, i, n)] for i in range(n)]
    level = self.level_at(step) if stage == "rl" else self.level
    out = []
    for i in range(n):
      key = self.keys[(step * n + i) % len(self.keys)]
      seeds = (_seed(self.seed, stage, step, i, *(("redraw", a) if a else ())) for a in range(MAX_REDRAWS))
      out.append((key, self._draw(key, seeds, level, f"{stage} step {step} row {i}")[1]))
    return out

  def pool_items(self) -> list[tuple[str, dict]]:
    """The fixed pool (pool > 0): held_out(pool), task by task; pool_id indexes it."""
    if self._pool_items is None:
      self._pool_items = self.held_out(self.pool)
    return self._pool_items

  def pool_id(self, stage: str, step: int, i: int, n: int) -> int:
    """Pool index of row i of n at a stage's step: the task cycles as in the stream, the
    instance is a hash of (seed, stage, step, row) modulo the pool size."""
    t = (step * n + i) % len(self.keys)
    return t * self.pool + _seed(self.seed, stage, step, i) % self.pool

  def held_out(self, num_per_task: int, level: str | None = None) -> list[tuple[str, dict]]:
    """num_per_task instances per task from seeds EVAL_SEED0, +1, ...; with the collapse
    filter, the first num_per_task of those seeds that it accepts."""
    level = level or self.level
    out = []
    for k in self.keys:
      start = EVAL_SEED0
      for j in range(num_per_task):
        seeds = range(start, start + MAX_REDRAWS)
        seed, q = self._draw(k, seeds, level, f"held-out instance {j}")
        start = seed + 1
        out.append((k, q))
    return out

  def _draw(self, key: str, seeds, level: str, what: str) -> tuple[int, dict]:
    """(seed, instance): the first instance of `seeds` the collapse filter accepts (the first one without it)."""
    task = tasks_lib.get(key)
    for seed in seeds:
      q = task.generate(seed, level)
      if self.collapse is None or self.collapse.accepts(key, q):
        return seed, q
    c = self.collapse
    raise ValueError(f"config.collapse: no {key} instance at level {level} with {c.min_optima}.."
                     f"{c.max_optima} optima in {MAX_REDRAWS} draws ({what}); widen min_optima/max_optima")


class PromptEncoder:
  """Task instance -> prompt token ids, and completion ids -> text to verify.

  Nothing is cut silently: a prompt longer than max_prompt_len loses its first tokens and
  an SFT answer longer than the completion length its last ones, and each cut is counted in
  `truncated` ("prompt", "answer"), which the training loop logs (`take_truncated`)."""

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
    text = self.prompt_text(key, q)
    if self.chat:
      ids = chat.encode_chat(self.tok, text)
    else:
      ids = self.tok.encode(text, add_special_tokens=False)
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
    ids = self.tok.encode(self.answer_text(key, solution), add_special_tokens=False) + [self.end]
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


def score_groups(items, texts: list[str], group: int, reward_cfg: rewards_lib.RewardConfig,
                 ground_truths: list[float] | None = None, collapse: Collapse | None = None):
  """Rewards [P, G] and per-group stats for P instances with G texts each (row-major).

  With `collapse`, also the collapse metrics of each group against the instance's
  enumerated optima (`collapse_stats`)."""
  p = len(items)
  rewards = np.zeros((p, group), np.float32)
  ratios = np.zeros((p, group), np.float32)
  feasible = np.zeros((p, group), bool)
  distinct, entropy, groups = [], [], []
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
  stats = {"ratio": ratios, "feasible": feasible, "distinct": np.asarray(distinct, np.float32),
           "solution_entropy": np.asarray(entropy, np.float32)}
  if collapse is not None:
    stats.update({k: np.asarray([g[k] for g in groups], bool if k == "optimal" else np.float32)
                  for k in COLLAPSE_STATS + ("optimal",)})
  return rewards, stats


COLLAPSE_STATS = ("optimal_rate", "distinct_optimal", "coverage", "entropy_optimal")


def collapse_stats(collapse: Collapse, key: str, q: dict, texts, verdicts, compat: str) -> dict:
  """One group's collapse metrics (`diversity.group_metrics`) from strict verdicts (the
  verdicts are re-verified strictly when the rewards use other rules), and which samples
  are optimal ("optimal" [G]). NaN metrics for a task without enumeration."""
  opt = collapse.optima(key, q)
  if opt is None:
    return {**dict.fromkeys(COLLAPSE_STATS, np.nan), "optimal": np.zeros(len(texts), bool)}
  task = tasks_lib.get(key)
  if compat != "strict":
    verdicts = [task.verify(q, t, compat="strict") for t in texts]
  sols = [v.solution if v.feasible else None for v in verdicts]
  values = [v.value if v.feasible else None for v in verdicts]
  m = diversity.group_metrics(sols, values, opt.value, opt.solutions)
  out = {k: float(m[k]) for k in COLLAPSE_STATS}
  out["optimal"] = diversity.optimal_mask(values, opt.value) & np.asarray([s is not None for s in sols])
  return out
