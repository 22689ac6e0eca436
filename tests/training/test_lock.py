"""The workdir lock (training/lock.py): one process writes a workdir at a time. The module
alone (take, refuse naming the holder, stale takeover, foreign hosts, release on any end),
a second training process refused with exit 2 while the first's metrics stay whole, a stale
lock taken over by a run, every process of a multi-process run refused together, and the
sweep's shared SFT stage waited for, not refused."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from dmpo_jax.experiments import sweep
from dmpo_jax.training import lock as lock_lib
from dmpo_jax.training import run as run_lib
from dmpo_jax.training import stages
from tests.helpers import REPO, smoke, xla_flags

ARGS = ["--config=configs/nphard.py:smoke", "--config.log.tensorboard=False",
        "--config.log.plots=False"]


def dead_pid() -> int:
  """The pid of a process that has exited."""
  p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                     text=True, check=True)
  return int(p.stdout)


def write_lock(wd, **fields):
  os.makedirs(wd, exist_ok=True)
  rec = {"pid": os.getpid(), "host": socket.gethostname(), "since": "2024-01-01T00:00:00+00:00",
         "token": "0123456789abcdef", **fields}
  with open(os.path.join(wd, ".lock"), "w") as f:
    json.dump(rec, f)
  return rec


def env():
  e = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    e.pop(k, None)
  return e


# ---------------------------------------------------------------------------
# The module alone.
def test_take_and_refuse_naming_the_holder(tmp_path):
  wd = str(tmp_path / "w")
  lock = lock_lib.acquire(wd)
  rec = json.load(open(os.path.join(wd, ".lock")))
  assert rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
  assert rec["token"] == lock.token and rec["since"] == lock.holder.since
  with pytest.raises(lock_lib.LockHeld) as e:
    lock_lib.acquire(wd)
  msg = str(e.value)
  assert f"pid {os.getpid()} on host {socket.gethostname()} since {rec['since']}" in msg
  assert os.path.join(wd, ".lock") in msg and e.value.holder == lock.holder
  with pytest.raises(lock_lib.LockHeld):
    lock_lib.check(wd)
  lock.release()
  assert not os.path.exists(os.path.join(wd, ".lock"))
  lock_lib.check(wd)  # free now
  with lock_lib.acquire(wd) as again:
    assert again.token != lock.token
  assert os.listdir(wd) == []  # no temp file left behind


def test_stale_lock_is_taken_over(tmp_path, capsys):
  wd = str(tmp_path / "w")
  pid = dead_pid()
  write_lock(wd, pid=pid)
  lock_lib.check(wd)  # a stale lock does not refuse
  lock = lock_lib.acquire(wd)
  assert f"taking over {os.path.join(wd, '.lock')}: its holder (pid {pid} " in capsys.readouterr().out
  assert json.load(open(os.path.join(wd, ".lock")))["pid"] == os.getpid()
  lock.release()
  assert os.listdir(wd) == []


def test_lock_of_another_host_is_never_taken_over(tmp_path):
  wd = str(tmp_path / "w")
  rec = write_lock(wd, pid=dead_pid(), host="some-other-host")
  with pytest.raises(lock_lib.LockHeld, match="another host.*delete .*\\.lock once that run is gone"):
    lock_lib.acquire(wd)
  assert json.load(open(os.path.join(wd, ".lock"))) == rec  # left as it was


def test_damaged_lock_is_refused_naming_the_file(tmp_path):
  wd = tmp_path / "w"
  wd.mkdir()
  (wd / ".lock").write_text("{not json")
  with pytest.raises(lock_lib.LockHeld, match=f"{wd}/.lock is not a lock record.*delete it") as e:
    lock_lib.acquire(str(wd))
  assert e.value.holder is None


def test_released_on_exception_and_only_its_own(tmp_path):
  wd = str(tmp_path / "w")
  with pytest.raises(ValueError):
    with lock_lib.acquire(wd):
      raise ValueError("boom")
  assert not os.path.exists(os.path.join(wd, ".lock"))
  lock = lock_lib.acquire(wd)
  os.remove(lock.path)
  other = write_lock(wd, token="fedcba9876543210")  # someone else's lock took the name
  lock.release()
  assert json.load(open(lock.path)) == other


# ---------------------------------------------------------------------------
# Training runs.
def test_train_on_a_locked_workdir_is_refused_before_writing(tmp_path):
  wd = tmp_path / "w"
  with lock_lib.acquire(str(wd)) as held:
    with pytest.raises(run_lib.WorkdirLocked, match=f"pid {os.getpid()} .*{wd}/.lock"):
      stages.train(smoke(), str(wd))
    assert os.listdir(wd) == [".lock"] and lock_lib.holds(str(wd), held.token)


def test_train_releases_the_lock_when_it_raises(tmp_path, monkeypatch):
  wd = tmp_path / "w"

  def fail(run, state, stop):
    assert lock_lib.holds(str(wd), run.lock.token)  # held while the stages run
    raise RuntimeError("injected")
  monkeypatch.setattr(stages, "sft_stage", fail)
  with pytest.raises(RuntimeError, match="injected"):
    stages.train(smoke(), str(wd))
  assert not (wd / ".lock").exists()


@pytest.mark.slow
def test_train_releases_the_lock_when_stopped(tmp_path):
  wd = tmp_path / "w"
  assert stages.train(smoke(stop_at_step=1), str(wd)) == {"stopped": True, "step": 1}
  assert not (wd / ".lock").exists() and (wd / "metrics.jsonl").exists()


def test_setup_takes_over_a_stale_lock(tmp_path, capsys):
  wd = tmp_path / "w"
  pid = dead_pid()
  write_lock(wd, pid=pid)
  run, _ = run_lib.setup(smoke(), str(wd))
  assert f"its holder (pid {pid} on host {socket.gethostname()}" in capsys.readouterr().out
  assert json.load(open(wd / ".lock"))["token"] == run.lock.token
  run.close()
  assert not (wd / ".lock").exists()


@pytest.mark.slow
def test_second_process_is_refused_and_metrics_stay_whole(tmp_path):
  wd = tmp_path / "w"
  cmd = [sys.executable, "-m", "dmpo_jax.train", f"--workdir={wd}"] + ARGS
  first = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  t0 = time.time()
  while not (wd / ".lock").exists() and first.poll() is None and time.time() - t0 < 120:
    time.sleep(0.1)
  assert (wd / ".lock").exists(), "the first run never took the lock"
  second = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
  out, err = first.communicate(timeout=300)
  assert first.returncode == 0, err[-3000:]
  assert second.returncode == 2, second.stderr[-3000:]
  line = [l for l in second.stderr.splitlines() if l.startswith("error:")]
  assert len(line) == 1 and f"in use by another run: pid {first.pid} on host" in line[0]
  assert f"{wd}/.lock" in line[0]
  steps = [json.loads(l)["step"] for l in open(wd / "metrics.jsonl")]
  assert steps == sorted(set(steps)) and len(steps) == 6  # each step once
  assert not (wd / ".lock").exists()


@pytest.mark.slow
def test_every_process_of_a_multi_process_run_is_refused(tmp_path):
  wd = tmp_path / "w"
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  e = dict(env(), XLA_FLAGS=xla_flags(2))
  with lock_lib.acquire(str(wd)):
    procs = [subprocess.Popen([sys.executable, "-m", "dmpo_jax.train", f"--workdir={wd}",
                               f"--coordinator_address=localhost:{port}", "--num_processes=2",
                               f"--process_id={i}"] + ARGS, cwd=REPO, env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]  # no process waits on the other
  assert [p.returncode for p in procs] == [2, 2], errs
  assert f"in use by another run: pid {os.getpid()}" in errs[0]
  assert "process 0 could not use its lock" in errs[1]
  assert os.listdir(wd) == []


# ---------------------------------------------------------------------------
# The sweep's shared SFT stage.
def sweep_run():
  return sweep.Run("grpo", 0, smoke(), True)


def fake_train(calls):
  def train_fn(cfg, workdir):
    calls.append(cfg.stop_at_step)
    os.makedirs(os.path.join(workdir, "checkpoints", str(cfg.sft.steps)))
    return {"stopped": True, "step": cfg.stop_at_step}
  return train_fn


@pytest.mark.parametrize("holder_finishes", [True, False])
def test_prepare_sft_waits_for_a_held_lock(tmp_path, holder_finishes):
  run, calls, logs, out = sweep_run(), [], [], {}
  d = tmp_path / "_sft" / "seed0"
  held = lock_lib.acquire(str(d))  # another sweep process training the seed's SFT stage
  waiter = threading.Thread(target=lambda: out.setdefault("d", sweep.prepare_sft(
      fake_train(calls), run, str(tmp_path), logs.append, poll_s=0.02)))
  waiter.start()
  time.sleep(0.5)
  assert waiter.is_alive() and calls == []  # waiting, not refused, not training
  assert len(logs) == 1 and "waiting" in logs[0] and f"pid {os.getpid()}" in logs[0]
  if holder_finishes:
    os.makedirs(d / "checkpoints" / str(run.cfg.sft.steps))
  held.release()
  waiter.join(timeout=10)
  assert not waiter.is_alive() and out["d"] == str(d)
  assert calls == ([] if holder_finishes else [run.cfg.sft.steps])  # what is left undone is trained


def test_prepare_sft_does_not_retrain_a_stage_finished_during_its_lock_check(tmp_path, monkeypatch):
  """The holder writes its checkpoint and releases between our first look and the lock check:
  the checkpoint is used, not trained again (this race once failed CI)."""
  run, calls = sweep_run(), []
  d = tmp_path / "_sft" / "seed0"

  def check_while_the_holder_finishes(path):
    os.makedirs(d / "checkpoints" / str(run.cfg.sft.steps))  # ... and then the lock is free
  monkeypatch.setattr(lock_lib, "check", check_while_the_holder_finishes)
  assert sweep.prepare_sft(fake_train(calls), run, str(tmp_path), lambda m: None) == str(d)
  assert calls == []
