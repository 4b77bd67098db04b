"""The tutorials run top to bottom at reduced size (SMOKE_TEST=1) without warnings or stray
outputs, are committed without outputs, and match their sources in notebooks/src (built by
notebooks/build.py)."""

import os
import pathlib
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOURCES = sorted((ROOT / "notebooks" / "src").glob("*.py"))


def test_every_tutorial_is_built_and_linked_from_the_readme():
    assert len(SOURCES) >= 4, "the tutorials' sources are missing from notebooks/src"
    assert [path.stem for path in NOTEBOOKS] == [path.stem for path in SOURCES], (
        "every notebooks/src/NAME.py needs its notebooks/NAME.ipynb: run python notebooks/build.py"
    )
    readme = (ROOT / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in readme, f"README.md does not link {path.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_matching_source(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: strip the outputs"
            assert cell.execution_count is None, f"{path.name}: strip the execution counts"
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import build
    finally:
        sys.path.pop(0)
    built = build.build(ROOT / "notebooks" / "src" / f"{path.stem}.py")
    assert [c.source for c in built.cells] == [c.source for c in notebook.cells], (
        f"{path.name} differs from notebooks/src/{path.stem}.py: run python notebooks/build.py"
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path, monkeypatch, tmp_path):
    import nbclient

    monkeypatch.setenv("SMOKE_TEST", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel uses the inline backend
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            text = output.get("text", "") or output.get("data", {}).get("text/plain", "")
            assert "Warning" not in text, f"{path.name}, cell {index} warns:\n{text}"
            assert "<torch._C.Generator" not in text, (
                f"{path.name}, cell {index} shows a stray generator: assign `_ = torch.manual_seed(...)`"
            )
