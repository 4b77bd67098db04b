"""Builds the tutorial notebooks from their sources in notebooks/src/*.py, outputs stripped.

Each source is a Python file whose cells are separated by lines ``# %%`` (code) or
``# %% [markdown]`` (markdown, with every line commented). Run ``python notebooks/build.py``
after editing a source; tests/test_notebooks.py checks the notebooks match their sources.
"""

from __future__ import annotations

import pathlib
import re

import nbformat

HERE = pathlib.Path(__file__).resolve().parent


def cells_of(source: str) -> list:
    cells = []
    for block in re.split(r"^# %%", source, flags=re.M)[1:]:
        header, _, body = block.partition("\n")
        body = body.strip("\n")
        if header.strip() == "[markdown]":
            text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                             for line in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(text))
        else:
            cells.append(nbformat.v4.new_code_cell(body))
    return cells


def build(path: pathlib.Path) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = cells_of(path.read_text())
    for index, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{index}"
    notebook.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return notebook


def main() -> None:
    for source in sorted((HERE / "src").glob("*.py")):
        target = HERE / f"{source.stem}.ipynb"
        nbformat.write(build(source), target)
        print(f"wrote {target.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
