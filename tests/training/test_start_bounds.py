"""The start's bounds (config.eval.start_bounds): the parser and the config check (each bad
item refused, naming the field, the item and the choices), the check against a point, the
sweep's stop and its report (a fake trainer), and end to end on the collapse smoke config: a
start outside the bounds stops before any RL step with the measured values; one within them
runs RL exactly as the run without bounds (slow)."""

import json
import os

import pytest

from dmpo_jax.experiments import report as sweep_report
from dmpo_jax.experiments import sweep
from dmpo_jax.training import points, report, specs
from dmpo_jax.training import run as run_lib
from studies.collapse_frontier import design
from tests.helpers import REPO, config_module

CONFIG = os.path.join(REPO, "configs", "collapse.py")
# configs/collapse.py's full run: A:32, B:64, C:32 samples per instance at the points
SPLITS = points.bound_metrics({"A": 32, "B": 64, "C": 32}, 3, tuple(range(1, 65)), True)


# ---------------------------------------------------------------------------
# The parser.
def test_parse_bounds_reads_sets_unions_ops_and_values():
  got = points.parse_bounds(" B:pass_optimal@64<=0.95, AB:pass_optimal@1 <= 0.8,A:coverage>=1e-1,", SPLITS)
  assert got == (points.Bound("B", "pass_optimal@64", "<=", 0.95),
                 points.Bound("AB", "pass_optimal@1", "<=", 0.8),
                 points.Bound("A", "coverage", ">=", 0.1))
  assert points.parse_bounds("", SPLITS) == () and points.parse_bounds(" ", SPLITS) == ()
  assert str(got[0]) == "B:pass_optimal@64<=0.95"
  b = got[0]  # <= holds at the bound itself, not above it; NaN is never within
  assert b.holds(0.95) and b.holds(0.2) and not b.holds(0.990) and not b.holds(float("nan"))
  assert got[2].holds(0.1) and not got[2].holds(0.05)


BAD = [
    ("B:pass_optimal@64<0.95", "is not <set>:<metric><op><value> with op one of ['<=', '>=']"),
    ("pass_optimal@1<=0.5", "is not <set>:<metric><op><value>"),
    (":pass_optimal@1<=0.5", "is not <set>:<metric><op><value>"),
    ("B:<=0.5", "is not <set>:<metric><op><value>"),
    ("B:pass_optimal@64<=x", "'x' is not a finite number"),
    ("B:pass_optimal@64<=nan", "'nan' is not a finite number"),
    ("D:coverage<=1", "set 'D' is not among the points' sets ['A', 'B', 'C', 'AB', 'AC', 'BC', 'ABC']"),
    ("B:pass_optimal@128<=0.9", "metric 'pass_optimal@128' is not recorded on set 'B'"),
    ("A:pass_optimal@64<=0.9", "metric 'pass_optimal@64' is not recorded on set 'A'"),  # A: 32 samples
    ("AB:pass_optimal@64<=0.9", "k in 1..32)"),  # a union has the metrics its sets share
    ("B:kl<=0.1", "choose from SR@3, QR@3, SR_mean, QR_mean, pass@k, distinct, solution_entropy, "
                  "length, kl_k1, kl_k3, optimal_rate, distinct_optimal, coverage, entropy_optimal, "
                  "pass_optimal@k, pass_feasible@k, best_qr@k (k in 1..64)"),
]


@pytest.mark.parametrize("item,expected", BAD, ids=[b for b, _ in BAD])
def test_parse_bounds_refuses_bad_items_naming_field_item_and_choices(item, expected):
  text = f"A:coverage>=0.1,{item}"
  with pytest.raises(ValueError) as e:
    points.parse_bounds(text, SPLITS)
  msg = str(e.value)
  assert msg.startswith(f"config.eval.start_bounds={text!r}: item {item!r}"), msg
  assert expected in msg, msg


def test_without_collapse_metrics_the_optimal_ones_are_refused():
  held_out = points.bound_metrics({"held_out": 8}, 3, (1, 3, 8), False)
  assert points.parse_bounds("held_out:pass@8<=0.9", held_out)
  with pytest.raises(ValueError, match=r"'pass_optimal@1' is not recorded on set 'held_out'.*"
                                       r"kl_k3 \(k in \[1, 3, 8\]\)"):
    points.parse_bounds("held_out:pass_optimal@1<=1", held_out)


# ---------------------------------------------------------------------------
# The config check (training/specs.py: check_points, which setup and --dry_run run).
def smoke_cfg(bounds=""):
  cfg = config_module("collapse").get_config("smoke")
  cfg.eval.start_bounds = bounds
  return cfg


def test_the_config_check_parses_the_bounds_against_the_configs_points():
  specs.check_points(smoke_cfg("B:pass_optimal@8<=0.95,AB:pass_optimal@1<=0.8"))  # smoke: 8 samples
  for bounds, expected in (("B:pass_optimal@64<=0.95", "'pass_optimal@64' is not recorded on set 'B'"),
                           ("pool:coverage<=1", "set 'pool' is not among the points' sets")):
    with pytest.raises(ValueError, match="config.eval.start_bounds=") as e:
      specs.check_points(smoke_cfg(bounds))
    assert expected in str(e.value)
  for field, value in (("eval.points", 0), ("eval.points", 1), ("rl.steps", 0)):
    cfg = smoke_cfg("B:pass_optimal@8<=0.95")
    section, name = field.split(".")
    cfg[section][name] = value
    with pytest.raises(ValueError, match=r"config.eval.start_bounds='B:pass_optimal@8<=0.95' needs the "
                                         r"evaluation point at RL step 0"):
      specs.check_points(cfg)
  cfg = smoke_cfg("")
  cfg.eval.points = 0
  specs.check_points(cfg)  # no bounds: nothing to refuse


@pytest.mark.slow  # 10 s on the contended 2-core CPU (the config check's memory estimate, absl)
def test_dry_run_refuses_bad_bounds_with_exit_status_2(tmp_path, capsys):
  from tests.training.test_bad_input import train_cli
  wd = tmp_path / "dry"
  code, err = train_cli([f"--config={CONFIG}:smoke", "--config.log.tensorboard=False",
                         "--config.eval.start_bounds=B:pass_optimal@8<0.9", "--dry_run",
                         f"--workdir={wd}"], capsys)
  assert code == 2 and err.startswith("error: config.eval.start_bounds='B:pass_optimal@8<0.9'"), err
  assert not wd.exists()


# ---------------------------------------------------------------------------
# The check against a point.
def point_of(a, b):
  """A point with sets A (2 instances) and B (1): {metric: value} each."""
  return {"sets": {"A": {"overall_instance": a, "num_per_task": {"x": 2}},
                   "B": {"overall_instance": b, "num_per_task": {"x": 1}}}}


def test_outside_measures_every_bound_and_lines_the_ones_not_met():
  pt = point_of({"pass_optimal@1": 0.25, "coverage": 0.5}, {"pass_optimal@1": 0.55, "pass_optimal@8": 0.990})
  bounds = points.parse_bounds("B:pass_optimal@8<=0.95,AB:pass_optimal@1<=0.8,A:coverage>=0.6",
                               points.bound_metrics({"A": 8, "B": 8}, 3, (1, 8), True))
  measured, lines = points.outside(bounds, pt)
  # AB: instances weigh, (2 x 0.25 + 1 x 0.55) / 3 = 0.35
  assert measured == {"B:pass_optimal@8": 0.990, "AB:pass_optimal@1": pytest.approx(0.35),
                      "A:coverage": 0.5}
  assert lines == ["B pass_optimal@8 = 0.990 > 0.95 (bound)", "A coverage = 0.500 < 0.6 (bound)"]
  assert points.outside(bounds[1:2], pt)[1] == []  # within: no line
  nan = point_of({"pass_optimal@1": 0.25}, {"pass_optimal@8": float("nan")})
  assert points.outside(bounds[:1], nan)[1] == ["B pass_optimal@8 = nan is not <= 0.95 (bound)"]
  assert points.outside(bounds[2:], nan) == ({"A:coverage": None},
                                             ["A coverage is not in the point (bound A:coverage>=0.6)"])


# ---------------------------------------------------------------------------
# The sweep: a run stopped by its start's bounds stops the sweep, and the report marks it.
RECORD = {"reason": "start_bounds", "step": 3, "rl_step": 0, "bounds": "B:pass_optimal@8<=0.95",
          "measured": {"B:pass_optimal@8": 0.99}, "outside": ["B pass_optimal@8 = 0.990 > 0.95 (bound)"],
          "point": "points/rl0.json"}


class OutOfBoundsTrainer:
  """Stands in for stages.train: the shared SFT stage, then each run's start outside its
  bounds (stopped.json, StartOutOfBounds), as the trainer ends such a run."""

  def __init__(self):
    self.calls = []

  def __call__(self, cfg, wd):
    self.calls.append(os.path.relpath(wd, os.path.dirname(os.path.dirname(wd))))
    os.makedirs(os.path.join(wd, "checkpoints", str(cfg.sft.steps)), exist_ok=True)
    report.write_json({"sft": {"steps": cfg.sft.steps}, "rl": {"steps": cfg.rl.steps},
                       "eval": {"points": cfg.eval.points}}, os.path.join(wd, "config.json"))
    if cfg.stop_at_step == cfg.sft.steps:
      return {"stopped": True, "step": cfg.sft.steps}
    report.write_json({"overall": {"SR_mean": 0.1}}, os.path.join(wd, "eval_before.json"))
    report.write_json({"sets": {"B": {"overall_instance": {"pass_optimal@8": 0.99}}}},
                      os.path.join(wd, "points", "rl0.json"))
    report.write_json(RECORD, os.path.join(wd, report.STOPPED))
    raise run_lib.StartOutOfBounds("start outside config.eval.start_bounds: B pass_optimal@8 = 0.990 > 0.95 "
                                   "(bound)", RECORD)


def test_a_start_out_of_bounds_stops_the_sweep_and_the_report_marks_it(tmp_path):
  out = str(tmp_path)
  runs = sweep.plan(sweep.load_config(CONFIG, smoke=True), ["grpo", "dmpo"], [0, 1], {}, log=lambda m: None,
                    settings=design.SETTINGS)
  msgs, fake = [], OutOfBoundsTrainer()
  st = sweep.run_sweep(runs, out, train_fn=fake, progress=False, log=msgs.append)
  assert st["out_of_bounds"] == ["grpo/seed0"] and st["failed"] == [] and st["done"] == []
  assert st["pending"] == ["grpo/seed1", "dmpo/seed0", "dmpo/seed1"]  # no further runs
  assert fake.calls == ["_sft/seed0", "grpo/seed0"]
  assert any("grpo/seed0: start outside config.eval.start_bounds: B pass_optimal@8 = 0.990 > 0.95" in m
             and "stopping the sweep" in m for m in msgs), msgs
  assert not os.path.exists(os.path.join(out, "grpo", "seed0", "sweep_error.txt"))  # not a failure
  assert not sweep.is_finished(os.path.join(out, "grpo", "seed0"))
  assert sweep.rewind_plan(os.path.join(out, "grpo", "seed0")) is None  # nothing to move aside

  rep = sweep_report.write_report(out, plots=False)
  r = rep["runs"]["grpo/seed0"]
  assert r["status"] == "out_of_bounds" and r["stopped"]["measured"] == {"B:pass_optimal@8": 0.99}
  assert rep["final"] == {}  # never analysed
  md = open(os.path.join(out, "report.md")).read()
  assert ("**Stopped: a start outside config.eval.start_bounds** (grpo/seed0: B pass_optimal@8 = 0.990 "
          "> 0.95 (bound))") in md
  assert "| grpo/seed0 | out_of_bounds: stopped before RL, start outside config.eval.start_bounds: B " \
         "pass_optimal@8 = 0.990 > 0.95 (bound) |" in md

  # a rerun runs the stopped run again (the trainer stops it again) and nothing after it
  fake = OutOfBoundsTrainer()
  st = sweep.run_sweep(runs, out, train_fn=fake, progress=False, log=lambda m: None)
  assert st["out_of_bounds"] == ["grpo/seed0"] and fake.calls == ["grpo/seed0"]


def test_the_sweep_command_exits_1_naming_the_run_and_the_measured_values(tmp_path, capsys, monkeypatch):
  from dmpo_jax.training import stages
  monkeypatch.setattr(stages, "train", OutOfBoundsTrainer())  # the runner's default trainer
  write = sweep_report.write_report  # without the plots (matplotlib: most of this test's time)
  monkeypatch.setattr(sweep_report, "write_report", lambda out, **kw: write(out, plots=False, **kw))
  code = sweep.main([f"--config={CONFIG}", f"--out={tmp_path}", "--smoke", "--seeds=0,1", "--no_progress",
                     "--cache_dir=none", "--set=eval.start_bounds=B:pass_optimal@8<=0.95"])
  err = capsys.readouterr().err
  assert code == 1
  assert ("stopped: config/seed0: start outside config.eval.start_bounds='B:pass_optimal@8<=0.95': "
          "B pass_optimal@8 = 0.990 > 0.95 (bound) (its stopped.json); the sweep ran no further runs") in err, err
  assert not os.path.exists(os.path.join(tmp_path, "config", "seed1"))
  assert json.load(open(os.path.join(tmp_path, "report.json")))["runs"]["config/seed0"]["status"] == "out_of_bounds"


# ---------------------------------------------------------------------------
# End to end on the collapse smoke config (3 SFT steps, points at RL steps 0 and 3).
def e2e_args(bounds, wd):
  return [f"--config={CONFIG}:smoke", "--config.log.tensorboard=False", "--config.log.plots=False",
          "--config.log.progress=False", "--config.checkpoint.export_hf=False",
          f"--config.eval.start_bounds={bounds}", f"--workdir={wd}"]


def resume_with_bounds(src, dst, bounds):
  """A copy of the stopped run's workdir whose config.json holds other bounds (the resume
  contract refuses a changed field: the copy stands for a run made with them), stopped.json
  removed: it resumes at the end of SFT, with its start point's file (points/rl0.json)."""
  import shutil
  shutil.copytree(src, dst)
  os.remove(os.path.join(dst, report.STOPPED))
  cfg = report.read_json(os.path.join(dst, "config.json"))
  cfg["eval"]["start_bounds"] = bounds
  report.write_json(cfg, os.path.join(dst, "config.json"))


@pytest.mark.slow
def test_a_start_outside_its_bounds_stops_before_rl_and_one_within_runs_unchanged(tmp_path, capsys):
  from tests.helpers import metric_rows
  from tests.training.test_bad_input import train_cli
  stopped = tmp_path / "stopped"
  code, err = train_cli(e2e_args("A:pass_optimal@1<=-1,B:pass_optimal@8<=1", stopped), capsys)
  point = report.read_json(os.path.join(stopped, "points", "rl0.json"))
  a = point["sets"]["A"]["overall_instance"]["pass_optimal@1"]
  b = point["sets"]["B"]["overall_instance"]["pass_optimal@8"]
  assert code == 2, err
  assert err.startswith(f"error: start outside config.eval.start_bounds='A:pass_optimal@1<=-1,B:pass_optimal@8<=1': "
                        f"A pass_optimal@1 = {a:.3f} > -1 (bound) (measured at RL step 0"), err
  rec = report.read_json(os.path.join(stopped, report.STOPPED))
  assert rec["reason"] == "start_bounds" and rec["rl_step"] == 0 and rec["step"] == 3
  assert rec["measured"] == {"A:pass_optimal@1": a, "B:pass_optimal@8": b}  # the point file's values
  assert rec["outside"] == [f"A pass_optimal@1 = {a:.3f} > -1 (bound)"]  # B's bound holds
  assert [r["stage"] for r in metric_rows(stopped)] == ["sft"] * 3  # no RL step
  assert sorted(os.listdir(os.path.join(stopped, "points"))) == ["rl0.json"]
  assert not os.path.exists(os.path.join(stopped, "results.json"))
  assert not os.path.exists(os.path.join(stopped, ".lock"))  # the run ended cleanly
  # the metrics a point records are the ones the config check accepts
  for s in ("A", "B", "C"):
    assert set(point["sets"][s]["overall_instance"]) == set(points.metric_names(8, 3, (1, 8), True)), s

  # Within the bounds (read back from the start point's file) RL runs as without any bounds.
  within, none = tmp_path / "within", tmp_path / "none"
  resume_with_bounds(stopped, within, "A:pass_optimal@1<=1,AB:pass_optimal@1>=0")
  resume_with_bounds(stopped, none, "")
  for wd, bounds in ((within, "A:pass_optimal@1<=1,AB:pass_optimal@1>=0"), (none, "")):
    code, err = train_cli(e2e_args(bounds, wd), capsys)
    assert code in (0, None), err
  assert [r["stage"] for r in metric_rows(within)] == ["sft"] * 3 + ["rl"] * 3
  assert metric_rows(within) == metric_rows(none)  # timings left out
  for f in ("points/rl0.json", "points/rl3.json", "eval_after.json"):
    assert report.read_json(os.path.join(within, f)) == report.read_json(os.path.join(none, f)), f
  assert report.read_json(os.path.join(within, "points/rl0.json")) == point
  assert not os.path.exists(os.path.join(within, report.STOPPED))
