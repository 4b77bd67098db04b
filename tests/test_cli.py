"""The ``rpm`` command: registry, help, exit statuses and messages (argparse range errors,
run-folder conflicts, unavailable device, non-finite loss)."""

import argparse
import importlib
import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import rpm.cli
from rpm.cli import SUBCOMMANDS, build_parser, main
from rpm.training.checkpoint import load_checkpoint

TOY = Path(__file__).parent / "training" / "toy_experiment.py"
EXPERIMENTS = Path(rpm.cli.__file__).parent / "experiments"


@pytest.fixture(scope="module")
def toy():
    spec = importlib.util.spec_from_file_location("toy_experiment", TOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _toy(toy, capsys, *argv):
    """Run ``rpm toy ARGV`` in this process: (exit status, stderr)."""
    try:
        status = main(["toy", *argv], modules=[toy])
    except SystemExit as exit:
        status = exit.code
    return status, capsys.readouterr().err


def test_every_experiment_module_is_registered_and_valid():
    defined = {
        ".".join(("rpm", "experiments", *path.relative_to(EXPERIMENTS).with_suffix("").parts))
        for path in EXPERIMENTS.rglob("*.py")
        if re.search(r"^def add_parser\(", path.read_text(), flags=re.M)
    }
    assert len(defined) >= 4, defined
    assert defined == set(SUBCOMMANDS), (
        f"add them to rpm.cli.SUBCOMMANDS: {defined - set(SUBCOMMANDS)}"
    )
    for name in SUBCOMMANDS:
        module = importlib.import_module(name)
        assert callable(module.add_parser) and callable(module.run)
    build_parser()  # every registered sub-command builds its parser


def test_python_m_rpm_without_subcommand_prints_help_and_exits_2():
    result = subprocess.run(
        [sys.executable, "-m", "rpm"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.startswith("usage: python -m rpm [-h] [--version] COMMAND")


def test_python_m_rpm_version_is_the_package_version():
    import rpm

    result = subprocess.run([sys.executable, "-m", "rpm", "--version"], capture_output=True,
                            text=True, timeout=120, check=True)
    assert result.stdout == f"rpm-pyro {rpm.__version__}\n"


def test_the_console_script_names_itself(toy, capsys, monkeypatch):
    """Run as the ``rpm-pyro`` script, usage and messages say ``rpm-pyro``; otherwise (``python
    -m rpm``, ``torchrun -m rpm``, a call from Python) they say ``python -m rpm``."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/rpm-pyro", "toy"])
    status, err = _toy(toy, capsys, "--lr", "0")
    assert status == 2 and err.startswith("usage: rpm-pyro toy ")
    monkeypatch.setattr(sys, "argv", ["/somewhere/rpm/__main__.py", "toy"])
    status, err = _toy(toy, capsys, "--lr", "0")
    assert status == 2 and err.startswith("usage: python -m rpm toy ")


def test_help_and_version(capsys, toy):
    with pytest.raises(SystemExit) as exit:
        main(["--help"], modules=[toy])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m rpm") and "toy" in out
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out.startswith("rpm-pyro 0.")
    with pytest.raises(SystemExit) as exit:
        main(["toy", "--help"], modules=[toy])
    out = capsys.readouterr().out
    for flag in ("--out", "--resume", "--overwrite", "--checkpoint-every", "--seed", "--device"):
        assert flag in out


def test_plain_text_renders_sphinx_markup_as_its_words():
    assert rpm.cli.plain_text(
        r"see :class:`~rpm.experiments.pendulum.model.GaussianKeypointEncoder`, "
        r":mod:`rpm.data.pendulum`, :math:`R^2`, :py:func:`the fit <rpm.x.fit>`, ``--steps``, "
        r"a\,b") == ("see GaussianKeypointEncoder, rpm.data.pendulum, R^2, the fit, --steps, "
                     "a b")


#: What a line of help may not break inside: a word, or one item of a comma-separated list.
_WORD = re.compile(r"[^\s,]+")


def _help_texts(parser):
    """The description and every help string of ``parser`` (its sub-commands' one-line helps
    included), as argparse expands them (``%(default)s``)."""
    formatter = parser._get_formatter()
    texts = [parser.description or ""]
    for action in parser._actions:
        actions = action._choices_actions if isinstance(action, argparse._SubParsersAction) \
            else [action]
        texts += [formatter._expand_help(a) for a in actions if a.help not in (None,
                                                                               argparse.SUPPRESS)]
    return texts


@pytest.mark.parametrize("columns", [50, 80, 132])
def test_every_commands_help_is_plain_text_and_splits_no_word(columns, capsys, monkeypatch):
    """``--help`` of every command shows no Sphinx markup, and lines break only between words
    (or after a list's commas): every word of the descriptions and help strings is whole."""
    monkeypatch.setenv("COLUMNS", str(columns))  # argparse's width
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(subparsers.choices) >= {"bouncing-balls", "digits", "identifiability", "lds",
                                       "pendulum"}
    for command, subparser in [(None, parser), *subparsers.choices.items()]:
        with pytest.raises(SystemExit):
            main([*([command] if command else []), "--help"])
        out = capsys.readouterr().out
        assert not re.search(r":[a-z]+:`", out) and "``" not in out and "\\" not in out, out
        rendered = set(_WORD.findall(out))
        words = {word for text in _help_texts(subparser)
                 for word in _WORD.findall(rpm.cli.plain_text(text))}
        assert words <= rendered, (command, sorted(words - rendered))
        if command == "digits":
            from rpm.experiments.digits.command import METHODS
            for name in METHODS:
                assert re.search(rf"(?<![\w]){name}(?![\w])", out), name


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--checkpoint-every", "-1"],
            "argument --checkpoint-every: expected a non-negative integer",
        ),
        (["--seed", "-3"], "argument --seed: expected a seed in [0, 2**32 - 1], got '-3'"),
        (["--lr", "0"], "argument --lr: expected a positive number (> 0), got '0'"),
        (["--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
        (["--dropout", "1.5"], "argument --dropout: expected a probability in [0, 1], got '1.5'"),
        (["--num-steps", "abc"], "argument --num-steps: expected an integer, got 'abc'"),
        (["--device", "gpu"], "argument --device: expected auto, cpu, cuda or cuda:N, got 'gpu'"),
        (["--resume", "--overwrite"], "argument --overwrite: not allowed with argument --resume"),
    ],
)
def test_out_of_range_arguments_exit_2_with_message(toy, capsys, tmp_path, argv, message):
    status, err = _toy(toy, capsys, "--out", str(tmp_path / "run"), *argv)
    assert status == 2
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_missing_out_is_an_argparse_error(toy, capsys):
    status, err = _toy(toy, capsys)
    assert status == 2 and "the following arguments are required: --out" in err


def test_existing_run_folder_needs_resume_or_overwrite(toy, capsys, tmp_path):
    flags = ["--out", str(tmp_path), "--num-steps", "4", "--no-progress", "--checkpoint-every", "2"]
    assert _toy(toy, capsys, *flags)[0] == 0
    first = load_checkpoint(tmp_path / "toy" / "checkpoint.pt")
    status, err = _toy(toy, capsys, *flags)
    assert status == 2
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert _toy(toy, capsys, *flags, "--overwrite", "--seed", "5")[0] == 0
    second = load_checkpoint(tmp_path / "toy" / "checkpoint.pt")
    assert not torch.equal(first["module"]["linear.weight"], second["module"]["linear.weight"])


def test_resume_errors(toy, capsys, tmp_path):
    status, err = _toy(toy, capsys, "--out", str(tmp_path / "none"), "--resume")
    assert status == 2 and "--resume: there is no run to resume in" in err
    flags = ["--out", str(tmp_path / "run"), "--num-steps", "3", "--no-progress"]
    assert _toy(toy, capsys, *flags)[0] == 0
    status, err = _toy(toy, capsys, *flags, "--resume", "--lr", "0.5")
    assert status == 2 and "--lr: was 0.05, now 0.5" in err


def test_unavailable_cuda_is_a_clear_error(toy, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    status, err = _toy(toy, capsys, "--out", str(tmp_path), "--device", "cuda")
    assert status == 2
    assert "--device cuda: CUDA is not available" in err and "--device cpu" in err


def test_nonfinite_loss_exits_1_naming_step_and_checkpoint(toy, capsys, tmp_path):
    status, err = _toy(
        toy,
        capsys,
        *["--out", str(tmp_path), "--num-steps", "20", "--checkpoint-every", "5"],
        *["--nan-at-step", "7", "--no-progress", "--log-every", "3"],
    )
    assert status == 1
    assert "non-finite loss (nan) at step 7" in err
    assert f"last good checkpoint is {tmp_path / 'toy' / 'checkpoint.pt'} (step 5)" in err
    assert load_checkpoint(tmp_path / "toy" / "checkpoint.pt")["step"] == 5


def test_module_without_the_interface_is_rejected():
    with pytest.raises(TypeError, match="must define add_parser"):
        build_parser([types.ModuleType("broken")])
    incomplete = types.ModuleType("incomplete")
    incomplete.add_parser = lambda subparsers: subparsers.add_parser("incomplete")
    incomplete.run = lambda args: 0
    with pytest.raises(RuntimeError, match="did not set func=run"):
        main(["incomplete"], modules=[incomplete])


def _fresh_python(code: str) -> str:
    """Runs ``code`` in a new interpreter importing rpm from this checkout; returns stdout."""
    root = str(Path(__file__).resolve().parents[1])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120, env={"PYTHONPATH": root, "PATH": ""})
    return result.stdout


def test_rpm_help_builds_every_parser_without_torch_pyro_or_matplotlib():
    code = (
        "import sys, contextlib, io\n"
        "from rpm.cli import main\n"
        "for argv in ([], ['identifiability'], ['bouncing-balls']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as text:\n"
        "        try: main([*argv, '--help'])\n"
        "        except SystemExit: pass\n"
        "    assert 'usage: python -m rpm' in text.getvalue(), text.getvalue()\n"
        "print(sorted(m for m in ('torch', 'pyro', 'matplotlib', 'numpy') if m in sys.modules))\n"
    )
    assert _fresh_python(code).strip() == "[]"


@pytest.mark.slow
def test_import_rpm_leaves_out_the_trainer_tqdm_and_matplotlib():
    heavy = "('tqdm', 'matplotlib', 'rpm.training', 'rpm.training.trainer')"
    code = (
        "import sys\n"
        "import rpm\n"
        f"print(sorted(m for m in {heavy} if m in sys.modules))\n"
        "rpm.RPM, rpm.RPMELBO, rpm.priors.ImplicitPrior, rpm.marginals.MixtureMarginal\n"
        f"print(sorted(m for m in {heavy} if m in sys.modules and m != 'tqdm'))\n"
    )
    assert _fresh_python(code).split() == ["[]", "[]"]


def test_flag_choices_written_in_the_commands_match_the_library():
    from rpm.data.synthetic import CONDITIONALS, MARGINALS, SPACES
    from rpm.experiments.identifiability import command, model
    from rpm.experiments.identifiability.encoder import ENCODER_SPACES

    assert (command.SPACES, command.MARGINALS, command.CONDITIONALS) == (
        SPACES, MARGINALS, CONDITIONALS)
    assert command.ENERGIES == model.ENERGIES and command.ENCODER_SPACES == ENCODER_SPACES


def test_distribution_and_script_names_are_not_the_unrelated_rpms():
    """PyPI's "rpm" is another project, and ``rpm`` is the RPM package manager's command: the
    distribution and its one console script are rpm-pyro; the import name stays rpm."""
    import configparser

    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    assert setup["metadata"]["name"] == "rpm-pyro"
    assert setup["options.entry_points"]["console_scripts"].strip() == "rpm-pyro = rpm.cli:main"
