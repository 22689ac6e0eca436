"""Outputs of a run: metrics.jsonl, TensorBoard events, PNG plots, atomic JSON files."""

from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np

from dmpo_jax.files import atomic_write


def write_json(obj, path: str) -> None:
  """Write JSON atomically (temp file + rename): never a half-written result."""
  atomic_write(path, lambda f: json.dump(obj, f, indent=1, default=float))


def read_json(path: str):
  with open(path) as f:
    return json.load(f)


def read_result(path: str, keys=()) -> tuple[dict | None, str | None]:
  """(the JSON object at path, None), or (None, why) when the file is damaged: unreadable, not
  JSON, not an object, or without one of `keys` (a finished result is then recomputed)."""
  try:
    obj = read_json(path)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    return None, f"{type(e).__name__}: {e}"
  if not isinstance(obj, dict):
    return None, f"holds a {type(obj).__name__}, not an object"
  missing = [k for k in keys if k not in obj]
  return (None, f"lacks {missing}") if missing else (obj, None)


# A run that ended for good before RL because its start is outside config.eval.start_bounds
# (training/stages.py: check_start): the record of why, beside the run's other outputs. Its
# own file, not results.json, whose presence means a finished run to the sweep and the studies.
STOPPED = "stopped.json"


def read_stopped(workdir: str) -> dict | None:
  """The workdir's stopped.json (`STOPPED`), None when there is none (a damaged one is a
  record too: {"reason": "damaged", "why": ...}, so that the run is never taken as unstopped)."""
  path = os.path.join(workdir, STOPPED)
  if not os.path.exists(path):
    return None
  rec, why = read_result(path, ("reason",))
  return rec if rec is not None else {"reason": "damaged", "why": why, "outside": [f"{path}: {why}"]}


def plot_or_warn(plot, *args) -> None:
  """A plot whose failure is a warning: plots come after the results, which they never lose."""
  try:
    plot(*args)
  except Exception as e:  # matplotlib's errors are many; a missing figure is not worth a run
    print(f"warning: could not draw {args[-1]} ({type(e).__name__}: {e})", flush=True)


def _clean(v):
  v = float(v)
  return v if math.isfinite(v) else None


def metrics_cut(path: str, resume_step: int | None) -> tuple[int | None, str | None]:
  """Where metrics.jsonl is to be cut, and why: at a partial or unreadable last line (a write
  that was interrupted), or at the first line logged after `resume_step` (steps are logged in
  order; those lines are redone). (None, None): keep the file whole."""
  with open(path, "rb") as f:
    data = f.read()
  offset = 0
  lines = data.split(b"\n")
  for i, line in enumerate(lines):
    last = i == len(lines) - 1
    if last and not line:  # the file ends with a newline
      break
    try:
      row = json.loads(line) if line.strip() else None
    except (ValueError, UnicodeDecodeError):
      row = "damaged"
    if last or (row == "damaged" and all(not l.strip() for l in lines[i + 1:])):
      return offset, f"partial last line ({len(line)} bytes) dropped"
    if isinstance(row, dict) and resume_step is not None and row.get("step", -1) > resume_step:
      partial = not data.endswith(b"\n")
      return offset, (f"partial last line ({len(lines[-1])} bytes) dropped" if partial else None)
    offset += len(line) + 1
  return None, None


class MetricsWriter:
  """Appends one JSON line per logged step to metrics.jsonl; mirrors scalars to TensorBoard.

  The file is only ever appended to, one line per os.write on an O_APPEND descriptor, so a
  kill leaves whole lines and at most a partial last one. On resume the lines logged after the
  checkpoint (and a partial last line, with a warning) are cut off by truncation; the lines
  before are never rewritten."""

  def __init__(self, workdir: str, tensorboard: bool = True, resume_step: int | None = None):
    self.path = os.path.join(workdir, "metrics.jsonl")
    os.makedirs(workdir, exist_ok=True)
    if os.path.exists(self.path):
      cut, why = metrics_cut(self.path, resume_step)
      if why:
        print(f"warning: {self.path}: {why}", flush=True)
      if cut is not None:
        os.truncate(self.path, cut)
    self.tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
        self.tb = SummaryWriter(os.path.join(workdir, "tb"))
      except ImportError:
        self.tb = None

  def write(self, step: int, stage: str, metrics: dict) -> None:
    row = {"step": int(step), "stage": stage}
    row.update({k: _clean(v) for k, v in metrics.items()})
    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
      os.close(fd)
    if self.tb is not None:
      for k, v in row.items():
        if k not in ("step", "stage") and v is not None:
          self.tb.add_scalar(f"{stage}/{k}", v, step)

  def close(self):
    if self.tb is not None:
      self.tb.close()


def read_metrics(path: str) -> list[dict]:
  """The rows of metrics.jsonl; a damaged line is skipped with a warning naming it."""
  if not os.path.exists(path):
    return []
  rows = []
  with open(path, "rb") as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except (ValueError, UnicodeDecodeError) as e:
        print(f"warning: {path}:{i} is damaged ({e}); skipped", flush=True)
  return rows


TRAIN_PLOTS = (("reward_mean", "reward"), ("qr_mean", "quality ratio (mean over samples)"),
               ("distinct", "distinct feasible solutions / group"), ("entropy", "token entropy"),
               ("length", "response length (tokens)"))


def plot_training(rows: list[dict], path: str) -> None:
  from matplotlib.figure import Figure  # no pyplot: never switches the caller's backend

  rl = [r for r in rows if r.get("stage") == "rl"]
  fig = Figure(figsize=(4 * len(TRAIN_PLOTS), 3.2))
  axes = fig.subplots(1, len(TRAIN_PLOTS))
  for ax, (key, title) in zip(axes, TRAIN_PLOTS):
    pts = [(r["step"], r[key]) for r in rl if r.get(key) is not None]
    if pts:
      x, y = zip(*pts)
      ax.plot(x, y, lw=1, alpha=0.5)
      if len(y) >= 5:
        w = max(2, len(y) // 10)
        ax.plot(x[w - 1:], np.convolve(y, np.ones(w) / w, mode="valid"), lw=2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
  fig.tight_layout()
  _save(fig, path)


def best_of_k(result: dict) -> int:
  """The k of an evaluation's SR@k / QR@k (its "k", else read from its metric names)."""
  if "k" in result:
    return int(result["k"])
  ks = [int(m[3:]) for m in result.get("overall", {}) if m.startswith("QR@") and m[3:].isdigit()]
  if not ks:
    raise ValueError("the evaluation has no QR@k metric")
  return ks[0]


def plot_before_after(before: dict | None, after: dict, path: str, metrics=None,
                      label: str = "policy") -> None:
  """Per-task bars (and overall) of `metrics` (default QR@k at the evaluation's k, QR_mean,
  distinct); before=None draws one evaluation."""
  from matplotlib.figure import Figure

  metrics = metrics or (f"QR@{best_of_k(after)}", "QR_mean", "distinct")

  names = list(after["per_task"])
  fig = Figure(figsize=(5 * len(metrics), 3.6))
  axes = fig.subplots(1, len(metrics))
  x = np.arange(len(names) + 1)
  for ax, m in zip(axes, metrics):
    a = [after["per_task"][n][m] for n in names] + [after["overall"][m]]
    if before is None:
      ax.bar(x, a, 0.6, label=label)
    else:
      b = [before["per_task"][n][m] for n in names] + [before["overall"][m]]
      ax.bar(x - 0.2, b, 0.4, label="before RL")
      ax.bar(x + 0.2, a, 0.4, label="after RL")
    ax.set_xticks(x, [n[:10] for n in names] + ["overall"], rotation=60, fontsize=7)
    ax.set_title(m, fontsize=9)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  _save(fig, path)


def _save(fig, path):
  d = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=d, suffix=".png")
  os.close(fd)
  fig.savefig(tmp, dpi=110)
  os.replace(tmp, path)


class NullWriter:
  """The MetricsWriter of processes other than 0: logs nothing."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "metrics.jsonl")

  def write(self, *args, **kwargs):
    pass

  def close(self):
    pass


def format_modalities(results: dict, metrics=None) -> str:
  """Overall scores per modality, one line each (the blank-image control beside the image)."""
  mods = results.get("modalities")
  if not mods:
    return ""
  if metrics is None:  # SR@k / QR@k at the evaluation's k (each modality's result records it)
    k = best_of_k(results if "k" in results or "overall" in results else next(iter(mods.values())))
    metrics = (f"SR@{k}", f"QR@{k}", "SR_mean", "QR_mean")
  lines = [f"{'modality':10s}" + "".join(f"{m:>10s}" for m in metrics)]
  for name, r in mods.items():
    lines.append(f"{name:10s}" + "".join(f"{r['overall'].get(m, float('nan')):10.3f}" for m in metrics))
  return "\n".join(lines)
