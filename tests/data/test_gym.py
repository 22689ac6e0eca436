"""reasoning-gym tasks as domains (dmpo_jax/data/gym.py): our scorers never run model text, give
reasoning-gym's own scores on reference and corrupted answers (less only where listed), key
instances by question text, count distinct correct answers, and train end to end."""

import json
import os
import random
import time

import numpy as np
import pytest

from dmpo_jax.data import domain, gym, gym_scorers, instances, pipeline
from dmpo_jax.tasks import diversity, rewards
from tests.helpers import config_module, override

# Small configs, fast to generate (futoshiki's default boards take seconds each to make).
CONFIGS = {"countdown": {}, "puzzle24": {}, "graph_color": {}, "shortest_path": {}, "n_queens": {},
           "gsm_symbolic": {}, "futoshiki": {"min_board_size": 4, "max_board_size": 6},
           "basic_arithmetic": {}, "chain_sum": {}, "leg_counting": {}, "letter_counting": {},
           "number_sorting": {}}
SLOW = {"countdown", "puzzle24", "futoshiki"}  # 200 instances take 4-11 s to generate (these check 100)
HOSTILE = ["__import__('os').system('touch PWNED')", "open('PWNED', 'w').write('1')",
           "(lambda: __import__('os').system('touch PWNED'))()", "9**9**9**9"]


def build(name, key=None, **cfg):
  return gym.domain(name, key=key or f"test-gym-{name}", size=100_000, seed=7, **{**CONFIGS[name], **cfg})


@pytest.fixture
def registered():
  """Builds gym domains (build(...)) and unregisters them after the test."""
  made = []
  def make(name, **kw):
    task = build(name, **kw)
    made.append(task.key)
    return task
  yield make
  for key in made:
    domain.unregister(key)


def ours(task, q, answer) -> float:
  v = task.verify_answer(q, answer)
  return v.value if v.feasible else 0.0


def test_wrapped_tasks_and_refusals(registered):
  assert set(gym.wrapped()) >= {"countdown", "graph_color", "shortest_path", "n_queens",
                                "gsm_symbolic", "futoshiki", "puzzle24", "basic_arithmetic",
                                "chain_sum", "leg_counting", "letter_counting", "number_sorting"}
  for name in ("spiral_matrix", "no_such_task"):  # scored by eval / sympy, or unknown
    with pytest.raises(ValueError, match=f"{name}.*not wrapped"):
      gym.domain(name)
  task = registered("gsm_symbolic")
  assert gym.domain("gsm_symbolic", key=task.key, size=100_000, seed=7) is task  # the same call
  with pytest.raises(ValueError, match="taken"):
    gym.domain("gsm_symbolic", key=task.key, size=5, seed=7)
  with pytest.raises(ValueError, match="bad config"):
    gym.domain("n_queens", key="test-gym-bad", n=99)
  assert "test-gym-bad" not in domain.names()
  q = task.generate(0, "tiny")
  bad = {**q, "data": {"answer": 12}}
  with pytest.raises(ValueError, match="data.answer"):
    task.verify(bad, "Answer: 12")
  with pytest.raises(ValueError, match="'answer' scores 0.01"):  # an answer its data refutes
    task.verify({**q, "answer": str(float(q["answer"]) + 1)}, "Answer: 12")
  paths = registered("shortest_path")
  p = paths.generate(0, "tiny")
  with pytest.raises(ValueError, match="'data' is malformed"):
    paths.verify({**p, "data": {**p["data"], "matrix": [[]]}}, "Answer: up")
  with pytest.raises(ValueError, match="image"):
    task.prompt(q, "image")


def test_a_missing_extra_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(__import__("sys").modules, "reasoning_gym", None)  # import fails
  with pytest.raises(ImportError, match=r"pip install -e \"\.\[gym\]\""):
    gym.domain("countdown", key="test-gym-missing")
  assert "test-gym-missing" not in domain.names()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hostile_answers_score_zero_fast_and_run_nothing(name, registered, tmp_path, monkeypatch):
  task = registered(name)
  def never(*a, **kw):
    raise AssertionError("reasoning-gym's scorer ran on model text")
  monkeypatch.setattr(type(task.dataset), "score_answer", never)
  monkeypatch.chdir(tmp_path)
  for seed in range(3):
    q = task.generate(seed, "tiny")
    for h in HOSTILE:
      for text in (f"Answer: {h}", f"Let me think.\nAnswer: {h}\n"):
        t0 = time.monotonic()
        v = task.verify(q, text)
        reward, _ = rewards.score(task, q, [text])
        assert time.monotonic() - t0 < 0.5, (h, time.monotonic() - t0)
        assert not v.feasible and v.value is None and reward[0] <= rewards.RewardConfig().format_bonus, (h, v)
  assert not os.listdir(tmp_path) and not os.path.exists("PWNED")


# ---- parity with reasoning-gym's own scores ------------------------------------------------------
# Each variant: (answer, label). "same": our score equals reasoning-gym's. Any other label is a
# listed difference (gym_scorers.Scorer.differences) where our scorer accepts less (ours <
# theirs), except "negative reference" (reasoning-gym drops the minus sign of the reference).

def _swap_first_op(expr):
  for a, b in (("+", "-"), ("-", "+"), ("*", "+"), ("/", "*")):
    if a in expr:
      return expr.replace(a, b, 1)
  return expr + "+1"


def _bump_first_number(expr, top=None):
  import re
  m = re.search(r"\d+", expr)
  n = int(m.group()) + 1
  n = 1 if top and n > top else n
  return expr[:m.start()] + str(n) + expr[m.end():]


def variants_countdown(e, q, rng):
  ref, theirs, target = q["answer"], e["answer"], e["metadata"]["target"]
  return [(ref, "same"), (theirs, "same"), (f"({ref})", "same"), (ref.replace(" ", ""), "same"),
          (_swap_first_op(theirs), "same"), (_bump_first_number(theirs), "same"), (theirs + " + 1", "same"),
          ("I don't know", "refused"), (f"{ref} = {target}", "refused"), ("2**3 + 1", "refused")]


def variants_puzzle24(e, q, rng):
  ref, theirs = q["answer"], e["answer"]
  return [(ref, "same"), (theirs, "same"), (_swap_first_op(theirs), "same"),
          (_bump_first_number(theirs, top=10), "other numbers"), ("no idea", "refused")]


def variants_graph_color(e, q, rng):
  ref = json.loads(q["answer"])
  options = e["metadata"]["puzzle"]["color_options"]
  shift = {c: options[(i + 1) % len(options)] for i, c in enumerate(options)}
  out = [(q["answer"], "same"), (json.dumps(e["metadata"]["possible_answer"]), "same"),
         (json.dumps({v: shift[c] for v, c in ref.items()}), "same"),
         (json.dumps({v: c for v, c in ref.items() if v != "0"}), "same"),
         (json.dumps({**ref, "1": 99}), "same"), (json.dumps({**ref, "2": [1]}), "same"),
         ("{'0': 1}", "same"), (json.dumps(list(ref.values())), "not an object")]
  edges = e["metadata"]["puzzle"]["edges"]
  if edges:
    u, v = edges[0]
    out.append((json.dumps({**ref, str(v): ref[str(u)]}), "same"))
  return out


def variants_shortest_path(e, q, rng):
  ref = q["answer"]
  out = [(ref, "same"), ("  ".join(ref.split()), "same"), ("infeasible", "same"), ("up left", "same"),
         ("go up", "same")]
  if ref != "infeasible":
    out.append((" ".join(ref.split()[:-1]) or "up", "same"))
    grid = e["metadata"]["matrix"]
    start = next((r, c) for r, row in enumerate(grid) for c, x in enumerate(row) if x == "*")
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}
    for d, (dr, dc) in gym_scorers.MOVES.items():
      r, c = start[0] + dr, start[1] + dc
      if 0 <= r < len(grid) and 0 <= c < len(grid[0]) and grid[r][c] == "O":
        out.append((f"{d} {back[d]} {ref}", "same"))  # a detour: valid, not shortest
        break
  return out


def variants_n_queens(e, q, rng):
  ref = q["answer"]
  rows = [r.split() for r in ref.split("\n")]
  puzzle = "\n".join(" ".join(r) for r in e["metadata"]["puzzle"])
  return [(ref, "same"), (e["answer"], "same"), (e["metadata"]["valid_answers"][-1], "same"),
          (repr(rows), "same"), (repr(["".join(r) for r in rows]), "same"), (puzzle, "same"),
          (ref.replace("\n", " \n"), "same"), (ref.replace("Q", "_", 1), "same")]


def variants_gsm_symbolic(e, q, rng):
  ref = q["answer"]
  out = [(ref, "negative reference" if ref.startswith("-") else "same"), (ref + ".", "same"),
         (str(float(ref)) + "1", "same"), (f"{ref} apples", "text around the number"),
         ("seven", "same")]
  return out


def variants_futoshiki(e, q, rng):
  ref = q["answer"]
  digits = [i for i, ch in enumerate(ref) if ch in "123456789"]
  i = rng.choice(digits)
  changed = ref[:i] + str(int(ref[i]) % 4 + 1) + ref[i + 1:]
  plain = "\n".join(" ".join(map(str, row)) for row in e["metadata"]["solution"])
  return [(ref, "same"), (ref.replace("\n", "  \n"), "same"), (changed, "same"), (plain, "same"),
          (plain + "\n" + plain, "same"), ("no idea", "same")]


def _number_variants(ref):
  """A short numeric answer (reasoning-gym's default score_answer: the text, or the share of it
  the oracle covers): variants that are numbers score the same; text around one is refused."""
  return [(ref, "same"), (ref + "0", "same"), (ref + ".0", "same"), (ref + ",", "same"),
          (str(int(ref) + 1), "same"), ("seven", "same"),
          (f"{ref} in total", "text around the number")]


def variants_basic_arithmetic(e, q, rng):
  return _number_variants(q["answer"])


variants_leg_counting = variants_letter_counting = variants_basic_arithmetic


def variants_chain_sum(e, q, rng):
  ref = q["answer"]
  out = _number_variants(ref) + [(f"{int(ref):,}", "same"), (ref + ".00", "same"),
                                 (ref + "e0", "exponent")]
  if not ref.startswith("-"):
    out.append(("+0" + ref, "same"))
  return out


def variants_number_sorting(e, q, rng):
  ref = q["answer"]
  nums = [float(x) for x in e["metadata"]["sorted_numbers"]]
  i = rng.randrange(len(nums))
  return [(ref, "same"), (e["answer"], "same"), (json.dumps(nums), "same"),
          (json.dumps(nums[::-1]), "same"), (json.dumps(nums[:-1]), "same"),
          (json.dumps(nums[:i] + [nums[i] + rng.choice([0.5, 3])] + nums[i + 1:]), "same"),
          (json.dumps([str(x) for x in nums] + ["1"]), "same"), ("[1, 2", "same"), ('"1, 2"', "same"),
          (json.dumps(["a"] * len(nums)), "same"), (json.dumps([[1]] * len(nums)), "same"),
          (", ".join(map(str, nums)), "same"),
          ("[" + ", ".join(["NaN"] * len(nums)) + "]", "non-finite")]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in sorted(CONFIGS)])
def test_scores_equal_reasoning_gyms(name, registered):
  """200 instances (100 of the SLOW tasks, whose generation and reasoning-gym's scoring cost the
  most): our score equals reasoning-gym's for its reference, ours, and corrupted answers; the
  listed differences go one way (ours lower), and each is exercised."""
  task = registered(name)
  rng = random.Random(0)
  make = globals()[f"variants_{name}"]
  labels, total = {}, 0
  for index in range(100 if name in SLOW else 200):
    e, q = task.dataset[index], task.instance(index)
    for answer, label in make(e, q, rng):
      mine, theirs = ours(task, q, answer), task.dataset.score_answer(answer, e)
      total += 1
      if label == "same" or mine == theirs:
        assert mine == theirs, (index, answer, mine, theirs)
      elif label == "negative reference":
        assert (mine, theirs) == (1.0, 0.01), (index, answer)
      else:
        assert mine < theirs, (label, index, answer, mine, theirs)
        labels[label] = labels.get(label, 0) + 1
  expected = {"countdown": {"refused"}, "puzzle24": {"refused"}, "graph_color": {"not an object"},
              "gsm_symbolic": {"text around the number"}, "basic_arithmetic": {"text around the number"},
              "leg_counting": {"text around the number"}, "letter_counting": {"text around the number"},
              "chain_sum": {"text around the number", "exponent"},
              "number_sorting": {"non-finite"}}.get(name, set())
  # puzzle24's "other numbers" (another expression of 24) may or may not occur
  assert expected <= set(labels) <= expected | {"other numbers"}, labels
  print(f"{name}: {total} answers, differences {labels}")


@pytest.mark.parametrize("name, cfg, n", [
    ("countdown", dict(min_numbers=3, max_numbers=3, max_value=9, min_target=10, max_target=30), 300),
    # puzzle24: 13 questions with a second answer among the first 100 (64 among 300, 30 s)
    pytest.param("puzzle24", dict(min_value=1, max_value=4), 100, marks=pytest.mark.slow),
])
def test_instances_are_keyed_by_question_text(name, cfg, n, registered):
  """Where reasoning-gym gives one question different answers (seed-dependent expressions),
  our instance of the question is still one: its answer is a function of the question."""
  task = registered(name, **cfg)
  by_question, theirs, clashes = {}, {}, 0
  for index in range(n):
    e, q = task.dataset[index], task.instance(index)
    clashes += theirs.setdefault(e["question"], e["answer"]) != e["answer"]
    assert by_question.setdefault(q["question"], q) == q, index
  assert clashes > 0  # the generator does give one question several answers


def test_distinct_correct_countdown_answers(registered):
  """Known solutions, written in several orders: the collapse metrics count each once."""
  task = registered("countdown")
  q = {"question": "Calculate 10 using all of these numbers: 1, 2, 3, 4.", "answer": "1+2+3+4",
       "data": {"numbers": [1, 2, 3, 4], "target": 10}}
  texts = ["1+2+3+4", "4+3+2+1", "(1+2)+(3+4)", "2+(3+(4+1))",       # one solution
           "1*2*3+4", "4+3*2*1", "(2*1)*3+4",                        # a second
           "4*3-2*1", "3*4-1*2",                                     # a third
           "4*3-2/1",                                                # a fourth: /1, not *1
           "1+2+3+5", "1+2*3+4", "oops"]                             # wrong, wrong, malformed
  verdicts = [task.verify_answer(q, t) for t in texts]
  sols = [v.solution if v.feasible else None for v in verdicts]
  values = [v.value if v.feasible else None for v in verdicts]
  m = diversity.group_metrics(sols, values, task.optimal_value(q))
  assert m["distinct_optimal"] == 4 and m["optimal_rate"] == pytest.approx(10 / 13)
  assert m["distinct_feasible"] == 4  # the wrong expressions score 0.05 and have no canonical form
  _, stats = pipeline.score_groups([(task.key, q)], [f"Answer: {t}" for t in texts], len(texts),
                                   rewards.RewardConfig(), correct="optimal")
  assert stats["correct"].sum() == 10 and stats["distinct"][0] == 4
  assert stats["feasible"][0].tolist() == [True] * 12 + [False]
  assert stats["ratio"][0].tolist() == pytest.approx([1.0] * 10 + [0.05, 0.05, 0.0])


def test_distinct_colourings_up_to_renaming(registered):
  task = registered("graph_color")
  q = task.generate(0, "tiny")
  ref = json.loads(q["answer"])
  options = task.problem(q).data["puzzle"]["color_options"]
  renamed = {v: options[(options.index(c) + 1) % len(options)] for v, c in ref.items()}
  v0 = task.verify_answer(q, q["answer"])
  assert v0.solution == task.verify_answer(q, json.dumps(renamed)).solution
  other = next((json.dumps({**ref, v: c}) for v in ref for c in options
                if c != ref[v] and task.verify_answer(q, json.dumps({**ref, v: c})).value == 1.0), None)
  assert other is not None and task.verify_answer(q, other).solution != v0.solution


@pytest.mark.slow
def test_a_gym_domain_trains_end_to_end(registered, tmp_path):
  """SFT, RL and evaluation on gym countdown through stages.train, with content-disjoint splits."""
  from dmpo_jax.training import specs, stages
  task = registered("countdown", key="gym-countdown-smoke", min_numbers=3, max_numbers=3,
                    max_value=9, min_target=10, max_target=40)
  cfg = config_module("collapse").get_config(f"smoke,tasks={task.key}")
  cfg.log.tensorboard = False
  override(cfg, **{"sft.targets": "sampled", "model.max_prompt_len": 368, "model.max_new_tokens": 16,
                   "sft.steps": 60, "sft.lr": 3e-3, "rl.steps": 2, "checkpoint.every": 1000})
  keys = [task.key]
  taskset = specs.taskset(cfg, keys)
  rows = instances.rows(specs.instances_spec(cfg), taskset)
  assert instances.checks(rows, taskset)["disjoint"]
  sets = taskset.split_sets()
  texts = {n: {q["question"] for _, q in getattr(sets, n)} for n in ("A", "B", "C")}
  assert not (texts["A"] & texts["B"] or texts["A"] & texts["C"] or texts["B"] & texts["C"])
  trained = {q["question"] for stage in ("sft", "rl") for _, q in rows[stage]}
  assert not trained & texts["C"] and not {q["question"] for _, q in rows["sft"]} & texts["B"]
  res = stages.train(cfg, str(tmp_path))
  after = res["after"]
  assert set(after["per_task"]) == {task.key} and set(after["categories"]) == {"gym"}
  assert not any(res["truncated"].values()), res["truncated"]  # questions (<= 361 tokens) fit whole
  assert np.isfinite(after["overall"]["QR_mean"])
  # SFT learnt to write expressions that the whitelist reads and that earn credit (0.375 of the
  # samples here after 60 steps); a policy that writes anything else scores 0.
  assert res["before"]["overall"]["SR_mean"] > 0.2
