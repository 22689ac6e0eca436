"""File writing that never leaves a half-written file (the package's one bottom-level helper:
it imports nothing from dmpo_jax, and every layer may use it)."""

from __future__ import annotations

import os
import tempfile


def atomic_write(path: str, write) -> None:
  """Call write(f) on a temp file beside `path`, then rename it into place: a reader sees the
  old file or the new one, never a half-written one."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
