"""Arithmetic and literals read from untrusted text through an AST whitelist (never Python's eval).

Model answers such as ``94*4 - 61 - 6`` or ``[["_", "Q"], ["Q", "_"]]`` are parsed with
``ast.parse`` (a parser: nothing runs) and then walked node by node; any node outside the
whitelist refuses the whole text with a ParseError that names it:

* ``expression``: numbers, ``+ - * /``, unary ``+ -`` and parentheses. A number is plain
  decimal digits with an optional fraction (``12``, ``2.5``; no ``1e3``, ``0x10``, ``1_0``),
  at most MAX_DIGITS digits; at most MAX_NODES nodes; no ``**`` (so no huge powers), no
  names, calls, attributes, subscripts, lambdas or comprehensions. Values are exact
  fractions; division by zero refuses the text. Input is cut off at max_chars, nodes are
  bounded, and evaluation checks a wall-clock deadline, so every answer is decided in
  milliseconds.
* ``literal``: nested lists / tuples of short strings and small integers (a board written as
  a Python list), depth and item count bounded.

``canonical`` turns an expression into a hashable normal form in which commutativity and
associativity are applied (``a+b`` = ``b+a``, ``a-(b-c)`` = ``a-b+c``, ``a/(b/c)`` =
``a*c/b``): two answers get one form when they are the same arithmetic up to reordering.
Distributivity is not applied (each number of a countdown answer is used once, so no two
such answers differ by it).
"""

from __future__ import annotations

import ast
import re
import time
from fractions import Fraction

from dmpo_jax.tasks.parsing import ParseError

MAX_CHARS = 512
MAX_NODES = 64
MAX_DIGITS = 18
TIME_LIMIT = 0.05  # seconds per expression; with the bounds above it is never near
_NUMBER = re.compile(r"[0-9]{1,%d}(?:\.[0-9]{1,%d})?" % (MAX_DIGITS, MAX_DIGITS))
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _tree(text: str, max_chars: int) -> tuple[str, ast.AST]:
  """The Python expression AST of `text` (stripped, at most max_chars), or ParseError."""
  if not isinstance(text, str):
    raise ParseError("the answer is not text")
  s = text.strip()
  if not s:
    raise ParseError("empty answer")
  if len(s) > max_chars:
    raise ParseError(f"longer than {max_chars} characters")
  try:
    return s, ast.parse(s, mode="eval").body
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    raise ParseError(f"not an expression ({type(e).__name__})") from None


def parse(text: str, *, max_chars: int = MAX_CHARS, max_nodes: int = MAX_NODES):
  """The whitelisted expression tree of `text`: ("num", Fraction) | ("neg", t) | (op, a, b)."""
  s, root = _tree(text, max_chars)
  count = 0

  def walk(node, depth):
    nonlocal count
    count += 1
    if count > max_nodes or depth > max_nodes:
      raise ParseError(f"more than {max_nodes} nodes")
    if isinstance(node, ast.BinOp) and type(node.op) not in _OPS:
      raise ParseError(f"operator {type(node.op).__name__} is not allowed (+ - * / only)")
    if isinstance(node, ast.BinOp):
      return (_OPS[type(node.op)], walk(node.left, depth + 1), walk(node.right, depth + 1))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
      inner = walk(node.operand, depth + 1)
      return ("neg", inner) if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
      seg = ast.get_source_segment(s, node) or ""
      if not _NUMBER.fullmatch(seg):
        raise ParseError(f"number {seg[:20]!r} is not plain decimal digits")
      return ("num", Fraction(seg))
    raise ParseError(f"{type(node).__name__} is not allowed (numbers, + - * / and parentheses only)")

  return walk(root, 0)


def value(tree, *, deadline: float | None = None) -> Fraction:
  """The exact value of a `parse` tree; ParseError on division by zero or past the deadline."""
  deadline = time.monotonic() + TIME_LIMIT if deadline is None else deadline

  def ev(t):
    if time.monotonic() > deadline:
      raise ParseError("evaluation took too long")
    if t[0] == "num":
      return t[1]
    if t[0] == "neg":
      return -ev(t[1])
    a, b = ev(t[1]), ev(t[2])
    if t[0] == "+":
      return a + b
    if t[0] == "-":
      return a - b
    if t[0] == "*":
      return a * b
    if b == 0:
      raise ParseError("division by zero")
    return a / b

  return ev(tree)


def evaluate(text: str, **kw) -> Fraction:
  """`value(parse(text))`: the exact value of a whitelisted arithmetic text."""
  return value(parse(text, **kw))


def canonical(tree):
  """A hashable normal form of a `parse` tree, equal for reorderings (see the module doc)."""
  kind = tree[0]
  if kind == "num":
    return ("n", str(tree[1]))
  if kind in ("+", "-", "neg"):
    terms = []
    _terms(tree, 1, terms)
    if len(terms) == 1 and terms[0][0] == 1:
      return terms[0][1]
    return ("+", tuple(sorted(terms, key=repr)))
  factors = []
  _factors(tree, 1, factors)
  return ("*", tuple(sorted(factors, key=repr)))


def _terms(t, sign, out):
  if t[0] == "+":
    _terms(t[1], sign, out)
    _terms(t[2], sign, out)
  elif t[0] == "-":
    _terms(t[1], sign, out)
    _terms(t[2], -sign, out)
  elif t[0] == "neg":
    _terms(t[1], -sign, out)
  else:
    out.append((sign, canonical(t)))


def _factors(t, power, out):
  if t[0] == "*":
    _factors(t[1], power, out)
    _factors(t[2], power, out)
  elif t[0] == "/":
    _factors(t[1], power, out)
    _factors(t[2], -power, out)
  else:
    out.append((power, canonical(t)))


def literal(text: str, *, max_chars: int = 4096, max_items: int = 1024, max_depth: int = 3,
            max_str: int = 64):
  """Nested lists (tuples read as lists) of strings and integers written as a Python literal;
  ParseError for anything else (names, calls, dicts, sets, operators, long strings)."""
  s, root = _tree(text, max_chars)
  count = 0

  def walk(node, depth):
    nonlocal count
    count += 1
    if count > max_items:
      raise ParseError(f"more than {max_items} items")
    if isinstance(node, (ast.List, ast.Tuple)):
      if depth >= max_depth:
        raise ParseError(f"nested deeper than {max_depth}")
      return [walk(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) <= max_str:
      return node.value
    if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 10 ** MAX_DIGITS:
      return node.value
    raise ParseError(f"{type(node).__name__} is not allowed in a literal (lists of strings and numbers only)")

  return walk(root, 0)
