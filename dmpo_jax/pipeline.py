"""Host-side data flow of training: instances -> prompt ids -> (sampler) -> texts -> rewards.

Everything here is deterministic in (seed, step): row i of stage `stage` at
step s is generated from a hash of (seed, stage, s, i) below 1,000,000, so a
resumed run sees exactly the data it would have seen (the data position is
the step). Evaluation instances use seeds from 1,000,000 (the TFDS test
split's), so training never sees them.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from dmpo_jax import tasks as tasks_lib
from dmpo_jax.tasks import rewards as rewards_lib
from dmpo_jax.tasks import scoring

EVAL_SEED0 = 1_000_000


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

  def __post_init__(self):
    for k in self.keys:
      tasks_lib.get(k)  # unknown names list the choices
    if self.level not in tasks_lib.LEVELS:
      raise ValueError(f"config.level={self.level!r}; choose from {tasks_lib.LEVELS}")

  def level_at(self, step: int) -> str:
    level = self.level
    for start, lv in self.curriculum or []:
      if step >= start:
        level = lv
    return level

  def train(self, stage: str, step: int, n: int) -> list[tuple[str, dict]]:
    """n (task key, instance) pairs for a stage ('sft', 'rl', 'dph') and step; tasks cycle."""
    level = self.level_at(step) if stage == "rl" else self.level
    out = []
    for i in range(n):
      key = self.keys[(step * n + i) % len(self.keys)]
      q = tasks_lib.get(key).generate(_seed(self.seed, stage, step, i), level)
      out.append((key, q))
    return out

  def held_out(self, num_per_task: int, level: str | None = None) -> list[tuple[str, dict]]:
    level = level or self.level
    return [(k, tasks_lib.get(k).generate(EVAL_SEED0 + j, level))
            for k in self.keys for j in range(num_per_task)]


class PromptEncoder:
  """Task instance -> prompt token ids, and completion ids -> text to verify."""

  def __init__(self, tokenizer, style: str, max_prompt_len: int, chat_template: bool = False):
    if style not in tasks_lib.PROMPT_STYLES:
      raise ValueError(f"config.prompt_style={style!r}; choose from {tasks_lib.PROMPT_STYLES}")
    self.tok, self.style, self.max_len, self.chat = tokenizer, style, max_prompt_len, chat_template
    self.bos = getattr(tokenizer, "bos_token_id", None)
    self.eos = tokenizer.eos_token_id
    self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

  def prompt_text(self, key: str, q: dict) -> str:
    return tasks_lib.get(key).prompt(q, self.style)

  def encode(self, key: str, q: dict) -> list[int]:
    text = self.prompt_text(key, q)
    if self.chat:
      ids = self.tok.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True, tokenize=True)
      ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    else:
      ids = self.tok.encode(text, add_special_tokens=False)
      if self.bos is not None:
        ids = [self.bos] + ids
    if len(ids) > self.max_len:
      raise ValueError(f"prompt of {key} has {len(ids)} tokens > config.model.max_prompt_len="
                       f"{self.max_len}; raise it or use a smaller level")
    return ids

  def answer_ids(self, key: str, solution) -> list[int]:
    """SFT target: the formatted answer then EOS."""
    text = tasks_lib.get(key).format_answer(solution)
    return self.tok.encode(text, add_special_tokens=False) + [self.eos]

  def texts(self, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
    """Completion rows -> the text the verifier reads."""
    out = []
    prefix = "Answer: " if self.style == "compact" else ""
    for row, m in zip(tokens, mask):
      ids = [int(t) for t, v in zip(row, m) if v and t != self.eos]
      out.append(prefix + self.tok.decode(ids, skip_special_tokens=True))
    return out


def pad_left(rows: list[list[int]], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
  tokens = np.full((len(rows), length), pad, np.int32)
  mask = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    tokens[i, length - len(r):] = r
    mask[i, length - len(r):] = 1
  return tokens, mask


def pad_right(rows: list[list[int]], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
  tokens = np.full((len(rows), length), pad, np.int32)
  mask = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    r = r[:length]
    tokens[i, :len(r)] = r
    mask[i, :len(r)] = 1
  return tokens, mask


def score_groups(items, texts: list[str], group: int, reward_cfg: rewards_lib.RewardConfig,
                 ground_truths: list[float] | None = None):
  """Rewards [P, G] and per-group stats for P instances with G texts each (row-major)."""
  p = len(items)
  rewards = np.zeros((p, group), np.float32)
  ratios = np.zeros((p, group), np.float32)
  feasible = np.zeros((p, group), bool)
  distinct, entropy = [], []
  for i, (key, q) in enumerate(items):
    task = tasks_lib.get(key)
    gt = ground_truths[i] if ground_truths is not None else rewards_lib.ground_truth(task, q, reward_cfg)
    r, verdicts = rewards_lib.score(task, q, texts[i * group:(i + 1) * group], reward_cfg, gt=gt)
    rewards[i] = r
    feasible[i] = [v.feasible for v in verdicts]
    ratios[i] = [scoring.ratio(v.value, gt, task.direction) if v.feasible else 0.0 for v in verdicts]
    sols = [v.solution for v in verdicts]
    distinct.append(scoring.distinct_solutions(sols))
    entropy.append(scoring.solution_entropy(sols))
  return rewards, {"ratio": ratios, "feasible": feasible,
                   "distinct": np.asarray(distinct, np.float32),
                   "solution_entropy": np.asarray(entropy, np.float32)}
