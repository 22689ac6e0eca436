"""NP-Bench tasks: generators, verifiers (strict and NP-Bench compat), solvers, scoring."""

import itertools
import json
import math
import os

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from dmpo_jax import tasks
from dmpo_jax.tasks import data, parsing, rewards, scoring
from tests.helpers import REPO

# NP-Bench instances with answers scored by its own rules and by ours (see tests/data/README.md).
DATA = os.path.join(REPO, "tests", "data", "npbench_reference.jsonl")

TABLE = {  # docs/TASKS.md: key -> (category, direction)
    "GCP-D": ("graph", "min"), "maximum_clique_problem": ("graph", "max"),
    "maximum-set": ("graph", "max"), "meeting-schedule": ("schedule", "max"),
    "minimum-cut": ("partition", "min"), "set-cover": ("selection", "min"),
    "subset-sum": ("selection", "max"), "knapsack": ("selection", "max"),
    "TSP": ("planning", "min"), "hamiltonian-cycle": ("planning", "max"),
}


def better_or_equal(direction, a, b):
  return a >= b if direction == "max" else a <= b


def test_registry_matches_npbench_table():
  assert tasks.names() == list(TABLE)
  for key, (cat, direction) in TABLE.items():
    t = tasks.get(key)
    assert (t.category, t.direction) == (cat, direction)
  with pytest.raises(KeyError, match="unknown task 'tsp'.*TSP"):
    tasks.get("tsp")


# ---------------------------------------------------------------------------
# Generators and solvers, every task and level.
CASES = [(k, lv, s) for k in TABLE for lv in tasks.LEVELS
         for s in ((0, 1, 2) if lv in ("tiny", "easy") else (0,))]


@pytest.mark.parametrize("key,level,seed", CASES)
def test_planted_reference_exact(key, level, seed):
  t = tasks.get(key)
  q, planted = t.generate_with_solution(seed, level)
  assert json.loads(json.dumps(q)) == q  # JSON-serialisable NP-Bench question dict
  assert t.generate(seed, level) == q    # deterministic by seed
  pv = t.verify_solution(q, planted)
  assert pv.feasible, pv.reason
  ref = t.reference_solution(q)
  rv = t.verify_solution(q, ref)
  assert rv.feasible, rv.reason
  assert rv.value == t.reference_value(q)
  # Our references meet or beat the planted solution on every generated instance we test.
  assert better_or_equal(t.direction, rv.value, pv.value), (rv.value, pv.value)
  if level in ("tiny", "easy"):
    unproven = key == "minimum-cut" and level != "tiny"
    ex = t.exact(q, time_limit=3 if unproven else 20)
    # NP-Bench's min-cut graphs (three dense communities, one must be split) are beyond
    # CP-SAT's proofs (60 s leave it FEASIBLE); it starts from the heuristic (docs/TASKS.md).
    assert ex.status in (("OPTIMAL", "FEASIBLE") if unproven else ("OPTIMAL",)), ex
    assert better_or_equal(t.direction, ex.value, rv.value)
    assert t.verify_solution(q, ex.solution).value == ex.value


def test_tiny_instances_never_change():
  """The default run trains on tiny instances: their bytes are pinned (hash taken before the
  easy..bench generators were changed to follow NP-Bench's distributions)."""
  import hashlib
  h = hashlib.sha256()
  for key in tasks.names():
    for s in range(20):
      h.update(json.dumps(tasks.get(key).generate(s, "tiny"), sort_keys=True).encode())
  assert h.hexdigest() == "5415d4b105ebd85c693015a46d014e742fbe31bce11654e06158889333fa6b49"


NPBENCH_STATS = {  # NP-Bench's generators, 200 instances per level: easy, medium, hard, bench
    'GCP-D': {
        'n': [10.045, 18.36, 28.505, 36.05],
        'density': [0.1461, 0.2773, 0.4261, 0.4245],
    },
    'maximum_clique_problem': {
        'n': [5.95, 9.99, 13.9, 17.995],
        'density': [0.5966, 0.4697, 0.4869, 0.5492],
        'planted': [3.015, 2.985, 3.795, 6.14],
    },
    'maximum-set': {
        'n': [16.025, 25.32, 34.705, 45.06],
        'density': [0.3901, 0.3629, 0.3556, 0.353],
        'planted': [6.13, 10.075, 13.865, 17.91],
    },
    'meeting-schedule': {
        'meetings': [4.48, 5.515, 6.46, 9.065],
        'attendees': [4.085, 4.965, 5.935, 8.08],
        'rooms': [3.505, 4.475, 5.49, 6.56],
        'room_capacity': [6.3954, 6.581, 6.5308, 6.4856],
        'meeting_size': [2.4737, 2.976, 3.0143, 3.4761],
        'duration': [60.075, 60.265, 59.1321, 59.5433],
    },
    'minimum-cut': {
        'n': [42.0, 45.0, 45.0, 50.0],
        'density': [0.356, 0.3547, 0.3014, 0.301],
        'weight_mean': [7.5808, 7.5959, 8.3399, 8.3202],
    },
    'set-cover': {
        'U': [15.355, 22.4, 27.33, 34.775],
        'S': [7.48, 12.505, 20.18, 25.215],
        'subset_size': [3.8333, 4.9604, 5.8258, 7.2814],
    },
    'subset-sum': {
        'numbers': [7.925, 9.9, 13.595, 17.495],
        'value_mean': [2.974, 5.4842, 7.9577, 7.8887],
        'target': [18.115, 34.4, 80.625, 98.385],
        'planted': [6.035, 6.33, 10.005, 12.345],
    },
    'knapsack': {
        'items': [19.675, 29.99, 46.72, 67.51],
        'weight_mean': [26.6618, 109.512, 365.4022, 455.3792],
        'weight_max': [88.02, 386.255, 2027.165, 3172.41],
        'value_mean': [39.2973, 146.3252, 457.1139, 585.159],
        'capacity': [149.37, 554.695, 2647.7, 4038.4],
    },
    'TSP': {
        'n': [14.88, 24.925, 39.785, 50.155],
        'dist_mean': [55.236, 55.0737, 55.0233, 54.9819],
    },
    'hamiltonian-cycle': {
        'n': [17.56, 24.805, 35.23, 44.915],
        'density': [0.2986, 0.3629, 0.4354, 0.5227],
    },
}
STATS_TOLERANCE = 0.12  # relative; two draws of 200 from NP-Bench's own generators differ by up to 8%


@pytest.mark.slow  # 8,000 instances, about a minute
@pytest.mark.parametrize("key", list(TABLE))
def test_generator_statistics_follow_npbench(key):
  """Mean statistics over 200 instances per level are within STATS_TOLERANCE of NP-Bench's
  generators' (docs/TASKS.md's table)."""
  from dmpo_jax.tasks import instance_stats as stats
  for i, level in enumerate(("easy", "medium", "hard", "bench")):
    ours = stats.level_stats(key, level, 200)
    assert set(ours) == set(NPBENCH_STATS[key])
    for m, theirs in NPBENCH_STATS[key].items():
      assert abs(ours[m] - theirs[i]) <= STATS_TOLERANCE * abs(theirs[i]), (key, level, m, ours[m], theirs[i])


@pytest.mark.parametrize("key", list(TABLE))
def test_generation_varies_with_seed_and_level(key):
  t = tasks.get(key)
  assert t.generate(0, "easy") != t.generate(1, "easy")
  with pytest.raises(ValueError, match="unknown level 'huge'"):
    t.generate(0, "huge")


@pytest.mark.parametrize("key", list(TABLE))
def test_sample_solutions_distinct_and_feasible(key):
  t = tasks.get(key)
  q = t.generate(3, "easy")
  sols = t.sample_solutions(q, 4)
  assert len(sols) >= 1
  verdicts = [t.verify_solution(q, s) for s in sols]
  assert all(v.feasible for v in verdicts)
  assert len({v.solution for v in verdicts}) == len(sols)


# ---------------------------------------------------------------------------
# Hand-made instances with known optima.
def square_tsp():
  # Unit square of side 10, diagonals 14: the perimeter (40) is optimal,
  # the crossing tour 0-2-1-3-0 costs 14 + 10 + 14 + 10 = 48.
  d = [[0, 10, 14, 10], [10, 0, 10, 14], [14, 10, 0, 10], [10, 14, 10, 0]]
  return {str(i): {str(j): d[i][j] for j in range(4)} for i in range(4)}


def test_hand_tsp():
  t, q = tasks.get("TSP"), square_tsp()
  assert t.verify(q, "Answer: [0, 1, 2, 3, 0]").value == 40
  assert t.verify(q, "Answer: [0, 2, 1, 3, 0]").value == 48
  assert t.verify(q, "Answer: 2 -> 3 -> 0 -> 1 -> 2").value == 40   # arrow form
  assert t.exact(q).value == 40 and t.reference_value(q) == 40
  v = t.verify(q, "Answer: [0, 1, 2, 3, 1]")
  assert not v.feasible and "return to its start" in v.reason      # wrong closing city
  v = t.verify(q, "Answer: [0, 1, 1, 3, 0]")
  assert not v.feasible and "visited twice" in v.reason
  assert not t.verify(q, "Answer: [0, 1, 2, 0]").feasible          # a city missing
  # A tour, its reverse and its rotations are one solution.
  sols = {t.verify(q, f"Answer: {s}").solution for s in
          ("[0, 1, 2, 3, 0]", "[2, 3, 0, 1, 2]", "[0, 3, 2, 1, 0]", "[1, 0, 3, 2, 1]")}
  assert len(sols) == 1


def test_hand_gcp_five_cycle_needs_three_colours():
  t = tasks.get("GCP-D")
  q = {str(i): sorted([(i + 1) % 5, (i - 1) % 5]) for i in range(5)}  # C5: odd cycle, chi = 3
  assert t.exact(q).value == 3 and t.reference_value(q) == 3
  v = t.verify(q, "Answer: [1, 2, 1, 2, 1]")  # vertices 0 and 4 are adjacent, both colour 1
  assert not v.feasible and "share colour 1" in v.reason
  assert t.verify(q, "Answer: [1, 2, 1, 2, 3]").value == 3
  assert not t.verify(q, "Answer: [0, 1, 0, 1, 2]").feasible      # colours must be positive
  assert not t.verify(q, "Answer: [1, 2, 1, 2]").feasible          # one colour per vertex
  # Colour names do not matter for diversity: [2,3,2,3,1] is [1,2,1,2,3] renamed.
  assert t.verify(q, "Answer: [2, 3, 2, 3, 1]").solution == t.verify(q, "Answer: [1, 2, 1, 2, 3]").solution


def test_hand_clique_mis():
  # K4 on 0..3 plus a pendant vertex 4 attached to 3: max clique 4 ({0,1,2,3});
  # max independent set 2 (e.g. {0, 4}).
  edges = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (3, 4)]
  adj = {str(i): sorted({b for a, b in edges if a == i} | {a for a, b in edges if b == i}) for i in range(5)}
  c = tasks.get("maximum_clique_problem")
  assert c.exact(adj).value == 4 and c.reference_value(adj) == 4
  assert not c.verify(adj, "Answer: [0, 1, 4]").feasible
  assert not c.verify(adj, "Answer: [0, 0, 1]").feasible
  mis_q = {k: {str(v): 1 for v in vs} for k, vs in adj.items()}
  m = tasks.get("maximum-set")
  assert m.exact(mis_q).value == 2 and m.reference_value(mis_q) == 2
  assert m.verify(mis_q, "Answer: [0, 4]").value == 2
  assert not m.verify(mis_q, "Answer: [0, 1]").feasible
  v = m.verify(mis_q, "Answer: [4, 4, 4]")                     # NP-Bench loophole
  assert not v.feasible and "repeated" in v.reason
  assert m.verify(mis_q, "Answer: [4, 4, 4]", compat="npbench").value == 3


def test_hand_longest_cycle():
  # A 4-cycle 0-1-2-3 with chord 0-2: the Hamiltonian cycle has 4 vertices, value 5.
  q = {"0": [1, 3, 2], "1": [0, 2], "2": [1, 3, 0], "3": [2, 0]}
  t = tasks.get("hamiltonian-cycle")
  assert t.verify(q, "Answer: [0, 1, 2, 3, 0]").value == 5
  assert t.verify(q, "Answer: [0, 1, 2, 0]").value == 4
  assert t.exact(q).value == 5 and t.reference_value(q) == 5
  for loophole in ("[0, 1, 0]", "[0]"):
    v = t.verify(q, f"Answer: {loophole}")
    assert not v.feasible and "3 distinct" in v.reason
    assert t.verify(q, f"Answer: {loophole}", compat="npbench").feasible
  assert not t.verify(q, "Answer: [0, 1, 3, 2, 0]").feasible       # 1-3 not adjacent
  qs = {k: [str(v) for v in vs] for k, vs in q.items()}              # string neighbour ids
  assert t.verify(qs, "Answer: [0, 1, 2, 3, 0]").value == 5


def test_hand_knapsack_subset_sum():
  k = tasks.get("knapsack")
  q = {"capacity": 50, "items": {"0": {"weight": 10, "value": 60}, "1": {"weight": 20, "value": 100},
                                 "2": {"weight": 30, "value": 120}}}
  assert k.exact(q).value == 220 and k.reference_value(q) == 220       # items 1 and 2
  v = k.verify(q, "Answer: [0, 1, 2]")
  assert not v.feasible and "exceeds capacity 50" in v.reason          # over capacity
  assert not k.verify(q, "Answer: [1, 1]").feasible
  assert not k.verify(q, "Answer: [3]").feasible
  s = tasks.get("subset-sum")
  q = {"target": 10, "numbers": {"0": 1, "1": 2, "2": 3, "3": 4, "4": 10}}
  assert s.exact(q).value == 4 and s.reference_value(q) == 4            # 1+2+3+4
  assert s.verify(q, "Answer: [4]").value == 1
  v = s.verify(q, "Answer: [3, 4]")
  assert not v.feasible and "sum is 14" in v.reason
  q2 = {"target": 4, "numbers": {"0": 1, "1": 3}}
  assert not s.verify(q2, "Answer: [0, 0, 0, 0]").feasible              # repeated index
  assert s.verify(q2, "Answer: [0, 0, 0, 0]", compat="npbench").value == 4


def test_hand_set_cover_and_impossible():
  t = tasks.get("set-cover")
  q = {"U": [0, 1, 2, 3, 4], "S": {"0": [0, 1, 2], "1": [3, 4], "2": [0, 3], "3": [1, 4], "4": [2]}}
  assert t.exact(q).value == 2 and t.reference_value(q) == 2
  assert t.verify(q, "Answer: [0, 1]").value == 2
  v = t.verify(q, "Answer: [0, 2]")
  assert not v.feasible and "[4]" in v.reason
  v = t.verify(q, "Answer: Impossible")
  assert not v.feasible and "cover U" in v.reason                       # Impossible, wrongly
  bad = {"U": [0, 1, 2], "S": {"0": [0], "1": [1]}}                     # 2 uncoverable
  v = t.verify(bad, "The element 2 is in no subset. Answer: Impossible")
  assert v.feasible and v.value == 0                                    # Impossible, rightly
  assert not t.verify(bad, "Answer: [0, 1]").feasible
  assert t.ratio(bad, "Answer: Impossible") == 1.0                      # 0/0 = 1


def test_hand_meetings():
  t = tasks.get("meeting-schedule")
  q = {"meetings": {"0": {"attendees": [0, 1], "duration": 60}, "1": {"attendees": [1, 2], "duration": 30}},
       "attendee_availability": {"0": [[540, 660]], "1": [[540, 720]], "2": [[600, 720]]},
       "rooms": {"0": 3, "1": 1}}
  v = t.verify(q, "Answer: []")
  assert v.feasible and v.value == 0                                   # [] schedules nothing
  assert t.verify(q, "Answer: [(0, 0, 540), (1, 0, 600)]").value == 4
  assert t.exact(q).value == 4 and t.reference_value(q) == 4
  cases = {
      "[(0, 0, 570), (1, 0, 600)]": "overlap in room 0",
      "[(0, 0, 540), (1, 1, 600)]": "holds 1",                          # capacity
      "[(0, 0, 630)]": "not available",                                 # 630+60 > 660
      "[(0, 0, 540), (0, 0, 600)]": "more than once",                   # NP-Bench loophole
      "[(0, 0, 540), (1, 0, 600), (1, 0, 660)]": "more than once",
      "[(7, 0, 540)]": "does not exist",
      "[(0, 5, 540)]": "does not exist",
  }
  for ans, why in cases.items():
    v = t.verify(q, f"Answer: {ans}")
    assert not v.feasible and why in v.reason, (ans, v)
  # An attendee in two meetings at once (different rooms): strict refuses, NP-Bench accepts.
  q2 = {"meetings": {"0": {"attendees": [0, 1], "duration": 60}, "1": {"attendees": [1, 2], "duration": 60}},
        "attendee_availability": {a: [[540, 720]] for a in "012"}, "rooms": {"0": 3, "1": 3}}
  v = t.verify(q2, "Answer: [(0, 0, 540), (1, 1, 570)]")
  assert not v.feasible and "attendee 1 is in meetings 0 and 1 at once" in v.reason
  assert t.verify(q2, "Answer: [(0, 0, 540), (1, 1, 570)]", compat="npbench").value == 4
  assert t.verify(q2, "Answer: [(0, 0, 540), (0, 1, 540)]", compat="npbench").value == 4  # twice


def test_hand_min_cut():
  # Two triangles {0,1,2} and {3,4,5} (weights 5) joined by one bridge 2-3 of weight 1.
  n, w = 6, {(0, 1): 5, (0, 2): 5, (1, 2): 5, (3, 4): 5, (3, 5): 5, (4, 5): 5, (2, 3): 1}
  q = {str(u): {str(v): w.get((min(u, v), max(u, v)), 0) for v in range(n)} for u in range(n)}
  t = tasks.get("minimum-cut")
  assert t.verify(q, "Answer: [[0, 1, 2], [3, 4, 5]]").value == 1
  assert t.exact(q).value == 1 and t.reference_value(q) == 1
  v = t.verify(q, "Answer: [[0, 1], [2, 3, 4, 5]]")
  assert not v.feasible and "unbalanced" in v.reason                    # unbalanced bisection
  assert not t.verify(q, "Answer: [[0, 1, 2], [3, 4]]").feasible        # node 5 missing
  assert not t.verify(q, "Answer: [[0, 1, 2], [2, 4, 5]]").feasible     # shared node
  assert not t.verify(q, "Answer: [0, 1, 2, 3, 4, 5]").feasible         # not two lists


# ---------------------------------------------------------------------------
# Answer extraction and parsing.
def test_last_answer_and_forms():
  t, q = tasks.get("TSP"), square_tsp()
  text = "First try. Answer: [0, 2, 1, 3, 0]\nOn reflection... Answer: [0, 1, 2, 3, 0]."
  assert t.verify(q, text).value == 40                                   # the LAST Answer:
  assert t.verify(q, "Answer: **[0, 1, 2, 3, 0]**").value == 40
  assert t.verify(q, "Answer: The tour is (0, 1, 2, 3, 0) with length 40").value == 40
  assert t.verify(q, "Answer: ['0', '1', '2', '3', '0']").value == 40
  assert t.verify(q, "Answer: [0 -> 1 -> 2 -> 3 -> 0]").value == 40
  v = t.verify(q, "the tour is [0, 1, 2, 3, 0]")
  assert not v.feasible and not v.well_formed and "no 'Answer:'" in v.reason
  for bad in ("Answer: [0, 1, 2.5, 3, 0]", "Answer: [0, 1, 2, 3, 0", "Answer: none",
              "Answer: __import__('os').system('echo pwned')", "Answer: [0, 1, x, 3, 0]"):
    v = t.verify(q, bad)
    assert not v.feasible and not v.well_formed and v.reason.startswith("malformed"), bad


def test_parser_bounds():
  with pytest.raises(parsing.ParseError, match="nested deeper"):
    parsing.parse_list("[" * 100_000 + "]" * 100_000)
  long = "Answer: [" + "1, " * 1_000_000 + "1]"
  assert len(parsing.extract_answer(long)) == parsing.MAX_ANSWER_CHARS
  with pytest.raises(parsing.ParseError):
    parsing.parse_list(parsing.extract_answer(long))  # truncated: no closing bracket


ANSWERY = st.one_of(
    st.text(max_size=200),
    st.text(alphabet="[](), 0123456789-> '\"Impossible.", max_size=300),
    st.recursive(st.integers(-5, 60), lambda c: st.lists(c, max_size=6), max_leaves=40).map(str),
    st.builds(lambda d: "[" * d + "1" + "]" * d, st.integers(0, 3000)),
)


@pytest.mark.parametrize("key", list(TABLE))
@hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
@hypothesis.given(body=ANSWERY, prefix=st.sampled_from(["", "Answer: ", "x Answer:", "Answer:Answer: "]))
def test_fuzz_verify_never_raises(key, body, prefix):
  t = tasks.get(key)
  q = FUZZ_INSTANCES[key]
  for compat in tasks.COMPAT:
    v = t.verify(q, prefix + body, compat=compat)
    assert isinstance(v, tasks.Verdict)
    assert v.feasible == (v.value is not None)


FUZZ_INSTANCES = {k: tasks.get(k).generate(0, "tiny") for k in TABLE}


# ---------------------------------------------------------------------------
# Compatibility with NP-Bench's own rules on its own instances.
def test_reference_data_both_columns():
  rows = [json.loads(line) for line in open(DATA)]
  assert len(rows) == 240
  checked = 0
  for r in rows:
    t = tasks.get(r["task_type"])
    for a in r["answers"]:
      for compat in ("strict", "npbench"):
        v = t.verify(r["question"], "Answer: " + a["text"], compat=compat)
        want = a[compat]
        assert v.feasible == want["feasible"], (r["task_type"], r["level"], a["text"], compat, v.reason)
        if v.feasible:
          assert v.value == float(want["value"]), (r["task_type"], a["text"], compat)
        checked += 1
  assert checked == 2 * 2338


def test_our_reference_on_npbench_instances():
  rows = [json.loads(line) for line in open(DATA)]
  for r in rows[::3]:
    t = tasks.get(r["task_type"])
    ref = t.reference_solution(r["question"])
    assert t.verify_solution(r["question"], ref).feasible


# ---------------------------------------------------------------------------
# Scoring.
def test_ratio_rule_by_hand():
  assert scoring.ratio(50, 40, "min") == 0.8       # gt / value
  assert scoring.ratio(30, 40, "min") == 40 / 30   # beats the reference: > 1, not clipped
  assert scoring.ratio(3, 4, "max") == 0.75        # value / gt
  assert scoring.ratio(0, 0, "max") == 1.0         # 0/0 = 1
  assert scoring.ratio(None, 4, "max") == 0.0      # infeasible
  assert math.isinf(scoring.ratio(2, 0, "max"))
  t, q = tasks.get("TSP"), square_tsp()
  assert t.ratio(q, "Answer: [0, 2, 1, 3, 0]") == 40 / 48
  assert t.ratio(q, "Answer: [0, 2, 1, 3, 0]", ground_truth=44) == 44 / 48
  assert t.ratio(q, "Answer: nonsense") == 0.0


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_pass_at_k_brute_force(n):
  for c in range(n + 1):
    outcomes = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
      subsets = list(itertools.combinations(range(n), k))
      brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
      assert scoring.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
  with pytest.raises(ValueError):
    scoring.pass_at_k(3, 4, 1)


def test_problem_scores_and_aggregate_by_hand():
  s = scoring.problem_scores([0.0, 0.5, 1.0, 0.9], [False, True, True, True], k=3, pass_ks=(1, 2))
  assert s["SR@3"] == 1.0 and s["QR@3"] == 1.0
  assert s["SR_mean"] == 0.75 and s["QR_mean"] == pytest.approx(0.6)
  assert s["pass@1"] == pytest.approx(0.75) and s["pass@2"] == pytest.approx(1.0)
  assert scoring.mean_at_k([True, False, True, True], 2) == 0.5
  # Overall is the mean of category means, not of problems:
  # graph (1.0 + 0.5) / 2 = 0.75, planning 0.25 -> overall 0.5 (a problem mean would give 0.5833).
  agg = scoring.aggregate([{"QR": 1.0}, {"QR": 0.5}, {"QR": 0.25}], ["graph", "graph", "planning"])
  assert agg["categories"]["graph"]["QR"] == 0.75
  assert agg["overall"]["QR"] == 0.5


def test_keep_exploration_and_diversity_by_hand():
  r = scoring.keep_and_exploration([True, True, False, False, False], [True, False, True, False, False])
  assert r["keep_rate"] == 0.5 and r["exploration_rate"] == pytest.approx(1 / 3)
  assert scoring.distinct_solutions(["a", "a", None, "b"]) == 2
  assert scoring.solution_entropy(["a", "a", "b", "b", None]) == pytest.approx(math.log(2))
  assert scoring.solution_entropy(["a", "a"]) == 0.0


def test_rewards():
  t, q = tasks.get("TSP"), square_tsp()
  texts = ["Answer: [0, 1, 2, 3, 0]", "Answer: [0, 2, 1, 3, 0]", "Answer: [0, 1, 2, 0]", "no answer"]
  r, v = rewards.score(t, q, texts)
  np.testing.assert_allclose(r, [1.1, 0.1 + 40 / 48, 0.1, 0.0], rtol=1e-6)
  r, _ = rewards.score(t, q, texts[:1], rewards.RewardConfig(format_bonus=0.0, cap=0.5), gt=40)
  assert r[0] == 0.5
  r, _ = rewards.score(t, q, texts[1:2], rewards.RewardConfig(ground_truth="optimal"))
  assert r[0] == pytest.approx(0.1 + 40 / 48)
  with pytest.raises(ValueError, match="ground_truth"):
    rewards.RewardConfig(ground_truth="oracle")


# ---------------------------------------------------------------------------
# Prompts, rendering, data.
@pytest.mark.parametrize("key", list(TABLE))
def test_prompts(key):
  from dmpo_jax.models import tokenizer
  tok = tokenizer.build()
  t = tasks.get(key)
  for seed in range(20):
    q = t.generate(seed, "tiny")
    text = t.prompt(q, "compact") + t.format_answer(t.reference_solution(q))
    ids = tok.encode(text)
    assert len(ids) <= 256 and tok.unk_token_id not in ids
    assert t.verify(q, text).feasible  # one parser serves both styles
  p = t.prompt(q, "npbench")
  assert p.endswith("Your response should end with: Answer: YOUR ANSWER")
  assert t.verify(q, p + "\n\nAnswer: " + t.format_answer(t.reference_solution(q))).feasible
  with pytest.raises(ValueError, match="prompt style"):
    t.prompt(q, "chatty")


@pytest.mark.parametrize("key", list(TABLE))
def test_render(key):
  t = tasks.get(key)
  q = t.generate(0, "easy")
  a, b = t.render(q, 384), t.render(q, 384)
  assert a.size == (384, 384) and a.tobytes() == b.tobytes()   # deterministic
  px = np.asarray(a)
  assert (px < 128).mean() > 0.005                              # something is drawn
  with pytest.raises(ValueError, match="render size"):
    t.render(q, 10)


def test_npbench_files_round_trip(tmp_path):
  recs = list(data.generate(["TSP", "knapsack"], "tiny", 3, style="compact", exact=True))
  assert len(recs) == 6 and all(r["optimum_status"] == "OPTIMAL" for r in recs)
  path = tmp_path / "set.jsonl"
  assert data.write_jsonl(recs, str(path)) == 6
  back = data.read_npbench(str(path))
  assert back == recs
  jpath = tmp_path / "bench.json"
  jpath.write_text(json.dumps(recs))
  assert data.read_npbench(str(jpath)) == recs
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"task_type": "sudoku", "question": {}}) + "\n")
  with pytest.raises(data.DataError, match="bad.jsonl: record 0 has unknown task_type 'sudoku'"):
    data.read_npbench(str(bad))
  with pytest.raises(data.DataError, match="no such file"):
    data.read_npbench(str(tmp_path / "missing.json"))


def test_tfds_builder_round_trip(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  from dmpo_jax.tasks import tfds_builder
  b = tfds_builder.NpBench(config="subset_sum_tiny", data_dir=str(tmp_path), num_train=4, num_test=2)
  b.download_and_prepare()
  src = b.as_data_source()
  assert len(src["train"]) == 4 and len(src["test"]) == 2
  t = tasks.get("subset-sum")
  seeds = set()
  for ex in src["train"]:
    q = json.loads(ex["question"])
    seeds.add(int(ex["seed"]))
    assert q == t.generate(int(ex["seed"]), "tiny")
    assert ex["ground_truth"] == t.reference_value(q)
  assert seeds == {0, 1, 2, 3}
