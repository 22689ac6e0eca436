"""NP-Bench fidelity: its keyed file, its own verdicts (compat="npbench"), strict mode's refusals.

The CASES table lists, per task, answer texts in the forms models write them
(plain, after reasoning, extra whitespace, next line, no spaces, trailing
sentence or period, bold, backticks, after a draft ``Answer:``, quoted ints,
tuples, bare comma lists, arrows, meeting triples as lists) and NP-Bench's
own quirks, on the small instances in Q. The expected (feasible, value)
pairs were obtained by running NP-Bench's own validation code (NP-Engine) on
each text and instance, outside this repository; an exception there counted
as a refusal.
"""

import json

import numpy as np
import pytest

from dmpo_jax import tasks
from dmpo_jax.tasks import data, npbench_rules, parsing

Q = {
    'GCP-D': {"0": [1, 2], "1": [0, 2], "2": [0, 1, 3], "3": [2]},
    'TSP': {"0": {"0": 0, "1": 10, "2": 15, "3": 20}, "1": {"0": 10, "1": 0, "2": 35, "3": 25}, "2": {"0": 15, "1": 35, "2": 0, "3": 30}, "3": {"0": 20, "1": 25, "2": 30, "3": 0}},
    'hamiltonian-cycle': {"0": [1, 3, 2], "1": [0, 2], "2": [1, 3, 0], "3": [2, 0]},
    'knapsack': {"capacity": 10, "items": {"0": {"weight": 5, "value": 10}, "1": {"weight": 4, "value": 40}, "2": {"weight": 6, "value": 30}, "3": {"weight": 3, "value": 50}}},
    'maximum_clique_problem': {"0": [1, 2], "1": [0, 2], "2": [0, 1, 3], "3": [2]},
    'maximum-set': {"0": {"1": 1}, "1": {"0": 1, "2": 1}, "2": {"1": 1}, "3": {}},
    'meeting-schedule': {"meetings": {"0": {"attendees": [0, 1], "duration": 30}, "1": {"attendees": [1, 2], "duration": 60}}, "attendee_availability": {"0": [[540, 600]], "1": [[540, 720]], "2": [[600, 720]]}, "rooms": {"0": 2, "1": 3}},
    'minimum-cut': {"0": {"1": 3, "2": 1}, "1": {"0": 3, "3": 1}, "2": {"0": 1, "3": 4}, "3": {"1": 1, "2": 4}},
    'set-cover': {"U": [0, 1, 2, 3, 4], "S": {"0": [0, 1], "1": [1, 2, 3], "2": [3, 4], "3": [0, 4]}},
    'subset-sum': {"target": 10, "numbers": {"0": 3, "1": 7, "2": 5, "3": 2}},
}

CASES = {
    'GCP-D': [
        ('Answer: [1, 2, 3, 1]', True, 3),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [1, 2, 3, 1]', True, 3),
        ('Answer:    [1, 2, 3, 1]   \n\n', True, 3),
        ('Answer:\n[1, 2, 3, 1]', True, 3),
        ('Answer: [1,2,3,1]', True, 3),
        ('Answer: [1, 2, 3, 1]\nThis is my final answer.', True, 3),
        ('Answer: [1, 2, 3, 1].', True, 3),
        ('**Answer: [1, 2, 3, 1]**', True, 3),
        ('Answer: **[1, 2, 3, 1]**', True, 3),
        ('Answer: `[1, 2, 3, 1]`', True, 3),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [1, 2, 3, 1]', True, 3),
        ("Answer: ['1', '2', '3', '1']", False, None),
        ('Answer: (1, 2, 3, 1)', True, 3),
        ('Answer: 1, 2, 3, 1', True, 3),
        ('Answer: 1 -> 2 -> 3 -> 1', True, 3),
        ('Answer: [1, 1, 2, 3]', False, None),
        ('Answer: [1, 2, 3]', False, None),
        ('Answer: [0, 1, 2, 0]', False, None),
        ('Answer: [-1, 2, 3, 1]', False, None),
        ('Answer: []', False, None),
        ('Answer: 1 -> 2 -> 3 -> 1', True, 3),
        ('Answer: {1, 2, 3, 1}', True, 3),
        ('Answer: [1, 2, 3, 4]', True, 4),
    ],
    'TSP': [
        ('Answer: [0, 1, 3, 2, 0]', True, 80),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [0, 1, 3, 2, 0]', True, 80),
        ('Answer:    [0, 1, 3, 2, 0]   \n\n', True, 80),
        ('Answer:\n[0, 1, 3, 2, 0]', True, 80),
        ('Answer: [0,1,3,2,0]', True, 80),
        ('Answer: [0, 1, 3, 2, 0]\nThis is my final answer.', True, 80),
        ('Answer: [0, 1, 3, 2, 0].', True, 80),
        ('**Answer: [0, 1, 3, 2, 0]**', True, 80),
        ('Answer: **[0, 1, 3, 2, 0]**', True, 80),
        ('Answer: `[0, 1, 3, 2, 0]`', True, 80),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [0, 1, 3, 2, 0]', True, 80),
        ("Answer: ['0', '1', '3', '2', '0']", False, None),
        ('Answer: (0, 1, 3, 2, 0)', True, 80),
        ('Answer: 0, 1, 3, 2, 0', True, 80),
        ('Answer: 0 -> 1 -> 3 -> 2 -> 0', True, 80),
        ('Answer: [0, 1, 2, 0]', False, None),
        ('Answer: [0, 1, 1, 2, 0]', False, None),
        ('Answer: [1, 3, 2, 0, 1]', True, 80),
        ('Answer: [0, 1, 3, 2]', False, None),
        ('Answer: [0, 1, 3, 4, 0]', False, None),
        ('Answer: 0 -> 1 -> 3 -> 2 -> 0', True, 80),
        ('Answer: []', False, None),
    ],
    'hamiltonian-cycle': [
        ('Answer: [0, 1, 2, 3, 0]', True, 5),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [0, 1, 2, 3, 0]', True, 5),
        ('Answer:    [0, 1, 2, 3, 0]   \n\n', True, 5),
        ('Answer:\n[0, 1, 2, 3, 0]', True, 5),
        ('Answer: [0,1,2,3,0]', True, 5),
        ('Answer: [0, 1, 2, 3, 0]\nThis is my final answer.', True, 5),
        ('Answer: [0, 1, 2, 3, 0].', True, 5),
        ('**Answer: [0, 1, 2, 3, 0]**', True, 5),
        ('Answer: **[0, 1, 2, 3, 0]**', True, 5),
        ('Answer: `[0, 1, 2, 3, 0]`', True, 5),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [0, 1, 2, 3, 0]', True, 5),
        ("Answer: ['0', '1', '2', '3', '0']", False, None),
        ('Answer: (0, 1, 2, 3, 0)', True, 5),
        ('Answer: 0, 1, 2, 3, 0', True, 5),
        ('Answer: 0 -> 1 -> 2 -> 3 -> 0', True, 5),
        ('Answer: [0]', True, 1),
        ('Answer: [0, 1, 0]', True, 3),
        ('Answer: [9]', True, 1),
        ('Answer: [0, 1, 2, 0]', True, 4),
        ('Answer: [0, 1, 3, 0]', False, None),
        ('Answer: [0, 1, 2, 3]', False, None),
        ('Answer: [0, 0]', False, None),
        ('Answer: [-1]', True, 1),
    ],
    'knapsack': [
        ('Answer: [1, 3]', True, 90),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [1, 3]', True, 90),
        ('Answer:    [1, 3]   \n\n', True, 90),
        ('Answer:\n[1, 3]', True, 90),
        ('Answer: [1,3]', True, 90),
        ('Answer: [1, 3]\nThis is my final answer.', True, 90),
        ('Answer: [1, 3].', True, 90),
        ('**Answer: [1, 3]**', True, 90),
        ('Answer: **[1, 3]**', True, 90),
        ('Answer: `[1, 3]`', True, 90),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [1, 3]', True, 90),
        ("Answer: ['1', '3']", False, None),
        ('Answer: (1, 3)', True, 90),
        ('Answer: 1, 3', True, 90),
        ('Answer: 1 -> 3', True, 90),
        ('Answer: []', False, None),
        ('Answer: [1, 1]', False, None),
        ('Answer: [0, 2]', False, None),
        ('Answer: [0, 1, 3]', False, None),
        ('Answer: [7]', False, None),
        ('Answer: 1, 3,', True, 90),
        ('Answer: [0, 1]', True, 50),
    ],
    'maximum_clique_problem': [
        ('Answer: [0, 1, 2]', True, 3),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [0, 1, 2]', True, 3),
        ('Answer:    [0, 1, 2]   \n\n', True, 3),
        ('Answer:\n[0, 1, 2]', True, 3),
        ('Answer: [0,1,2]', True, 3),
        ('Answer: [0, 1, 2]\nThis is my final answer.', False, None),
        ('Answer: [0, 1, 2].', False, None),
        ('**Answer: [0, 1, 2]**', False, None),
        ('Answer: **[0, 1, 2]**', False, None),
        ('Answer: `[0, 1, 2]`', False, None),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [0, 1, 2]', False, None),
        ("Answer: ['0', '1', '2']", True, 3),
        ('Answer: (0, 1, 2)', False, None),
        ('Answer: 0, 1, 2', False, None),
        ('Answer: 0 -> 1 -> 2', False, None),
        ('Answer: []', False, None),
        ('Answer: [0, 0]', False, None),
        ("Answer: ['0', 0]", True, 2),
        ('Answer: [0.0, 1.0]', True, 2),
        ('Answer: [2, 3]', True, 2),
        ('Answer: [0, 3]', False, None),
        ('Answer: [0, 1, 2] # final', True, 3),
        ('Answer: [True, 2]', True, 2),
        ('Answer: [9]', False, None),
        ('Answer: [[0, 1]]', False, None),
        ("Answer: ('0', '1')", False, None),
        ('Answer: [0, 1, 2]\nAnswer: [2, 3]', False, None),
    ],
    'maximum-set': [
        ('Answer: [0, 2, 3]', True, 3),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [0, 2, 3]', True, 3),
        ('Answer:    [0, 2, 3]   \n\n', True, 3),
        ('Answer:\n[0, 2, 3]', False, None),
        ('Answer: [0,2,3]', True, 3),
        ('Answer: [0, 2, 3]\nThis is my final answer.', True, 3),
        ('Answer: [0, 2, 3].', False, None),
        ('**Answer: [0, 2, 3]**', False, None),
        ('Answer: **[0, 2, 3]**', False, None),
        ('Answer: `[0, 2, 3]`', False, None),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [0, 2, 3]', True, 3),
        ("Answer: ['0', '2', '3']", True, 3),
        ('Answer: (0, 2, 3)', False, None),
        ('Answer: 0, 2, 3', True, 3),
        ('Answer: 0 -> 2 -> 3', False, None),
        ('Answer: []', True, 0),
        ('Answer: [3, 3, 3]', True, 3),
        ('Answer: [0, 1]', False, None),
        ('Answer: 0, 2', True, 2),
        ('Answer: [0, 2]\nmore text', True, 2),
        ("Answer: ['0', '2']", True, 2),
        ('Answer: [0.0]', False, None),
        ('Answer: [9]', False, None),
        ('Answer: (0, 2)', False, None),
        ('Answer: [ ]', True, 0),
    ],
    'meeting-schedule': [
        ('Answer: [(0, 0, 540), (1, 1, 600)]', True, 4),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [(0, 0, 540), (1, 1, 600)]', True, 4),
        ('Answer:    [(0, 0, 540), (1, 1, 600)]   \n\n', True, 4),
        ('Answer:\n[(0, 0, 540), (1, 1, 600)]', True, 4),
        ('Answer: [(0,0,540),(1,1,600)]', True, 2),
        ('Answer: [(0, 0, 540), (1, 1, 600)]\nThis is my final answer.', False, None),
        ('Answer: [(0, 0, 540), (1, 1, 600)].', False, None),
        ('**Answer: [(0, 0, 540), (1, 1, 600)]**', False, None),
        ('Answer: **[(0, 0, 540), (1, 1, 600)]**', False, None),
        ('Answer: `[(0, 0, 540), (1, 1, 600)]`', False, None),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [(0, 0, 540), (1, 1, 600)]', True, 4),
        ("Answer: [('0', '0', '540'), ('1', '1', '600')]", True, 4),
        ('Answer: ((0, 0, 540), (1, 1, 600))', True, 4),
        ('Answer: (0, 0, 540), (1, 1, 600)', True, 4),
        ('Answer: [[0, 0, 540], [1, 1, 600]]', False, None),
        ('Answer: []', True, 0),
        ('Answer: [(0, 0, 540), (0, 0, 570)]', True, 4),
        ('Answer: [(0, 0, 540), (0, 1, 540)]', True, 4),
        ('Answer: [(1, 0, 600)]', True, 2),
        ('Answer: [(0, 0, 600)]', False, None),
        ('Answer: [(0,0,540),(1,1,600)]', True, 2),
        ('Answer: [(0, 0, 540, 7)]', True, 2),
        ("Answer: [('0', '0', '540')]", True, 2),
        ('Answer: [ ]', False, None),
        ('Answer: [(0, 0, 540), (1, 0, 550)]', False, None),
        ('Answer: [(5, 0, 540)]', False, None),
    ],
    'minimum-cut': [
        ('Answer: [[0, 1], [2, 3]]', True, 2),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [[0, 1], [2, 3]]', True, 2),
        ('Answer:    [[0, 1], [2, 3]]   \n\n', True, 2),
        ('Answer:\n[[0, 1], [2, 3]]', True, 2),
        ('Answer: [[0,1],[2,3]]', True, 2),
        ('Answer: [[0, 1], [2, 3]]\nThis is my final answer.', False, None),
        ('Answer: [[0, 1], [2, 3]].', False, None),
        ('**Answer: [[0, 1], [2, 3]]**', False, None),
        ('Answer: **[[0, 1], [2, 3]]**', False, None),
        ('Answer: `[[0, 1], [2, 3]]`', False, None),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [[0, 1], [2, 3]]', True, 2),
        ("Answer: [['0', '1'], ['2', '3']]", False, None),
        ('Answer: ([0, 1], [2, 3])', False, None),
        ('Answer: [0, 1], [2, 3]', False, None),
        ('Answer: [[0, 0, 1], [2, 3]]', True, 2),
        ('Answer: [[0, 1, 2], [3]]', False, None),
        ('Answer: [[0, 1], [1, 2, 3]]', False, None),
        ('Answer: [[0, 1], [2]]', False, None),
        ('Answer: [[0, 2], [1, 3]]', True, 7),
        ('Answer: [[0, 1], [2, 3.0]]', True, 1),
        ('Answer: [[0, 1.0], [2, 3]]', False, None),
        ('Answer: [[0, 1], [2, 3], []]', False, None),
        ("Answer: [('0', 1), [2, 3]]", False, None),
        ('Answer: [[3, 2], [1, 0]]', True, 2),
    ],
    'set-cover': [
        ('Answer: [1, 3]', True, 2),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [1, 3]', True, 2),
        ('Answer:    [1, 3]   \n\n', True, 2),
        ('Answer:\n[1, 3]', True, 2),
        ('Answer: [1,3]', True, 2),
        ('Answer: [1, 3]\nThis is my final answer.', False, None),
        ('Answer: [1, 3].', False, None),
        ('**Answer: [1, 3]**', False, None),
        ('Answer: **[1, 3]**', False, None),
        ('Answer: `[1, 3]`', False, None),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [1, 3]', True, 2),
        ("Answer: ['1', '3']", False, None),
        ('Answer: (1, 3)', False, None),
        ('Answer: 1, 3', True, 2),
        ('Answer: 1 -> 3', False, None),
        ('Answer: Impossible', False, None),
        ('Answer: [1, 1, 3]', True, 3),
        ('Answer: []', False, None),
        ('Answer: [0, 1, 2]', True, 3),
        ('Answer: [0, 2]', False, None),
        ('Answer: [9]', False, None),
        ('Answer: 1, 3', True, 2),
        ('Answer: [1, 3, 3, 3]', True, 4),
    ],
    'subset-sum': [
        ('Answer: [1, 0]', True, 2),
        ('Let me think step by step.\nA first try [0, 1] fails.\nAnswer: [1, 0]', True, 2),
        ('Answer:    [1, 0]   \n\n', True, 2),
        ('Answer:\n[1, 0]', True, 2),
        ('Answer: [1,0]', True, 2),
        ('Answer: [1, 0]\nThis is my final answer.', True, 2),
        ('Answer: [1, 0].', True, 2),
        ('**Answer: [1, 0]**', True, 2),
        ('Answer: **[1, 0]**', True, 2),
        ('Answer: `[1, 0]`', True, 2),
        ('Answer: [0]\nWait, let me fix that.\nAnswer: [1, 0]', True, 2),
        ("Answer: ['1', '0']", True, 2),
        ('Answer: (1, 0)', True, 2),
        ('Answer: 1, 0', True, 2),
        ('Answer: 1 -> 0', False, None),
        ('Answer: [1, 0, 0]', False, None),
        ('Answer: [2, 3, 0]', True, 3),
        ('Answer: [0, 0, 3, 3]', True, 4),
        ('Answer: [2, 2]', True, 2),
        ('Answer: []', False, None),
        ('Answer: 1, 0', True, 2),
        ('Answer: [9]', False, None),
        ('Answer: [1, 0,]', True, 2),
    ],
}


# NP-Bench accepts these; strict mode refuses them (docs/TASKS.md says why): rule loopholes
# (a repeated vertex, index, meeting or node; a "cycle" of fewer than 3 vertices; an empty
# independent set), and forms strict mode does not read (bare comma lists, 4-number meeting
# entries, floats, booleans, a set).
STRICT_REFUSES = {
    "GCP-D": {"Answer: 1, 2, 3, 1", "Answer: {1, 2, 3, 1}"},
    "TSP": {"Answer: 0, 1, 3, 2, 0"},
    "hamiltonian-cycle": {"Answer: 0, 1, 2, 3, 0", "Answer: [0]", "Answer: [0, 1, 0]", "Answer: [9]",
                          "Answer: [-1]"},
    "knapsack": {"Answer: 1, 3", "Answer: 1, 3,"},
    "maximum_clique_problem": {"Answer: ['0', 0]", "Answer: [0.0, 1.0]", "Answer: [True, 2]"},
    "maximum-set": {"Answer: 0, 2, 3", "Answer: []", "Answer: [3, 3, 3]", "Answer: 0, 2", "Answer: [ ]"},
    "meeting-schedule": {"Answer: (0, 0, 540), (1, 1, 600)", "Answer: [(0, 0, 540), (0, 0, 570)]",
                         "Answer: [(0, 0, 540), (0, 1, 540)]", "Answer: [(0, 0, 540, 7)]"},
    "minimum-cut": {"Answer: [[0, 0, 1], [2, 3]]", "Answer: [[0, 1], [2, 3.0]]"},
    "set-cover": {"Answer: 1, 3", "Answer: [1, 1, 3]", "Answer: [1, 3, 3, 3]"},
    "subset-sum": {"Answer: 1, 0", "Answer: [0, 0, 3, 3]", "Answer: [2, 2]"},
}
# Both accept with different values: NP-Bench splits meeting triples on "), (", so without
# spaces it reads only the first triple; strict mode reads them all.
VALUE_DIFFERS = {("meeting-schedule", "Answer: [(0,0,540),(1,1,600)]")}


@pytest.mark.parametrize("key", list(CASES))
def test_compat_reproduces_npbench_verdicts(key):
  t = tasks.get(key)
  assert len(CASES[key]) >= 20
  for text, feasible, value in CASES[key]:
    v = t.verify(Q[key], text, compat="npbench")
    assert v.feasible == feasible, (key, text, v.reason)
    assert v.feasible == (v.value is not None)
    if feasible:
      assert v.value == value, (key, text, v.value, value)


@pytest.mark.parametrize("key", list(CASES))
def test_strict_refusals_listed(key):
  """Strict mode refuses exactly the listed NP-Bench acceptances; where both accept, the
  values agree."""
  t = tasks.get(key)
  refused = set()
  for text, feasible, value in CASES[key]:
    v = t.verify(Q[key], text)
    if feasible and not v.feasible:
      refused.add(text)
    if feasible and v.feasible:
      assert (v.value == value) != ((key, text) in VALUE_DIFFERS), (key, text)
  assert refused == STRICT_REFUSES[key]


@pytest.mark.parametrize("key", list(CASES))
def test_strict_never_accepts_a_solution_npbench_refuses(key):
  """Strict mode reads more forms than NP-Bench, but whatever it accepts, written plainly,
  NP-Bench accepts with the same value."""
  t = tasks.get(key)
  accepted = 0
  for text, _, _ in CASES[key]:
    v = t.verify(Q[key], text)
    if v.feasible:
      plain = t.format_answer(t._parse(parsing.extract_answer(text)))
      nb = t.verify(Q[key], "Answer: " + plain, compat="npbench")
      assert nb.feasible and nb.value == v.value, (key, text, plain, nb.reason)
      accepted += 1
  assert accepted >= 5


def test_quirks_by_hand():
  # The first 'Answer:' for maximum clique; the last elsewhere.
  clique, q = tasks.get("maximum_clique_problem"), Q["maximum_clique_problem"]
  assert not clique.verify(q, "Answer: [9]\nAnswer: [0, 1, 2]", compat="npbench").feasible
  assert clique.verify(q, "Answer: [9]\nAnswer: [0, 1, 2]").value == 3
  # Independent set reads the first line only; the empty set is accepted with value 0.
  mis, q = tasks.get("maximum-set"), Q["maximum-set"]
  assert mis.verify(q, "Answer: []", compat="npbench").value == 0
  assert not mis.verify(q, "Answer:\n[0, 2, 3]", compat="npbench").feasible
  # Knapsack: an empty choice is refused by both.
  knap, q = tasks.get("knapsack"), Q["knapsack"]
  for compat in tasks.COMPAT:
    assert not knap.verify(q, "Answer: []", compat=compat).feasible
  # Meeting triples without spaces: only the first one counts.
  meet, q = tasks.get("meeting-schedule"), Q["meeting-schedule"]
  assert meet.verify(q, "Answer: [(0,0,540),(1,1,600)]", compat="npbench").value == 2
  assert meet.verify(q, "Answer: [(0,0,540),(1,1,600)]").value == 4


def test_verify_answer_npbench_is_verify_with_marker():
  for key in CASES:
    t = tasks.get(key)
    for text, feasible, value in CASES[key]:
      if text.startswith("Answer: ") and text.count("Answer:") == 1:
        v = t.verify_answer(Q[key], text[len("Answer: "):], compat="npbench")
        assert (v.feasible, v.value) == (feasible, None if value is None else float(value)), text


def test_strict_refuses_accidental_parses():
  t, q = tasks.get("TSP"), Q["TSP"]
  assert t.verify(q, "Answer: [0, 1, 3, 2, 0]").feasible
  assert not t.verify(q, "Answer: [\u0660, 1, 3, 2, \u0660]").feasible          # Arabic-Indic zeros
  assert not t.verify(q, "Answer: [０, 1, 3, 2, ０]").feasible                   # full-width zeros
  assert not t.verify(q, 'Answer: {"tour": [0, 1, 3, 2, 0]}').feasible
  assert "dict" in t.verify(q, 'Answer: {"tour": [0, 1, 3, 2, 0]}').reason
  assert not t.verify(q, "Answer: 0 -> 1 -> 3 -> 2 -> \u0660").feasible
  # NP-Bench converts with Python's int(), which reads any Unicode digit: so does compat mode.
  assert t.verify(q, "Answer: [\u0660, 1, 3, 2, \u0660]", compat="npbench").value == 80


def test_literal_reader_is_bounded_and_python_like():
  lit = npbench_rules.literal
  assert lit("[1, -2, '3', (4,), (5), 6.5, True, None] # note") == [1, -2, "3", (4,), 5, 6.5, True, None]
  assert lit(" [ ] ") == [] and lit("()") == ()
  for bad in ("[1, 2", "[1 2]", "[01]", "[0x1]", "[1_0]", "{1: 2}", "{1}", "[1+1]", "['a\\'b']",
              "[1j]", "[1] [2]", "[" * 50 + "]" * 50, "[" + "1," * 5000 + "]", "x" * 10000):
    with pytest.raises(npbench_rules.Refused):
      lit(bad)


# ---------------------------------------------------------------------------
# NP_Bench.json's shape: a dict of records keyed <task>_<level>_question<N>.
def keyed_file(tmp_path, prompt_of=lambda r: r["prompt"]):
  """A small file in NP_Bench.json's shape, made here: two tasks, two levels (keys); the
  instances are tiny ones, to keep the test fast."""
  obj = {}
  for key in ("TSP", "knapsack"):
    for level, seeds in (("easy", (0, 1)), ("medium", (2,))):
      for n, seed in enumerate(seeds, 1):
        r = data.make_record(key, seed, "tiny")
        rec = {"prompt": r["prompt"], "question": r["question"], "task_type": key,
               "ground_truth": r["ground_truth"]}
        rec["prompt"] = prompt_of(rec)
        obj[f"{key}_{level}_question{n}"] = rec
  path = tmp_path / "NP_Bench.json"
  path.write_text(json.dumps(obj, indent=2))
  return path, obj


def test_keyed_file_loads_and_round_trips(tmp_path):
  path, obj = keyed_file(tmp_path)
  recs = data.read_npbench(str(path))
  assert [r["key"] for r in recs] == list(obj)
  assert [r["level"] for r in recs] == ["easy", "easy", "medium"] * 2
  assert all({k: r[k] for k in obj[r["key"]]} == obj[r["key"]] for r in recs)
  out = tmp_path / "again.json"
  assert data.write_npbench(recs, str(out)) == 6
  assert json.loads(out.read_text()) == obj        # same keys, same records
  assert data.read_npbench(str(out)) == recs
  # Records without keys get <task>_<level>_question<N>, N from 1 per task and level.
  fresh = [{k: v for k, v in r.items() if k != "key"} for r in recs]
  assert data.npbench_keys(fresh) == list(obj)
  # JSONL still loads.
  data.write_jsonl(fresh, str(tmp_path / "f.jsonl"))
  assert data.read_npbench(str(tmp_path / "f.jsonl")) == fresh


def test_keyed_file_errors_name_the_record(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"TSP_question1": {"question": {}, "task_type": "TSP"}}))
  with pytest.raises(data.DataError, match="bad.json: record key 'TSP_question1' names no level"):
    data.read_npbench(str(bad))
  bad.write_text(json.dumps({"TSP_easy_question1": {"question": {}}}))
  with pytest.raises(data.DataError, match=r"record 'TSP_easy_question1' lacks \['task_type'\]"):
    data.read_npbench(str(bad))
  with pytest.raises(data.DataError, match="level 'tiny'.*needs one of"):
    data.write_npbench([{"task_type": "TSP", "level": "tiny", "question": {}}], str(tmp_path / "x.json"))


class CharTokenizer:
  """One token per character (reversible), enough to drive the evaluation loop."""
  eos_token_id, pad_token_id, bos_token_id = 1, 0, None

  def encode(self, text, add_special_tokens=False):
    return [ord(c) + 2 for c in text]

  def decode(self, ids, skip_special_tokens=True):
    return "".join(chr(i - 2) for i in ids if i > 1)


@pytest.mark.slow  # imports the evaluation stack (about 10 s on a contended 2-core machine)
def test_keyed_file_evaluates_with_its_own_prompts(tmp_path):
  """Each level is scored on its own, the file's prompt is what the policy sees, and the
  file's ground truth is the denominator."""
  import jax
  from absl.testing import flagsaver
  from dmpo_jax import evaluate
  from dmpo_jax.training import evaluation
  from dmpo_jax.tasks import rewards

  def with_answer(r):  # the "policy" below answers whatever follows SOLVE in its prompt
    t = tasks.get(r["task_type"])
    return r["prompt"] + "\nSOLVE " + t.format_answer(t.reference_solution(r["question"]))

  path, obj = keyed_file(tmp_path, with_answer)
  tok = CharTokenizer()

  def sample_fn(pt, pm, rng):
    rows = []
    for row, m in zip(np.asarray(pt), np.asarray(pm)):
      prompt = tok.decode([int(i) for i, v in zip(row, m) if v])
      ids = tok.encode("Answer: " + prompt.split("SOLVE ")[-1])
      rows += [ids + [tok.eos_token_id] * (400 - len(ids))] * 3
    toks = np.asarray(rows)
    return toks, np.ones_like(toks, bool)

  with flagsaver.flagsaver():
    evaluate.FLAGS(["evaluate", f"--npbench_file={path}"])
    groups, proto = evaluate.file_protocol("npbench", "easy")
  assert proto["name"] == "NP-Bench" and proto["samples"] == 3 and proto["compat"] == "npbench"
  assert sorted(groups) == ["easy", "medium"]
  for level, (items, gts, prompts) in groups.items():
    assert len(items) == (4 if level == "easy" else 2)
    enc = evaluate.FilePromptEncoder(tok, "npbench", 10**6, False, prompts)
    assert tok.decode(enc.encode(*items[0])).startswith(obj[f"TSP_{level}_question1"]["prompt"])
    res = evaluation.evaluate(sample_fn, enc, items, rng=jax.random.key(0),
                              ground_truths=[g * 2 for g in gts],
                              spec=evaluation.ScoreSpec(
                                  samples=3, batch_prompts=2, prompt_len=10**4,
                                  reward_cfg=rewards.RewardConfig(compat="npbench"), k=3))
    for key in ("TSP", "knapsack"):
      s = res["per_task"][key]
      assert s["SR@3"] == 1.0
      # against twice the file's ground truth: min tasks score 2, max tasks 0.5
      assert s["QR@3"] == pytest.approx(2.0 if key == "TSP" else 0.5)


def test_compat_is_bounded_on_adversarial_text():
  """NP-Bench's first-group pattern backtracks quadratically on a run of opening brackets;
  ours is linear, and every rule answers hostile text quickly with a refusal."""
  import time
  texts = ["Answer: " + "[" * 4000, "Answer: " + "(" * 20000 + "1", "Answer: " + "[1, " * 1000 + "]" * 1000,
           "Answer: " + "9" * 5000, "x" * 200_000 + "Answer: [" + "1, " * 20000 + "1]",
           "Answer: " + "1" * 70_000]
  for key in CASES:
    t = tasks.get(key)
    for text in texts:
      t0 = time.perf_counter()
      v = t.verify(Q[key], text, compat="npbench")
      assert time.perf_counter() - t0 < 0.25, (key, text[:20])
      assert not v.feasible
  assert npbench_rules.first_group("x (1, [2) y]") == "1, [2"
  assert npbench_rules.first_group("((((") is None
