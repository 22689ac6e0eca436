"""NP-Bench data files: read them, and write our generated sets in the same format.

A record is NP-Bench's: ``{"prompt", "question", "task_type", "ground_truth"}``;
ours add ``level``, ``seed``, ``optimum`` and ``optimum_status``. Three file
shapes are read:

* NP-Bench's released benchmark file: ONE JSON object mapping keys
  ``<task>_<level>_question<N>`` to records. The level is read from the key
  the way NP-Bench's evaluation reads it (the first of easy, medium, hard,
  bench that the key contains) and stored in the record as ``level``; the key
  is kept as ``key``. ``write_npbench`` writes this shape.
* a JSON list of records;
* JSON Lines, one record per line (``write_jsonl``).

CLI (writes JSONL; NP_Bench.json's keyed shape with --format=npbench; a TFDS
array_record dataset with --format=tfds):

    python -m dmpo_jax.tasks.data --out=data/tiny --level=tiny --num=200
"""

from __future__ import annotations

import json
import math
import os
from typing import Iterable, Iterator, NamedTuple

from dmpo_jax import tasks as tasks_lib
from dmpo_jax.files import atomic_write

REQUIRED = ("question", "task_type")
# NP-Bench's evaluation tests the key for these substrings in this order.
KEY_LEVELS = ("easy", "medium", "hard", "bench")


class DataError(ValueError):
  """A data file or record is malformed; the message names the file and record."""


def level_of_key(key: str) -> str | None:
  """The level NP-Bench's evaluation reads from a record key, or None (it skips such keys)."""
  for level in KEY_LEVELS:
    if level in key:
      return level
  return None


def _from_keyed(path: str, obj: dict) -> list[dict]:
  """Records of a dict keyed ``<task>_<level>_question<N>`` (NP_Bench.json's shape)."""
  records = []
  for key, r in obj.items():
    if not isinstance(r, dict):
      raise DataError(f"{path}: record {key!r} is not an object")
    level = level_of_key(key)
    if level is None:
      raise DataError(f"{path}: record key {key!r} names no level (one of {KEY_LEVELS}); "
                      "NP-Bench's evaluation would skip it")
    if r.get("level") not in (None, level):
      raise DataError(f"{path}: record {key!r} has level {r['level']!r} but its key says {level!r}")
    records.append({**r, "key": key, "level": level})
  return records


def _int(digits: str):
  """JSON integers; one too long for Python's int() stays text, for the record's check to name."""
  return int(digits) if len(digits) <= 1000 else digits


def _parse_file(path: str) -> tuple[list, list[str]]:
  """(records, their names for messages) of a keyed object, a JSON list or JSON Lines."""
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such file")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from e
  if not text.strip():
    raise DataError(f"{path}: the file is empty")
  try:
    obj = json.loads(text, parse_int=_int)
  except json.JSONDecodeError as whole:
    if text.lstrip().startswith("["):
      raise DataError(f"{path}: not JSON ({whole})") from whole
    records, names = [], []  # JSON Lines: each line on its own, named by its line number
    for n, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        records.append(json.loads(line, parse_int=_int))
      except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {n} is not JSON ({e.msg}, column {e.colno})") from e
      names.append(f"on line {n}")
    return records, names
  if isinstance(obj, dict):
    keyed = obj and all(isinstance(v, dict) for v in obj.values()) and not any(k in obj for k in REQUIRED)
    if keyed:
      records = _from_keyed(path, obj)
      return records, [repr(r["key"]) for r in records]
    return [obj], ["0"]
  if not isinstance(obj, list):
    raise DataError(f"{path}: expected a JSON object of records, a list or JSON Lines, "
                    f"got a {type(obj).__name__}")
  return obj, [str(i) for i in range(len(obj))]


def check_ground_truth(value, task) -> float:
  """The ground truth as a float: finite and > 0, since the quality ratio divides by it (a
  maximisation's value / gt, a minimisation's gt / value)."""
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    raise ValueError(f"must be a number, got {type(value).__name__}")
  if isinstance(value, str) and len(value) > 40 or isinstance(value, int) and abs(value) > 10**30:
    raise ValueError("is not a plausible objective value (over 30 digits)")
  try:
    gt = float(value)
  except (ValueError, OverflowError):
    raise ValueError("must be a number") from None
  if not math.isfinite(gt) or gt <= 0:
    raise ValueError(f"must be finite and > 0 (NP-Bench's {task.direction} ratio divides by it)")
  return gt


def check_record(path: str, name: str, r) -> None:
  """One record against its task: task_type, question shape, ground truth, prompt, key."""
  if not isinstance(r, dict):
    raise DataError(f"{path}: record {name} is not an object")
  missing = [k for k in REQUIRED if k not in r]
  if missing:
    raise DataError(f"{path}: record {name} lacks {missing}")
  if r["task_type"] not in tasks_lib.names():
    raise DataError(f"{path}: record {name} has unknown task_type {r['task_type']!r}; "
                    f"choose from {tasks_lib.names()}")
  task = tasks_lib.get(r["task_type"])
  if not isinstance(r["question"], dict):
    raise DataError(f"{path}: record {name}: question must be an object")
  try:
    task.validate(r["question"])  # what the verifiers check: a bad graph is found here, not after sampling
  except ValueError as e:
    raise DataError(f"{path}: record {name}: question: {e}") from None
  if r.get("ground_truth") is not None:
    try:
      r["ground_truth"] = check_ground_truth(r["ground_truth"], task)
    except ValueError as e:
      shown = repr(r["ground_truth"])
      shown = shown if len(shown) <= 24 else shown[:20] + "..."
      raise DataError(f"{path}: record {name}: ground_truth={shown} {e}") from None
  if "prompt" in r and not (isinstance(r["prompt"], str) and r["prompt"].strip()):
    raise DataError(f"{path}: record {name}: prompt must be non-empty text")
  if r.get("level") is not None and r["level"] not in tasks_lib.LEVELS:
    raise DataError(f"{path}: record {name}: level {r['level']!r} is not one of {tasks_lib.LEVELS}")
  if r.get("key") and not r["key"].startswith(r["task_type"] + "_"):
    raise DataError(f"{path}: record {name}: key names another task than its task_type "
                    f"{r['task_type']!r} (NP-Bench keys are <task>_<level>_question<N>)")


class Checked(NamedTuple):
  """A file's valid records, how messages name each (`read_npbench_named`), their indices in
  the file, the skipped ones ({"record", "index", "error"}) and the file's record count."""
  records: list
  names: list
  indices: list
  skipped: list
  total: int


def record_context(i: int, total: int, name: str, r) -> str:
  """What a message adds to a record's name: its index where the name is a key or a line,
  and its own key or id where the name is not that."""
  parts = [] if name == str(i) else [f"record {i} of {total}"]
  ident = next((r[f] for f in ("key", "id", "name") if isinstance(r, dict) and r.get(f) is not None), None)
  if ident is not None and repr(ident) != name:
    parts.append(f"id {ident!r}" if len(repr(ident)) <= 80 else f"id {repr(ident)[:76]}...")
  return f" ({', '.join(parts)})" if parts else ""


def read_npbench_checked(path: str, *, skip_invalid: bool = False) -> Checked:
  """The records of an NP-Bench file (keyed object, JSON list or JSONL), each checked
  (`check_record`: its question with `Task.validate`, what the verifiers check). A bad one
  raises a DataError naming the file, the record (key, index or line, and `record_context`)
  and the field, or with skip_invalid is left out and listed in `skipped`. A file that cannot
  be read, or holds no valid record, raises."""
  records, names = _parse_file(path)
  if not records:
    raise DataError(f"{path}: holds no records")
  out = Checked([], [], [], [], len(records))
  for i, (name, r) in enumerate(zip(names, records)):
    try:
      check_record(path, name, r)
    except DataError as e:
      message = f"{e}{record_context(i, len(records), name, r)}"
      if not skip_invalid:
        raise DataError(message) from None
      out.skipped.append({"record": name, "index": i, "error": message})
      continue
    out.records.append(r)
    out.names.append(name)
    out.indices.append(i)
  if not out.records:
    raise DataError(f"{path}: none of its {len(records)} records is valid "
                    f"(first: {out.skipped[0]['error']})")
  return out


def read_npbench_named(path: str) -> tuple[list[dict], list[str]]:
  """(records, how messages name each: its key, index or line) of an NP-Bench file (keyed
  object, JSON list or JSONL), each checked (`check_record`); an error names the file, the
  record and the field."""
  checked = read_npbench_checked(path)
  return checked.records, checked.names


def read_npbench(path: str) -> list[dict]:
  """The checked records of an NP-Bench file (`read_npbench_named`)."""
  return read_npbench_named(path)[0]


def npbench_keys(records: Iterable[dict]) -> list[str]:
  """NP-Bench record keys: a record's own ``key``, else ``<task>_<level>_question<N>``
  with N counting from 1 per (task, level)."""
  counts: dict = {}
  keys = []
  for i, r in enumerate(records):
    if r.get("key"):
      keys.append(r["key"])
      continue
    level = r.get("level")
    if level not in KEY_LEVELS:
      raise DataError(f"record {i} ({r.get('task_type')}) has level {level!r}; NP-Bench's file "
                      f"needs one of {KEY_LEVELS} (its evaluation reads the level from the key)")
    n = counts[(r["task_type"], level)] = counts.get((r["task_type"], level), 0) + 1
    keys.append(f"{r['task_type']}_{level}_question{n}")
  if len(set(keys)) != len(keys):
    raise DataError("records have duplicate NP-Bench keys")
  return keys


def write_npbench(records: Iterable[dict], path: str) -> int:
  """Write records as NP_Bench.json does: one object keyed ``<task>_<level>_question<N>``.
  ``key``, and ``level`` where the key says it, are not repeated inside the record (so an
  NP_Bench.json read and written again is the same file)."""
  records = list(records)
  keys = npbench_keys(records)
  obj = {k: {f: v for f, v in r.items()
             if f != "key" and not (f == "level" and v == level_of_key(k))}
         for k, r in zip(keys, records)}
  atomic_write(path, lambda f: json.dump(obj, f, indent=1))
  return len(obj)


def write_jsonl(records: Iterable[dict], path: str) -> int:
  """Write records as JSON Lines, atomically."""
  n = 0
  def write(f):
    nonlocal n
    for r in records:
      f.write(json.dumps(r) + "\n")
      n += 1
  atomic_write(path, write)
  return n


def make_record(task_key: str, seed: int, level: str, *, style: str = "npbench",
                exact: bool = False, exact_time_limit: float = 10.0) -> dict:
  """One NP-Bench record of `task_key` (`Task.record`)."""
  return tasks_lib.get(task_key).record(seed, level, style=style, exact=exact,
                                     exact_time_limit=exact_time_limit)


def generate(task_keys, level: str, num: int, *, seed0: int = 0, style: str = "npbench",
             exact: bool = False, progress: bool = False) -> Iterator[dict]:
  """num records per task; seeds seed0..seed0+num-1 (disjoint ranges make disjoint splits)."""
  keys = tasks_lib.names() if task_keys in (None, "all") else list(task_keys)
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
  ap.add_argument("--level", default="easy", choices=tasks_lib.LEVELS)
  ap.add_argument("--num", type=int, default=100, help="instances per task")
  ap.add_argument("--seed", type=int, default=0, help="first seed")
  ap.add_argument("--style", default="npbench", choices=tasks_lib.PROMPT_STYLES)
  ap.add_argument("--exact", action="store_true", help="also solve exactly (CP-SAT/DP)")
  ap.add_argument("--format", default="jsonl", choices=("jsonl", "npbench", "tfds"),
                  help="npbench: one JSON object keyed <task>_<level>_question<N>, as NP_Bench.json")
  args = ap.parse_args(argv)
  keys = None if args.tasks == "all" else args.tasks.split(",")
  for k in keys or []:
    if k not in tasks_lib.names():
      ap.error(f"unknown task {k!r}; choose from {tasks_lib.names()}")
  if args.format == "jsonl":
    path = os.path.join(args.out, f"npbench_{args.level}.jsonl")
    n = write_jsonl(generate(keys, args.level, args.num, seed0=args.seed, style=args.style,
                             exact=args.exact, progress=True), path)
    print(f"wrote {n} records to {path}")
  elif args.format == "npbench":
    if args.level not in KEY_LEVELS:
      ap.error(f"--format=npbench needs --level in {KEY_LEVELS} (the level goes into each key)")
    path = os.path.join(args.out, f"npbench_{args.level}.json")
    n = write_npbench(generate(keys, args.level, args.num, seed0=args.seed, style=args.style,
                               exact=args.exact, progress=True), path)
    print(f"wrote {n} records to {path}")
  else:
    from dmpo_jax.tasks import tfds_builder
    for k in keys or tasks_lib.names():
      b = tfds_builder.NpBench(config=tfds_builder.config_name(k, args.level), data_dir=args.out,
                               num_train=args.num, num_test=max(1, args.num // 10))
      b.download_and_prepare()
      print(f"built {b.info.full_name} in {args.out}")


if __name__ == "__main__":
  main()
