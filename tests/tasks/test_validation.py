"""Instances are validated in full before any work (`Task.validate`, tasks/checks.py): every
generated and NP-Bench instance passes; a corrupted one of each task is refused, by name, by
`validate` and by the verifiers (which call it); a bad record of an NP-Bench file is refused
by `evaluate --npbench_file` before the model loads (file, record key and index named, nothing
written), or skipped, counted and listed with --skip_invalid."""

import copy
import hashlib
import json
import os

import pytest

from dmpo_jax import tasks
from tests import helpers
from dmpo_jax.tasks import base, data
from tests.helpers import REPO


def one_sided(q):
  """Add an edge u-v to u's list only."""
  u, v = next((u, v) for u in q for v in range(len(q)) if int(u) != v and v not in q[u])
  q[u].append(v)


def setitem(path, value):
  def mutate(q):
    d = q
    for k in path[:-1]:
      d = d[k]
    d[path[-1]] = value
  return mutate


def renamed(field, old, new):
  def mutate(q):
    m = q[field] if field else q
    m[new] = m.pop(old)
  return mutate


# task -> [(what is corrupted, mutation of a generated easy instance, expected message)]
CORRUPT = {
    "GCP-D": [
        ("edge to 99", lambda q: q["0"].append(99), "question field '0': neighbour 99 is not a vertex id"),
        ("self-loop", lambda q: q["1"].append(1), "vertex 1 lists itself"),
        ("one-sided edge", one_sided, "does not list"),
        ("repeated neighbour", lambda q: q["2"].extend(q["2"][:1] or [0, 0]), "listed twice|does not list"),
        ("bool neighbour", lambda q: q["3"].append(True), "neighbour True is not a vertex id"),
        ("key 01", renamed(None, "1", "01"), "'01' is not a vertex id"),
        ("dict row", setitem(["0"], {"1": 1}), "question field '0' is dict, expected a list"),
    ],
    "maximum_clique_problem": [
        ("edge to 99", lambda q: q["0"].append(99), "neighbour 99"),
        ("one-sided edge", one_sided, "does not list"),
        ("string neighbour out of range", lambda q: q["0"].append("42"), "neighbour '42'"),
    ],
    "maximum-set": [
        ("zero-valued pair", lambda q: q["0"].update({"1": 0}), "positive value"),
        ("self-loop", lambda q: q["2"].update({"2": 1}), "vertex 2 lists itself"),
        ("one-sided edge", lambda q: q["0"].update({next(str(v) for v in range(1, len(q))
                                                          if str(v) not in q["0"]): 1}), "does not list"),
        ("list row", setitem(["0"], [1]), "question field '0' is list, expected an object"),
    ],
    "hamiltonian-cycle": [
        ("edge to 99", lambda q: q["0"].append(99), "neighbour 99"),
        ("self-loop", lambda q: q["0"].append(0), "lists itself"),
        ("one-sided edge", one_sided, "does not list"),
    ],
    "TSP": [
        ("asymmetric", setitem(["0", "1"], 1234), "is 1234 but 1-0"),
        ("missing column", lambda q: q["2"].pop("3"), "question field '2': has"),
        ("negative", lambda q: (q["0"].update({"1": -5}), q["1"].update({"0": -5})), "-5, expected a finite"),
        ("diagonal", setitem(["3", "3"], 7), "to itself is 7"),
        ("text distance", setitem(["0", "1"], "12"), "'12', expected a finite number"),
        ("column 99", setitem(["0", "99"], 3), "column '99'"),
    ],
    "minimum-cut": [
        ("asymmetric", setitem(["0", "1"], 777), "is 777 but"),
        ("self-loop", setitem(["4", "4"], 3), "node 4 to itself is 3"),
        ("negative", lambda q: (q["0"].update({"1": -1}), q["1"].update({"0": -1})), "-1, expected"),
        ("nan", setitem(["0", "1"], float("nan")), "nan, expected"),
    ],
    "knapsack": [
        ("float weight", setitem(["items", "0", "weight"], 2.5), "item 0's weight is 2.5"),
        ("negative value", setitem(["items", "1", "value"], -3), "item 1's value is -3"),
        ("fractional capacity", setitem(["capacity"], 10.5), "the capacity is 10.5"),
        ("no value", lambda q: q["items"]["2"].pop("value"), "item 2 is"),
        ("id 01", renamed("items", "1", "01"), "item id '01'"),
    ],
    "subset-sum": [
        ("target 0", setitem(["target"], 0), "the target is 0"),
        ("float number", setitem(["numbers", "0"], 1.5), "number 0 is 1.5"),
        ("negative number", setitem(["numbers", "1"], -2), "number 1 is -2"),
        ("id 01", renamed("numbers", "1", "01"), "number id '01'"),
    ],
    "set-cover": [
        ("element outside U", lambda q: q["S"]["0"].append(10**6), "1000000, which is not an element of U"),
        ("U repeats", lambda q: q["U"].append(q["U"][0]), "is listed twice"),
        ("text element", lambda q: q["U"].append("x"), "element 'x' is not an integer"),
        ("subset not a list", setitem(["S", "1"], {"a": 1}), "subset 1 is dict"),
    ],
    "meeting-schedule": [
        ("unknown attendee", lambda q: q["meetings"]["0"]["attendees"].append(99),
         "meeting 0's attendee 99 is not an attendee id"),
        ("window backwards", setitem(["attendee_availability", "0"], [[600, 540]]), r"window \[600, 540\]"),
        ("duration 0", setitem(["meetings", "1", "duration"], 0), "meeting 1's duration is 0"),
        ("negative room", setitem(["rooms", "0"], -1), "room 0's capacity is -1"),
        ("attendee twice", lambda q: q["meetings"]["0"]["attendees"].append(q["meetings"]["0"]["attendees"][0]),
         "lists an attendee twice"),
        ("float start", setitem(["attendee_availability", "1"], [[540.5, 720]]), r"window \[540\.5, 720\]"),
    ],
}
CASES = [(k, *c) for k, cases in CORRUPT.items() for c in cases]


def test_every_task_has_corruption_cases():
  assert sorted(CORRUPT) == sorted(tasks.names())


@pytest.mark.parametrize("key,what,mutate,expected", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_corrupted_instance_is_refused_by_name(key, what, mutate, expected):
  task = tasks.get(key)
  q = copy.deepcopy(task.generate(3, "easy"))
  task.validate(q)  # the instance before the corruption is valid
  mutate(q)
  with pytest.raises(base.InvalidInstance, match=expected) as e:
    task.validate(q)
  assert str(e.value).startswith(f"{key}: ") and "\n" not in str(e.value)
  for compat in ("strict", "npbench"):  # the verifiers call validate: they cannot drift from it
    with pytest.raises(ValueError, match=expected):
      task.verify(q, "Answer: [0, 1]", compat=compat)


def test_generated_and_npbench_instances_are_valid():
  """Validation never refuses a real instance: 10 seeds of every task and level, and the 240
  instances NP-Bench's own generators made (tests/data/npbench_reference.jsonl)."""
  for key in tasks.names():
    for level in tasks.LEVELS:
      for seed in range(10):
        tasks.get(key).validate(tasks.get(key).generate(seed, level))
  with open(os.path.join(REPO, "tests", "data", "npbench_reference.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == 240
  for r in rows:
    tasks.get(r["task_type"]).validate(r["question"])


def test_what_the_checks_prevent():
  """Without validation, a self-loop split the verifiers (strict ignored it, NP-Bench refused
  every colouring) and a one-sided edge made a cycle valid in one direction only."""
  from dmpo_jax.tasks import npbench_rules
  q = {"0": [1, 0], "1": [0]}
  with pytest.raises(npbench_rules.Refused):
    npbench_rules.check("GCP-D", q, "Answer: [1, 2]")
  with pytest.raises(ValueError, match="lists itself"):
    tasks.get("GCP-D").verify(q, "Answer: [1, 2]")
  ham = {"0": [1, 2], "1": [2], "2": [0, 1]}  # 0-1 listed from 0 only
  assert npbench_rules.check("hamiltonian-cycle", ham, "Answer: [0, 1, 2, 0]")[0] == 4
  with pytest.raises(npbench_rules.Refused):
    npbench_rules.check("hamiltonian-cycle", ham, "Answer: [0, 2, 1, 0]")
  with pytest.raises(ValueError, match="vertex 1 does not list 0"):
    tasks.get("hamiltonian-cycle").verify(ham, "Answer: [0, 2, 1, 0]")


# ---------------------------------------------------------------------------
# NP-Bench files.
def gcp_records(n):
  t = tasks.get("GCP-D")
  return {f"GCP-D_easy_question{i + 1}": {"prompt": t.prompt(t.generate(i, "easy")),
                                          "question": t.generate(i, "easy"), "task_type": "GCP-D",
                                          "ground_truth": 3} for i in range(n)}


def test_a_bad_record_is_named_by_file_key_and_index(tmp_path):
  obj = gcp_records(40)
  obj["GCP-D_easy_question37"]["question"]["0"].append(99)
  path = tmp_path / "bench.json"
  path.write_text(json.dumps(obj))
  with pytest.raises(data.DataError) as e:
    data.read_npbench(str(path))
  assert str(e.value) == (f"{path}: record 'GCP-D_easy_question37': question: GCP-D: question field "
                          "'0': neighbour 99 is not a vertex id 0..9 (record 36 of 40)")
  checked = data.read_npbench_checked(str(path), skip_invalid=True)
  assert len(checked.records) == 39 and checked.total == 40 and checked.indices[36] == 37
  assert [(s["record"], s["index"]) for s in checked.skipped] == [("'GCP-D_easy_question37'", 36)]
  # JSON Lines: the line and the index; a JSON list: the index and the record's own key.
  recs = [dict(r, key=k) for k, r in gcp_records(3).items()]
  recs[2]["question"]["1"].append(1)
  (tmp_path / "b.jsonl").write_text("\n\n".join(json.dumps(r) for r in recs))
  with pytest.raises(data.DataError, match=r"record on line 5: question: GCP-D: .*lists itself .*"
                                           r"\(record 2 of 3, id 'GCP-D_easy_question3'\)$"):
    data.read_npbench(str(tmp_path / "b.jsonl"))
  (tmp_path / "c.json").write_text(json.dumps(recs))
  with pytest.raises(data.DataError, match=r"c.json: record 2: .* \(id 'GCP-D_easy_question3'\)$"):
    data.read_npbench(str(tmp_path / "c.json"))
  (tmp_path / "d.json").write_text(json.dumps(recs[2:]))
  with pytest.raises(data.DataError, match="none of its 1 records is valid"):
    data.read_npbench_checked(str(tmp_path / "d.json"), skip_invalid=True)


def evaluate_cli(argv, capsys):
  """`python -m dmpo_jax.evaluate` in this process: (exit status, stdout, stderr)."""
  return helpers.run_evaluate(argv, capsys)


def snapshot(folder) -> dict:
  out = {}
  for root, _, files in os.walk(folder):
    for f in files:
      with open(os.path.join(root, f), "rb") as fh:
        out[os.path.relpath(os.path.join(root, f), folder)] = hashlib.sha256(fh.read()).hexdigest()
  return out


BAD_GRAPHS = [("edge99", lambda q: q["0"].append(99), "neighbour 99 is not a vertex id 0.."),
              ("selfloop", lambda q: q["0"].append(0), "vertex 0 lists itself"),
              ("onesided", one_sided, "does not list")]


@pytest.mark.parametrize("name,mutate,expected", BAD_GRAPHS, ids=[b[0] for b in BAD_GRAPHS])
def test_evaluate_refuses_a_bad_record_before_the_model_loads(name, mutate, expected, tmp_path,
                                                              capsys, monkeypatch):
  from dmpo_jax import evaluate

  def never(*a, **k):
    raise AssertionError("the model was loaded: the bad record was not found up front")
  monkeypatch.setattr(evaluate, "load_policy", never)
  obj = gcp_records(30)
  mutate(obj["GCP-D_easy_question21"]["question"])
  path = tmp_path / f"{name}.json"
  path.write_text(json.dumps(obj))
  before = snapshot(tmp_path)
  code, _, err = evaluate_cli([f"--hf={tmp_path}/model", f"--npbench_file={path}",
                               f"--out={tmp_path}/out", "--chat"], capsys)
  lines = [line for line in err.splitlines() if line.strip()]
  assert code == 2 and len(lines) == 1, err
  assert lines[0].startswith(f"error: {path}: record 'GCP-D_easy_question21': question: GCP-D: "
                             "question field '0': ") and lines[0].endswith("(record 20 of 30)")
  assert expected in lines[0]
  assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()
  # --skip_invalid applies to a file only
  code, _, err = evaluate_cli([f"--hf={tmp_path}/model", f"--out={tmp_path}/out", "--skip_invalid"],
                              capsys)
  assert code == 2 and "--skip_invalid applies to --npbench_file" in err


@pytest.mark.slow  # builds and samples a tiny model (about 20 s on a contended 2-core machine)
def test_skip_invalid_skips_counts_and_lists(tmp_path, capsys):
  """Two good records are scored; an edge to 99 and a subset sum no subset reaches (valid, but
  without a ground truth our reference cannot solve it) are skipped, counted and listed."""
  from dmpo_jax.models import tokenizer as tokenizer_lib
  from tests.helpers import tiny_hf

  tok = tokenizer_lib.build(str(tmp_path / "model"))
  tiny_hf(str(tmp_path / "model"), vocab=len(tok))
  t = tasks.get("GCP-D")
  good = [data.make_record("GCP-D", s, "tiny") for s in (0, 1)]
  bad = copy.deepcopy(good[0])
  bad["question"]["0"].append(99)
  unsolvable = {"task_type": "subset-sum", "level": "tiny", "prompt": "Pick numbers.",
                "question": {"target": 3, "numbers": {"0": 2, "1": 4}}}
  lines = [good[0], bad, good[1], unsolvable]
  path = tmp_path / "mixed.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in lines))
  argv = [f"--hf={tmp_path}/model", f"--npbench_file={path}", f"--out={tmp_path}/out",
          "--samples=1", "--k=1", "--max_new_tokens=4", "--batch_prompts=2"]
  code, _, err = evaluate_cli(argv, capsys)
  assert code == 2 and "record on line 2: question: GCP-D: question field '0': neighbour 99" in err
  assert not (tmp_path / "out").exists()
  code, out, err = evaluate_cli(argv + ["--skip_invalid"], capsys)
  assert code == 0, err
  assert "skipped 2 invalid record(s)" in out and "record on line 2" in out and "record on line 4" in out
  res = json.loads((tmp_path / "out" / "eval.json").read_text())
  assert res["num_problems"] == 2 and res["skipped"]["count"] == 2
  assert [(s["record"], s["index"]) for s in res["skipped"]["records"]] == [("on line 2", 1), ("on line 4", 3)]
  assert "no ground_truth, and our reference finds no solution" in res["skipped"]["records"][1]["error"]
  assert "skipped 2 invalid record(s)" in (tmp_path / "out" / "table.txt").read_text()
  assert t.key in res["levels"]["tiny"]["per_task"]
