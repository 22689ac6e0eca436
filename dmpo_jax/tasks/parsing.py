"""Safe, bounded parsing of model answers (untrusted text; never `eval`).

This is strict mode's reading (NP-Bench's own per-task reading is in
npbench_rules.py). The answer is the text after the LAST ``Answer:``. Only the first
``MAX_ANSWER_CHARS`` characters after it are read, nesting is bounded, and the
parser is a single left-to-right scan, so any input is answered in
milliseconds. Accepted forms:

* a bracketed literal: ``[0, 3, 1, 0]``, ``[(0, 1, 540), (1, 0, 630)]``,
  ``[[0, 2], [1, 3]]`` (round or square brackets, integers, optionally quoted
  integers such as ``'3'``; trailing text after the literal is ignored);
* the arrow form ``0 -> 3 -> 1 -> 0`` (optionally wrapped in brackets);
* otherwise the first bracketed group anywhere in the answer.

Refused as accidental parses: digits other than ASCII 0-9 (Python's ``\\d``
and ``int`` read e.g. Arabic-Indic digits), and an answer whose first bracket
is ``{`` (a dict or set, such as ``{"tour": [0, 1, 0]}``, whose first list
would otherwise be read).
"""

from __future__ import annotations

import re

MARKER = "Answer:"
MAX_ANSWER_CHARS = 4096
MAX_DEPTH = 4
MAX_ITEMS = 4096


class ParseError(ValueError):
  """The answer text is not a well-formed list; the message says why."""


def extract_answer(text: str) -> str | None:
  """Text after the last ``Answer:``, bounded to ``MAX_ANSWER_CHARS``; None if absent."""
  if not isinstance(text, str):
    return None
  i = text.rfind(MARKER)
  if i < 0:
    return None
  return text[i + len(MARKER):i + len(MARKER) + MAX_ANSWER_CHARS]


_DECOR = str.maketrans({"*": " ", "`": " ", "$": " "})
_INT = re.compile(r"\s*([+-]?[0-9]{1,18})\s*")
_ARROW_ITEM = re.compile(r"^\s*['\"]?([+-]?[0-9]{1,18})['\"]?\s*$")


def clean(answer: str) -> str:
  return answer[:MAX_ANSWER_CHARS].translate(_DECOR).strip()


class _Scanner:
  """Recursive-descent parser for nested lists/tuples of integers."""

  def __init__(self, s: str, pos: int):
    self.s, self.pos, self.items = s, pos, 0

  def _skip(self):
    s, n = self.s, len(self.s)
    while self.pos < n and s[self.pos] in " \t\r\n":
      self.pos += 1

  def value(self, depth: int):
    self._skip()
    if self.pos >= len(self.s):
      raise ParseError("answer ends inside a list")
    c = self.s[self.pos]
    if c in "[(":
      if depth >= MAX_DEPTH:
        raise ParseError(f"lists nested deeper than {MAX_DEPTH}")
      return self.seq(depth + 1)
    if c in "'\"":
      end = self.s.find(c, self.pos + 1)
      if end < 0 or end - self.pos > 20:
        raise ParseError("unterminated or overlong quoted item")
      inner = self.s[self.pos + 1:end]
      m = _INT.fullmatch(inner)
      if not m:
        raise ParseError(f"item {inner!r} is not an integer")
      self.pos = end + 1
      return int(m.group(1))
    m = _INT.match(self.s, self.pos)
    if not m:
      snippet = self.s[self.pos:self.pos + 12]
      raise ParseError(f"expected an integer at {snippet!r}")
    self.pos = m.end()
    # Reject decimals such as 3.5 rather than reading them as 3.
    if self.pos < len(self.s) and self.s[self.pos] in ".eE" and \
        self.pos + 1 < len(self.s) and self.s[self.pos + 1].isdigit():
      raise ParseError("items must be integers")
    return int(m.group(1))

  def seq(self, depth: int):
    close = "]" if self.s[self.pos] == "[" else ")"
    is_tuple = close == ")"
    self.pos += 1
    out = []
    self._skip()
    if self.pos < len(self.s) and self.s[self.pos] == close:
      self.pos += 1
      return tuple(out) if is_tuple else out
    while True:
      out.append(self.value(depth))
      self.items += 1
      if self.items > MAX_ITEMS:
        raise ParseError(f"more than {MAX_ITEMS} items")
      self._skip()
      if self.pos >= len(self.s):
        raise ParseError(f"missing closing {close!r}")
      c = self.s[self.pos]
      if c == ",":
        self.pos += 1
        self._skip()
        if self.pos < len(self.s) and self.s[self.pos] == close:  # trailing comma
          self.pos += 1
          break
        continue
      if c == close:
        self.pos += 1
        break
      raise ParseError(f"unexpected {c!r} in list")
    return tuple(out) if is_tuple else out


def parse_list(answer: str):
  """Parse an answer body into a (nested) Python list of ints.

  Raises ParseError with a reason; never evaluates the text.
  """
  if not isinstance(answer, str):
    raise ParseError("answer is not text")
  s = clean(answer)
  if not s:
    raise ParseError("empty answer")
  # Arrow form: 0 -> 3 -> 1 -> 0 (optionally inside one pair of brackets).
  if "->" in s:
    body = s
    if body[0] in "[(" and body[-1] in "])":
      body = body[1:-1]
    line = body.splitlines()[0] if body else ""
    parts = line.split("->")
    if len(parts) > MAX_ITEMS:
      raise ParseError(f"more than {MAX_ITEMS} items")
    items = []
    for p in parts:
      m = _ARROW_ITEM.match(p.rstrip(" .;,"))
      if not m:
        raise ParseError(f"arrow item {p.strip()[:12]!r} is not an integer")
      items.append(int(m.group(1)))
    return items
  start = -1
  for i, c in enumerate(s):
    if c == "{":
      raise ParseError("the answer is a dict or set, not a list")
    if c in "[(":
      start = i
      break
  if start < 0:
    raise ParseError("no list found after 'Answer:'")
  result = _Scanner(s, start).value(0)
  return list(result) if isinstance(result, tuple) else result


def parse_int_list(answer: str) -> list[int]:
  """A flat list of integers (tuples/lists of ints refused)."""
  items = parse_list(answer)
  if not isinstance(items, list) or any(not isinstance(x, int) for x in items):
    raise ParseError("expected a flat list of integers")
  return items
