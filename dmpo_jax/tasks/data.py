"""NP-Bench data files: read them, and write our generated sets in the same format.

A record is NP-Bench's: ``{"prompt", "question", "task_type", "ground_truth"}``;
ours add ``level``, ``seed``, ``optimum`` and ``optimum_status``. Files are a
JSON list (NP-Bench's benchmark files) or JSON Lines (one record per line).

CLI (writes JSONL, or a TFDS array_record dataset with --format=tfds):

    python -m dmpo_jax.tasks.data --out=data/tiny --level=tiny --num=200
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Iterable, Iterator

from dmpo_jax import tasks as _tasks

REQUIRED = ("question", "task_type")


class DataError(ValueError):
  """A data file or record is malformed; the message names the file and record."""


def read_npbench(path: str) -> list[dict]:
  """Records of an NP-Bench JSON (list) or JSONL file, validated."""
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such file")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  stripped = text.lstrip()
  try:
    if stripped.startswith("["):
      records = json.loads(text)
    else:
      records = [json.loads(line) for line in text.splitlines() if line.strip()]
  except json.JSONDecodeError as e:
    raise DataError(f"{path}: not JSON or JSON Lines ({e})") from e
  if isinstance(records, dict):
    records = [records]
  for i, r in enumerate(records):
    if not isinstance(r, dict):
      raise DataError(f"{path}: record {i} is not an object")
    missing = [k for k in REQUIRED if k not in r]
    if missing:
      raise DataError(f"{path}: record {i} lacks {missing}")
    if r["task_type"] not in _tasks.names():
      raise DataError(f"{path}: record {i} has unknown task_type {r['task_type']!r}; "
                      f"choose from {_tasks.names()}")
    if not isinstance(r["question"], dict):
      raise DataError(f"{path}: record {i}: question must be an object")
  return records


def write_jsonl(records: Iterable[dict], path: str) -> int:
  """Write records atomically (a temp file renamed into place): no half-written files."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
  n = 0
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      for r in records:
        f.write(json.dumps(r) + "\n")
        n += 1
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return n


def make_record(task_key: str, seed: int, level: str, *, style: str = "npbench",
                exact: bool = False, exact_time_limit: float = 10.0) -> dict:
  task = _tasks.get(task_key)
  q = task.generate(seed, level)
  rec = {"prompt": task.prompt(q, style), "question": q, "task_type": task_key,
         "ground_truth": task.reference_value(q), "level": level, "seed": seed}
  if exact:
    ex = task.exact(q, time_limit=exact_time_limit)
    rec["optimum"], rec["optimum_status"] = ex.value, ex.status
  return rec


def generate(task_keys, level: str, num: int, *, seed0: int = 0, style: str = "npbench",
             exact: bool = False, progress: bool = False) -> Iterator[dict]:
  """num records per task; seeds seed0..seed0+num-1 (disjoint ranges make disjoint splits)."""
  keys = _tasks.names() if task_keys in (None, "all") else list(task_keys)
  jobs = [(k, seed0 + i) for k in keys for i in range(num)]
  if progress:
    from tqdm import tqdm
    jobs = tqdm(jobs, desc=f"generating {level}", unit="inst")
  for k, s in jobs:
    yield make_record(k, s, level, style=style, exact=exact)


def main(argv=None):
  import argparse
  ap = argparse.ArgumentParser(description="Generate NP-Bench-format instances.")
  ap.add_argument("--out", required=True, help="output folder")
  ap.add_argument("--tasks", default="all", help="comma-separated task keys, or 'all'")
  ap.add_argument("--level", default="easy", choices=_tasks.LEVELS)
  ap.add_argument("--num", type=int, default=100, help="instances per task")
  ap.add_argument("--seed", type=int, default=0, help="first seed")
  ap.add_argument("--style", default="npbench", choices=_tasks.PROMPT_STYLES)
  ap.add_argument("--exact", action="store_true", help="also solve exactly (CP-SAT/DP)")
  ap.add_argument("--format", default="jsonl", choices=("jsonl", "tfds"))
  args = ap.parse_args(argv)
  keys = None if args.tasks == "all" else args.tasks.split(",")
  for k in keys or []:
    if k not in _tasks.names():
      ap.error(f"unknown task {k!r}; choose from {_tasks.names()}")
  if args.format == "jsonl":
    path = os.path.join(args.out, f"npbench_{args.level}.jsonl")
    n = write_jsonl(generate(keys, args.level, args.num, seed0=args.seed, style=args.style,
                             exact=args.exact, progress=True), path)
    print(f"wrote {n} records to {path}")
  else:
    from dmpo_jax.tasks import tfds_builder
    for k in keys or _tasks.names():
      b = tfds_builder.NpBench(config=tfds_builder.config_name(k, args.level), data_dir=args.out,
                               num_train=args.num, num_test=max(1, args.num // 10))
      b.download_and_prepare()
      print(f"built {b.info.full_name} in {args.out}")


if __name__ == "__main__":
  main()
