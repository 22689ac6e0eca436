"""The docs match the repository: README's test command is the one .ci/run runs, every
relative link in README.md and docs/*.md names a file that exists, no tracked text file links
outside the repository (papers are cited by title and arXiv id), and every
`python -m dmpo_jax...` module in README's code answers --help."""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def read(path):
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    return f.read()


def test_readme_test_command_is_what_ci_runs():
  ci = [l for l in read(".ci/run").splitlines() if "pytest" in l and not l.lstrip().startswith("#")]
  assert len(ci) == 1, ci
  blocks = re.findall(r"```bash\n(.*?)```", read("README.md"), re.S)
  assert any(ci[0].strip() in b for b in blocks), ci[0]


def markdown_files():
  docs = [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(REPO, "docs"))) if f.endswith(".md")]
  return ["README.md"] + docs


@pytest.mark.parametrize("path", markdown_files())
def test_relative_links_exist(path):
  base = os.path.dirname(os.path.join(REPO, path))
  missing = [t for t in LINK.findall(read(path))
             if "://" not in t and not t.startswith("mailto:") and not os.path.exists(os.path.join(base, t))]
  assert not missing, f"{path} links to missing files: {missing}"


URL = re.compile(r"\b(?:https?|ftp)://", re.I)


def test_no_link_outside_the_repository():
  """Every tracked Markdown, Python, config and text file: no URL (the repository stands alone)."""
  files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
  found = []
  for path in files.stdout.split():
    if not path.endswith((".md", ".py", ".txt", ".toml", ".cfg", ".yaml", ".yml", ".json")):
      continue
    with open(os.path.join(REPO, path), encoding="utf-8", errors="replace") as f:
      found += [f"{path}:{n}" for n, line in enumerate(f, 1) if URL.search(line)]
  assert not found, f"links outside the repository: {found}"


@pytest.mark.slow
def test_readme_modules_answer_help():
  code = "\n".join(re.findall(r"```(?:bash)?\n(.*?)```", read("README.md"), re.S))
  table = read("README.md")
  modules = sorted(set(re.findall(r"python -m (dmpo_jax[\w.]*)", code + table)))
  assert "dmpo_jax.train" in modules and "dmpo_jax.evaluate" in modules
  for m in modules:
    r = subprocess.run([sys.executable, "-m", m, "--help"], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
    # absl's --help exits 1 after printing the flags; argparse's exits 0
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, f"{m} --help: {r.stderr[-2000:]}"
    assert "--" in r.stdout and ("flags" in r.stdout.lower() or "usage" in r.stdout.lower()), m
