"""The README's Python example runs as written and shows the ELBO = -InfoNCE + log N identity;
the README names the test command that .ci/run calls."""

import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_example_runs(tmp_path, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "README.md has no python example"
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[0])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    match = re.search(r"ELBO/N = (-?[\d.]+), -InfoNCE \+ log N = (-?[\d.]+)", out)
    assert match and match.group(1) == match.group(2)
    assert "prior sites: ['z', 'z2'] likelihood factors: ['x', 'x2']" in out
    step = float(re.search(r"learned step of the Student-t walk: ([\d.]+)", out).group(1))
    assert step != pytest.approx(0.5, abs=1e-3)  # the custom prior's parameter was learned


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)```", README, re.S)
    test_command = next(c.strip() for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci
