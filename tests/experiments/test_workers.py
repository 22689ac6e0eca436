"""A sweep in several processes (--processes, dmpo_jax/experiments/workers.py): the shares,
the refusals, and end to end with a stand-in trainer (tests/experiments/fake_sweep.py): two
workers give the same runs as one process, stop on a signal to the parent with every run saved,
and a rerun ends where an uninterrupted sweep ends."""

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dmpo_jax.experiments import sweep, workers
from dmpo_jax.training import report
from studies.collapse_frontier import design
from tests.experiments import fake_sweep
from tests.helpers import REPO

CONFIG = os.path.join(REPO, "configs", "collapse.py")


def runs_of(labels, seeds):
  base = sweep.load_config(CONFIG, smoke=True)
  runs = sweep.plan(base, labels, seeds, {}, log=lambda m: None, settings=design.SETTINGS)
  runs.sort(key=lambda r: r.seed)
  return runs


def test_shares_give_whole_seeds_and_every_run_once():
  runs = runs_of(["grpo", "dmpo", "rkl-0.1"], [4, 0, 2, 1, 3])
  parts = workers.shares(runs, 2)
  assert [sorted({r.seed for r in p}) for p in parts] == [[0, 2, 4], [1, 3]]  # plan order 0..4, in turn
  assert sorted(r.name for p in parts for r in p) == sorted(r.name for r in runs)
  for p in parts:  # a worker keeps the plan's order
    assert p == [r for r in runs if r in p]
  # fewer seeds than workers: the runs in turn
  runs = runs_of(["grpo", "dmpo", "rkl-0.1"], [7])
  parts = workers.shares(runs, 2)
  assert [[r.label for r in p] for p in parts] == [["grpo", "rkl-0.1"], ["dmpo"]]
  assert workers.shares(runs, 1) == [runs]
  with pytest.raises(ValueError, match="at least 1"):
    workers.shares(runs, 0)


def test_max_runs_parts_add_up_and_worker_flags_are_checked():
  for total in range(0, 9):
    for n in (1, 2, 3):
      parts = [workers.max_runs_share(total, k, n) for k in range(n)]
      assert sum(parts) == total and max(parts) - min(parts) <= 1
  assert workers.max_runs_share(None, 0, 2) is None
  assert workers.parse_worker("1/2") == (1, 2)
  for bad in ("2/2", "x/2", "1", "-1/2"):
    with pytest.raises(ValueError, match="--worker"):
      workers.parse_worker(bad)
  assert workers.module_of("python -m studies.collapse_frontier.sweep") == "studies.collapse_frontier.sweep"
  with pytest.raises(ValueError, match="python -m"):
    workers.module_of("my_sweep.py")


def test_workers_get_single_threaded_xla_only_with_a_core_each(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  env = workers.worker_env(n_cores=2, n=2)
  assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false"
  assert workers.worker_env(n_cores=2, n=3)["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


def test_bad_processes_are_refused_by_name(tmp_path, capsys):
  args = [f"--config={CONFIG}", "--smoke", f"--out={tmp_path}", "--presets=grpo", "--seeds=0"]
  assert sweep.main(args + ["--processes=0"], design=design.DESIGN) == 2
  assert "--processes=0" in capsys.readouterr().err
  assert sweep.main(args + ["--processes=2"], design=design.DESIGN, prog="my_sweep.py") == 2
  assert "'python -m <module>'" in capsys.readouterr().err
  assert not os.listdir(tmp_path)  # nothing was started


def snapshot(out, label, seed):
  wd = os.path.join(out, label, f"seed{seed}")
  rows = [{k: v for k, v in json.loads(l).items() if k != "time"} for l in open(os.path.join(wd, "metrics.jsonl"))]
  pts = {f: report.read_json(os.path.join(wd, "points", f)) for f in sorted(os.listdir(os.path.join(wd, "points")))}
  return rows, pts, report.read_json(os.path.join(wd, "results.json"))


def calls(out):
  return [json.loads(l) for l in open(os.path.join(out, "calls.jsonl"))]


@pytest.mark.slow
def test_two_workers_equal_one_process_stop_on_a_signal_and_resume(tmp_path):
  labels, seeds = ["grpo", "dmpo"], [0, 1, 2]
  args = [f"--config={CONFIG}", "--smoke", "--presets=" + ",".join(labels), "--seeds=0-2", "--seed_major",
          "--no_progress", "--set=rl.steps=6", "--set=eval.points=4"]
  one = str(tmp_path / "one")
  assert fake_sweep.main(args + [f"--out={one}"]) == 0  # one process, uninterrupted

  two = str(tmp_path / "two")
  cmd = [sys.executable, "-m", "tests.experiments.fake_sweep", *args, f"--out={two}", "--processes=2"]
  env = dict(os.environ, PYTHONPATH=REPO, FAKE_STEP_S="0.3")
  parent = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 120
  while time.time() < deadline:  # both workers inside an RL run
    seen = calls(two) if os.path.exists(os.path.join(two, "calls.jsonl")) else []
    if len({c["pid"] for c in seen if not c["run"].startswith("_sft")}) == 2:
      break
    time.sleep(0.2)
  else:
    parent.kill()
    pytest.fail("the two workers never both started an RL run: " + parent.communicate()[0][-3000:])
  time.sleep(0.5)
  parent.send_signal(signal.SIGTERM)
  text = parent.communicate(timeout=120)[0]
  assert parent.returncode == 0, text[-3000:]
  assert "stopping the workers" in text
  statuses = [workers.read_status(two, k) for k in (0, 1)]
  assert all(st["stopped"] for st in statuses), statuses  # each worker's run saved and stopped
  unfinished = [(l, s) for l in labels for s in seeds
                if not sweep.is_finished(os.path.join(two, l, f"seed{s}"))]
  assert unfinished
  stopped = [n for st in statuses for n in st["stopped"]]
  for name in stopped:  # saved where the signal came: a checkpoint past the SFT stage
    assert max(sweep.checkpoint_steps(os.path.join(two, name))) > 3
  manifest = report.read_json(os.path.join(two, "sweep.json"))
  assert manifest["sessions"][-1]["processes"] == 2

  # the rerun (no pauses) ends where the uninterrupted sweep ended, run by run
  env.pop("FAKE_STEP_S")
  r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  for l in labels:
    for s in seeds:
      assert snapshot(two, l, s) == snapshot(one, l, s), (l, s)
  rep = report.read_json(os.path.join(two, "report.json"))
  assert len(rep["runs"]) == 6 and all(v["status"] == "finished" for v in rep["runs"].values())
  assert len(report.read_json(os.path.join(two, "sweep.json"))["sessions"]) == 2

  # whole seeds per worker: a seed's runs and its SFT stage are one process's, in each session,
  # and each seed's SFT stage was trained once; the stopped runs resumed from their checkpoints
  by_session = collections.defaultdict(set)
  seen = calls(two)
  for c in seen:
    seed = int(c["run"].split("seed")[-1])
    by_session[c["pid"]].add(seed)
  pids = list(by_session)
  assert len(pids) == 4  # two workers x two sessions
  for a in pids:
    for b in pids:
      if a != b and by_session[a] & by_session[b]:
        # the same seed in two processes only across sessions, never in one session's two workers
        assert {a, b} not in ({pids[0], pids[1]}, {pids[2], pids[3]})
  assert collections.Counter(c["run"] for c in seen if c["run"].startswith("_sft")) == {
      f"_sft/seed{s}": 1 for s in seeds}
  for name in stopped:
    resumed = [c for c in seen if c["run"] == name][-1]
    assert resumed["start"] > 3
