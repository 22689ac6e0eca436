"""Transcripts: an instance written out in its compact text form (the compact prompt without
its "Answer:" line: the edge list, the item table, the distance matrix), and the way back.

A policy that reads an instance's image is trained to write its transcript first (the
perception stage of docs/MULTIMODAL.md); `read` turns what it wrote back into a question,
so that a transcription is scored as the instance it names. Model output is untrusted:
`read` parses numbers with int/float only and raises `TranscriptError` (a ValueError)
naming what is wrong.

    text = transcripts.text("TSP", q)          # "TSP n 4 dist 3 5 2 ; 4 1 ; 6"
    transcripts.read("TSP", text)              # a TSP question equal in content to q
"""

from __future__ import annotations

import re

from dmpo_jax import tasks as tasks_lib


class TranscriptError(ValueError):
  """A transcript that does not name an instance of its task."""


def text(key: str, q: dict) -> str:
  """The instance's transcript: its compact prompt without the "Answer:" line."""
  task = tasks_lib.get(key)
  return task.prompt(q, "compact").rsplit("\nAnswer:", 1)[0].strip()


def _number(tok: str, what: str):
  try:
    x = float(tok)
  except ValueError:
    raise TranscriptError(f"{what}: {tok!r} is not a number") from None
  return int(x) if x.is_integer() else x


def _int(tok: str, what: str) -> int:
  if not re.fullmatch(r"-?\d+", tok):
    raise TranscriptError(f"{what}: {tok!r} is not an integer")
  return int(tok)


def _fields(s: str, word: str, names: tuple) -> list[str]:
  """'GCP n 5 edges 0-2 1-4' with names ("n", "edges") -> ["5", "0-2 1-4"]."""
  head, *rest = s.strip().split(None, 1)
  if head != word:
    raise TranscriptError(f"a transcript of this task starts with {word!r}, got {head!r}")
  pattern = r"\s*" + r"\s+".join(rf"{n}(?:\s+(.*?))?" for n in names) + r"\s*"
  m = re.fullmatch(pattern, rest[0] if rest else "", re.S)
  if m is None:
    raise TranscriptError(f"expected the fields {' '.join(names)} in order after {word!r}")
  return [g or "" for g in m.groups()]


def _pair(tok: str, what: str) -> tuple[int, int]:
  a, sep, b = tok.partition("-")
  if not sep:
    raise TranscriptError(f"{what}: {tok!r} is not u-v")
  return _int(a, what), _int(b, what)


def _vertices(n_text: str) -> int:
  n = _int(n_text, "n")
  if not 1 <= n <= 10_000:
    raise TranscriptError(f"n: {n} vertices")
  return n


def _graph(word):
  def read(s: str) -> dict:
    n_text, edges = _fields(s, word, ("n", "edges"))
    n = _vertices(n_text)
    adj = {str(v): [] for v in range(n)}
    for tok in edges.split():
      u, v = _pair(tok, "edges")
      if not (0 <= u < n and 0 <= v < n) or u == v:
        raise TranscriptError(f"edges: {tok} is not an edge between two of the vertices 0..{n - 1}")
      adj[str(u)].append(v)
      adj[str(v)].append(u)
    rows = {k: sorted(set(vs)) for k, vs in adj.items()}
    # maximum-set's questions are adjacency dicts (NP-Bench's rules read a list's ids as no edge)
    return {k: {str(v): 1 for v in vs} for k, vs in rows.items()} if word == "mis" else rows
  return read


def _cut(s: str) -> dict:
  n_text, edges = _fields(s, "cut", ("n", "edges"))
  n = _vertices(n_text)
  w = {str(u): {str(v): 0 for v in range(n)} for u in range(n)}
  for tok in edges.split():
    pair, sep, wt = tok.partition(":")
    if not sep:
      raise TranscriptError(f"edges: {tok!r} is not u-v:weight")
    u, v = _pair(pair, "edges")
    if not (0 <= u < n and 0 <= v < n) or u == v:
      raise TranscriptError(f"edges: {tok} is not an edge between two of the nodes 0..{n - 1}")
    w[str(u)][str(v)] = w[str(v)][str(u)] = _number(wt, "edge weight")
  return w


def _rows(body: str, what: str) -> list[list[str]]:
  return [part.split() for part in body.split(";")] if body.strip() else []


def _tsp(s: str) -> dict:
  n_text, dist = _fields(s, "TSP", ("n", "dist"))
  n = _vertices(n_text)
  rows = _rows(dist, "dist")
  if len(rows) != n - 1 or any(len(r) != n - 1 - i for i, r in enumerate(rows)):
    raise TranscriptError(f"dist: expected {n - 1} rows of the upper triangle ({n - 1}, {n - 2}, "
                          f"..., 1 numbers), got {[len(r) for r in rows]}")
  d = {str(i): {str(j): 0 for j in range(n)} for i in range(n)}
  for i, row in enumerate(rows):
    for k, tok in enumerate(row):
      j = i + 1 + k
      d[str(i)][str(j)] = d[str(j)][str(i)] = _number(tok, "dist")
  return d


def _cover(s: str) -> dict:
  n_text, sets = _fields(s, "cover", ("n", "sets"))
  n = _vertices(n_text)
  rows = _rows(sets, "sets")
  out = {}
  for i, row in enumerate(rows):
    elems = [_int(t, f"set {i}") for t in row]
    if any(not 0 <= e < n for e in elems):
      raise TranscriptError(f"set {i}: elements must lie in 0..{n - 1}, got {elems}")
    out[str(i)] = sorted(elems)
  return {"U": list(range(n)), "S": out}


def _subset(s: str) -> dict:
  target, items = _fields(s, "subset", ("target", "items"))
  return {"target": _int(target, "target"),
          "numbers": {str(i): _int(t, "items") for i, t in enumerate(items.split())}}


def _knapsack(s: str) -> dict:
  cap, items = _fields(s, "knap", ("cap", "items"))
  out = {}
  for i, tok in enumerate(items.split()):
    w, sep, v = tok.partition("/")
    if not sep:
      raise TranscriptError(f"items: {tok!r} is not weight/value")
    out[str(i)] = {"weight": _int(w, "item weight"), "value": _int(v, "item value")}
  return {"capacity": _int(cap, "cap"), "items": out}


def _meetings(s: str) -> dict:
  att, avail, rooms = _fields(s, "meet", ("att", "avail", "rooms"))
  meetings = {}
  for i, row in enumerate(_rows(att, "att")):
    if len(row) < 3 or row[-2] != "dur":
      raise TranscriptError(f"att: meeting {i} is not '<attendees> dur <minutes>'")
    meetings[str(i)] = {"attendees": [_int(t, f"meeting {i}") for t in row[:-2]],
                        "duration": _int(row[-1], f"meeting {i} duration")}
  availability = {str(a): [list(_pair(t, f"availability of {a}")) for t in row]
                  for a, row in enumerate(_rows(avail, "avail"))}
  return {"meetings": meetings, "attendee_availability": availability,
          "rooms": {str(r): _int(t, "rooms") for r, t in enumerate(rooms.split())}}


READERS = {
    "GCP-D": _graph("GCP"), "maximum_clique_problem": _graph("clique"), "maximum-set": _graph("mis"),
    "hamiltonian-cycle": _graph("ham"), "minimum-cut": _cut, "TSP": _tsp, "set-cover": _cover,
    "subset-sum": _subset, "knapsack": _knapsack, "meeting-schedule": _meetings,
}


def read(key: str, s: str) -> dict:
  """The question a transcript names (TranscriptError if it names none)."""
  if key not in READERS:
    raise KeyError(f"no transcript reader for task {key!r}; readers: {sorted(READERS)}")
  if not isinstance(s, str) or len(s) > 100_000:
    raise TranscriptError("a transcript is a string of at most 100,000 characters")
  q = READERS[key](s)
  try:
    tasks_lib.get(key).problem(q)
  except ValueError as e:
    raise TranscriptError(f"not a {key} instance: {e}") from None
  return q


def same_instance(key: str, a: dict, b: dict) -> bool:
  """Whether two questions of a task are the same instance: their parsed problems have equal
  fields (memos that scoring attaches to a problem, names starting with "_", are left out)."""
  task = tasks_lib.get(key)
  fields = lambda q: {k: v for k, v in vars(task.problem(q)).items() if not k.startswith("_")}
  return fields(a) == fields(b)
