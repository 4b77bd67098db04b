"""What a release ships: the licence the metadata names, the typing marker, the changelog, one
version written in one place, and the test dependencies pinned to the versions the suite runs
on."""

import configparser
import pathlib
import re
import shutil

import pytest

import rpm

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
