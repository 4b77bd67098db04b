"""The API reference builds: docs/ with Sphinx, offline (``-t offline``: no intersphinx
downloads) and without executing the tutorials (``-t no_execute``), warnings as errors
(``-W``) and every cross-reference of the docstrings, theory.md and the tutorials resolved
(``-n``, nitpicky)."""

import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytest.importorskip("sphinx", reason="the reference needs Sphinx: pip install -e '.[test]'")
pytest.importorskip("myst_nb", reason="the reference needs myst-nb: pip install -e '.[test]'")


def test_reference_builds_offline_with_warnings_as_errors(tmp_path):
    from sphinx.cmd.build import build_main

    source = tmp_path / "docs"  # a copy: the pages the build generates stay out of the checkout
    shutil.copytree(ROOT / "docs", source,
                    ignore=shutil.ignore_patterns("_build", "api", "tutorials", "__pycache__"))
    html = tmp_path / "html"
    status = build_main(["-t", "offline", "-t", "no_execute", "-W", "-n", "-q", "-b", "html",
                         str(source), str(html)])
    assert status == 0, "the reference has warnings: run the command of README's API reference"
    for page in ["index", "theory", "tutorials", "api/index", "api/rpm.priors", "api/rpm.models",
                 "api/rpm.inference", "api/rpm.distributions", "tutorials/01_infonce_is_an_rpm"]:
        assert (html / f"{page}.html").is_file(), f"{page}.html was not built"
    priors = (html / "api" / "rpm.priors.html").read_text()
    assert 'id="rpm.priors.RBFEnergy"' in priors  # documented at its home, the package
    index = (html / "api" / "index.html").read_text()
    assert 'href="rpm.models.html#rpm.models.RPM"' in index  # rpm.RPM links to it
    distributions = (html / "api" / "rpm.distributions.html").read_text()
    assert 'id="rpm.distributions.GaussianStateSpace"' in distributions  # the package is its home
    assert 'id="rpm.distributions.VonMisesFisher"' in distributions
    experiments = (html / "api" / "rpm.experiments.html").read_text()
    assert 'id="rpm.experiments.identifiability.encoder.MLPEncoder"' in experiments
