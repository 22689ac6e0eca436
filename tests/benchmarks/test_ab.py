"""benchmarks/ab.py: a script at an old commit against the working tree, interleaved."""

import json
import os
import subprocess
import sys

import pytest
from tests.helpers import REPO

AB = os.path.join(REPO, "benchmarks", "ab.py")
SCRIPT = ("import json; print('warm-up line'); "
          "print(json.dumps({{'step': {{'update_s': {t}, 'n': 3}}, 'loss_ms': {t} * 2000}}))\n")


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_ab_compares_an_old_commit_with_the_working_tree(tmp_path):
  repo = tmp_path / "repo"
  os.makedirs(repo / "benchmarks")
  (repo / "benchmarks" / "b.py").write_text(SCRIPT.format(t=0.3))
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old")
  (repo / "benchmarks" / "b.py").write_text(SCRIPT.format(t=0.1))  # the new code: 3x faster
  out = subprocess.run([sys.executable, AB, f"--repo={repo}", "--old=HEAD", "--pairs=2",
                        "benchmarks/b.py"], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  res = json.loads(out.stdout.strip().splitlines()[-1])
  t = res["times"]["step.update_s"]
  assert list(res["times"]) == ["step.update_s", "loss_ms"]  # `n` is not a time
  assert res["times"]["loss_ms"]["new_best_s"] == pytest.approx(0.2)  # milliseconds -> seconds
  assert t["old_best_s"] == 0.3 and t["new_best_s"] == 0.1
  assert t["speed"] == pytest.approx(3.0) and t["speed_per_pair"] == pytest.approx([3.0, 3.0])
  listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True,
                          text=True).stdout.strip().splitlines()
  assert len(listed) == 1  # the old side's worktree is gone


def test_ab_refuses_a_ref_that_is_not_a_commit(tmp_path):
  repo = tmp_path / "repo"
  os.makedirs(repo / "benchmarks")
  (repo / "benchmarks" / "b.py").write_text(SCRIPT.format(t=0.1))
  _git(repo, "init", "-q")
  out = subprocess.run([sys.executable, AB, f"--repo={repo}", "--old=nope", "benchmarks/b.py"],
                       capture_output=True, text=True)
  assert out.returncode == 2 and "--old=nope is not a commit" in out.stderr
