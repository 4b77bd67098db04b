"""The README's Python example runs as written and shows the ELBO = -InfoNCE + log N identity;
the README names the test command that .ci/run calls; the links into docs/theory.md land on its
headings, and the theory page, not an internal file, is what the code cites."""

import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_readme_example_runs(tmp_path, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "README.md has no python example"
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[0])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    match = re.search(r"ELBO/N = (-?[\d.]+), -InfoNCE \+ log N = (-?[\d.]+)", out)
    assert match and match.group(1) == match.group(2)
    assert "prior sites: ['z', 'z2'] factors: ['z_to_z2', 'x', 'x2']" in out
    step = float(re.search(r"learned step of the Student-t walk: ([\d.]+)", out).group(1))
    assert step != pytest.approx(0.5, abs=1e-3)  # the custom prior's parameter was learned


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)```", README, re.S)
    test_command = next(c.strip() for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci
    assert re.search(r"^ruff check \.$", ci, re.M), "CI must run the linter: ruff check ."


def _github_anchor(heading: str) -> str:
    """The fragment GitHub gives a markdown heading: lower case, punctuation other than '-' and
    '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_theory_page_anchors_cited_in_the_repository_exist():
    theory = (ROOT / "docs" / "theory.md").read_text()
    anchors = {_github_anchor(h) for h in re.findall(r"^#+ (.+)$", theory, re.M)}
    cited = {}
    for path in [*ROOT.glob("rpm/**/*.py"), *ROOT.glob("notebooks/src/*.py"), *ROOT.glob("*.md"),
                 *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*")]:
        if path.is_file():
            for anchor in re.findall(r"theory\.md#([\w\-]+)", path.read_text()):
                cited.setdefault(anchor, path.relative_to(ROOT))
    for anchor in re.findall(r"\]\(#([\w\-]+)\)", theory):  # the page's own links
        cited.setdefault(anchor, "docs/theory.md")
    assert "implicit-prior" in anchors and "elbo" in anchors
    missing = {anchor: str(where) for anchor, where in cited.items() if anchor not in anchors}
    assert not missing, f"links to headings docs/theory.md does not have: {missing}"


def test_docs_and_code_cite_the_theory_page_not_an_internal_spec():
    internal = re.compile(r"\b" + "SP" + r"EC\b(,| section| \d)")  # not spelled out in this file
    offenders = []
    for path in [*ROOT.glob("rpm/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*"),
                 *ROOT.glob("notebooks/src/*.py"), *ROOT.glob("*.md"), *ROOT.glob("docs/*.md")]:
        if path.is_file() and internal.search(path.read_text(errors="ignore")):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"cite docs/theory.md or the paper's equations instead: {offenders}"
