"""A sweep in several processes (`--processes=N`): N worker processes of the same command, each
pinned to its own core with single-threaded XLA, share one sweep folder.

    python -m studies.collapse_frontier.sweep --config=configs/collapse.py --out=runs/sw \
        --presets=grpo,dmpo --seeds=0-3 --seed_major --processes=2

Each worker runs its share of the planned runs (`shares`: whole seeds, so that a seed's SFT
stage is trained by one worker; with fewer seeds than workers, runs in turn, and a worker
that needs a seed's SFT stage waits for the one training it: `sweep.prepare_sft`'s lock). A
run folder belongs to one worker; two workers never train in one workdir (each trainer holds
its workdir's lock as well). Workers write their logs to `<out>/_workers/worker<k>.log` and
their status to `status<k>.json`; the parent shows one progress bar over every run, then
writes sweep.json (one session, with "processes") and the report once, as one process would.
A signal to the parent (Ctrl-C, TERM) reaches every worker, whose trainer saves and stops; a
worker whose run starts outside config.eval.start_bounds stops the others. Rerun the same
command to resume: finished runs are skipped, interrupted ones resume from their checkpoints.

What a worker computes: tests/experiments/test_workers.py checks the orchestration (with a
stand-in trainer, every metrics row, point and result equals a one-process sweep's, after a
signal and a resume). With the real trainer (configs/collapse.py smoke, 2 seeds, 2026-12-06):
a worker's run is bit-identical to one process's pinned to one core (`taskset -c 1`, with the
same single-threaded flag; the flag alone, unpinned, changed nothing); against an unpinned process (2 cores) every evaluation point and evaluation was
bit-identical, and some update diagnostics (grad_norm, entropy, dm_*) differed by float
rounding, at most 6e-6 relative (the thread pool's reduction order; pg_approx_kl_old, about
1e-8, differed in its leading digits)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

DIR = "_workers"
SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false"


def shares(runs: list, n: int) -> list[list]:
  """The runs of each of n workers, in the planned order: whole seeds in turn (seed i of the
  plan's order to worker i mod n) when there are at least n seeds, else the runs in turn."""
  if n < 1:
    raise ValueError(f"--processes={n}: need at least 1")
  seeds = list(dict.fromkeys(r.seed for r in runs))
  if len(seeds) >= n:
    owner = {s: i % n for i, s in enumerate(seeds)}
    return [[r for r in runs if owner[r.seed] == k] for k in range(n)]
  return [runs[k::n] for k in range(n)]


def parse_worker(text: str) -> tuple[int, int]:
  """'k/n' -> (k, n), 0 <= k < n."""
  k, slash, n = str(text).partition("/")
  try:
    k, n = int(k), int(n)
  except ValueError:
    raise ValueError(f"--worker={text!r}: expected k/n") from None
  if not slash or not 0 <= k < n:
    raise ValueError(f"--worker={text!r}: expected k/n with 0 <= k < n")
  return k, n


def max_runs_share(max_runs: int | None, k: int, n: int) -> int | None:
  """Worker k's part of --max_runs (the parts add up to it)."""
  return None if max_runs is None else max_runs // n + (k < max_runs % n)


def module_of(prog: str) -> str:
  """The module a `python -m <module>` prog names (the workers run the same entry point)."""
  parts = prog.split()
  if len(parts) != 3 or parts[:2] != ["python", "-m"]:
    raise ValueError(f"--processes needs an entry point run as 'python -m <module>', not {prog!r}")
  return parts[2]


def worker_env(n_cores: int, n: int) -> dict:
  """The workers' environment: XLA single-threaded (added to any XLA_FLAGS given) when the
  workers have a core each."""
  env = dict(os.environ)
  flags = env.get("XLA_FLAGS", "")
  if n <= n_cores and "xla_cpu_multi_thread_eigen" not in flags:
    env["XLA_FLAGS"] = f"{flags} {SINGLE_THREAD}".strip()
  return env


def status_path(out: str, k: int) -> str:
  return os.path.join(out, DIR, f"status{k}.json")


def write_status(out: str, k: int, status: dict) -> None:
  os.makedirs(os.path.join(out, DIR), exist_ok=True)
  tmp = status_path(out, k) + ".tmp"
  with open(tmp, "w") as f:
    json.dump(status, f)
  os.replace(tmp, status_path(out, k))


def read_status(out: str, k: int) -> dict | None:
  try:
    with open(status_path(out, k)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


KEYS = ("done", "skipped", "failed", "stopped", "out_of_bounds", "pending")


def run_parallel(argv: list[str], prog: str, n: int, out: str, runs: list, is_finished,
                 progress: bool = True, poll_s: float = 2.0, log=print) -> dict:
  """Start n workers of `python -m <prog's module> <argv> --worker=k/n`, show progress over
  `runs` (is_finished(run) per run), forward signals, and return the merged status ({"done",
  ...} lists, as sweep.run_sweep's; a worker that ended without a status is named under
  "failed" as "worker<k>")."""
  from tqdm import tqdm
  module = module_of(prog)
  cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
  pin = n <= len(cores)
  os.makedirs(os.path.join(out, DIR), exist_ok=True)
  for k in range(n):
    if os.path.exists(status_path(out, k)):
      os.remove(status_path(out, k))
  procs = []
  for k in range(n):
    logf = open(os.path.join(out, DIR, f"worker{k}.log"), "a")
    core = cores[k] if pin else None
    pre = (lambda c=core: os.sched_setaffinity(0, {c})) if pin else None
    procs.append(subprocess.Popen([sys.executable, "-m", module, *argv, f"--worker={k}/{n}"],
                                  stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=worker_env(len(cores), n), preexec_fn=pre,
                                  start_new_session=True))  # signals reach them through `forward` only
    logf.close()
    log(f"worker {k}: pid {procs[-1].pid}" + (f", core {core}" if pin else "") +
        f", log {os.path.join(out, DIR, f'worker{k}.log')}")

  stopping = []
  def forward(signum, frame):  # once per worker: a second signal would stop its trainer unsaved
    if stopping:
      return
    log(f"signal {signum}: stopping the workers (each saves its run); rerun the same command to resume")
    stopping.append(signum)
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGINT)
  old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  bar = tqdm(total=len(runs), desc="sweep", unit="run", dynamic_ncols=True, disable=not progress)
  unfinished = list(runs) if progress else []  # a finished run stays finished: checked until it is
  try:
    while True:
      alive = [p for p in procs if p.poll() is None]
      if unfinished:
        unfinished = [r for r in unfinished if not is_finished(r)]
        bar.n = len(runs) - len(unfinished)
        bar.refresh()
      for k, p in enumerate(procs):  # a start out of bounds stops the sweep: every worker
        st = read_status(out, k) if p.poll() is not None else None
        if st and st.get("out_of_bounds") and not stopping:
          log(f"worker {k}: {st['out_of_bounds'][0]} started outside config.eval.start_bounds; "
              "stopping the other workers")
          forward(signal.SIGINT, None)
      if not alive:
        break
      time.sleep(poll_s)
  finally:
    bar.close()
    for s, h in old.items():
      signal.signal(s, h)
  merged = {key: [] for key in KEYS}
  for k, p in enumerate(procs):
    st = read_status(out, k)
    if st is None:
      merged["failed"].append(f"worker{k}")
      log(f"worker {k} exited with status {p.returncode} and no status file; see its log")
      continue
    for key in KEYS:
      merged[key].extend(st.get(key, []))
  return merged
