"""Both notebooks run top to bottom on CPU with the small budget; any cell error fails."""

import os

import nbformat
import pytest
from nbclient import NotebookClient
from tests.helpers import REPO

NB = os.path.join(REPO, "notebooks")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mode_collapse.ipynb", "quickstart.ipynb"])
def test_notebook_runs(name, tmp_path, monkeypatch):
  nb = nbformat.read(os.path.join(NB, name), as_version=4)
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "stored with outputs"
  monkeypatch.setenv("DMPO_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("PYTHONPATH", REPO)
  client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError on any failing cell
  outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outs if o.get("output_type") == "error"]
  assert any(o.get("output_type") == "display_data" for o in outs)  # the plots were drawn


def test_notebooks_match_their_builder(tmp_path):
  """The committed notebooks are exactly what notebooks/build.py writes."""
  import importlib.util
  spec = importlib.util.spec_from_file_location("nb_build", os.path.join(NB, "build.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  for cells, name in ((mod.QUICKSTART, "quickstart.ipynb"), (mod.MODE_COLLAPSE, "mode_collapse.ipynb")):
    committed = nbformat.read(os.path.join(NB, name), as_version=4)
    assert [c.source for c in committed.cells] == [c.source for c in cells], name
