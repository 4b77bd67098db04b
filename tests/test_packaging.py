"""What a release ships: the licence the metadata names, the typing marker, the changelog, one
version written in one place, the test dependencies pinned to the versions the suite runs on, a
core that needs torch, Pyro and NumPy alone (the experiments' packages in an extra), and a
command line that names that extra when it is missing."""

import configparser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import rpm
import rpm.cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _setup_cfg() -> configparser.ConfigParser:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return setup


def test_the_licence_file_is_the_one_the_metadata_names():
    setup = _setup_cfg()
    assert setup["metadata"]["license"] == "MIT"
    assert setup["metadata"]["license_files"].strip() == "LICENSE"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the rpm developers\n")
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text


def test_the_package_is_marked_typed():
    assert (ROOT / "rpm" / "py.typed").is_file()
    assert _setup_cfg()["options.package_data"]["rpm"].split() == ["py.typed"]


def test_the_version_is_written_once(tmp_path):
    """setup.cfg reads the version from rpm/__init__.py (``attr: rpm.__version__``): setuptools
    resolves it statically from the file, so a changed ``__version__`` is the metadata's version,
    and no other file of the package or its configuration spells a version."""
    read_configuration = pytest.importorskip("setuptools.config.setupcfg").read_configuration
    assert _setup_cfg()["metadata"]["version"] == "attr: rpm.__version__"
    assert read_configuration(ROOT / "setup.cfg")["metadata"]["version"] == rpm.__version__
    # a copy whose rpm/__init__.py says 9.8.7 is version 9.8.7
    for name in ("setup.cfg", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "rpm").mkdir()
    (tmp_path / "rpm" / "__init__.py").write_text('__version__ = "9.8.7"\n')
    assert read_configuration(tmp_path / "setup.cfg")["metadata"]["version"] == "9.8.7"
    # the version literal appears once
    literal = re.compile(r"""(__version__|\bversion)\s*=\s*["']?\d+\.\d+""")
    holders = [str(path.relative_to(ROOT))
               for path in [*ROOT.glob("rpm/**/*.py"), ROOT / "setup.cfg", ROOT / "pyproject.toml"]
               if literal.search(path.read_text())]
    assert holders == [str(pathlib.Path("rpm", "__init__.py"))]


def test_the_changelog_has_an_unreleased_section_and_the_current_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, flags=re.M)
    assert headings[0] == "Unreleased"
    assert rpm.__version__ in headings[1:]


def test_torch_and_pyro_are_pinned_below_the_next_minor_version():
    """The suite runs on torch 2.13 and Pyro 1.9: a release declares no newer minor version,
    whose changes it was never tested against."""
    requires = _setup_cfg()["options"]["install_requires"].split()
    assert "torch>=2.1,<2.14" in requires
    assert "pyro-ppl>=1.9,<1.10" in requires


def _requirements(field: str) -> list[str]:
    return [line.strip() for line in field.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _distribution(requirement: str) -> str:
    """The distribution a requirement names: ``scikit-learn>=1.3`` -> ``scikit-learn``."""
    return re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower()


#: The distributions of the experiments (and the names they are imported as): the commands,
#: rpm.data, rpm.metrics, rpm.evaluation, rpm.training and the figures need them, the core not.
EXPERIMENTS = {"kornia": "kornia", "matplotlib": "matplotlib", "scikit-learn": "sklearn",
               "scipy": "scipy", "tqdm": "tqdm"}


def test_the_core_requires_torch_pyro_and_numpy_only():
    setup = _setup_cfg()
    assert _requirements(setup["options"]["install_requires"]) == [
        "torch>=2.1,<2.14", "pyro-ppl>=1.9,<1.10", "numpy>=1.24"]
    extras = {name: _requirements(field) for name, field in setup["options.extras_require"].items()}
    assert {_distribution(r) for r in extras["experiments"]} == set(EXPERIMENTS)
    # the notebooks run the experiments' code under nbconvert; the tests need everything
    assert "rpm-pyro[experiments]" in extras["notebooks"]
    assert {"nbconvert", "nbclient", "ipykernel"} <= {_distribution(r) for r in extras["notebooks"]}
    assert "rpm-pyro[experiments,docs,lightning,benchmark]" in extras["test"]
    # rpm benchmark's MNIST-1D, pinned: the generator's version decides the data
    assert extras["benchmark"] == ["mnist1d==0.0.2.post1"]
    # Lightning below its next minor version, as torch and Pyro (2.6 keeps torch 2.13)
    assert extras["lightning"] == ["lightning>=2.6.6,<2.7"]
    assert {"pytest", "ruff", "mypy"} <= {_distribution(r) for r in extras["test"]}
    assert {_distribution(r) for r in extras["docs"]} == {"sphinx", "myst-parser", "myst-nb"}


#: The import names of the lightning extra (rpm.lightning), which the core never imports.
LIGHTNING = ("lightning", "pytorch_lightning")


def test_the_command_line_names_the_packages_of_the_experiments_extra():
    """rpm.cli checks for the extra's packages by their import names before a command runs."""
    assert rpm.cli._EXPERIMENTS_EXTRA == {module: distribution
                                          for distribution, module in EXPERIMENTS.items()}


#: Runs in a fresh interpreter: imports torch and Pyro, then the core, then trains a small RPM one
#: step with SVI and one with torch.optim, and reports which packages of the experiments were
#: imported at each stage, and which rpm modules.
_CORE_SCRIPT = """
import json, sys
EXTRA = {extra!r}
def imported():
    return sorted(name for name in EXTRA if sys.modules.get(name) is not None)
import pyro, torch
after_pyro = imported()
import rpm, rpm.priors, rpm.models, rpm.inference, rpm.losses, rpm.mi, rpm.marginals
import rpm.ops, rpm.distributions, rpm.nn
after_import = imported()
torch.manual_seed(0)
model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, 2)),
                rpm.priors.ImplicitPrior(rpm.priors.RBFEnergy()))
x, x2 = torch.randn(16, 4), torch.randn(16, 4)
svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({{"lr": 1e-2}}), rpm.RPMELBO())
svi.step(x, x2)
before = [p.detach().clone() for p in model.parameters()]
optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2).backward()
optimiser.step()
moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
print(json.dumps({{"after_pyro": after_pyro, "after_import": after_import, "after_step": imported(),
                  "moved": moved, "rpm": sorted(m for m in sys.modules if m.startswith("rpm"))}}))
"""


def _blocking(tmp_path: pathlib.Path, modules: list[str]) -> dict[str, str]:
    """The environment of a Python process in which ``modules`` cannot be imported: a
    sitecustomize puts None in ``sys.modules`` for each (``import`` then raises
    ModuleNotFoundError and ``importlib.util.find_spec`` returns None, as for a package that is
    not installed), and this checkout's rpm comes first on the path."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in modules))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_the_core_imports_and_trains_without_the_experiments_packages(tmp_path):
    """Importing the core and training a small RPM (SVI and a torch.optim step with RPMELBO)
    imports none of the experiments' packages (nor Lightning) beyond what ``import pyro``
    imports itself (Pyro imports tqdm, a dependency of pyro-ppl); with scipy, scikit-learn,
    kornia, matplotlib and Lightning made unimportable, the same script runs."""
    script = _CORE_SCRIPT.format(extra=sorted([*EXPERIMENTS.values(), *LIGHTNING]))
    blocked = sorted(set(EXPERIMENTS.values()) - {"tqdm"} | set(LIGHTNING))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, env=_blocking(tmp_path, blocked), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report["after_pyro"]) <= {"tqdm"}, report["after_pyro"]
    assert report["after_import"] == report["after_pyro"]
    assert report["after_step"] == report["after_pyro"]
    assert report["moved"], "the torch.optim step changed no parameter"
    outside = [m for m in report["rpm"] if m.split(".")[1:2] and m.split(".")[1] in
               ("experiments", "data", "training", "metrics", "evaluation", "cli", "lightning")]
    assert not outside, f"the core imported {outside}"


def test_a_command_without_the_experiments_extra_names_it_in_one_line(tmp_path):
    """With matplotlib and scipy not importable, ``python -m rpm lds`` prints one line naming
    the missing packages and the extra's install command, exits 2, and writes nothing."""
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "rpm", "lds", "--out", str(out)],
                            capture_output=True, text=True, timeout=300,
                            env=_blocking(tmp_path, ["matplotlib", "scipy"]), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("python -m rpm lds: error: the commands need matplotlib, scipy,")
    assert lines[0].endswith("pip install 'rpm-pyro[experiments]'")
    assert not out.exists()
