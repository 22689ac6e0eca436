"""The AST whitelist of tasks/safe_expr.py: exact arithmetic on numbers and + - * / ( ) only,
hostile text refused fast and without side effects, and canonical forms up to reordering."""

import os
import time
from fractions import Fraction

import pytest

from dmpo_jax.tasks import safe_expr
from dmpo_jax.tasks.parsing import ParseError

HOSTILE = [
    "__import__('os').system('touch PWNED')",
    "open('PWNED', 'w').write('x')",
    "(lambda: __import__('os').system('touch PWNED'))()",
    "9**9**9**9",
    "2**3",
    "[x for x in range(10**9)]",
    "().__class__.__bases__[0].__subclasses__()",
    "1e308*1e308",
    "0x10 + 1",
    "1_000 + 1",
    "(" * 300 + "1" + ")" * 300,
    "-" * 400 + "1",
    "1" * 40,
    "a + 1",
    "'1' + '2'",
    "1 if 1 else 2",
    "1 < 2",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_refused_fast_and_runs_nothing(text, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  t0 = time.monotonic()
  with pytest.raises(ParseError):
    safe_expr.evaluate(text)
  with pytest.raises(ParseError):
    safe_expr.literal(text)
  assert time.monotonic() - t0 < 0.5
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("text, value", [
    ("94*4 - 61 - 6", 309), ("(8 - 5) * 10 - 6", 24), ("8/(3-8/3)", 24), ("-3 + +4", 1),
    ("2.5*2", 5), ("1/3 + 1/6", Fraction(1, 2)), (" 7 ", 7), ("((((2))))", 2)])
def test_arithmetic_is_exact(text, value):
  assert safe_expr.evaluate(text) == value


def test_division_by_zero_and_bounds_refuse():
  with pytest.raises(ParseError, match="division by zero"):
    safe_expr.evaluate("5/(3-3)")
  with pytest.raises(ParseError, match="nodes"):
    safe_expr.evaluate("+".join(["1"] * 40))
  assert safe_expr.evaluate("+".join(["1"] * 30)) == 30
  with pytest.raises(ParseError, match="characters"):
    safe_expr.evaluate("1" + " " * 600 + "+1")
  with pytest.raises(ParseError, match="Pow"):
    safe_expr.evaluate("2**2")


def test_canonical_forms_identify_reorderings_only():
  form = lambda s: safe_expr.canonical(safe_expr.parse(s))
  same = ["94*4 - 61 - 6", "4*94 - 6 - 61", "94*4 - (61 + 6)", "-6 + 4*94 - 61", "(94*4) - 61 - 6"]
  assert len({form(s) for s in same}) == 1
  assert form("8/(4/2)") == form("8*2/4")
  assert form("10-(4-2)") == form("10-4+2")
  different = ["94*4 - 61 - 6", "94*4 - 61 + 6", "94 + 4 - 61 - 6", "94*(4 - 61) - 6", "94/4 - 61 - 6"]
  assert len({form(s) for s in different}) == len(different)


def test_literals_are_lists_of_strings_and_numbers():
  assert safe_expr.literal("[['_', 'Q'], ('Q', '_')]") == [["_", "Q"], ["Q", "_"]]
  assert safe_expr.literal("[1, 2]") == [1, 2]
  for bad in ("{'a': 1}", "[f(1)]", "[[[[1]]]]", "['x' * 3]", "[" + "'a'," * 2000 + "]"):
    with pytest.raises(ParseError):
      safe_expr.literal(bad)
