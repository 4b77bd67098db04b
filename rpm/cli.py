"""The command line of rpm: ``python -m rpm COMMAND`` (or the installed script ``rpm-pyro
COMMAND``, named so as not to shadow the RPM package manager's ``rpm``), one sub-command per
experiment.

An experiment module registers itself by being listed in :data:`SUBCOMMANDS`; it provides

* ``add_parser(subparsers) -> None``: adds its sub-parser (with the run flags of
  :func:`rpm.experiments.common.add_common_arguments`, the training flags of
  :func:`rpm.experiments.common.add_training_arguments` and, for a command that trains on a
  file, ``--data`` of :func:`rpm.experiments.data_file.add_data_file_argument`, each with the
  command's defaults) and sets ``func=run`` as a default;
* ``run(args) -> int``: runs the experiment and returns the exit status.

``main`` turns the predictable failures into one-line messages and exit statuses instead of
tracebacks:

* exit 2 (like an argparse error): :class:`~rpm.experiments.common.ConfigurationError` (a bad
  flag or folder), :class:`~rpm.training.run_folder.RunFolderError` (a folder held by another
  process, made by another command, or with an edited configuration),
  :class:`~rpm.training.checkpoint.CheckpointError` (a truncated, empty, damaged or unsafe
  checkpoint), :class:`OSError` (a folder that cannot be written, e.g. made read-only during
  the run); and, before anything is written, a package of the ``experiments`` extra (scipy,
  scikit-learn, kornia, matplotlib, tqdm: the core installs without them) that is not
  installed, with the ``pip install`` command of the extra;
* exit 1: :class:`~rpm.training.trainer.NonFiniteLossError`;
* exit 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM):
  :class:`~rpm.training.trainer.TrainingInterrupted`, with the hint to rerun with ``--resume``;
  a Ctrl-C outside training (start-up, evaluation, figures) exits 130 too, with one line. The
  message starts on a new line when stderr is a terminal (which has echoed ``^C``).

Every parser takes no abbreviations (``--epoch`` is not ``--epochs``) and reads a negative
number such as ``-1e-3`` as a value (so that ``--lr -1e-3`` gets the range error of ``--lr``).
``main`` records on the parsed arguments which flags were written on the command line
(``args.given_flags``), so that ``--resume`` takes the others from the run's saved
configuration, and the command line itself (``args.command_line``), kept in the run's record.

Help is plain text (:class:`PlainHelpFormatter`, in the parser and every sub-parser): the
commands' descriptions are their module docstrings, whose Sphinx markup (roles such as
``:class:``, double backticks, backslash escapes) is rendered as the words it stands for
(:func:`plain_text`), and lines break only between words or after the commas of a list
(``infonce,ntxent,...``), never inside a word or at a hyphen.

Building the parser imports neither torch nor Pyro nor matplotlib (an experiment module
imports them inside ``run``), so that ``python -m rpm --help`` answers at once.

More than one process: ``torchrun --nproc_per_node=K -m rpm EXPERIMENT ...``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import shlex
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from rpm.experiments.common import COMMAND_LINE, GIVEN_FLAGS, ConfigurationError
from rpm.training.run_folder import RunFolderError

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_USAGE", "PROG", "PlainHelpFormatter", "SCRIPT",
           "SUBCOMMANDS", "build_parser", "main", "plain_text"]

#: The documented way to run the commands, and the name of the installed console script.
PROG = "python -m rpm"
SCRIPT = "rpm-pyro"

#: Modules of the experiments, one sub-command each.
SUBCOMMANDS: tuple[str, ...] = (
    "rpm.experiments.bouncing_balls.command",
    "rpm.experiments.causal_ident.command",
    "rpm.experiments.content_style.command",
    "rpm.experiments.digits.command",
    "rpm.experiments.identifiability.command",
    "rpm.experiments.lds.command",
    "rpm.experiments.masks.command",
    "rpm.experiments.mutual_information.command",
    "rpm.experiments.pendulum.command",
    "rpm.experiments.rpm_hmm.command",
    "rpm.experiments.peer_supervision.command",
    "rpm.experiments.benchmark.command",
    "rpm.experiments.uncertainty.command",
)

EXIT_FAILURE = 1  # the run failed (non-finite loss)
EXIT_USAGE = 2  # bad command line, as argparse

#: The distributions of the ``experiments`` extra (setup.cfg), by the top-level name they are
#: imported as: the commands need them, the core (``rpm.priors``, ``rpm.models``, ...) does not.
_EXPERIMENTS_EXTRA = {"kornia": "kornia", "matplotlib": "matplotlib", "scipy": "scipy",
                     "sklearn": "scikit-learn", "tqdm": "tqdm"}
#: The command that installs them.
_INSTALL_EXPERIMENTS = "pip install 'rpm-pyro[experiments]'"


#: A Sphinx role, ``:role:`target``` or ``:domain:role:`text <target>```, ``~`` for the last part.
_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")
#: Backslash escapes of reST (``\,``, ``\ ``): a space.
_ESCAPE = re.compile(r"\\[, ]")


def _role_text(match: re.Match) -> str:
    shorten, text = match.group(1), match.group(2)
    return text.rsplit(".", 1)[-1] if shorten else text


def plain_text(text: str) -> str:
    """``text`` (reST from a docstring) as plain words: a Sphinx role (``:class:``, ``:mod:``,
    ``:math:``, ...) becomes its text, the last part of the target when it starts with ``~``
    and the label of a ``label <target>`` form; double backticks are dropped and a backslash
    escape (a thin space) is a space."""
    text = _ROLE.sub(_role_text, text)
    return _ESCAPE.sub(" ", text.replace("``", ""))


class _ListWrapper(textwrap.TextWrapper):
    """Breaks lines between words or after a comma inside a word (a list such as
    ``infonce,ntxent,rbf``), never inside a word or at a hyphen; a longer word overflows."""

    wordsep_re = re.compile(r"(\s+)|(?<=,)(?=[^\s,])")

    def __init__(self, width: int, indent: str = ""):
        super().__init__(width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=True)  # True: wordsep_re


class PlainHelpFormatter(argparse.HelpFormatter):
    """argparse's help formatter on :func:`plain_text` of every description and help string,
    wrapped only between words or after a list's commas (``_ListWrapper``)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        text = self._whitespace_matcher.sub(" ", plain_text(text)).strip()
        return _ListWrapper(width).wrap(text)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = self._whitespace_matcher.sub(" ", plain_text(text)).strip()
        return _ListWrapper(width, indent).fill(text)


def _load(module: str | ModuleType) -> ModuleType:
    if isinstance(module, str):
        module = importlib.import_module(module)
    for name in ("add_parser", "run"):
        if not callable(getattr(module, name, None)):
            raise TypeError(f"experiment module {module.__name__} must define {name}()")
    return module


def _invoked_as() -> str:
    """:data:`SCRIPT` when this process is the console script, else :data:`PROG`."""
    return SCRIPT if Path(sys.argv[0]).stem == SCRIPT else PROG


def build_parser(modules: Iterable[str | ModuleType] | None = None,
                 prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the commands, one sub-command per experiment module.

    :param modules: module names or modules providing ``add_parser`` and ``run``;
        default :data:`SUBCOMMANDS`.
    :param prog: the program name its usage and errors show; default :data:`SCRIPT` in the
        console script, :data:`PROG` otherwise (``python -m rpm``, ``torchrun -m rpm``, a call
        from Python).
    """
    from rpm import __version__

    parser = argparse.ArgumentParser(
        prog=_invoked_as() if prog is None else prog,
        description="Recognition parameterised models: run the experiments of the papers.",
        allow_abbrev=False, formatter_class=PlainHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rpm-pyro {__version__}")
    subparsers = parser.add_subparsers(title="experiments", dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS if modules is None else modules:
        _load(module).add_parser(subparsers)
    _habits(parser)
    return parser


#: What argparse takes for a negative number (so a value, not a flag): with an exponent,
#: ``inf`` and ``nan`` too, which argparse's own pattern leaves out (``-1e-3``).
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$",
                              re.IGNORECASE)


def _habits(parser: argparse.ArgumentParser) -> None:
    """No abbreviations, negative numbers as values and plain help
    (:class:`PlainHelpFormatter`), in the parser and every sub-parser."""
    parser.allow_abbrev = False
    parser.formatter_class = PlainHelpFormatter
    parser._negative_number_matcher = _NEGATIVE_NUMBER
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _habits(subparser)


def _suppress_defaults(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _suppress_defaults(subparser)
        elif action.dest not in ("help", "version"):
            action.default = argparse.SUPPRESS
            action.required = False


def _given_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> frozenset[str]:
    """The destinations of the flags written in ``argv``: ``parser`` parses it again with
    every default suppressed, so that only the written flags appear in the namespace."""
    _suppress_defaults(parser)
    given = vars(parser.parse_args(argv))
    return frozenset(key for key in given if key not in ("command", "func"))


def main(
    argv: Sequence[str] | None = None, *, modules: Iterable[str | ModuleType] | None = None,
    prog: str | None = None,
) -> int:
    """Entry point of ``python -m rpm`` and of the ``rpm-pyro`` console script.

    :param argv: the arguments, default ``sys.argv[1:]``.
    :param modules: the experiment modules, default :data:`SUBCOMMANDS`.
    :param prog: the program name of the usage, the messages and the recorded command line;
        default as :func:`build_parser`.
    :returns: the exit status (argparse errors exit with status 2 through ``SystemExit``).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = _invoked_as() if prog is None else prog
    parser = build_parser(modules, prog)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    run = getattr(args, "func", None)
    if run is None:
        raise RuntimeError(f"sub-command {args.command!r} did not set func=run in add_parser")
    setattr(args, GIVEN_FLAGS, _given_flags(build_parser(modules, prog), argv))
    setattr(args, COMMAND_LINE, shlex.join([*prog.split(), *argv]))
    prog = f"{prog} {args.command}"
    rank = int(os.environ.get("RANK", "0"))  # set by torchrun
    if rank:
        prog = f"{prog} (process {rank})"
    missing = _missing_from_experiments_extra()
    if missing:
        _say(f"{prog}: error: the commands need {', '.join(missing)}, not installed (the core "
             f"installs without them); install the experiments extra: {_INSTALL_EXPERIMENTS}")
        return EXIT_USAGE
    # The trainer's and the checkpoints' errors are looked up only when an error is caught
    # (_loaded): importing their modules would import torch before a command has checked its
    # flags and its --data file, which it does first.
    try:
        return int(run(args))
    except (ConfigurationError, RunFolderError) + _loaded(_CHECKPOINT, "CheckpointError") as err:
        _say(f"{prog}: error: {_one_line(err)}")
        return EXIT_USAGE
    except OSError as err:
        where = f" {err.filename}" if err.filename else ""
        _say(f"{prog}: error: cannot write or read{where} ({err.strerror or err}); fix the "
             "folder's permissions or free space, then rerun with --resume to continue from the "
             "last checkpoint")
        return EXIT_USAGE
    except _loaded(_TRAINER, "NonFiniteLossError") as err:
        _say(f"{prog}: {_one_line(err)}")
        return EXIT_FAILURE
    except _loaded(_TRAINER, "TrainingInterrupted") as interrupted:
        stop = cast(Any, interrupted)  # a TrainingInterrupted: step, checkpoint_path, signal
        if not rank:  # every process of a torchrun stops at the same step: say it once
            _say(f"{prog}: interrupted at step {stop.step}; checkpoint saved to "
                 f"{stop.checkpoint_path}; rerun with --resume to continue", after_signal=True)
        return 128 + int(stop.signal_number)
    except KeyboardInterrupt:
        _say(f"{prog}: interrupted (Ctrl-C) outside training; the checkpoints already saved "
             "are intact: rerun with --resume to continue", after_signal=True)
        return EXIT_INTERRUPTED


EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention

_CHECKPOINT = "rpm.training.checkpoint"
_TRAINER = "rpm.training.trainer"


def _loaded(module: str, name: str) -> tuple[type[BaseException], ...]:
    """``(module.name,)`` when ``module`` has been imported, else ``()`` (an ``except`` clause
    that catches nothing): an exception of a class defined there cannot have been raised before
    its module was imported, so the lookup never imports it (nor torch with it)."""
    loaded = sys.modules.get(module)
    return (getattr(loaded, name),) if loaded is not None else ()


def _missing_from_experiments_extra() -> list[str]:
    """The distributions of the ``experiments`` extra that are not installed (found by
    ``importlib.util.find_spec``, without importing them), in the order of their import names."""
    return [distribution for name, distribution in sorted(_EXPERIMENTS_EXTRA.items())
            if importlib.util.find_spec(name) is None]


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _say(message: str, after_signal: bool = False) -> None:
    """Print a message on stderr on a line of its own (after the terminal's ``^C`` echo)."""
    stream = sys.stderr
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    print(("\n" if after_signal and terminal else "") + message, file=stream, flush=True)
