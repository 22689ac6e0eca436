"""Files of an experiment's report: figures written atomically, strict JSON."""

from __future__ import annotations

import math
import os
import tempfile


def save_figure(fig, path: str) -> None:
  """A matplotlib Figure to `path` (PNG), written to a temporary file first: a reader never
  sees half a figure."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".png")
  os.close(fd)
  fig.savefig(tmp, dpi=110)
  os.replace(tmp, path)


def json_safe(x):
  """NaN/inf -> None (strict JSON), recursively."""
  if isinstance(x, dict):
    return {k: json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [json_safe(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x
