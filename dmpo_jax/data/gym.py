"""reasoning-gym tasks as training domains, scored without running model text (docs/GYM.md).

    from dmpo_jax.data import gym
    task = gym.domain("countdown", size=10_000, seed=0, min_numbers=3, max_numbers=4)
    task.key  # "gym-countdown:min_numbers=3:max_numbers=4": config.tasks trains it by that key

`domain(name, **cfg)` builds reasoning-gym's dataset `name` with cfg (size, seed and the
dataset's own difficulty fields), wraps it as a `Task` and registers it with
dmpo_jax.data.domain under the key "gym-<name>" plus its fields (or `key=`). A key spells
its config, "gym-<name>:<field>=<value>:...", so a command line needs nothing else
(`register_keys`), and two configs of one task are two keys. reasoning-gym (the "gym" extra)
is imported only here, when a domain is built or a key's fields are checked.

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
import dataclasses
import importlib
import json
import math
import types
import typing
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

  def settings(self) -> dict:
    """The dataset's whole config (every field, defaults included) as JSON values: what a
    results file records of the task."""
    return json.loads(json.dumps({"task": self.name, **dataclasses.asdict(self.dataset.config)}))

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
  a domain under `key` (default `key_of(name, kwargs)`: "gym-<name>" plus the fields) and
  return it. The same call again returns the registered task; a key taken by another task or
  config is refused, so is a key that spells other fields than kwargs, a config the dataset
  refuses or fails to generate from, and a task name without a safe scorer (`wrapped()`)."""
  if name not in SCORERS:
    raise ValueError(f"reasoning-gym task {name!r} is not wrapped (its scorer is not re-implemented "
                     f"safely here); wrapped: {', '.join(wrapped())}")
  if not isinstance(size, int) or isinstance(size, bool) or size < 1:
    raise ValueError(f"gym {name}: size={size!r} must be an int >= 1")
  if not isinstance(seed, int) or isinstance(seed, bool):
    raise ValueError(f"gym {name}: seed={seed!r} must be an int")
  key = key or key_of(name, kwargs)
  if key.startswith(PREFIX) and SEP in key and parse_key(key) != (name, kwargs):
    # a key that spells a config is that config, whoever registers it
    raise ValueError(f"gym key {key!r} spells another config than {name} {kwargs}; pass another key=")
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
    raise ValueError(f"{key!r}: gym {name}: bad config {kwargs} ({type(e).__name__}: {e})") from None
  task = GymTask(name, key, config, dataset, SCORERS[name])
  if kwargs:  # a config the generator fails on is refused here, not at the first evaluation
    try:
      task.instance(0)
    except (TypeError, ValueError, AssertionError, KeyError, IndexError, ZeroDivisionError) as e:
      raise ValueError(f"{key!r}: gym {name}: bad config {kwargs}: its first item fails "
                       f"({type(e).__name__}: {e})") from None
  return domain_lib.register(task)


PREFIX = "gym-"
# Between a key's task name and each config field: "gym-chain_sum:min_terms=2:max_terms=2". Not
# "," or "+", which separate the keys of config.tasks, config.eval.transfer and --gym, and
# nothing a shell reads.
SEP = ":"
SETTABLE = (int, float, bool, str)  # field types a key can spell (no lists or tuples)


def task_name(key: str) -> str:
  """The reasoning-gym task name of "gym-<name>[:<field>=<value>...]" (no import, no checks)."""
  return key[len(PREFIX):].split(SEP, 1)[0] if key.startswith(PREFIX) else key


def key_of(name: str, fields: dict) -> str:
  """The key that spells `fields` of task `name`: "gym-<name>:<field>=<value>:..." in the
  given order; "gym-<name>" without fields."""
  return PREFIX + name + "".join(f"{SEP}{f}={_text(v)}" for f, v in fields.items())


def _text(v) -> str:
  return ("true" if v else "false") if isinstance(v, bool) else str(v)


def config_fields(name: str) -> dict:
  """{field: type} of task `name`'s reasoning-gym config dataclass, but size and seed (those
  are `domain`'s arguments, the same for every key)."""
  config_cls = reasoning_gym().factory.DATASETS[name][1]
  hints = typing.get_type_hints(config_cls)
  return {f.name: hints[f.name] for f in dataclasses.fields(config_cls)
          if f.name not in ("size", "seed")}


def parse_key(key: str) -> tuple[str, dict]:
  """(task name, {field: value}) of "gym-<name>:<field>=<value>:...": each field one of the
  task's reasoning-gym config fields, once, with a value of its type (int, float, true/false,
  a string; one of the choices of a Literal field). A ValueError names the key, the task and
  the field; the dataset's own checks (`validate()`) run when `domain` builds it."""
  if not key.startswith(PREFIX):
    raise ValueError(f"{key!r} is not a reasoning-gym key "
                     f"(\"{PREFIX}<name>[{SEP}<field>=<value>...]\")")
  name, *parts = key[len(PREFIX):].split(SEP)
  if name not in SCORERS:
    raise ValueError(f"{key!r}: reasoning-gym task {name!r} is not wrapped (its scorer is not "
                     f"re-implemented safely here); wrapped: {', '.join(wrapped())}")
  if not parts:
    return name, {}
  known = config_fields(name)
  fields = {}
  for part in parts:
    field, eq, text = part.partition("=")
    field, text = field.strip(), text.strip()
    where = f"{key!r}: {name} field {field!r}"
    if not eq or not field or not text:
      raise ValueError(f"{key!r}: {part!r} is not <field>=<value> (fields are separated by {SEP!r})")
    if field not in known:
      why = ("is gym.domain's argument, not settable in a key" if field in ("size", "seed")
             else "is unknown")
      raise ValueError(f"{where} {why}; its fields: {', '.join(known)}")
    if field in fields:
      raise ValueError(f"{where} is given twice")
    fields[field] = _value(f"{key!r}: {name} field {field}", known[field], text)
  return name, fields


def _value(where: str, hint, text: str):
  """`text` as a value of the config field type `hint`, or a ValueError naming the field."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) is typing.Union and len(args) == 1:  # Optional[X]
    hint = args[0]
  if typing.get_origin(hint) is typing.Literal:
    for choice in typing.get_args(hint):
      if _text(choice) == text:
        return choice
    raise ValueError(f"{where}={text!r}: choose one of {[_text(c) for c in typing.get_args(hint)]}")
  if hint not in SETTABLE:
    raise ValueError(f"{where} ({getattr(hint, '__name__', hint)}) cannot be set in a key: only "
                     "int, float, bool and string fields can")
  if hint is bool:
    if text.lower() not in ("true", "false"):
      raise ValueError(f"{where}={text!r}: expected true or false")
    return text.lower() == "true"
  try:
    value = hint(text)
  except ValueError:
    want = "an int" if hint is int else "a " + hint.__name__
    raise ValueError(f"{where}={text!r}: expected {want}") from None
  if hint is float and not math.isfinite(value):
    raise ValueError(f"{where}={text!r}: expected a finite number")
  return value


def register_keys(keys) -> None:
  """Register every "gym-<name>[:<field>=<value>...]" key among `keys` (`parse_key`) that is not
  a registered task yet, with its fields over the task's default config, so that
  config.tasks="gym-countdown" (or evaluate --gym=chain_sum:max_terms=2) works from the command
  line; other keys are left to the caller's checks. A ValueError names the key and field."""
  for key in keys:
    if key.startswith(PREFIX) and (SEP in key or key not in domain_lib.names()):
      name, fields = parse_key(key)
      domain(name, key=key, **fields)  # a registered key of these fields: returned as it is
