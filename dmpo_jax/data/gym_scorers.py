"""Our own scorers of the wrapped reasoning-gym tasks: model text never reaches Python's eval.

reasoning-gym's `score_answer` methods run model text through Python's eval (n_queens) or
sympy's expression parser (countdown, puzzle24), so they are never called on model text here.
Each wrapped task has a `Scorer` that re-implements its `score_answer` (reasoning-gym 0.1.25,
read from the installed package) on safe parsers: the AST whitelist of tasks/safe_expr.py,
`json.loads`, and plain string operations. tests/data/test_gym.py checks that the scores
equal reasoning-gym's on reference and corrupted answers; where they differ our parser accepts
less, with the exceptions listed in `Scorer.differences` (docs/GYM.md has the table).

A scorer reads reasoning-gym's entry once, when an instance is built:
  data(entry)   the fields the score needs (JSON values), a function of the question text
  reference(entry, data)   a correct answer (score 1), also a function of the question text
and then scores answers against the instance's data:
  parse(text)   the answer read, or ParseError (score 0: not well formed)
  score(data, parsed) -> (score in [0, 1], canonical form, reason)
The canonical form is hashable and equal for answers that are the same solution (an
expression up to reordering, a colouring up to renaming its colours).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable

from dmpo_jax.tasks import safe_expr
from dmpo_jax.tasks.parsing import ParseError

MAX_ANSWER = 4096
_INTS = re.compile(r"\b\d+\b")  # reasoning-gym's reading of the numbers an expression uses
SEARCH_BUDGET = 5_000  # states of a reference search (countdown: ~20 ms) before the dataset's answer


@dataclasses.dataclass(frozen=True)
class Scorer:
  name: str
  parse: Callable[[str], Any]
  score: Callable[[dict, Any], tuple]
  data: Callable[[dict], dict]
  reference: Callable[[dict, dict], str]
  fields: dict          # data field -> allowed types (checked on every instance)
  differences: tuple    # where our score differs from reasoning-gym's (docs/GYM.md)
  check: Callable[[dict], None] = lambda data: None  # deeper checks; ValueError names the field


def require(ok: bool, what: str) -> None:
  """A check of an instance's data: ValueError(what) unless ok."""
  if not ok:
    raise ValueError(what)


def check_numbers(data: dict) -> None:
  require(all(type(n) is int and 0 <= n < 10 ** 6 for n in data["numbers"]) and
          1 <= len(data["numbers"]) <= 12, "data.numbers must be 1 to 12 ints in 0..10^6")


def check_grid(data: dict) -> None:
  m = data["matrix"]
  cells = [x for row in m if isinstance(row, list) for x in row]
  require(m and all(isinstance(row, list) and len(row) == len(m[0]) > 0 for row in m) and
          all(x in ("*", "#", "O", "X") for x in cells) and cells.count("*") == 1 and
          cells.count("#") == 1, "data.matrix must be equal rows of * # O X with one * and one #")


def check_puzzle(data: dict) -> None:
  p = data["puzzle"]
  vs = p.get("vertices")
  require(isinstance(vs, list) and all(type(v) is int for v in vs) and
          isinstance(p.get("color_options"), list) and p["color_options"] and
          isinstance(p.get("edges"), list) and
          all(isinstance(e, list) and len(e) == 2 and set(e) <= set(vs) for e in p["edges"]),
          "data.puzzle must have int vertices, color_options and edges between its vertices")


def check_solution(data: dict) -> None:
  sol = data["solution"]
  require(all(isinstance(r, list) and len(r) == len(sol) and all(type(x) is int for x in r)
              for r in sol), "data.solution must be a square grid of ints")


def bounded(text: str) -> str:
  """The answer stripped, or ParseError when empty or longer than MAX_ANSWER."""
  if not isinstance(text, str):
    raise ParseError("the answer is not text")
  s = text.strip()
  if not s:
    raise ParseError("empty answer")
  if len(s) > MAX_ANSWER:
    raise ParseError(f"longer than {MAX_ANSWER} characters")
  return s


# ---- arithmetic: countdown and puzzle24 ------------------------------------------------------

def parse_arithmetic(text: str):
  s = bounded(text)
  tree = safe_expr.parse(s)
  return safe_expr.value(tree), sorted(int(m) for m in _INTS.findall(s)), safe_expr.canonical(tree)


def score_countdown(data: dict, parsed) -> tuple:
  value, used, canon = parsed
  if used != sorted(data["numbers"]):
    return 0.05, canon, f"uses {used}, not each of {sorted(data['numbers'])} once"
  if value != data["target"]:
    return 0.05, canon, f"equals {value}, not {data['target']}"
  return 1.0, canon, "ok"


def score_puzzle24(data: dict, parsed) -> tuple:
  value, used, canon = parsed
  if used != sorted(data["numbers"]):
    return 0.01, canon, f"uses {used}, not each of {sorted(data['numbers'])} once"
  if value != 24:
    return 0.01, canon, f"equals {value}, not 24"
  return 1.0, canon, "ok"


def _show(tree, parent: str = "", right: bool = False) -> str:
  """An expression tree as text with the parentheses precedence needs."""
  if tree[0] == "num":
    return str(tree[1])
  op, a, b = tree
  text = f"{_show(a, op)} {op} {_show(b, op, True)}" if op in "+-" else f"{_show(a, op)}{op}{_show(b, op, True)}"
  low = op in "+-"
  needs = (parent in "*/" and parent and low) or (right and parent == "-" and low) or \
      (right and parent == "/" and not low)
  return f"({text})" if needs else text


def solve(numbers, target, *, classic: bool, budget: int) -> str | None:
  """An expression using each number once that equals `target`, the first in a fixed search
  order (so a function of the numbers and the target), or None when there is none or the
  search passes `budget` states. classic: the numbers game's rules (a subtraction's result
  is positive, a division's exact), a smaller search that finds most countdown answers."""
  failed, count = set(), 0

  def search(items):
    nonlocal count
    if len(items) == 1:
      return items[0][1] if items[0][0] == target else None
    state = tuple(sorted(v for v, _ in items))
    if state in failed:
      return None
    count += 1
    if count > budget:
      raise TimeoutError
    for i, (x, tx) in enumerate(items):
      for j, (y, ty) in enumerate(items):
        if i == j:
          continue
        rest = [it for k, it in enumerate(items) if k not in (i, j)]
        options = [(x + y, "+"), (x * y, "*")] if i < j else []  # commutative: one order
        if not classic or x > y:
          options.append((x - y, "-"))
        if y and (not classic or x % y == 0):
          options.append((x / y, "/"))
        for v, op in options:
          found = search(rest + [(v, (op, tx, ty))])
          if found is not None:
            return found
    failed.add(state)
    return None

  try:
    tree = search([(Fraction(n), ("num", n)) for n in numbers])
  except TimeoutError:
    return None
  return None if tree is None else _show(tree)


def arithmetic_reference(target_of: Callable[[dict], int]):
  """The first answer of the numbers game's search, else of the full search, else the dataset's
  (whether a search finds one is decided by the numbers and the target, so the reference stays
  a function of the question)."""
  def reference(entry: dict, data: dict) -> str:
    numbers, target = data["numbers"], target_of(data)
    return (solve(numbers, target, classic=True, budget=SEARCH_BUDGET)
            or solve(numbers, target, classic=False, budget=SEARCH_BUDGET) or entry["answer"])
  return reference


# ---- graph_color ------------------------------------------------------------------------------

def parse_json(text: str):
  s = bounded(text)
  try:
    return json.loads(s)
  except (ValueError, RecursionError) as e:
    raise ParseError(f"not JSON ({type(e).__name__})") from None


def score_graph_color(data: dict, colouring) -> tuple:
  """reasoning-gym's verify_graph_coloring_solution on a JSON object: every vertex coloured (a
  key "3" names vertex 3), every colour allowed, no edge with one colour on both ends."""
  if not isinstance(colouring, dict):
    return 0.0, None, "not a JSON object of vertex -> colour"
  p = data["puzzle"]
  colours = {}
  for v in p["vertices"]:
    if str(v) not in colouring:
      return 0.01, None, f"vertex {v} has no colour"
    colours[v] = colouring[str(v)]
  for v, c in colours.items():
    if isinstance(c, (list, dict)):
      return 0.0, None, f"vertex {v}: colour {c!r} is not a value"
    if c not in set(p["color_options"]):
      return 0.01, None, f"vertex {v}: colour {c!r} not in {p['color_options']}"
  for u, v in p["edges"]:
    if colours[u] == colours[v]:
      return 0.01, None, f"edge ({u}, {v}) has colour {colours[u]!r} on both ends"
  return 1.0, partition(colours), "ok"


def partition(colours: dict):
  """A colouring up to renaming its colours: the sorted classes of vertices of one colour."""
  classes = {}
  for v, c in colours.items():
    classes.setdefault(c, []).append(v)
  return tuple(sorted(tuple(sorted(vs)) for vs in classes.values()))


def first_colouring(puzzle: dict, budget: int = SEARCH_BUDGET) -> dict | None:
  """The first proper colouring in vertex order and colour order (backtracking), or None."""
  vs, options = list(puzzle["vertices"]), list(puzzle["color_options"])
  nbrs = {v: set() for v in vs}
  for u, v in puzzle["edges"]:
    nbrs[u].add(v)
    nbrs[v].add(u)
  out, count = {}, 0

  def go(i):
    nonlocal count
    count += 1
    if count > budget:
      raise TimeoutError
    if i == len(vs):
      return True
    for c in options:
      if all(out.get(u) != c for u in nbrs[vs[i]]):
        out[vs[i]] = c
        if go(i + 1):
          return True
        del out[vs[i]]
    return False

  try:
    return dict(out) if go(0) else None
  except TimeoutError:
    return None


def graph_color_reference(entry: dict, data: dict) -> str:
  colouring = first_colouring(data["puzzle"]) or entry["metadata"]["possible_answer"]
  return json.dumps({str(v): c for v, c in colouring.items()})


# ---- shortest_path ---------------------------------------------------------------------------

MOVES = {"right": (0, 1), "down": (1, 0), "left": (0, -1), "up": (-1, 0)}


def parse_path(text: str):
  words = bounded(text).split()
  if words != ["infeasible"] and any(w not in MOVES for w in words):
    bad = next(w for w in words if w not in MOVES)
    raise ParseError(f"{bad[:20]!r} is not one of {sorted(MOVES)} (or 'infeasible')")
  return tuple(words)


def score_shortest_path(data: dict, path) -> tuple:
  oracle = data["oracle"].split()
  if list(path) == oracle:
    return 1.0, path, "ok"
  grid = data["matrix"]
  cells = {(r, c): x for r, row in enumerate(grid) for c, x in enumerate(row)}
  start = next(rc for rc, x in cells.items() if x == "*")
  r, c = start
  for w in path:
    if w not in MOVES:
      return 0.0, None, "'infeasible', but a path exists"
    r, c = r + MOVES[w][0], c + MOVES[w][1]
    if cells.get((r, c), "X") == "X":
      return 0.0, None, f"the path leaves the grid or enters a blocked cell at ({r}, {c})"
  if cells[(r, c)] != "#":
    return 0.0, None, f"the path ends at ({r}, {c}), not at #"
  if len(path) == len(oracle):
    return 1.0, path, "ok"
  return 0.5, path, f"{len(path)} moves, the shortest takes {len(oracle)}"


# ---- n_queens --------------------------------------------------------------------------------

def parse_board(text: str):
  """("text", board text) when the text is a board of Q and _; ("literal", board text) when it
  is a Python list of rows (reasoning-gym evaluates those, for half a score); else ParseError."""
  s = bounded(text)
  rows = s.split("\n")
  if all(set(r.split()) <= {"Q", "_"} and r.split() for r in rows):
    return ("text", s)
  board = safe_expr.literal(s)
  if not isinstance(board, list) or not all(isinstance(r, (list, str)) for r in board):
    raise ParseError("a board literal is a list of rows")
  if not all(isinstance(x, str) for r in board for x in r):
    raise ParseError("a board literal's rows hold strings")
  return ("literal", "\n".join(" ".join(x for x in row) for row in board))


def score_n_queens(data: dict, parsed) -> tuple:
  kind, board = parsed
  if board in data["valid_answers"]:
    return (1.0, board, "ok") if kind == "text" else (0.5, board, "a valid board, written as a list")
  return 0.0, None, "not a completion of the board with non-attacking queens"


# ---- gsm_symbolic ----------------------------------------------------------------------------

_NUMBER = re.compile(r"-?[0-9]{1,18}(?:\.[0-9]{1,18})?\.?")


def parse_number(text: str) -> float:
  s = bounded(text)
  if not _NUMBER.fullmatch(s):
    raise ParseError(f"{s[:20]!r} is not a number")
  return float(s.rstrip("."))


def score_gsm(data: dict, number: float) -> tuple:
  if number == float(data["answer"]):
    return 1.0, number, "ok"
  return 0.01, number, f"{number}, not {data['answer']}"


# ---- futoshiki -------------------------------------------------------------------------------

def score_futoshiki(data: dict, answer: str) -> tuple:
  """reasoning-gym's rule: the oracle text (lines right-stripped) scores 1; otherwise 0.9 x the
  share of cells right in lines of exactly n digits 1-9; times oracle length / answer length
  when the answer is longer."""
  oracle, solution = data["oracle"], data["solution"]
  n = len(solution[0])
  if _rstrip_lines(answer) == _rstrip_lines(oracle):
    score, canon = 1.0, tuple(map(tuple, solution))
  else:
    row, hits, read = 0, 0, []
    for line in answer.split("\n"):
      if row >= len(solution):
        break
      numbers = [int(c) for c in line if c in "123456789"]
      if len(numbers) != n:
        continue
      hits += sum(a == b for a, b in zip(solution[row], numbers))
      read.append(tuple(numbers))
      row += 1
    score, canon = hits / (n * n), ("partial", tuple(read))
    score *= 0.9  # reasoning-gym's order of operations: the same float
  if len(answer) > len(oracle):
    score *= len(oracle) / len(answer)
  return score, canon if score > 0 else None, "ok" if score == 1 else f"score {score:.3f}"


def _rstrip_lines(s: str) -> str:
  return "\n".join(line.rstrip() for line in s.split("\n"))


# ---- short numeric answers: basic_arithmetic, chain_sum, leg_counting, letter_counting ----------

_PLAIN_NUMBER = re.compile(r"[+-]?[0-9][0-9,]{0,39}(?:\.[0-9]{0,20})?")


def parse_plain_number(text: str) -> str:
  """The answer text when it is one number in plain decimal notation (a sign, digits, commas,
  a decimal point), else ParseError; scored as text, the way reasoning-gym scores it."""
  s = bounded(text)
  if not _PLAIN_NUMBER.fullmatch(s):
    raise ParseError(f"{s[:20]!r} is not a number")
  return s


def score_exact_text(data: dict, answer: str) -> tuple:
  """reasoning-gym's default score_answer (ProceduralDataset): 1 for the oracle text, else
  len(oracle) / len(answer) when the answer contains the oracle, else 0."""
  oracle = data["answer"]
  if answer == oracle:
    return 1.0, answer, "ok"
  if oracle in answer:
    return len(oracle) / len(answer), None, f"{answer!r} contains {oracle!r}"
  return 0.0, None, f"{answer!r}, not {oracle!r}"


def score_decimal(data: dict, answer: str) -> tuple:
  """reasoning-gym's utils.compute_decimal_reward (chain_sum): commas dropped, 1 when the two
  are equal decimals ('+01,000.00' is 1000), else the default rule's containment credit."""
  a, oracle = answer.replace(",", ""), data["answer"].replace(",", "")
  try:
    if Decimal(a) == Decimal(oracle):
      return 1.0, oracle, "ok"
  except (ArithmeticError, ValueError):
    pass
  if oracle in a:
    return len(oracle) / len(a), None, f"{answer!r} contains {oracle!r}"
  return 0.0, None, f"{answer!r}, not {oracle!r}"


def check_integer_answer(data: dict) -> None:
  require(re.fullmatch(r"-?[0-9]{1,30}", data["answer"]) is not None, "data.answer must be an integer")


# ---- number_sorting --------------------------------------------------------------------------

def parse_number_list(text: str) -> tuple:
  """reasoning-gym's reading: single quotes become double quotes, json.loads, a list, each item
  through float(); anything else ParseError (reasoning-gym: 0). Non-finite numbers are refused."""
  s = bounded(text).replace("'", '"')
  try:
    value = json.loads(s)
  except (ValueError, RecursionError) as e:
    raise ParseError(f"not JSON ({type(e).__name__})") from None
  if not isinstance(value, list):
    raise ParseError("not a JSON list")
  try:
    numbers = tuple(float(x) for x in value)
  except (TypeError, ValueError, OverflowError):
    raise ParseError("a list item is not a number") from None
  if not all(math.isfinite(x) for x in numbers):
    raise ParseError("a list item is not a finite number")
  return numbers


def score_number_sorting(data: dict, numbers: tuple) -> tuple:
  """reasoning-gym's rule: as many numbers as the oracle, sorted in the asked direction, each
  within 1 of the oracle's number in its place."""
  expected = [float(x) for x in data["sorted_numbers"]]
  if len(numbers) != len(expected):
    return 0.0, None, f"{len(numbers)} numbers, not {len(expected)}"
  ordered = sorted(numbers, reverse=data["direction"] != "ascending")
  if list(numbers) != ordered:
    return 0.0, None, f"not in {data['direction']} order"
  if any(abs(a - b) > 1 for a, b in zip(numbers, expected)):
    return 0.0, None, "a number differs from the sorted list's by more than 1"
  return 1.0, numbers, "ok"


def check_sorting(data: dict) -> None:
  nums = data["sorted_numbers"]
  require(nums and all(isinstance(x, str) and re.fullmatch(r"-?[0-9]{1,12}(\.[0-9]{1,12})?", x)
                       for x in nums), "data.sorted_numbers must be decimal strings")
  require(data["direction"] in ("ascending", "descending"),
          "data.direction must be 'ascending' or 'descending'")


# ---- the table -------------------------------------------------------------------------------

_ONE_NUMBER = ("the answer must be one number in plain notation (reasoning-gym gives text that "
               "contains the oracle's number len(oracle) / len(text), so 'It is 4' scores 0.14 there, 0 here)")
_REFUSED = "an answer our parser refuses scores 0 (reasoning-gym: 0.01)"

SCORERS = {s.name: s for s in (
    Scorer("countdown", parse_arithmetic, score_countdown,
           lambda e: {"numbers": list(e["metadata"]["numbers"]), "target": e["metadata"]["target"]},
           arithmetic_reference(lambda d: d["target"]),
           {"numbers": (list,), "target": (int,)},
           (_REFUSED + ", which includes '**', '^', '=', names and calls, and division by zero",
            "the value must equal the target exactly (reasoning-gym: numpy.isclose, relative 1e-5)"),
           check_numbers),
    Scorer("puzzle24", parse_arithmetic, score_puzzle24,
           lambda e: {"numbers": list(e["metadata"]["numbers"])},
           arithmetic_reference(lambda d: 24),
           {"numbers": (list,)},
           (_REFUSED,
            "the numbers must be the instance's (reasoning-gym: any 4 numbers in the value range)",
            "the value must be exactly 24 (reasoning-gym truncates it to an integer: 49/2 counts)"),
           check_numbers),
    Scorer("graph_color", parse_json, score_graph_color,
           lambda e: {"puzzle": e["metadata"]["puzzle"]}, graph_color_reference,
           {"puzzle": (dict,)},
           ("a JSON value that is not an object scores 0 (reasoning-gym: 0.01 for most lists)",),
           check_puzzle),
    Scorer("shortest_path", parse_path, score_shortest_path,
           lambda e: {"matrix": e["metadata"]["matrix"], "oracle": e["answer"].strip()},
           lambda e, d: d["oracle"],
           {"matrix": (list,), "oracle": (str,)}, (), check_grid),
    Scorer("n_queens", parse_board, score_n_queens,
           lambda e: {"valid_answers": sorted(e["metadata"]["valid_answers"])},
           lambda e, d: d["valid_answers"][0],
           {"valid_answers": (list,)},
           ("a board written as a Python expression other than a list or tuple literal of "
            "strings scores 0 (reasoning-gym evaluates it with Python's eval)",)),
    Scorer("gsm_symbolic", parse_number, score_gsm,
           lambda e: {"answer": str(e["answer"])}, lambda e, d: d["answer"],
           {"answer": (str,)},
           ("the answer must be one number (reasoning-gym reads the first number anywhere in the "
            "text, so 'about 288 apples' scores 1 there and 0 here)",
            "a negative number is read with its sign (reasoning-gym drops a leading minus sign, "
            "so the reference '-1' scores 0.01 there and 1 here)")),
    Scorer("futoshiki", bounded, score_futoshiki,
           lambda e: {"solution": e["metadata"]["solution"], "oracle": e["answer"]},
           lambda e, d: d["oracle"],
           {"solution": (list,), "oracle": (str,)}, (), check_solution),
    *(Scorer(name, parse_plain_number, score_exact_text,
             lambda e: {"answer": str(e["answer"])}, lambda e, d: d["answer"],
             {"answer": (str,)}, (_ONE_NUMBER,), check_integer_answer)
      for name in ("basic_arithmetic", "leg_counting", "letter_counting")),
    Scorer("chain_sum", parse_plain_number, score_decimal,
           lambda e: {"answer": str(e["answer"])}, lambda e, d: d["answer"],
           {"answer": (str,)},
           (_ONE_NUMBER + "; exponents ('1e3') are refused (reasoning-gym's Decimal reads them)",),
           check_integer_answer),
    Scorer("number_sorting", parse_number_list, score_number_sorting,
           lambda e: {"sorted_numbers": list(e["metadata"]["sorted_numbers"]),
                      "direction": e["metadata"]["direction"]},
           lambda e, d: e["answer"],
           {"sorted_numbers": (list,), "direction": (str,)},
           ("a list holding NaN or infinity scores 0 (reasoning-gym: a list of NaNs can score 1)",),
           check_sorting),
)}
