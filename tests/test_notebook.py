"""The example notebook runs, as a user would run it, in a real Jupyter kernel (nbclient): it cannot rot; and a
run trained inside the kernel gives the command line's numbers bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import nbclient
import nbformat
import pytest

from tests.conftest import REPO

NOTEBOOK = REPO / "examples" / "sweep_from_python.ipynb"


@pytest.mark.slow
@pytest.mark.long
def test_the_sweep_notebook_runs_and_shows_the_runs_it_made(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})  # fmt: skip
    client.execute()  # a cell that raises fails here, naming it
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]

    sweep_dir = tmp_path / "runs" / "notebook" / "norms"
    summaries = {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/summary.json")}
    assert sorted(summaries) == ["norm=ln", "norm=none"]
    # the table the notebook shows is the one made from those runs' files
    html = [o.data["text/html"] for o in outputs if o.output_type == "execute_result" and "text/html" in o.data]
    (table,) = [t for t in html if "final client-mean acc" in t]
    for summary in summaries.values():
        assert f"{100 * summary['final_client_mean_acc']:.2f}" in table
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1  # the accuracy plot
    # the run trained inside the kernel gives the numbers of the sweep's ln cell (a fedsim run process)
    (single,) = [p for p in tmp_path.rglob("notebook-*/metrics.jsonl")]
    numbers = ("round", "train_loss", "client_mean_acc", "global_acc", "client_acc", "per_class_acc")
    lines = [[{k: json.loads(x)[k] for k in numbers} for x in path.read_text().splitlines()]
             for path in (single, sweep_dir / "norm=ln" / "metrics.jsonl")]  # fmt: skip
    assert lines[0] == lines[1] and len(lines[0]) == 4
    # its progress bar is a live widget (ipywidgets, fedsim[notebook]), not rich's warning at every refresh
    single_outputs = nb.cells[-1].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in single_outputs)
    assert not any("ipywidgets" in str(o.get("text", "")) + str(o.get("data", {})) for o in single_outputs)
