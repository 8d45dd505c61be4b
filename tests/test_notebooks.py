"""Executes every notebook in notebooks/ top to bottom (nbclient) in the
small budget (KERAS_TRM_NOTEBOOK_BUDGET=ci); any cell error fails the test.

The kernel is ``python3`` started in the repository root with the root on
PYTHONPATH, so it imports this checkout's ``keras_trm``; data come from
$KERAS_TRM_DATA_DIR like the rest of the suite.
"""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"transformer_quickstart.ipynb", "transformer_xl_streaming.ipynb",
            "layer_normalization.ipynb"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_are_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name}: commit the notebook without outputs"
            assert cell.execution_count is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_notebook_runs(path, data_dir, monkeypatch):
    monkeypatch.setenv("KERAS_TRM_DATA_DIR", str(data_dir))
    monkeypatch.setenv("KERAS_TRM_NOTEBOOK_BUDGET", "ci")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    # Every code cell ran, and none wrote an error output.
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.execution_count is not None
            assert all(o.output_type != "error" for o in cell.outputs)
