"""The Task interface shared by the ten NP-Bench tasks.

A task turns a seed and a level into an NP-Bench ``question`` dict, checks an
answer text against it (strictly by default, or with NP-Bench's own looser
rules via ``compat="npbench"``), solves it with an NP-Bench-style heuristic
(the ground truth) and exactly where affordable, formats prompts in two
styles, and draws the instance as an image (MM-NP-Bench).

Subclasses implement the underscore methods on a parsed *problem* object
(plain Python lists, built once per instance by ``_load``); the public
methods handle answer extraction, errors, caching and timing.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
from typing import Any, Hashable

from dmpo_jax.tasks import npbench_rules, optima, parsing

LEVELS = ("tiny", "easy", "medium", "hard", "bench")
CATEGORIES = ("graph", "schedule", "partition", "selection", "planning")
COMPAT = ("strict", "npbench")
PROMPT_STYLES = ("npbench", "compact")  # text prompts: the instance written out
# MM-NP-Bench prompts: the instance as an image (`render`) at IMAGE, then a text
# instruction that is the same for every instance of a task (no instance numbers).
# "image": the compact prompt's task word (from-scratch models); "npbench_image":
# NP-Bench's wording with the image in place of the instance listing.
IMAGE_STYLES = ("image", "npbench_image")
IMAGE = "<image>"  # where a prompt's image goes; the model's processor expands it


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The score of one answer.

  feasible: the answer is a valid solution of the instance.
  value: the objective (tour length, colours, ...) when feasible, else None.
  reason: a short human-readable explanation ("ok" when feasible).
  solution: a canonical, hashable form of a feasible solution (a tour and its
    reverse or rotation are one solution), for diversity metrics.
  well_formed: an ``Answer:`` was found and its list parsed.
  """
  feasible: bool
  value: float | None
  reason: str
  solution: Hashable | None = None
  well_formed: bool = False


@dataclasses.dataclass(frozen=True)
class Exact:
  """Result of an exact solve. status: OPTIMAL, FEASIBLE (time limit hit),
  INFEASIBLE, UNKNOWN (nothing found in time) or UNAVAILABLE (no solver)."""
  value: float | None
  status: str
  solution: Any = None
  seconds: float = 0.0


class Infeasible(Exception):
  """Raised inside checkers; the message becomes Verdict.reason."""


class InvalidInstance(ValueError):
  """A question that is not an instance of its task; the message names the field."""


_KIND_NAMES = {int: "an int", float: "a number", list: "a list", dict: "an object", str: "a string"}


class Task:
  key: str = ""
  title: str = ""
  category: str = ""
  direction: str = ""        # "min" or "max"
  description: str = ""      # NP-Bench-style task description
  answer_format: str = ""    # the submission format line of the prompt
  # The question's shape, checked once per instance before it is parsed (`check_instance`):
  # `fields` maps each required field to its allowed types; a task without fields takes a
  # vertex map, {"0": ..., "n-1": ...}, whose values have one of the types in `vertex_values`.
  fields: dict = {}
  vertex_values: tuple = (list, dict)

  def __init__(self):
    self._cache: collections.OrderedDict = collections.OrderedDict()

  def __repr__(self):
    return f"<Task {self.key} ({self.category}, {self.direction})>"

  # ---- subclass hooks --------------------------------------------------
  def _generate(self, rng: random.Random, level: str) -> tuple[dict, Any]:
    raise NotImplementedError

  def _load(self, question: dict):
    raise NotImplementedError

  def _validate(self, instance: dict) -> None:
    """The task's own checks of a question of the right shape (tasks/checks.py); raise
    InvalidInstance naming the field."""

  def _parse(self, answer: str):
    return parsing.parse_int_list(answer)

  def _check(self, problem, parsed) -> tuple[float, Hashable]:
    """Strict mode's check: (value, canonical solution) or raise Infeasible(reason).
    NP-Bench's own rules (compat="npbench") are in npbench_rules.py."""
    raise NotImplementedError

  def _reference(self, problem, rng: random.Random, deadline: float):
    raise NotImplementedError

  def _exact(self, problem, time_limit: float) -> Exact:
    return Exact(None, "UNAVAILABLE")

  def _sample(self, problem, rng: random.Random):
    """One randomised feasible solution of varied quality (SFT warm start)."""
    return self._reference(problem, rng, time.monotonic() + 0.05)

  def format_answer(self, solution) -> str:
    return "[" + ", ".join(str(x) for x in solution) + "]"

  def _npbench_instance(self, problem) -> str:
    raise NotImplementedError

  def _compact(self, problem) -> str:
    raise NotImplementedError

  def _render(self, problem, size: int):
    raise NotImplementedError

  # ---- public API ------------------------------------------------------
  def check_instance(self, instance) -> None:
    """Refuse a question that is not of this task's shape (an empty one, another task's),
    naming the field; the values inside are checked when the instance is parsed."""
    def kinds(types):
      return " or ".join(_KIND_NAMES.get(t, t.__name__) for t in types)
    if not isinstance(instance, dict):
      raise InvalidInstance(f"{self.key}: the question must be an object, got {type(instance).__name__}")
    if self.fields:
      for name, types in self.fields.items():
        if name not in instance:
          raise InvalidInstance(f"{self.key}: the question lacks field {name!r} (a {self.key} "
                                f"question has {list(self.fields)})")
        v = instance[name]
        if isinstance(v, bool) or not isinstance(v, types):
          raise InvalidInstance(f"{self.key}: question field {name!r} is {type(v).__name__}, "
                                f"expected {kinds(types)}")
        if isinstance(v, (list, dict)) and not v:
          raise InvalidInstance(f"{self.key}: question field {name!r} is empty")
      return
    if not instance:
      raise InvalidInstance(f"{self.key}: the question is empty (a {self.key} question maps vertex "
                            f"ids 0..n-1 to {kinds(self.vertex_values)})")
    n = len(instance)
    for k, v in instance.items():
      plain = isinstance(k, str) and k.isascii() and k.isdigit() and str(int(k)) == k
      if not plain or not 0 <= int(k) < n:  # "01" and "1" are one id to int(), two to str()
        raise InvalidInstance(f"{self.key}: question field {k!r} is not a vertex id 0..{n - 1} "
                              f"(a {self.key} question maps vertex ids, written \"0\", \"1\", ..., to "
                              f"{kinds(self.vertex_values)})")
      if not isinstance(v, self.vertex_values):
        raise InvalidInstance(f"{self.key}: question field {k!r} is {type(v).__name__}, expected "
                              f"{kinds(self.vertex_values)}")

  def validate(self, instance) -> None:
    """Refuse a question that is not a valid instance of this task, with a one-line
    InvalidInstance (a ValueError) naming the field and what is wrong: its shape
    (`check_instance`), then every value a verifier reads (ids in range, edges listed from both
    ends, no self-loops, sizes and types). The verifiers call it (`problem`), and a data file's
    records are checked with it before any work (tasks/data.py), so the two cannot differ."""
    self.check_instance(instance)
    self._validate(instance)

  def problem(self, instance: dict):
    """The parsed instance, cached by identity (instances are not mutated); the question is
    validated the first time (`validate`)."""
    if not isinstance(instance, dict):
      raise TypeError(f"{self.key}: instance must be a question dict, got {type(instance).__name__}")
    hit = self._cache.get(id(instance))
    if hit is not None and hit[0] is instance:
      self._cache.move_to_end(id(instance))
      return hit[1]
    self.validate(instance)
    try:
      problem = self._load(instance)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise ValueError(f"{self.key}: malformed instance ({type(e).__name__}: {e})") from e
    self._cache[id(instance)] = (instance, problem)
    if len(self._cache) > 256:
      self._cache.popitem(last=False)
    return problem

  def generate_with_solution(self, seed: int, level: str = "easy") -> tuple[dict, Any]:
    """(question, planted solution); deterministic in (task, level, seed)."""
    if level not in LEVELS:
      raise ValueError(f"unknown level {level!r}; choose from {LEVELS}")
    rng = random.Random(f"{self.key}/{level}/{int(seed)}")
    return self._generate(rng, level)

  def generate(self, seed: int, level: str = "easy") -> dict:
    return self.generate_with_solution(seed, level)[0]

  def verify(self, instance: dict, text: str, *, compat: str = "strict") -> Verdict:
    """Score a full model response.

    strict: the answer is the text after the last 'Answer:', read by parsing.py.
    npbench: NP-Bench's own per-task rules on the whole response (npbench_rules.py).
    """
    if compat not in COMPAT:
      raise ValueError(f"unknown compat {compat!r}; choose from {COMPAT}")
    self.problem(instance)  # a malformed question is refused whatever the text
    if compat == "npbench":
      return self._npbench_verdict(instance, text)
    answer = parsing.extract_answer(text)
    if answer is None:
      return Verdict(False, None, "no 'Answer:' in the response")
    return self.verify_answer(instance, answer, compat=compat)

  def _npbench_verdict(self, instance: dict, text: str) -> Verdict:
    """NP-Bench's verdict and value. The canonical solution is strict mode's when strict
    mode accepts the same answer, else the answer as NP-Bench read it; a refused answer is
    well formed when strict mode could read its list."""
    strict = self.verify(instance, text)  # also: a malformed instance is our error
    try:
      value, parsed = npbench_rules.check(self.key, instance, text)
    except npbench_rules.Refused as e:
      return Verdict(False, None, f"refused by NP-Bench's rules: {e}", well_formed=strict.well_formed)
    canon = strict.solution if strict.feasible else ("npbench", repr(parsed))
    return Verdict(True, float(value), "ok", canon, well_formed=True)

  def verify_answer(self, instance: dict, answer: str, *, compat: str = "strict") -> Verdict:
    """Score the answer body (the text after 'Answer:')."""
    if compat not in COMPAT:
      raise ValueError(f"unknown compat {compat!r}; choose from {COMPAT}")
    if compat == "npbench":
      return self._npbench_verdict(instance, parsing.MARKER + " " + answer)
    problem = self.problem(instance)
    try:
      parsed = self._parse(answer)
    except parsing.ParseError as e:
      return Verdict(False, None, f"malformed answer: {e}")
    except RecursionError:
      return Verdict(False, None, "malformed answer: nested too deeply")
    try:
      value, canon = self._check(problem, parsed)
    except Infeasible as e:
      return Verdict(False, None, str(e), well_formed=True)
    return Verdict(True, float(value), "ok", canon, well_formed=True)

  def verify_solution(self, instance: dict, solution, *, compat: str = "strict") -> Verdict:
    return self.verify_answer(instance, self.format_answer(solution), compat=compat)

  def reference_solution(self, instance: dict, *, seed: int = 0, time_limit: float = 2.0):
    """The heuristic ground-truth solution (NP-Bench style); always strictly feasible."""
    problem = self.problem(instance)
    rng = random.Random(f"{self.key}/reference/{seed}")
    solution = self._reference(problem, rng, time.monotonic() + time_limit)
    verdict = self.verify_solution(instance, solution)
    if not verdict.feasible:  # a bug, never a silent bad ground truth
      raise AssertionError(f"{self.key}: reference solution {solution} infeasible: {verdict.reason}")
    return solution

  def reference_value(self, instance: dict, *, seed: int = 0, time_limit: float = 2.0) -> float:
    problem = self.problem(instance)
    memo = getattr(problem, "_reference_value", None)  # problems are SimpleNamespaces
    if memo is not None and memo[0] == (seed, time_limit):
      return memo[1]
    solution = self.reference_solution(instance, seed=seed, time_limit=time_limit)
    value = self.verify_solution(instance, solution).value
    problem._reference_value = ((seed, time_limit), value)
    return value

  def exact(self, instance: dict, *, time_limit: float = 10.0) -> Exact:
    """Exact optimum with a time limit and a status (see Exact)."""
    problem = self.problem(instance)
    t0 = time.monotonic()
    result = self._exact(problem, time_limit)
    if result.solution is not None:
      verdict = self.verify_solution(instance, result.solution)
      if not verdict.feasible:
        raise AssertionError(f"{self.key}: exact solution infeasible: {verdict.reason}")
    return dataclasses.replace(result, seconds=time.monotonic() - t0)

  def optimal_value(self, instance: dict, *, time_limit: float = 10.0) -> float | None:
    """The proven optimum, or None when it could not be proven in time."""
    result = self.exact(instance, time_limit=time_limit)
    return result.value if result.status == "OPTIMAL" else None

  def sample_solutions(self, instance: dict, n: int, *, seed: int = 0) -> list:
    """Up to n distinct strictly feasible solutions of varied quality."""
    problem = self.problem(instance)
    rng = random.Random(f"{self.key}/sample/{seed}")
    out, seen = [], set()
    for _ in range(4 * n):
      sol = self._sample(problem, rng)
      v = self.verify_solution(instance, sol)
      if v.feasible and v.solution not in seen:
        seen.add(v.solution)
        out.append(sol)
        if len(out) == n:
          break
    return out

  def ratio(self, instance: dict, text: str, ground_truth: float | None = None, *,
            compat: str = "strict") -> float:
    """NP-Bench's quality ratio of a response (0 when infeasible)."""
    from dmpo_jax.tasks.scoring import ratio
    v = self.verify(instance, text, compat=compat)
    if not v.feasible:
      return 0.0
    gt = self.reference_value(instance) if ground_truth is None else ground_truth
    return ratio(v.value, gt, self.direction)

  def prompt(self, instance: dict, style: str = "npbench") -> str:
    """The prompt text; image styles hold IMAGE once where `render(instance)` goes."""
    if style not in PROMPT_STYLES + IMAGE_STYLES:
      raise ValueError(f"unknown prompt style {style!r}; choose from {PROMPT_STYLES + IMAGE_STYLES}")
    problem = self.problem(instance)
    if style == "compact":
      return self._compact(problem) + "\nAnswer: "
    if style == "image":  # the compact prompt's task word only: the numbers are in the image
      return f"{IMAGE}{self._compact(problem).split()[0]}\nAnswer: "
    if style == "npbench_image":
      return (
          f"{IMAGE}You are an expert in combinatorial optimization.\n\n"
          f"Task: {self.title}. {self.description}\n\n"
          "Instance: shown in the image above.\n\n"
          f"Submission format: {self.answer_format}\n\n"
          "Think step by step, then give your final answer.\n"
          "Your response should end with: Answer: YOUR ANSWER")
    return (
        f"You are an expert in combinatorial optimization.\n\n"
        f"Task: {self.title}. {self.description}\n\n"
        f"Instance:\n{self._npbench_instance(problem)}\n\n"
        f"Submission format: {self.answer_format}\n\n"
        "Think step by step, then give your final answer.\n"
        "Your response should end with: Answer: YOUR ANSWER")

  def render(self, instance: dict, size: int = 512):
    """The instance as a PIL image (MM-NP-Bench), size x size pixels."""
    if not isinstance(size, int) or size < 128:
      raise ValueError(f"render size must be an int >= 128, got {size!r}")
    return self._render(self.problem(instance), size)

  def record(self, seed: int, level: str, *, style: str = "npbench", exact: bool = False,
             exact_time_limit: float = 10.0) -> dict:
    """The NP-Bench data row of instance (seed, level): prompt, question, task_type,
    ground_truth (the reference solver's value), level, seed; with exact=True also the proven
    optimum and its status (tasks/data.py writes these; tfds_builder.py packs them)."""
    q = self.generate(seed, level)
    rec = {"prompt": self.prompt(q, style), "question": q, "task_type": self.key,
           "ground_truth": self.reference_value(q), "level": level, "seed": seed}
    if exact:
      ex = self.exact(q, time_limit=exact_time_limit)
      rec["optimum"], rec["optimum_status"] = ex.value, ex.status
    return rec

  # ---- every optimum (the mode-collapse testbed; the machinery is tasks/optima.py) ----
  def enumerate_optima(self, problem, limit: int, deadline: float):
    """(canonical forms, complete, optimal value, reason) for a parsed problem: every optimal
    solution up to `limit` + 1 forms, searched until time.monotonic() passes `deadline`. A
    task with enumeration overrides this and `solution_of` (see `has_optima`)."""
    raise NotImplementedError(f"{self.key}: optimal-solution enumeration is not implemented; "
                              "supported tasks: dmpo_jax.tasks.with_optima()")

  def solution_of(self, canonical):
    """The solution (a `format_answer` input, e.g. an SFT target) of a canonical form."""
    raise NotImplementedError(f"{self.key}: no canonical forms (no optimum enumeration)")

  @property
  def has_optima(self) -> bool:
    """Whether this task enumerates its optima (overrides `enumerate_optima`)."""
    return type(self).enumerate_optima is not Task.enumerate_optima

  def optimal_solutions(self, instance: dict, *, limit: int = 64, time_limit: float = 10.0):
    """All optimal solutions as canonical forms (an optima.Optima: .solutions, .complete)."""
    return optima.optimal_solutions(self, instance, limit=limit, time_limit=time_limit)

  def format_solution(self, canonical) -> str:
    """Answer text (after 'Answer:') whose strict Verdict.solution is `canonical` again."""
    return optima.format_solution(self, canonical)

  def sample_optimal_solutions(self, instance: dict, n: int, *, seed: int = 0, limit: int = 64,
                               time_limit: float = 10.0) -> list:
    """n optimal solutions drawn uniformly from the enumerated set (SFT targets)."""
    return optima.sample_optimal(self, instance, n, seed=seed, limit=limit, time_limit=time_limit)
