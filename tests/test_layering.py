"""The package's dependencies run one way (docs/ARCHITECTURE.md): no import cycle among its
modules (imports inside functions included), no module uses another's private names, each
package imports only the layers below it, and no module imports the command lines."""

import ast
import collections
import os

from tests.helpers import REPO

PKG = os.path.join(REPO, "dmpo_jax")
# What each part may import (besides itself). Bottom: models, tasks, objectives.
ALLOWED = {
    "models": set(), "tasks": set(), "objectives": set(),
    "parallel": {"models"},                      # plan.py sizes the models
    "sampling": {"models", "parallel"},
    "data": {"models", "tasks"},
    "training": {"models", "tasks", "objectives", "parallel", "sampling", "data"},  # tasks: metrics only
    "experiments": {"models", "tasks", "objectives", "parallel", "sampling", "data", "training"},
    "train": {"parallel", "data", "training"},   # the command lines
    "evaluate": {"models", "tasks", "objectives", "parallel", "sampling", "data", "training"},
}
CLIS = {"dmpo_jax.train", "dmpo_jax.evaluate"}
# dmpo_jax/files.py (atomic writes) imports nothing of the package: every part may use it.
ANYWHERE = {"files"}
# The training layer reaches the task domain only through data/ (data/domain.py); of tasks/ it
# may use the two modules of metrics over verdict arrays, which know no task.
TASK_METRICS = {"dmpo_jax.tasks.scoring", "dmpo_jax.tasks.diversity"}


def modules() -> dict:
  out = {}
  for d, _, files in os.walk(PKG):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(d, f)
        name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
  return out


def imports(mods: dict):
  """{module: {imported module}}, and [(module, private name it imports or reads)]."""
  edges, private = collections.defaultdict(set), []
  for name, path in mods.items():
    tree = ast.parse(open(path).read())
    alias = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dmpo_jax"):
        for a in node.names:
          full = f"{node.module}.{a.name}"
          if full in mods:
            edges[name].add(full)
            alias[a.asname or a.name] = full
          elif node.module in mods:
            edges[name].add(node.module)
            if a.name.startswith("_") and not a.name.startswith("__"):
              private.append((name, full))
      elif isinstance(node, ast.Import):
        for a in node.names:
          if a.name in mods:
            edges[name].add(a.name)
            if a.asname:
              alias[a.asname] = a.name
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id in alias and node.attr.startswith("_") and not node.attr.startswith("__")):
        private.append((name, f"{alias[node.value.id]}.{node.attr}"))
    edges[name].discard(name)
  return edges, private


def cycles(edges) -> list:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = n[0]
    n[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in list(edges):
    if v not in index:
      visit(v)
  return out


def part(module: str) -> str:
  return module.split(".")[1] if "." in module else module


def test_no_cycles_and_no_private_names():
  edges, private = imports(modules())
  assert cycles(edges) == []
  assert private == []


def test_packages_import_only_the_layers_below():
  edges, _ = imports(modules())
  wrong = sorted((m, d) for m, ds in edges.items() for d in ds
                 if part(m) != part(d) and part(d) not in ALLOWED.get(part(m), set()) | ANYWHERE)
  assert wrong == [], wrong
  assert not [m for m, ds in edges.items() if part(m) == "files" and ds]


def test_training_reaches_tasks_only_through_data():
  edges, _ = imports(modules())
  direct = sorted((m, d) for m, ds in edges.items() for d in ds
                  if part(m) == "training" and part(d) == "tasks" and d not in TASK_METRICS)
  assert direct == [], direct
  assert not [m for m, ds in edges.items() if ds & CLIS]  # nothing imports a command line


def test_the_checks_can_fail(tmp_path):
  """The checker finds a planted cycle and a planted private import."""
  a, b = tmp_path / "a.py", tmp_path / "b.py"
  a.write_text("from dmpo_jax.b import _secret\n")
  b.write_text("def f():\n  from dmpo_jax import a\n")
  edges, private = imports({"dmpo_jax.a": str(a), "dmpo_jax.b": str(b)})
  assert cycles(edges) == [["dmpo_jax.a", "dmpo_jax.b"]]
  assert private == [("dmpo_jax.a", "dmpo_jax.b._secret")]


# The stage layer (docs/ARCHITECTURE.md, "The stage layer"): the modules that read the config
# and the run context. Below it a module takes the specs (training/specs.py) and the state it
# uses.
STAGE_LAYER = {"dmpo_jax.train", "dmpo_jax.evaluate", "dmpo_jax.training.config",
               "dmpo_jax.training.memory", "dmpo_jax.training.run", "dmpo_jax.training.stages",
               "dmpo_jax.training.specs"}
STAGE_PARTS = {"experiments"}


def config_sections() -> set:
  """The config's sections (its top-level blocks: rl, eval, ...), from the shipped configs."""
  from tests.helpers import config_module
  return {k for name in ("nphard", "collapse", "mm_nphard")
          for k, v in config_module(name).get_config("smoke").items() if hasattr(v, "keys")}


def config_reads(path: str, sections: set) -> list[str]:
  """Where a module reads the config or takes a run: `cfg.<section>` / `config.<section>` (an
  attribute, `.get("<section>")`, `["<section>"]`, `"<section>" in cfg`), any `run.cfg`, a
  parameter named `run` or annotated `Run`."""
  out = []
  cfg = lambda n: isinstance(n, ast.Name) and n.id in ("cfg", "config")
  for n in ast.walk(ast.parse(open(path).read())):
    line = getattr(n, "lineno", 0)
    if isinstance(n, ast.Attribute) and cfg(n.value) and n.attr in sections:
      out.append(f"{line}: {n.value.id}.{n.attr}")
    elif (isinstance(n, ast.Attribute) and n.attr == "cfg" and
          (isinstance(n.value, ast.Name) and n.value.id == "run" or
           isinstance(n.value, ast.Attribute) and n.value.attr == "run")):
      out.append(f"{line}: run.cfg")
    elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
          and cfg(n.func.value) and n.args and isinstance(n.args[0], ast.Constant)
          and n.args[0].value in sections):
      out.append(f"{line}: {n.func.value.id}.get({n.args[0].value!r})")
    elif (isinstance(n, ast.Subscript) and cfg(n.value) and isinstance(n.slice, ast.Constant)
          and n.slice.value in sections):
      out.append(f"{line}: {n.value.id}[{n.slice.value!r}]")
    elif (isinstance(n, ast.Compare) and isinstance(n.left, ast.Constant) and n.left.value in sections
          and any(isinstance(o, (ast.In, ast.NotIn)) for o in n.ops) and any(map(cfg, n.comparators))):
      out.append(f"{line}: {n.left.value!r} in cfg")
    elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      for a in n.args.posonlyargs + n.args.args + n.args.kwonlyargs:
        note = ast.unparse(a.annotation) if a.annotation is not None else ""
        if a.arg == "run" or note.split(".")[-1].strip("'\"") == "Run":
          out.append(f"{line}: takes a Run ({a.arg})")
  return out


def test_below_the_stage_layer_nothing_reads_the_config_or_a_run(tmp_path):
  """No module below the stage layer reads a config section or takes a `Run`. The check sees
  the modules below (data/, models/ among them) and finds planted reads."""
  sections = config_sections()
  assert {"rl", "eval", "dph", "sft", "model", "perception"} <= sections and "seed" not in sections
  found = {m: config_reads(p, sections) for m, p in modules().items()
           if m not in STAGE_LAYER and part(m) not in STAGE_PARTS}
  assert {"dmpo_jax.data.instances", "dmpo_jax.data.images", "dmpo_jax.models.build"} <= set(found)
  assert {m: r for m, r in found.items() if r} == {}
  planted = tmp_path / "planted.py"
  planted.write_text("def f(cfg, run: Run, spec):\n  n = cfg.rl.steps + run.cfg.eval.k\n"
                     "  return cfg.get('dph'), config['sft'], 'perception' in cfg, spec.steps\n"
                     "def g(run):\n  return self.run.cfg\n")
  assert sorted(config_reads(str(planted), sections)) == sorted([
      "1: takes a Run (run)", "2: cfg.rl", "2: run.cfg", "3: cfg.get('dph')", "3: config['sft']",
      "3: 'perception' in cfg", "4: takes a Run (run)", "5: run.cfg"])


def missing_names(paths) -> list[str]:
  """`from dmpo_jax.x import y` (anywhere in the files) where dmpo_jax.x has no `y` and no
  submodule `y`, and `import dmpo_jax.x` of a module that does not exist."""
  import importlib
  import importlib.util
  out = []
  for path in paths:
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dmpo_jax":
        mod = importlib.import_module(node.module)
        out += [f"{os.path.relpath(path, REPO)}: {node.module}.{a.name}" for a in node.names
                if not hasattr(mod, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
      elif isinstance(node, ast.Import):
        out += [f"{os.path.relpath(path, REPO)}: {a.name}" for a in node.names
                if a.name.split(".")[0] == "dmpo_jax" and importlib.util.find_spec(a.name) is None]
  return out


def test_scripts_benchmarks_and_configs_import_what_exists(tmp_path):
  """The command-line files outside the package (scripts/, benchmarks/, configs/) name only
  modules and names the package has: a move inside the package cannot leave one behind.
  The check finds a planted stale import."""
  paths = [os.path.join(REPO, d, f) for d in ("scripts", "benchmarks", "configs")
           for f in sorted(os.listdir(os.path.join(REPO, d))) if f.endswith(".py")]
  assert len(paths) > 20
  assert missing_names(paths) == []
  stale = tmp_path / "stale.py"
  stale.write_text("from dmpo_jax.training import pipeline\nimport dmpo_jax.no_such_module\n")
  assert missing_names([str(stale)]) == [f"{os.path.relpath(str(stale), REPO)}: dmpo_jax.training.pipeline",
                                         f"{os.path.relpath(str(stale), REPO)}: dmpo_jax.no_such_module"]


def study_imports(mods: dict) -> list[tuple[str, str]]:
  """[(module, imported module)] where a module imports from the studies beside the library
  (`studies`, `studies.<study>...`), anywhere in its file (imports inside functions included)."""
  out = []
  for name, path in sorted(mods.items()):
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "studies":
        out.append((name, node.module))
      elif isinstance(node, ast.Import):
        out += [(name, a.name) for a in node.names if a.name.split(".")[0] == "studies"]
  return out


def test_the_library_imports_no_study(tmp_path):
  """A study (studies/<name>/: its design, entry points, README) imports the library, never
  the reverse: the runner takes a study's design as an argument. The check finds planted
  imports, at the top and inside a function."""
  assert study_imports(modules()) == []
  planted = tmp_path / "planted.py"
  planted.write_text("import os, studies.collapse_frontier.design\n"
                     "def f():\n  from studies.collapse_frontier import design\n  from studies import x\n"
                     "from studies_other import y\nfrom .studies import z\n")
  assert study_imports({"dmpo_jax.planted": str(planted)}) == [
      ("dmpo_jax.planted", "studies.collapse_frontier.design"), ("dmpo_jax.planted", "studies.collapse_frontier"),
      ("dmpo_jax.planted", "studies")]
