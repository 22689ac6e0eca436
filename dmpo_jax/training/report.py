"""Outputs of a run: metrics.jsonl, TensorBoard events, PNG plots, atomic JSON files."""

from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np


def write_json(obj, path: str) -> None:
  """Write JSON atomically (temp file + rename): never a half-written result."""
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(obj, f, indent=1, default=float)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def read_json(path: str):
  with open(path) as f:
    return json.load(f)


def _clean(v):
  v = float(v)
  return v if math.isfinite(v) else None


class MetricsWriter:
  """Appends one JSON line per logged step to metrics.jsonl; mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str, tensorboard: bool = True, resume_step: int | None = None):
    self.path = os.path.join(workdir, "metrics.jsonl")
    os.makedirs(workdir, exist_ok=True)
    if resume_step is not None and os.path.exists(self.path):
      # drop lines logged after the checkpoint we resume from (they will be redone)
      with open(self.path) as f:
        keep = [l for l in f if l.strip() and json.loads(l).get("step", -1) <= resume_step]
      with open(self.path, "w") as f:
        f.writelines(keep)
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
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    if self.tb is not None:
      for k, v in row.items():
        if k not in ("step", "stage") and v is not None:
          self.tb.add_scalar(f"{stage}/{k}", v, step)

  def close(self):
    if self.tb is not None:
      self.tb.close()


def read_metrics(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


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


def plot_before_after(before: dict | None, after: dict, path: str,
                      metrics=("QR@3", "QR_mean", "distinct"), label: str = "policy") -> None:
  """Per-task bars (and overall) of `metrics`; before=None draws one evaluation."""
  from matplotlib.figure import Figure

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
