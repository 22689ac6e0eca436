"""reasoning-gym tasks as training domains, scored without running model text (docs/GYM.md).

    from dmpo_jax.data import gym
    task = gym.domain("countdown", size=10_000, seed=0, min_numbers=3, max_numbers=4)
    # now config.tasks = "gym-countdown" trains and evaluates it like an NP-Bench task

`domain(name, **cfg)` builds reasoning-gym's dataset `name` with cfg (size, seed and the
dataset's own difficulty fields), wraps it as a `Task` and registers it with
dmpo_jax.data.domain under the key "gym-<name>" (or `key=`); it is all a command line needs.
reasoning-gym (the "gym" extra) is imported only here, when a domain is built.

How the optimisation-task interface reads a task with a score in [0, 1]:

* an instance is {"question": the dataset's question text, "answer": a correct answer, "data":
  the fields the score needs}; answer and data are functions of the question text (see
  gym_scorers.py), so the instance's content key (data/splits.py) is its question text and
  the A / B / C splits are disjoint by question;
* the answer (after "Answer:") is scored by our own scorer (gym_scorers.py), never by
  reasoning-gym's `score_answer`; a score above 0 is a feasible answer whose value is the
  score, an answer scored 0 is infeasible, an answer the parser refuses is malformed;
* direction "max", and the reference (and proven optimum) is the full score 1, reached by
  the instance's answer: the quality ratio, and so the reward, is the score, and "optimal"
  (correct="optimal" of the objectives and DPH, `diversity.optimal_mask`) is a full score;
* only a full score has a canonical form (Verdict.solution), so the evaluation's "distinct"
  and "solution_entropy" count distinct correct answers;
* SFT targets are the instance's answer (n_queens: any of its valid boards).
"""

from __future__ import annotations

import collections
import importlib
import json
import types
import warnings

from dmpo_jax.data import domain as domain_lib
from dmpo_jax.data.gym_scorers import SCORERS, Scorer
from dmpo_jax.tasks.base import IMAGE_STYLES, PROMPT_STYLES, InvalidInstance

PINNED = "0.1.25"  # the reasoning-gym version whose scorers gym_scorers.py re-implements
CATEGORY = "gym"
CACHE = 4096  # instances kept per domain (the pipeline regenerates the same seeds)
INSTRUCTION = ("\n\nThink step by step, then give your final answer.\n"
               "Your response should end with: Answer: YOUR ANSWER")


def wrapped() -> list[str]:
  """The reasoning-gym task names with a safe scorer; every other name is refused."""
  return sorted(SCORERS)


def reasoning_gym():
  """The reasoning_gym module, or an error that says how to install it."""
  try:
    rg = importlib.import_module("reasoning_gym")
  except ImportError as e:
    raise ImportError(f"gym domains need reasoning-gym=={PINNED}: pip install -e \".[gym]\" "
                      f"({e})") from None
  try:
    from importlib.metadata import version
    have = version("reasoning-gym")
  except Exception:  # an unusual install: nothing to compare
    have = PINNED
  if have != PINNED:
    warnings.warn(f"reasoning-gym {have} is installed; the gym scorers re-implement {PINNED}'s "
                  "(tests/data/test_gym.py checks them against it)", stacklevel=2)
  return rg


class GymTask(domain_lib.Task):
  """One reasoning-gym dataset (name + config) as a Task; see the module docstring."""
  category, direction = CATEGORY, "max"
  # The optimum without a search, a full score: the collapse metrics' "optimal" (pipeline.
  # collapse_stats) is a full score; coverage, which needs every correct answer, is left out.
  known_optimum = 1.0
  fields = {"question": (str,), "answer": (str,), "data": (dict,)}

  def __init__(self, name: str, key: str, config: dict, dataset, scorer: Scorer):
    super().__init__()
    self.name, self.key, self.config, self.scorer = name, key, dict(config), scorer
    self.title = f"reasoning-gym {name}"
    self.dataset = dataset
    self.size = int(config["size"])
    self._instances: collections.OrderedDict = collections.OrderedDict()

  def instance(self, index: int) -> dict:
    """The instance of the dataset's item `index` (its reference checked to score 1)."""
    hit = self._instances.get(index)
    if hit is None:
      entry = self.dataset[index]
      data = json.loads(json.dumps(self.scorer.data(entry)))  # JSON values, as a file reads back
      hit = {"question": entry["question"], "answer": self.scorer.reference(entry, data), "data": data}
      score = self.scorer.score(data, self.scorer.parse(hit["answer"]))[0]
      if score != 1.0:  # a bug in our scorer, never a silent bad reference
        raise AssertionError(f"{self.key}: the reference {hit['answer']!r} of item {index} scores {score}")
      self._instances[index] = hit
      if len(self._instances) > CACHE:
        self._instances.popitem(last=False)
    self._instances.move_to_end(index)
    return hit

  # ---- the Task hooks ------------------------------------------------------------------------
  def _generate(self, rng, level):
    q = self.instance(rng.randrange(self.size))  # one config at every level
    return q, q["answer"]

  def _validate(self, q):
    if not q["answer"].strip():
      raise InvalidInstance(f"{self.key}: question field 'answer' is empty")
    for name, types_ in self.scorer.fields.items():
      v = q["data"].get(name)
      if not isinstance(v, types_) or isinstance(v, bool):
        raise InvalidInstance(f"{self.key}: question field 'data.{name}' is "
                              f"{type(v).__name__}, expected {'/'.join(t.__name__ for t in types_)}")
    try:  # the instance's own answer must score 1 against its data (a file's record included)
      self.scorer.check(q["data"])
      score = self.scorer.score(q["data"], self.scorer.parse(q["answer"]))[0]
    except domain_lib.ParseError as e:
      raise InvalidInstance(f"{self.key}: question field 'answer' is unreadable ({e})") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
      raise InvalidInstance(f"{self.key}: question field 'data' is malformed "
                            f"({type(e).__name__}: {e})") from None
    if score != 1.0:
      raise InvalidInstance(f"{self.key}: question field 'answer' scores {score}, not 1, on its data")

  def _load(self, q):
    return types.SimpleNamespace(question=q["question"], answer=q["answer"], data=q["data"])

  def _parse(self, answer):
    try:
      return self.scorer.parse(answer)
    except domain_lib.ParseError:
      raise
    except (ValueError, TypeError, OverflowError, MemoryError) as e:  # untrusted text: never a crash
      raise domain_lib.ParseError(f"unreadable ({type(e).__name__})") from None

  def _check(self, problem, parsed):
    score, canon, reason = self.scorer.score(problem.data, parsed)
    if not score > 0:
      raise domain_lib.Infeasible(f"score 0: {reason}")
    # Only a full score has a canonical form: the distinct-solution counts and entropies of the
    # evaluation (Verdict.solution None is skipped) then count distinct correct answers.
    return score, canon if score == 1.0 else None

  def _reference(self, problem, rng, deadline):
    return problem.answer

  def _sample(self, problem, rng):
    choices = problem.data.get("valid_answers") if self.name == "n_queens" else None
    return rng.choice(choices) if choices else problem.answer

  def _exact(self, problem, time_limit):
    # 1 is the most any answer scores, and the instance's answer scores it: a proven optimum.
    return domain_lib.Exact(1.0, "OPTIMAL", problem.answer)

  def format_answer(self, solution) -> str:
    return str(solution)

  def prompt(self, instance: dict, style: str = "npbench") -> str:
    """The dataset's question; "npbench" adds the instruction to end with 'Answer:', "compact"
    ends with 'Answer: ' itself. No image styles."""
    if style in IMAGE_STYLES or style not in PROMPT_STYLES:
      raise ValueError(f"{self.key}: prompt style {style!r} is not available; choose from {PROMPT_STYLES}")
    q = self.problem(instance)
    return q.question.rstrip() + ("\nAnswer: " if style == "compact" else INSTRUCTION)


def domain(name: str, *, key: str | None = None, size: int = 10_000, seed: int = 0, **kwargs) -> GymTask:
  """Register reasoning-gym's dataset `name` (size, seed, its own config fields as kwargs) as
  a domain under `key` (default "gym-<name>") and return it. The same call again returns the
  registered task; a key taken by another task or config is refused, and so is a task name
  without a safe scorer (`wrapped()`)."""
  if name not in SCORERS:
    raise ValueError(f"reasoning-gym task {name!r} is not wrapped (its scorer is not re-implemented "
                     f"safely here); wrapped: {', '.join(wrapped())}")
  if not isinstance(size, int) or isinstance(size, bool) or size < 1:
    raise ValueError(f"gym {name}: size={size!r} must be an int >= 1")
  if not isinstance(seed, int) or isinstance(seed, bool):
    raise ValueError(f"gym {name}: seed={seed!r} must be an int")
  key = key or f"gym-{name}"
  config = {"size": size, "seed": seed, **kwargs}
  if key in domain_lib.names():
    task = domain_lib.get(key)
    if isinstance(task, GymTask) and task.name == name and task.config == config:
      return task
    raise ValueError(f"task key {key!r} is taken by {task!r}; pass another key=")
  rg = reasoning_gym()
  try:
    dataset = rg.create_dataset(name, size=size, seed=seed, **kwargs)
  except (TypeError, ValueError, AssertionError, KeyError) as e:
    raise ValueError(f"gym {name}: bad config {kwargs} ({type(e).__name__}: {e})") from None
  return domain_lib.register(GymTask(name, key, config, dataset, SCORERS[name]))


PREFIX = "gym-"


def register_keys(keys) -> None:
  """Register, with its default config, every "gym-<name>" key among `keys` that is not a
  registered task yet, so that config.tasks="gym-countdown" (or evaluate --gym=countdown)
  works from the command line; other keys are left to the caller's checks."""
  for key in keys:
    if key.startswith(PREFIX) and key not in domain_lib.names():
      domain(key[len(PREFIX):])
