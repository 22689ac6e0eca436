"""NP-Bench's own acceptance rules (``compat="npbench"``), task by task, on the full response.

NP-Bench scores a response with one ``validation(question, response)`` per
task; they differ from our strict reading (``parsing.py``) and from each other
in where the answer starts, which list forms they read, and what they check.
This module is our own implementation of that behaviour, so that a verdict
and value here are the ones NP-Bench would give (docs/TASKS.md lists every
rule and quirk reproduced, and why). An exception inside NP-Bench's check
counts as a refusal, so every refusal here is a verdict, never an error.

The one deliberate difference: where NP-Bench evaluates the answer as a
Python expression (maximum clique, independent set, minimum cut), a bounded
literal parser (``literal``) reads it instead. It reads the literals a model
writes (ints, floats, quoted strings, True/False/None, lists, tuples,
comments) and refuses the rest (sets, dicts, arithmetic, hex, underscores,
string escapes), each of which NP-Bench would accept or refuse on its own.
"""

from __future__ import annotations

import re

MARKER = "Answer:"
MAX_CHARS = 8192    # answer text read by the literal parser
MAX_ANSWER = 65536  # longer text after the marker is refused (NP-Bench reads any length)
_OPEN, _CLOSE = "[({", "])}"
MAX_DEPTH = 4
MAX_ITEMS = 4096

_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?")


class Refused(Exception):
  """NP-Bench refuses the answer (or its check would raise); the message says why."""


# ---------------------------------------------------------------------------
# A bounded Python-literal reader (in place of NP-Bench's eval / literal_eval).
class _Literal:

  def __init__(self, s: str):
    self.s, self.pos, self.items = s, 0, 0

  def skip(self):
    s = self.s
    while self.pos < len(s):
      c = s[self.pos]
      if c in " \t\r\n\f":
        self.pos += 1
      elif c == "#":  # a comment runs to the end of the line
        end = s.find("\n", self.pos)
        self.pos = len(s) if end < 0 else end
      else:
        break

  def value(self, depth: int):
    self.skip()
    s = self.s
    if self.pos >= len(s):
      raise Refused("answer ends inside a literal")
    c = s[self.pos]
    if c in "[(":
      if depth >= MAX_DEPTH:
        raise Refused(f"literal nested deeper than {MAX_DEPTH}")
      return self.seq(depth + 1)
    if c in "'\"":
      end = s.find(c, self.pos + 1)
      body = s[self.pos + 1:end] if end >= 0 else ""
      if end < 0 or "\\" in body or "\n" in body:
        raise Refused("unterminated or escaped string")
      self.pos = end + 1
      return body
    for word, v in (("True", True), ("False", False), ("None", None)):
      if s.startswith(word, self.pos) and not s[self.pos + len(word):self.pos + len(word) + 1].isidentifier():
        self.pos += len(word)
        return v
    sign = 1
    if c in "+-":
      sign = -1 if c == "-" else 1
      self.pos += 1
      self.skip()
    m = _NUMBER.match(s, self.pos)
    if not m or m.end() - m.start() > 40:
      raise Refused(f"not a literal at {s[self.pos:self.pos + 12]!r}")
    text = m.group(0)
    nxt = s[m.end():m.end() + 1]
    if nxt.isalnum() or nxt in "_.":  # 0x1, 1_0, 1j, 3abc: not read here
      raise Refused(f"unsupported literal near {s[m.start():m.end() + 4]!r}")
    self.pos = m.end()
    if m.group(1) is None and m.group(2) is None and m.group(3) is None and text[0] != ".":
      if len(text) > 1 and text[0] == "0" and text.strip("0"):
        raise Refused(f"leading zeros in {text!r}")  # a syntax error in Python
      return sign * int(text)
    return sign * float(text)

  def seq(self, depth: int):
    opening = self.s[self.pos]
    close = "]" if opening == "[" else ")"
    self.pos += 1
    out, comma = [], False
    while True:
      self.skip()
      if self.pos >= len(self.s):
        raise Refused(f"missing closing {close!r}")
      if self.s[self.pos] == close:
        self.pos += 1
        break
      if out and not comma:
        raise Refused(f"expected ',' or {close!r} at {self.s[self.pos:self.pos + 12]!r}")
      out.append(self.value(depth))
      self.items += 1
      if self.items > MAX_ITEMS:
        raise Refused(f"more than {MAX_ITEMS} items")
      self.skip()
      comma = self.pos < len(self.s) and self.s[self.pos] == ","
      if comma:
        self.pos += 1
    if opening == "[":
      return out
    if len(out) == 1 and not comma:  # (x) is x; (x,) is a tuple
      return out[0]
    return tuple(out)


def literal(text: str):
  """The Python literal that is the whole of ``text`` (surrounding space and comments allowed)."""
  if len(text) > MAX_CHARS:
    raise Refused(f"answer longer than {MAX_CHARS} characters")
  p = _Literal(text)
  v = p.value(0)
  p.skip()
  if p.pos != len(text):
    raise Refused(f"text after the literal: {text[p.pos:p.pos + 12]!r}")
  return v


# ---------------------------------------------------------------------------
# Shared pieces of the per-task rules.
def after_marker(text: str, first: bool = False) -> str:
  """The text after the last (or first) ``Answer:``."""
  if not isinstance(text, str) or MARKER not in text:
    raise Refused("no 'Answer:' in the response")
  out = text.split(MARKER, 1)[1] if first else text.rsplit(MARKER, 1)[1]
  if len(out) > MAX_ANSWER:
    raise Refused(f"more than {MAX_ANSWER} characters after 'Answer:'")
  return out


def first_group(s: str) -> str | None:
  """The inside of the first bracketed group: from the first opening bracket (any of [({)
  to the first closing bracket after it (any of ])}), NP-Bench's pattern, found in linear
  time (a regular expression backtracks quadratically on a run of openers). None if none."""
  i = min((k for k in (s.find(c) for c in _OPEN) if k >= 0), default=-1)
  if i < 0:
    return None
  j = min((k for k in (s.find(c, i + 1) for c in _CLOSE) if k >= 0), default=-1)
  return s[i + 1:j] if j >= 0 else None


def list_body(answer: str) -> str:
  """The comma list inside an answer, as the list-reading tasks find it: the whole answer
  when it is one [...] (quotes kept), an arrow chain, else the first bracketed group (quotes
  dropped), else the quote-free answer."""
  s = answer.strip()
  if s.startswith("[") and s.endswith("]"):
    return s[1:-1]
  if "->" in s:
    return ",".join(part.strip() for part in s.split("->"))
  s = s.replace("'", "").replace('"', "")
  group = first_group(s)
  return s if group is None else group


def ints(body: str, *, skip_empty: bool = False, empty_ok: bool = False) -> list[int]:
  """Python's int() of each comma-separated piece (as NP-Bench converts them)."""
  if empty_ok and not body.strip():
    return []
  pieces = body.split(",")
  if len(pieces) > MAX_ITEMS:
    raise Refused(f"more than {MAX_ITEMS} items")
  try:
    return [int(p.strip()) for p in pieces if not (skip_empty and not p.strip())]
  except ValueError as e:
    raise Refused(f"not a list of integers ({e})") from None


# ---------------------------------------------------------------------------
# The ten tasks: each returns (value, the parsed answer) or raises Refused.
def coloring(q: dict, text: str):
  colors = ints(list_body(after_marker(text)), empty_ok=True)
  if not colors:
    raise Refused("coloring cannot be empty")
  if -1 in colors:
    raise Refused("-1 in the coloring")
  if len(colors) != len(q):
    raise Refused(f"{len(colors)} colours for {len(q)} vertices")
  for u, nbrs in q.items():
    if colors[int(u)] <= 0:
      raise Refused(f"vertex {u} has colour {colors[int(u)]} (must be positive)")
    for v in nbrs:
      if colors[int(u)] == colors[int(v)]:
        raise Refused(f"vertices {u} and {v} share colour {colors[int(u)]}")
  return len(set(colors)), colors


def tsp(q: dict, text: str):
  path = ints(list_body(after_marker(text)))
  n = len(q)
  if path[0] != path[-1]:
    raise Refused("the tour does not return to its start")
  if len(path) != n + 1:
    raise Refused(f"the tour lists {len(path)} cities, expected {n + 1}")
  if len(set(path[:-1])) != n or any(c < 0 or c >= n for c in path[:-1]):
    raise Refused("a city is repeated or out of range")
  try:
    return sum(q[str(a)][str(b)] for a, b in zip(path, path[1:])), path
  except KeyError as e:
    raise Refused(f"no distance for city {e}") from None


def cycle(q: dict, text: str):
  path = ints(list_body(after_marker(text)))
  if path[0] != path[-1]:
    raise Refused("the path does not return to its start")
  if len(set(path[:-1])) != len(path) - 1:
    raise Refused("a vertex is visited twice")
  for a, b in zip(path, path[1:]):
    if str(a) not in q:
      raise Refused(f"vertex {a} is not in the graph")
    if b not in {int(v) for v in q[str(a)]}:  # the file's ints; in-memory strings read alike
      raise Refused(f"vertices {a} and {b} are not adjacent")
  return len(path), path


def knapsack(q: dict, text: str):
  cap, items = q.get("capacity"), q.get("items")
  try:
    if int(cap) < 0:
      raise ValueError(cap)
  except (TypeError, ValueError):
    raise Refused("invalid capacity") from None
  if not isinstance(items, dict) or not items:
    raise Refused("no items")
  items = {str(k): v for k, v in items.items()}
  chosen = ints(list_body(after_marker(text)), skip_empty=True)
  if not chosen:
    raise Refused("the answer list is empty")
  if len(set(chosen)) != len(chosen):
    raise Refused("an item is listed twice")
  weight = value = 0
  for i in chosen:
    if str(i) not in items:
      raise Refused(f"item {i} does not exist")
    w, v = int(items[str(i)]["weight"]), int(items[str(i)]["value"])
    if w < 0 or v < 0:
      raise Refused(f"item {i} has a negative weight or value")
    weight, value = weight + w, value + v
  if weight > int(cap):
    raise Refused(f"total weight {weight} exceeds capacity {cap}")
  return value, chosen


def _adjacency(q: dict) -> tuple[set, dict]:
  """Vertices and symmetric neighbour sets of an adjacency list or dict (weights: 0 = no edge)."""
  verts, nbrs = set(), {}
  for u_raw, adj in q.items():
    try:
      u = int(u_raw)
    except (TypeError, ValueError):
      continue
    verts.add(u)
    nbrs.setdefault(u, set())
    pairs = adj.items() if isinstance(adj, dict) else ((v, 1) for v in adj) \
        if isinstance(adj, (list, set, tuple)) else ()
    for v_raw, w in pairs:
      try:
        v = int(v_raw)
      except (TypeError, ValueError):
        continue
      verts.add(v)
      if not isinstance(w, (int, float)) or w != 0:
        nbrs.setdefault(u, set()).add(v)
        nbrs.setdefault(v, set()).add(u)
  return verts, nbrs


def clique(q: dict, text: str):
  got = literal(after_marker(text, first=True).strip())
  if not isinstance(got, list):
    raise Refused("the answer is not a list")
  if not got:
    raise Refused("empty clique")
  if len(set(got)) != len(got):  # raw values: '1' and 1 differ here
    raise Refused("a vertex is listed twice")
  try:
    members = [int(x) for x in got]
  except (TypeError, ValueError):
    raise Refused("a vertex id is not an integer") from None
  verts, nbrs = _adjacency(q)
  if any(u not in verts for u in members):
    raise Refused("a vertex is not in the graph")
  group = set(members)
  for u in members:
    if not (group - {u}) <= nbrs.get(u, set()):
      raise Refused(f"vertex {u} is not adjacent to every other member")
  return len(members), members


def independent_set(q: dict, text: str):
  line = after_marker(text).split("\n")[0].strip()
  if line.startswith("[") and line.endswith("]"):
    got = literal(line)
  else:
    got = ints(line.replace("[", "").replace("]", ""))
  if not isinstance(got, list):
    raise Refused("the answer is not a list")
  names = [str(v) for v in got]
  if any(v not in q for v in names):
    raise Refused("a vertex is not in the graph")
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      if b in q.get(a, {}):
        raise Refused(f"vertices {a} and {b} are adjacent")
  return len(got), got


def meetings(q: dict, text: str):
  rooms, mtgs, avail = q["rooms"], q["meetings"], q["attendee_availability"]
  s = after_marker(text).strip()
  sched = []
  if s != "[]":
    if s.startswith("[") and s.endswith("]"):
      s = s[1:-1]
    chunks = s.replace("'", "").split("), (")
    if len(chunks) > MAX_ITEMS:
      raise Refused(f"more than {MAX_ITEMS} items")
    for chunk in chunks:
      parts = chunk.replace("(", "").replace(")", "").split(",")
      try:  # the first three numbers of each chunk; the rest is ignored
        sched.append(tuple(int(parts[j].strip()) for j in range(3)))
      except (ValueError, IndexError):
        raise Refused("a schedule item is not (meeting, room, start)") from None
  booked: dict = {}
  for m, r, t in sched:
    if str(r) not in rooms:
      raise Refused(f"unknown room {r}")
    if str(m) not in mtgs:
      raise Refused(f"unknown meeting {m}")
    end = t + mtgs[str(m)]["duration"]
    for m2, t2 in booked.get(r, []):
      if t < t2 + mtgs[str(m2)]["duration"] and end > t2:
        raise Refused(f"meeting {m} overlaps meeting {m2} in room {r}")
    booked.setdefault(r, []).append((m, t))
  total = 0
  for m, r, t in sched:
    people, end = mtgs[str(m)]["attendees"], t + mtgs[str(m)]["duration"]
    if len(people) > rooms[str(r)]:
      raise Refused(f"meeting {m} exceeds room {r}'s capacity")
    for a in people:
      if str(a) not in avail:
        raise Refused(f"attendee {a} has no availability")
      if not any(t >= s0 and end <= s1 for s0, s1 in avail[str(a)]):
        raise Refused(f"attendee {a} is not available for meeting {m}")
    total += len(people)
  return total, sched


def bisection(q: dict, text: str):
  s = after_marker(text).strip()
  if not (s.startswith("[") and s.endswith("]")):
    raise Refused("the answer is not [[...], [...]]")
  got = literal(s)
  if not isinstance(got, list) or len(got) != 2 or not all(isinstance(g, list) for g in got):
    raise Refused("the answer is not two lists")
  try:
    a, b = set(got[0]), set(got[1])
  except TypeError:
    raise Refused("a node is not a plain value") from None
  if a & b:
    raise Refused("a node is in both groups")
  nodes = {int(u) for u in q}
  if a | b != nodes:
    raise Refused("the groups do not cover exactly the graph's nodes")
  if abs(len(a) - len(b)) > len(nodes) % 2:
    raise Refused(f"unbalanced groups of {len(a)} and {len(b)}")
  try:
    return sum(q[str(u)].get(str(v), 0) for u in a for v in b), got
  except KeyError:
    raise Refused("a node id is not written as an integer") from None


def set_cover(q: dict, text: str):
  universe, subsets = set(q["U"]), q["S"]
  s = after_marker(text).strip()
  if s == "Impossible":
    if set().union(*map(set, subsets.values())) == universe:
      raise Refused("claims 'Impossible' but a cover exists")
    return 0, "Impossible"
  if s.startswith("[") and s.endswith("]"):
    s = s[1:-1]
  ids = ints(s, empty_ok=True)
  for i in ids:
    if str(i) not in subsets:
      raise Refused(f"unknown subset {i}")
  if set().union(*(set(subsets[str(i)]) for i in ids)) != universe:
    raise Refused("the subsets do not cover U")
  return len(ids), ids


def subset_sum(q: dict, text: str):
  s = after_marker(text).strip().replace("'", "").replace('"', "")
  group = first_group(s)
  ids = ints(s if group is None else group, skip_empty=True)
  if not ids:
    raise Refused("the index list is empty")
  numbers, target = q.get("numbers", {}), q.get("target")
  if target is None or not isinstance(numbers, dict):
    raise Refused("malformed instance")
  if any(str(i) not in numbers for i in ids):
    raise Refused("an index is not in the instance")
  total = sum(numbers[str(i)] for i in ids)
  if total != target:
    raise Refused(f"the sum {total} is not the target {target}")
  return len(ids), ids


RULES = {
    "GCP-D": coloring, "maximum_clique_problem": clique, "maximum-set": independent_set,
    "meeting-schedule": meetings, "minimum-cut": bisection, "set-cover": set_cover,
    "subset-sum": subset_sum, "knapsack": knapsack, "TSP": tsp, "hamiltonian-cycle": cycle,
}


def check(key: str, question: dict, text: str):
  """(value, parsed answer) by NP-Bench's rules for task ``key``; raises Refused.

  Any error inside a check is a refusal, as in NP-Bench's evaluation."""
  try:
    return RULES[key](question, text)
  except Refused:
    raise
  except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError,
          OverflowError) as e:
    raise Refused(f"check failed ({type(e).__name__}: {e})") from None
