"""A workdir's lock: one process at a time writes a training workdir.

Two runs on one workdir corrupt it (both append to metrics.jsonl, both rotate the same
checkpoints), so a run holds ``<workdir>/.lock`` from the moment it first writes there
until it ends, however it ends. The file is a JSON record of its holder (pid, host, start
time, a random token) and is created atomically: a complete temp file is hard-linked to the
name (a link fails when the name exists), or, where the filesystem has no hard links,
opened with O_CREAT|O_EXCL. A second run is refused (`LockHeld`, naming the holder and the
file). A lock whose holder is gone (same host, its pid no longer exists) is stale: it is
taken over with a printed message. A lock from another host is never taken over: this
host cannot tell whether that run still lives, so the error says to delete the file once
it is known to be gone.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import os
import secrets
import socket

LOCK_FILE = ".lock"
FIELDS = ("pid", "host", "since", "token")


class LockHeld(RuntimeError):
  """Another run holds the workdir's lock (`holder`; None when the file is not a lock
  record) or it could not be taken; the message names the holder and the file."""

  def __init__(self, message: str, path: str, holder: Holder | None):
    super().__init__(message)
    self.path = path
    self.holder = holder


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lock: process id, host name, start time (ISO 8601) and the run's token."""
  pid: int
  host: str
  since: str
  token: str

  def alive(self) -> bool | None:
    """True: the process runs (or is this one); False: it is gone (the lock is stale);
    None: it runs on another host, where this process cannot look."""
    if self.host != socket.gethostname():
      return None
    if self.pid == os.getpid():
      return True
    try:
      os.kill(self.pid, 0)
    except ProcessLookupError:
      return False
    except PermissionError:  # it exists, run by another user
      return True
    return True

  def describe(self) -> str:
    return f"pid {self.pid} on host {self.host} since {self.since}"


def lock_path(workdir: str) -> str:
  return os.path.join(workdir, LOCK_FILE)


def new_holder() -> Holder:
  return Holder(pid=os.getpid(), host=socket.gethostname(),
                since=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                token=secrets.token_hex(8))


def load(path: str) -> Holder:
  """The lock record in `path` (OSError, ValueError: not one)."""
  with open(path, encoding="utf-8") as f:
    rec = json.load(f)
  if not isinstance(rec, dict) or any(k not in rec for k in FIELDS):
    raise ValueError(f"not a JSON object with the fields {list(FIELDS)}")
  if not isinstance(rec["pid"], int) or not all(isinstance(rec[k], str) for k in FIELDS[1:]):
    raise ValueError("pid must be an int; host, since and token strings")
  return Holder(**{k: rec[k] for k in FIELDS})


def read(workdir: str) -> Holder | None:
  """The holder of workdir's lock; None when there is no lock. A file that is not a lock
  record is a LockHeld (no holder) that says to delete it."""
  path = lock_path(workdir)
  try:
    return load(path)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:  # UnicodeDecodeError, JSONDecodeError: ValueErrors
    raise LockHeld(f"{path} is not a lock record ({type(e).__name__}: {e}); delete it if no run "
                   "uses this workdir", path, None) from None


def refusal(workdir: str, holder: Holder) -> LockHeld:
  """The error for a workdir that `holder` (alive, or on another host) holds."""
  path = lock_path(workdir)
  if holder.alive() is None:
    why = (f"; it is from another host, whose runs this one cannot see, so it is not taken over: "
           f"delete {path} once that run is gone")
  else:
    why = f" (lock file {path}); stop that run or use another --workdir"
  return LockHeld(f"{workdir} is in use by another run: {holder.describe()}{why}", path, holder)


def check(workdir: str) -> None:
  """Raise LockHeld when another run holds workdir's lock (read only: a stale lock passes,
  `acquire` takes it over)."""
  holder = read(workdir)
  if holder is not None and holder.alive() is not False:
    raise refusal(workdir, holder)


def create(path: str, holder: Holder) -> bool:
  """Write the lock file atomically; False when it exists already."""
  data = json.dumps(dataclasses.asdict(holder)).encode()
  tmp = f"{path}.{holder.token}.tmp"
  with open(tmp, "wb") as f:
    f.write(data)
  try:
    os.link(tmp, path)  # the name appears with the whole record, or not at all
    return True
  except FileExistsError:
    return False
  except OSError as e:  # no hard links on this filesystem
    if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV):
      raise
  finally:
    os.remove(tmp)
  try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  return True


def remove_stale(workdir: str, stale: Holder) -> bool:
  """Delete the lock file if it still holds `stale`. It is renamed aside first (one process
  wins the rename) and its record compared: a fresh lock taken meanwhile by another process
  is put back."""
  path = lock_path(workdir)
  aside = f"{path}.stale.{os.getpid()}.{secrets.token_hex(4)}"
  try:
    os.rename(path, aside)
  except FileNotFoundError:
    return False
  try:
    moved = load(aside)
  except (OSError, ValueError):
    moved = None
  if moved == stale:
    os.remove(aside)
    return True
  try:
    os.link(aside, path)  # back where it was, unless yet another lock took the name
  except OSError:
    pass
  os.remove(aside)
  return False


@dataclasses.dataclass
class Lock:
  """A lock this process holds; `release` (or leaving a `with` block) deletes its file."""
  workdir: str
  holder: Holder
  released: bool = False

  @property
  def path(self) -> str:
    return lock_path(self.workdir)

  @property
  def token(self) -> str:
    return self.holder.token

  def release(self) -> None:
    """Delete the lock file if it is still this lock's (idempotent)."""
    if self.released:
      return
    self.released = True
    try:
      if read(self.workdir) == self.holder:
        os.remove(self.path)
    except (LockHeld, FileNotFoundError):
      pass  # not ours any more: left to whoever wrote it

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.release()


def say(message: str) -> None:
  print(message, flush=True)


def acquire(workdir: str, log=say, attempts: int = 5) -> Lock:
  """Take workdir's lock (the folder is created), taking over a stale one with a message;
  LockHeld when another run holds it."""
  os.makedirs(workdir, exist_ok=True)
  path = lock_path(workdir)
  mine = new_holder()
  for _ in range(attempts):
    if create(path, mine):
      return Lock(workdir, mine)
    holder = read(workdir)
    if holder is None:  # released meanwhile
      continue
    if holder.alive() is not False:
      raise refusal(workdir, holder)
    if remove_stale(workdir, holder):
      log(f"taking over {path}: its holder ({holder.describe()}) is no longer running")
  raise LockHeld(f"could not take {path} in {attempts} attempts (other processes keep taking it)",
                 path, read(workdir))


def holds(workdir: str, token: str) -> bool:
  """Whether workdir's lock file is the one with `token` (another process's view of a lock)."""
  try:
    holder = read(workdir)
  except LockHeld:
    return False
  return holder is not None and holder.token == token
