"""The ``rpm`` command: one sub-command per experiment.

An experiment module registers itself by being listed in :data:`SUBCOMMANDS`; it provides

* ``add_parser(subparsers) -> None``: adds its sub-parser (usually with
  :func:`rpm.experiments.common.add_common_arguments`) and sets ``func=run`` as a default;
* ``run(args) -> int``: runs the experiment and returns the exit status.

``main`` turns the predictable failures into one-line messages and exit statuses instead of
tracebacks:

* exit 2 (like an argparse error): :class:`~rpm.experiments.common.ConfigurationError` (a bad
  flag or folder), :class:`~rpm.training.run_folder.RunFolderError` (a folder held by another
  process, made by another command, or with an edited configuration),
  :class:`~rpm.training.checkpoint.CheckpointError` (a truncated, empty, damaged or unsafe
  checkpoint) and :class:`OSError` (a folder that cannot be written, e.g. made read-only during
  the run);
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

Building the parser imports neither torch nor Pyro nor matplotlib (an experiment module
imports them inside ``run``), so that ``rpm --help`` answers at once.

More than one process: ``torchrun --nproc_per_node=K -m rpm EXPERIMENT ...``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType

from rpm.experiments.common import COMMAND_LINE, GIVEN_FLAGS, ConfigurationError

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_USAGE", "SUBCOMMANDS", "build_parser", "main"]

#: Modules of the experiments, one sub-command each.
SUBCOMMANDS: tuple[str, ...] = (
    "rpm.experiments.bouncing_balls.command",
    "rpm.experiments.content_style.command",
    "rpm.experiments.digits.command",
    "rpm.experiments.identifiability.command",
    "rpm.experiments.lds.command",
    "rpm.experiments.pendulum.command",
)

EXIT_FAILURE = 1  # the run failed (non-finite loss)
EXIT_USAGE = 2  # bad command line, as argparse


def _load(module: str | ModuleType) -> ModuleType:
    if isinstance(module, str):
        module = importlib.import_module(module)
    for name in ("add_parser", "run"):
        if not callable(getattr(module, name, None)):
            raise TypeError(f"experiment module {module.__name__} must define {name}()")
    return module


def build_parser(modules: Iterable[str | ModuleType] | None = None) -> argparse.ArgumentParser:
    """The ``rpm`` argument parser with one sub-command per experiment module.

    :param modules: module names or modules providing ``add_parser`` and ``run``;
        default :data:`SUBCOMMANDS`.
    """
    from rpm import __version__

    parser = argparse.ArgumentParser(
        prog="rpm",
        description="Recognition parameterised models: run the experiments of the papers.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"rpm {__version__}")
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
    """No abbreviations and negative numbers as values, in the parser and every sub-parser."""
    parser.allow_abbrev = False
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
    argv: Sequence[str] | None = None, *, modules: Iterable[str | ModuleType] | None = None
) -> int:
    """Entry point of the ``rpm`` console script and of ``python -m rpm``.

    :param argv: the arguments, default ``sys.argv[1:]``.
    :param modules: the experiment modules, default :data:`SUBCOMMANDS`.
    :returns: the exit status (argparse errors exit with status 2 through ``SystemExit``).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    run = getattr(args, "func", None)
    if run is None:
        raise RuntimeError(f"sub-command {args.command!r} did not set func=run in add_parser")
    setattr(args, GIVEN_FLAGS, _given_flags(build_parser(modules), argv))
    setattr(args, COMMAND_LINE, shlex.join(["rpm", *argv]))
    prog = f"rpm {args.command}"
    rank = int(os.environ.get("RANK", "0"))  # set by torchrun
    if rank:
        prog = f"{prog} (process {rank})"
    try:
        # Imported only now: the trainer brings torch with it.
        from rpm.training.checkpoint import CheckpointError
        from rpm.training.run_folder import RunFolderError
        from rpm.training.trainer import NonFiniteLossError, TrainingInterrupted
    except KeyboardInterrupt:
        _say(f"{prog}: interrupted (Ctrl-C) during start-up; nothing was written",
             after_signal=True)
        return EXIT_INTERRUPTED
    try:
        return int(run(args))
    except (ConfigurationError, RunFolderError, CheckpointError) as err:
        _say(f"{prog}: error: {_one_line(err)}")
        return EXIT_USAGE
    except OSError as err:
        where = f" {err.filename}" if err.filename else ""
        _say(f"{prog}: error: cannot write or read{where} ({err.strerror or err}); fix the "
             "folder's permissions or free space, then rerun with --resume to continue from the "
             "last checkpoint")
        return EXIT_USAGE
    except NonFiniteLossError as err:
        _say(f"{prog}: {_one_line(err)}")
        return EXIT_FAILURE
    except TrainingInterrupted as err:
        if not rank:  # every process of a torchrun stops at the same step: say it once
            _say(f"{prog}: interrupted at step {err.step}; checkpoint saved to "
                 f"{err.checkpoint_path}; rerun with --resume to continue", after_signal=True)
        return 128 + int(err.signal_number)
    except KeyboardInterrupt:
        _say(f"{prog}: interrupted (Ctrl-C) outside training; the checkpoints already saved "
             "are intact: rerun with --resume to continue", after_signal=True)
        return EXIT_INTERRUPTED


EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention


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
