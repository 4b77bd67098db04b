"""What every experiment shares: the command-line flags, the run-folder contract, the resumed
configuration, one seeding scheme, the thread-count guard, the device and the environment
record of ``results.json``.

The run folder (``--out DIR``) of every experiment::

    DIR/
      .rpm-lock          held (flock) by the process writing DIR; a second one is refused
      .rpm-run           the run record: the command that made DIR, a copy of config.json
                         and its SHA-256, the segments (fresh start, each --resume) with
                         their command lines and wall times (rpm.training.run_folder);
                         --overwrite deletes only folders that have it (or only rpm's files)
      config.json        the flags of the run, written when it starts; --resume reads it and
                         refuses it if it differs from the record's copy
      results.json       scores, the configuration, the environment and the provenance (the
                         original command, every segment, their total wall time)
      *.png              figures
      NAME/              one folder per trained model (a prior, an energy):
        checkpoint.pt    the training state (rpm.training.checkpoint), weights-only loadable,
        checkpoint.pt.sha256   its SHA-256 (and the previous one's), checked on load,
        checkpoint.pt.prev     the previous checkpoint, used when the latest is damaged
        history.json     losses and held-out scores by step
        model.json       the model record: what rpm.load rebuilds the model from
                         (rpm.experiments.trained)

An experiment's ``run(args)`` is::

    with torch_threads(args.threads), open_run(args, may_grow=("steps",),
                                               validate=check_flags) as run:
        device = resolve_device(args.device)
        ...
        seed_everything(args.seed)                     # before building each model
        ... derived_seed(args.seed, "train", chunk) ...  # every other random stream
        write_json_atomic(run.path / "results.json", {..., **run.provenance()})

:func:`open_run` validates every flag (``validate``) before it creates or changes anything, so
that a refused command leaves no folder behind; on ``--resume`` it checks the recorded command
and configuration first, then validates the flags in force, and only then writes.

Errors the user can fix by changing the command line raise :class:`ConfigurationError` (and the
run folder's own :class:`~rpm.training.run_folder.RunFolderError`), which the ``rpm`` command
prints as a one-line message with exit status 2, like an argparse error.

This module does not import torch at import time, so that ``python -m rpm --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rpm._validation import check_choice, check_int
from rpm.training.run_folder import (
    LOCK_NAME,
    RECORD_NAME,
    RunFolderError,
    RunLock,
    config_digest,
    new_record,
    read_record,
    verify_config,
    write_record,
)

__all__ = [
    "COMMAND_LINE",
    "CONFIG_NAME",
    "ConfigurationError",
    "GIVEN_FLAGS",
    "RUN_MARKER",
    "Run",
    "SEED_PURPOSES",
    "add_common_arguments",
    "add_training_arguments",
    "at_least_two_frames",
    "check_batch_size",
    "contrastive_batch_size",
    "derived_seed",
    "check_models_resumable",
    "cpu_threads",
    "device_name",
    "environment",
    "fraction_of_frames",
    "nonnegative_float",
    "nonnegative_int",
    "momentum",
    "open_run",
    "positive_float",
    "positive_int",
    "prepare_run_dir",
    "probability",
    "read_run_config",
    "resolve_device",
    "save_run_config",
    "seed_everything",
    "seed_value",
    "torch_threads",
    "write_json_atomic",
]

#: Hidden file that marks a folder as an rpm run folder: the run record
#: (:mod:`rpm.training.run_folder`, written by :func:`prepare_run_dir`).
RUN_MARKER = RECORD_NAME
#: The run's configuration file.
CONFIG_NAME = "config.json"
#: Files an rpm run writes, recognised in a folder (or a model's subfolder) without the marker.
_RUN_FILES = frozenset({"checkpoint.pt", "checkpoint.pt.prev", "checkpoint.pt.sha256",
                        "history.json", "model.json", CONFIG_NAME, "results.json", LOCK_NAME})
_RUN_TEMPORARY = re.compile(
    r"^\.(checkpoint\.pt|history\.json|model\.json|config\.json|results\.json|rpm-run)\..*\.tmp$"
)
#: Attribute of the parsed arguments holding the names of the flags written on the command
#: line (set by :func:`rpm.cli.main`); on resume the others are read from ``config.json``.
GIVEN_FLAGS = "given_flags"
#: Attribute of the parsed arguments holding the command line as written (set by
#: :func:`rpm.cli.main`), recorded in the run's segments.
COMMAND_LINE = "command_line"
#: Arguments that are not part of a run's configuration.
_NOT_CONFIG = frozenset({"func", "command", GIVEN_FLAGS, COMMAND_LINE})
#: Flags that may differ from the saved configuration when a run is resumed: they change
#: where and how fast it runs and what it shows, never what it computes.
_RESUMABLE_FLAGS = frozenset(
    {"out", "resume", "overwrite", "device", "checkpoint_every", "progress", "threads"}
)
#: The purposes of :func:`derived_seed`; a purpose's number is its place here (append only:
#: reordering would change every run).
SEED_PURPOSES = ("mixing", "train", "eval", "test", "oracle", "data", "epoch", "drop", "restart")


class ConfigurationError(ValueError):
    """A command-line choice that cannot work (existing run folder, missing checkpoint,
    unavailable device, ...); the message says which flag to change."""


# --------------------------------------------------------------------------- argparse types
def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _parse_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1."""
    value = _parse_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (>= 1), got {text!r}")
    return value


def contrastive_batch_size(text: str) -> int:
    """argparse ``type=``: a contrastive minibatch size, an integer >= 2 (each pair's negatives
    are the other pairs of its minibatch, so one pair alone has none)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"expected a batch size >= 2 (the other pairs of the batch are the negatives), "
            f"got {text!r}")
    return value


def check_batch_size(batch_size: int, available: int | None, unit: str, *, what: str = "",
                     minimum: int = 2) -> None:
    """Refuse a ``--batch-size`` that the model or the data cannot take, before anything is
    written: fewer than ``minimum`` items (the recognition marginal of an RPM is a mixture over
    the batch, so one item alone has nothing to contrast), or more than the ``available``
    distinct training items a batch is drawn from (a larger batch only repeats items, and
    costs memory and time in proportion).

    :param int batch_size: the value of ``--batch-size``.
    :param available: the number of distinct training items (pairs, windows, images); None
        when every step draws fresh samples, so that there is no upper bound.
    :param str unit: what an item is, plural (``"windows"``), in the messages.
    :param str what: how ``available`` is counted, in words (``"200 sequences x 76 starts of
        a --window 25"``), added to the message.
    :param int minimum: the smallest batch the model takes.
    :raises ConfigurationError: one line naming the bound and the value to use.
    """
    if batch_size < minimum:
        raise ConfigurationError(
            f"--batch-size {batch_size}: a batch needs at least {minimum} {unit} (the "
            "recognition marginal is a mixture over the batch, so a lone one has nothing to "
            f"contrast); use --batch-size {minimum} or more")
    if available is not None and batch_size > available:
        counted = f" ({what})" if what else ""
        fix = (f"use --batch-size {available} or less, or give more data"
               if available >= minimum else "give more data")
        raise ConfigurationError(
            f"--batch-size {batch_size} is more than the {available} distinct training {unit}"
            f"{counted}: a larger batch only repeats them; {fix}")


def nonnegative_int(text: str) -> int:
    """argparse ``type=``: an integer >= 0."""
    value = _parse_int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer (>= 0), got {text!r}")
    return value


def seed_value(text: str) -> int:
    """argparse ``type=``: a seed in [0, 2**32 - 1], the range NumPy accepts."""
    value = _parse_int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, 2**32 - 1], got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse ``type=``: a finite number > 0."""
    value = _parse_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number (> 0), got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse ``type=``: a finite number >= 0."""
    value = _parse_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number (>= 0), got {text!r}")
    return value


def fraction_of_frames(text: str) -> float:
    """argparse ``type=``: a number in [0, 1), the probability of dropping a frame
    (``--drop-frames``, ``--eval-drop-frames``)."""
    value = _parse_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction of frames in [0, 1), got {text!r}")
    return value


def probability(text: str) -> float:
    """argparse ``type=``: a number in the closed interval [0, 1]."""
    value = _parse_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}")
    return value


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_threads(text: str) -> int:
    """argparse ``type=``: a number of CPU threads, 0 (torch's default) to the number of cores
    this process may use (more only makes the threads wait for each other)."""
    value = nonnegative_int(text)
    cores = _cpu_count()
    if value > cores:
        raise argparse.ArgumentTypeError(
            f"expected at most {cores}, the CPU cores this process may use, got {text!r}")
    return value


_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def device_name(text: str) -> str:
    """argparse ``type=``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def at_least_two_frames(text: str) -> int:
    """argparse ``type=``: an integer >= 2, a window or a sequence of at least 2 frames (a
    prior over the frames of one window has no dynamics with one frame)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 2 (a window needs at least 2 frames), got {text!r}")
    return value


def momentum(text: str) -> float:
    """argparse ``type=``: a momentum (of SGD, of a moving average) in [0, 1)."""
    value = _parse_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a momentum in [0, 1), got {text!r}")
    return value


def table_rows(rows: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse type for ``--rows`` of a command that reproduces a table: ``all``, or some of
    ``rows`` separated by commas, each at most once; the value is the chosen names in the
    table's order (the order of ``rows``).

    :param rows: the table's row names, in its order.
    :return: the type function (raises ``argparse.ArgumentTypeError`` naming the rows).
    """
    rows = list(rows)

    def parse(text: str) -> list[str]:
        if text.strip() == "all":
            return list(rows)
        names = [part.strip() for part in text.split(",")]
        unknown = [name for name in names if name not in rows]
        if unknown or not names or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(
                f"expected 'all' or distinct rows from {', '.join(rows)} separated by commas, "
                f"got {text!r}")
        return [name for name in rows if name in names]

    return parse


def add_common_arguments(
    parser: argparse.ArgumentParser,
    *,
    default_out: str | None = None,
    default_seed: int = 0,
    default_checkpoint_every: int = 1000,
    grow_flag: str | None = None,
) -> None:
    """Add the flags every experiment shares.

    ``--out DIR`` (required unless ``default_out`` is given), ``--resume`` / ``--overwrite``
    (mutually exclusive), ``--checkpoint-every STEPS`` (>= 0, 0 = only at the end),
    ``--seed INT``, ``--device {auto,cpu,cuda,cuda:N}``, ``--threads N`` and ``--no-progress``
    (sets ``args.progress = False``). The parser takes no abbreviations (``allow_abbrev``
    is turned off: ``--epoch 3`` is an error, not ``--epochs 3``).

    :param argparse.ArgumentParser parser: the experiment's sub-command parser.
    :param str default_out: default run folder; ``None`` makes ``--out`` required.
    :param int default_seed: default of ``--seed``.
    :param int default_checkpoint_every: default of ``--checkpoint-every``.
    :param str grow_flag: the flag that may grow on ``--resume`` to extend a run (e.g.
        ``"--epochs"``), named in the help of ``--resume``.
    """
    parser.allow_abbrev = False
    group = parser.add_argument_group("run")
    group.add_argument(
        "--out",
        metavar="DIR",
        required=default_out is None,
        default=default_out,
        help="run folder for checkpoints, history, results and figures"
        + ("" if default_out is None else f" (default: {default_out})"),
    )
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--resume", action="store_true",
        help="continue the run in --out from its checkpoints with the flags saved in its "
        "config.json (other flags are not needed"
        + (f"; {grow_flag} may grow to extend it)" if grow_flag else ")"),
    )
    exclusive.add_argument(
        "--overwrite", action="store_true", help="delete the previous run in --out and start afresh"
    )
    group.add_argument(
        "--checkpoint-every",
        type=nonnegative_int,
        default=default_checkpoint_every,
        metavar="STEPS",
        help="save a checkpoint every STEPS steps; 0: only at the end and on Ctrl-C "
        f"(default: {default_checkpoint_every})",
    )
    group.add_argument(
        "--seed",
        type=seed_value,
        default=default_seed,
        help=f"random seed (default: {default_seed})",
    )
    group.add_argument(
        "--device",
        type=device_name,
        default="auto",
        metavar="{auto,cpu,cuda,cuda:N}",
        help="where to train; auto: cuda if available, else cpu (default: auto); under "
        "torchrun each process takes cuda:LOCAL_RANK",
    )
    group.add_argument(
        "--threads", type=cpu_threads, default=1,
        help=f"CPU threads of torch, at most the {_cpu_count()} cores; 0: torch's default, one "
        "per core. One thread is the "
        "fastest for these small networks on a busy machine, where threads wait for each "
        "other (default: 1)",
    )
    group.add_argument(
        "--no-progress", dest="progress", action="store_false", help="hide the progress bar"
    )


#: The training flags the commands share, in the order they are added: destination -> (flag,
#: type, metavar, what the flag sets when the command does not say it in its own words).
_TRAINING_FLAGS: dict[str, tuple[str, Callable[[str], Any], str | None, str]] = {
    "steps": ("--steps", positive_int, None,
              "optimiser steps; on --resume it may grow to extend a run"),
    "batch_size": ("--batch-size", positive_int, None, "samples per minibatch"),
    "lr": ("--lr", positive_float, None, "peak learning rate of Adam"),
    "prior_lr": ("--prior-lr", positive_float, None,
                 "peak learning rate of the prior's parameters"),
    "warmup": ("--warmup", probability, None,
               "fraction of the steps with a linear warm-up, then a cosine decay to 0"),
    "eval_every": ("--eval-every", nonnegative_int, "STEPS",
                   "evaluate the held-out scores every STEPS steps; 0: at the end only"),
    "eval_samples": ("--eval-samples", positive_int, None,
                     "fresh samples of each held-out set"),
    "chunk_steps": ("--chunk-steps", positive_int, None,
                    "minibatches sampled at once on the device"),
}
#: What ``--batch-size`` is and checks (>= 2) in a contrastive command.
_CONTRASTIVE_BATCH = ("pairs per minibatch, >= 2 (each pair's negatives are the other pairs "
                      "of its minibatch)")


def _default_text(value: Any) -> str:
    """A default as its help shows it: ``1e-3`` rather than ``0.001`` below 0.01."""
    if isinstance(value, float) and 0 < abs(value) < 0.01:
        mantissa, exponent = f"{value:e}".split("e")
        return f"{float(mantissa):g}e{int(exponent)}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_training_arguments(
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, Any],
    *,
    contrastive: bool = False,
    descriptions: Mapping[str, str] | None = None,
) -> argparse._ArgumentGroup:
    """Add the ``training`` group with the training flags the commands share, each with the
    command's default; returns the group, for the command's own training flags.

    The flags, added in this order for those named in ``defaults`` (by destination):
    ``--steps`` (>= 1), ``--batch-size`` (>= 1; >= 2 when ``contrastive``), ``--lr`` (> 0),
    ``--prior-lr`` (> 0), ``--warmup`` (in [0, 1]), ``--eval-every STEPS`` (>= 0),
    ``--eval-samples`` (>= 1) and ``--chunk-steps`` (>= 1). Each help string is the command's
    description of the flag (``descriptions``, by destination) or the shared one, followed by
    ``(default: VALUE)``.

    :param argparse.ArgumentParser parser: the command's sub-parser.
    :param defaults: destination -> default, e.g. ``{"steps": 600, "lr": 3e-3}``; only these
        flags are added.
    :param bool contrastive: whether a minibatch of ``--batch-size`` pairs gives each pair the
        others as negatives, so that ``--batch-size`` must be >= 2
        (:func:`contrastive_batch_size`).
    :param descriptions: destination -> what the flag means in this command (without the
        default), where the shared wording does not say it.
    :raises ValueError: a destination that is not a shared training flag, a description of a
        flag without a default, or a default that its flag would refuse.
    """
    descriptions = dict(descriptions or {})
    unknown = sorted(set(defaults).difference(_TRAINING_FLAGS))
    if unknown:
        raise ValueError(f"add_training_arguments: no shared training flag {', '.join(unknown)}; "
                         f"the shared ones are {', '.join(_TRAINING_FLAGS)}")
    undefaulted = sorted(set(descriptions).difference(defaults))
    if undefaulted:
        raise ValueError(f"add_training_arguments: descriptions of {', '.join(undefaulted)} "
                         "without a default: give each flag described a default too")
    group = parser.add_argument_group("training")
    for dest, (flag, parse, metavar, description) in _TRAINING_FLAGS.items():
        if dest not in defaults:
            continue
        if dest == "batch_size" and contrastive:
            parse, description = contrastive_batch_size, _CONTRASTIVE_BATCH
        default = defaults[dest]
        try:
            parse(str(default))
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"add_training_arguments: the default of {flag}, {default!r}, is "
                             f"refused by the flag itself ({err})") from None
        group.add_argument(flag, type=parse, default=default, metavar=metavar,
                           help=f"{descriptions.get(dest, description)} (default: "
                           f"{_default_text(default)})")
    return group


# --------------------------------------------------------------------------- run folder
def _is_ours(entry: Path) -> bool:
    if entry.is_dir() and not entry.is_symlink():  # a model's subfolder
        return all(_is_ours(child) and child.is_file() for child in entry.iterdir())
    return entry.is_file() and (
        entry.name in _RUN_FILES
        or entry.name == RUN_MARKER
        or bool(_RUN_TEMPORARY.match(entry.name))
    )


def _clear(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.name == LOCK_NAME:  # held by this process
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _user_error(err: OSError, what: str) -> ConfigurationError:
    return ConfigurationError(f"{what} ({err.strerror or err}): choose a writable --out")


def prepare_run_dir(out: str | os.PathLike, resume: bool = False, overwrite: bool = False,
                    command: str | None = None) -> Path:
    """Check and prepare the run folder ``out`` (module docstring).

    * fresh run (neither flag): ``out`` must not exist or be empty; it is created and gets a
      new run record for ``command``;
    * ``resume``: ``out`` must hold a run record of this rpm (and, when ``command`` is given,
      of the same command) and ``config.json``;
    * ``overwrite``: the previous run's content is deleted, but only if ``out`` is a run folder
      (it holds the :data:`RUN_MARKER` written here, or only files and model subfolders of
      files an rpm run writes); any other non-empty folder is refused, never deleted.

    Call it holding the folder's lock (:func:`open_run` does).

    :param path-like out: the run folder.
    :param bool resume: continue a previous run.
    :param bool overwrite: start afresh, deleting the previous run.
    :param str command: the experiment (``bouncing-balls``, ``identifiability``).
    :returns: the folder, as a :class:`~pathlib.Path`.
    :raises ConfigurationError: on any of the conflicts above, naming the flag to use.
    :raises RunFolderError: if the folder was made by another command or an older rpm.
    """
    out = Path(out)
    if resume and overwrite:
        raise ConfigurationError("--resume and --overwrite exclude each other: choose one")
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"--out {out} is a file, not a folder: choose another --out")
    if resume:
        if not (out / CONFIG_NAME).exists() and not (out / RUN_MARKER).exists():
            raise ConfigurationError(
                f"--resume: there is no run to resume in {out} (no {CONFIG_NAME}); start a fresh "
                "run without --resume"
                + (" (add --overwrite if the folder holds a failed run)" if _is_run_folder(out)
                   else ""))
        if (out / "checkpoint.pt").is_file():
            raise ConfigurationError(
                f"--resume: {out} was written by an older rpm (its checkpoint.pt is not in a "
                "model's subfolder) and cannot be continued; start afresh with --overwrite"
            )
        record = read_record(out)
        if record is None:
            raise RunFolderError(
                f"--resume: {out} has no run record ({RUN_MARKER}): it was not made by this rpm "
                "and cannot be continued safely; start afresh with --overwrite")
        if command is not None and record.get("command") not in (None, command):
            from rpm.cli import PROG

            raise RunFolderError(
                f"--resume: {out} is a run of `{PROG} {record['command']}`, not of `{PROG} "
                f"{command}`; continue it with `{PROG} {record['command']} --resume --out {out}`")
        if not (out / CONFIG_NAME).is_file():
            raise RunFolderError(f"--resume: {out / CONFIG_NAME} is missing or not a file: the "
                                 "run cannot be resumed; start afresh with --overwrite")
        return out
    entries = (sorted(e for e in out.iterdir() if e.name not in (RUN_MARKER, LOCK_NAME))
               if out.is_dir() else [])
    if entries and not overwrite:
        shown = f"{', '.join(e.name for e in entries[:4])}{', ...' if len(entries) > 4 else ''}"
        if not _is_run_folder(out):
            raise ConfigurationError(
                f"--out {out} is not empty ({shown}) and is not an rpm run folder: choose "
                "another --out (rpm never deletes folders it did not write)")
        raise ConfigurationError(
            f"--out {out} already holds a run ({shown}): pass --resume to continue it or "
            "--overwrite to delete it and start afresh"
        )
    if entries and not _is_run_folder(out):
        foreign = [e.name for e in entries if not _is_ours(e)]
        raise ConfigurationError(
            f"refusing to --overwrite {out}: it is not an rpm run folder (no "
            f"{RUN_MARKER} marker) and holds files rpm did not write "
            f"({', '.join(foreign[:4])}{', ...' if len(foreign) > 4 else ''}); "
            "choose another --out or delete the folder yourself"
        )
    try:
        if entries:
            _clear(out)
        out.mkdir(parents=True, exist_ok=True)
        write_record(out, new_record(command))
    except OSError as err:
        raise _user_error(err, f"cannot write the run folder {out}") from None
    return out


def _is_run_folder(out: Path) -> bool:
    """``out`` has the run marker, or holds only files (and model subfolders) rpm writes."""
    if (out / RUN_MARKER).is_file():
        return True
    entries = [e for e in out.iterdir()] if out.is_dir() else []
    return all(_is_ours(e) for e in entries)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _config_of(args: argparse.Namespace) -> dict:
    config = {}
    for key, value in sorted(vars(args).items()):
        if key in _NOT_CONFIG:
            continue
        if isinstance(value, Path):
            value = str(value)
        try:
            json.dumps(value)
        except TypeError:
            continue
        config[key] = value
    return config


def _resumed_config(path: Path, args: argparse.Namespace, saved: dict,
                    may_change: Iterable[str], may_grow: Iterable[str]) -> dict:
    """The configuration in force on resume (``args`` updated in place), without writing."""
    config = _config_of(args)
    given = getattr(args, GIVEN_FLAGS, None)
    free = _RESUMABLE_FLAGS | set(may_change)
    grow = set(may_grow)
    changed = []
    for key in sorted(set(saved) | set(config)):
        if key in ("out", "resume", "overwrite") or key not in saved:
            continue
        if given is not None and key not in given:
            config[key] = saved[key]
            setattr(args, key, saved[key])
            continue
        new = config.get(key)
        if new == saved[key] or key in free:
            continue
        if key in grow and isinstance(new, (int, float)) and new > saved[key]:
            continue
        hint = " (it may only grow, to extend the run)" if key in grow else ""
        changed.append(f"{_flag(key)}: was {saved[key]!r}, now {new!r}{hint}")
    if changed:
        raise ConfigurationError(
            "--resume must continue the same experiment, but "
            + "; ".join(changed)
            + f" (saved in {path}); drop these flags to use the saved values"
        )
    missing = sorted(set(config) - set(saved) - {"out", "resume", "overwrite"})
    if missing:
        raise RunFolderError(
            f"{path} lacks the flags {', '.join(_flag(key) for key in missing)} of this command: "
            "it was edited or written by another rpm; start afresh with --overwrite")
    return config


def _write_config(out: Path, config: dict) -> None:
    record = read_record(out)
    if record is not None:
        record["previous_config"] = record.get("config")
        record["config"] = config
        record["config_sha256"] = config_digest(config)
        write_record(out, record)
    write_json_atomic(out / CONFIG_NAME, config)


def _saved_config(out: Path) -> dict:
    record = read_record(out)
    if record is not None:
        return verify_config(out, record, CONFIG_NAME)
    path = out / CONFIG_NAME
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise RunFolderError(f"cannot read {path} ({err}): restore it or start afresh with "
                             "--overwrite") from None
    if not isinstance(saved, dict):
        raise RunFolderError(f"{path} holds a {type(saved).__name__}, not the run's "
                             "configuration: restore it or start afresh with --overwrite")
    return saved


def save_run_config(
    out: str | os.PathLike,
    args: argparse.Namespace,
    resume: bool = False,
    may_change: Iterable[str] = (),
    may_grow: Iterable[str] = (),
) -> dict:
    """Record the command-line configuration in ``out/config.json`` (and its copy and SHA-256 in
    the run record); on resume, read it back.

    On resume, ``config.json`` is first checked against the run record's copy (an edited or
    incomplete file is refused, naming the keys). Every flag not written on the command line
    (``args.given_flags``, set by the ``rpm`` command; when absent every flag counts as
    written) takes its saved value, in ``args`` too, so that ``rpm EXPERIMENT --resume --out
    DIR`` needs no other flag. A written flag must equal the saved value, except ``out``,
    ``resume``, ``overwrite``, ``device``, ``checkpoint_every``, ``threads``, ``progress`` and
    those in ``may_change``, which may differ, and those in ``may_grow`` (e.g. ``steps``), which
    may grow to extend the run. The file is then rewritten with the values in force.

    :param path-like out: the run folder.
    :param argparse.Namespace args: the parsed arguments (``func``, ``command``,
        ``given_flags`` and other non-JSON values are skipped); updated in place on resume.
    :param bool resume: read the saved configuration instead of starting one.
    :param may_change: further argument names allowed to differ on resume.
    :param may_grow: numeric argument names allowed to grow (not shrink) on resume.
    :returns: the configuration in force, as a dict.
    :raises ConfigurationError: if a resumed run's written flags differ from the saved ones.
    :raises RunFolderError: if ``config.json`` is malformed, incomplete or edited.
    """
    out = Path(out)
    path = out / CONFIG_NAME
    if not (resume and path.exists()):
        config = _config_of(args)
    else:
        config = _resumed_config(path, args, _saved_config(out), may_change, may_grow)
    _write_config(out, config)
    return config


def read_run_config(args: argparse.Namespace) -> dict:
    """Give the flags not written on the command line their values saved in the run's
    ``config.json`` (what :func:`save_run_config` does on resume, without the checks or a
    write: for the other processes of a ``torchrun``, once process 0 has checked and written).

    :returns: the saved configuration.
    """
    saved = json.loads((Path(args.out) / CONFIG_NAME).read_text())
    given = getattr(args, GIVEN_FLAGS, None)
    for key, value in saved.items():
        if key not in ("out", "resume", "overwrite") and (given is None or key not in given):
            setattr(args, key, value)
    return saved


class Run:
    """An open run folder (yielded by :func:`open_run`): its path and its provenance.

    :ivar Path path: the run folder.
    :ivar dict record: the run record (:mod:`rpm.training.run_folder`).
    """

    def __init__(self, path: Path, record: dict, segment: int) -> None:
        self.path = path
        self.record = record
        self._segment = segment
        self._started = time.perf_counter()
        self._reported: float | None = None

    def elapsed(self) -> float:
        """Seconds since this segment started."""
        return time.perf_counter() - self._started

    def provenance(self) -> dict:
        """What ``results.json`` records about how the run was made: ``command``, the command
        line that started it; ``segments``, one per process that wrote the folder (the fresh
        start and every ``--resume``) with its command line, start time, wall time (seconds;
        ``None`` for a process that was killed before it could say) and end (``finished``,
        ``interrupted``, ``failed (ERROR)``, ``killed``); ``wall_time``, the sum of the
        segments' wall times, this one's up to now. The segment of the process writing the
        results says ``running`` until its block of :func:`open_run` ends, which records how
        it ended in the run record and in ``results.json`` (a process killed before then
        leaves ``running``)."""
        segments = [dict(segment) for segment in self.record["segments"]]
        self._reported = self.elapsed()  # a finished segment records the same number
        segments[self._segment]["wall_time"] = self._reported
        return {
            "command": segments[0]["command"],
            "segments": segments,
            "wall_time": sum(s["wall_time"] for s in segments if s["wall_time"] is not None),
        }

    def _finish(self, end: str) -> None:
        segment = self.record["segments"][self._segment]
        finished = end == "finished" and self._reported is not None
        segment.update(wall_time=self._reported if finished else self.elapsed(), end=end)
        try:
            record = read_record(self.path) or self.record
            record["segments"] = self.record["segments"]
            write_record(self.path, record)
        except (OSError, RunFolderError):
            pass  # the folder became unwritable: the error that ends the run says so
        if self._reported is not None:
            self._record_end_in_results(segment)

    def _record_end_in_results(self, segment: dict) -> None:
        """How this segment ended, in the ``results.json`` it wrote (its provenance said
        ``running``)."""
        path = self.path / "results.json"
        try:
            results = json.loads(path.read_text())
            written = results["segments"][self._segment]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return  # no results of this segment (or not ours): nothing to correct
        if written.get("start") != segment.get("start") or written.get("end") != "running":
            return
        written["end"] = segment["end"]
        try:
            write_json_atomic(path, results)
        except OSError:
            pass  # the folder became unwritable: the error that ends the run says so


def _command_line(args: argparse.Namespace) -> str:
    written = getattr(args, COMMAND_LINE, None)
    return written or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])


@contextlib.contextmanager
def open_run(args: argparse.Namespace, may_change: Iterable[str] = (),
             may_grow: Iterable[str] = (),
             validate: Callable[[argparse.Namespace], Any] | None = None) -> Iterator[Run]:
    """Open the run folder of ``args`` (``out``, ``resume``, ``overwrite``) for the length of
    the block: check the flags, lock the folder, prepare it, record the configuration and this
    segment; yields a :class:`Run`.

    The order makes every refusal leave the folder as it was: a fresh run or ``--overwrite``
    checks ``--device`` (:func:`resolve_device`) and calls ``validate(args)`` before creating
    or touching ``--out``; ``--resume`` takes the lock, checks the recorded command (another
    experiment's run is refused) and the integrity of ``config.json``
    (:func:`~rpm.training.run_folder.verify_config`), gives ``args`` the saved flags, checks
    ``--device`` and calls ``validate(args)``, and only then writes. The lock
    (:class:`~rpm.training.run_folder.RunLock`) refuses a second process on the same folder,
    naming the holder, and is released at the end of the block (or by the operating system
    when the process dies). At the end the segment's wall time and how it ended
    (``finished``, ``interrupted``, ``failed``) are recorded.

    :param may_change: further flags allowed to change on resume (:func:`save_run_config`).
    :param may_grow: flags allowed to grow on resume.
    :param validate: checks the flags (raises :class:`ConfigurationError`); it may fill
        ``args``.
    :raises ConfigurationError: on a bad flag or folder (one line, exit 2 from ``rpm``).
    :raises RunFolderError: if the folder is held, of another command, or edited.
    """
    command = getattr(args, "command", None)
    out = Path(args.out)
    if args.resume and args.overwrite:
        raise ConfigurationError("--resume and --overwrite exclude each other: choose one")
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"--out {out} is a file, not a folder: choose another --out")
    validate = _with_device_check(validate)
    if not args.resume:
        validate(args)
    created = not out.exists()
    if args.resume and created:
        prepare_run_dir(out, resume=True)  # raises: nothing to resume
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _user_error(err, f"cannot create --out {out}") from None
    lock = RunLock(out, _command_line(args))
    try:
        lock.acquire()
    except RunFolderError:
        if created:
            _remove_if_empty(out)
        raise
    run = None
    try:
        try:
            prepare_run_dir(out, resume=args.resume, overwrite=args.overwrite, command=command)
            if args.resume:
                config = _resumed_config(out / CONFIG_NAME, args, _saved_config(out), may_change,
                                         may_grow)
                validate(args)
            else:
                config = _config_of(args)
            _write_config(out, config)
            record = read_record(out)
            for segment in record["segments"]:
                if segment.get("end") == "running":  # its process died without a word
                    segment["end"] = "killed"
            record["segments"].append({"command": _command_line(args),
                                       "start": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                                       "wall_time": None, "end": "running"})
            write_record(out, record)
        except OSError as err:
            raise _user_error(err, f"cannot write the run folder {out}") from None
        except (ConfigurationError, RunFolderError):
            if created:
                lock.release()
                shutil.rmtree(out, ignore_errors=True)
            raise
        run = Run(out, record, len(record["segments"]) - 1)
        yield run
    except BaseException as err:
        if run is not None:
            interrupted = isinstance(err, KeyboardInterrupt) or type(err).__name__ == \
                "TrainingInterrupted"
            run._finish("interrupted" if interrupted else f"failed ({type(err).__name__})")
        raise
    else:
        run._finish("finished")
    finally:
        lock.release()


def _with_device_check(validate: Callable[[argparse.Namespace], Any] | None
                       ) -> Callable[[argparse.Namespace], None]:
    """``validate`` preceded by the check of ``--device`` (:func:`resolve_device`), so that a
    device this machine lacks is refused before the run folder is created or written."""
    def check(args: argparse.Namespace) -> None:
        if getattr(args, "device", None) is not None:
            resolve_device(args.device)
        if validate is not None:
            validate(args)
    return check


def check_models_resumable(out: str | os.PathLike, names: Iterable[str]) -> None:
    """On ``--resume``, refuse a run whose models' checkpoints were deleted with their folders.

    The models of a run train one after the other, in the order ``names``; each model folder
    holds ``checkpoint.pt`` (or at least its manifest, ``checkpoint.pt.sha256``) from its first
    checkpoint on. So a model without one is legitimate only after every model that has one and
    when the run has not finished (no ``results.json``); anything else means that a checkpoint
    was deleted, and training it again from step 0 would silently change the results.

    :param path-like out: the run folder.
    :param names: the model subfolders, in training order.
    :raises RunFolderError: naming the models whose checkpoints are missing.
    """
    out = Path(out)
    names = list(names)
    has = [(out / name / "checkpoint.pt").exists() or (out / name / "checkpoint.pt.sha256").exists()
           for name in names]
    last = max((i for i, present in enumerate(has) if present), default=-1)
    finished = (out / "results.json").exists()
    missing = [name for i, name in enumerate(names) if not has[i] and (finished or i < last)]
    if missing:
        why = "the run finished" if finished else f"{names[last]} trained after them"
        raise RunFolderError(
            f"--resume: the checkpoints of {', '.join(missing)} are missing from {out} although "
            f"{why}: restore them, or start afresh with --overwrite")


def _remove_if_empty(out: Path) -> None:
    try:
        out.rmdir()
    except OSError:
        pass


# --------------------------------------------------------------------------- device, threads
_LOCAL_RANK = "LOCAL_RANK"


def resolve_device(name: str):
    """The torch device for ``--device``: ``auto`` is ``cuda`` when available, else ``cpu``.
    Under ``torchrun`` (``LOCAL_RANK`` set) ``auto`` and ``cuda`` give ``cuda:LOCAL_RANK``, one
    GPU per process.

    :param str name: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    :rtype: torch.device
    :raises ConfigurationError: if CUDA (or device N) is asked for but not available.
    """
    import torch

    name = str(name)
    if not _DEVICE.match(name):
        raise ConfigurationError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and _LOCAL_RANK in os.environ:
        name = f"cuda:{int(os.environ[_LOCAL_RANK])}"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError(
                f"--device {name}: CUDA is not available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); use --device cpu or auto"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigurationError(
                f"--device {name}: only {count} CUDA device(s) (cuda:0 to cuda:{count - 1})"
            )
    return device


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[int]:
    """Run the block with ``threads`` CPU threads of torch (0: leave torch's default), then
    restore the calling process's setting. Yields the number of threads in force.

    :param int threads: >= 0.
    """
    import torch

    threads = check_int("threads", threads, minimum=0)
    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- seeding
def fit_or_resume(trainer, resume: bool, name: str) -> dict:
    """Trains with ``trainer`` (:class:`rpm.training.trainer.Trainer`) to its ``num_steps``: from
    the run folder's checkpoint when ``resume`` is asked for and a checkpoint exists (one line,
    on the main process, says at which step, or that the training had finished), else from the
    start.

    :param trainer: the trainer of one model of the run.
    :param bool resume: whether the command was given ``--resume``.
    :param str name: the model's name in the line printed.
    :return: the training history (:meth:`~rpm.training.trainer.Trainer.fit`).
    """
    from rpm import distributed

    resume = resume and trainer.has_checkpoint()  # a deleted checkpoint is an error in fit
    if resume and distributed.is_main_process():
        step = trainer.resume_state()["step"]  # verified (or the previous one, with a message)
        total = trainer.num_steps
        print(f"{name}: finished earlier ({step}/{total} steps), reloaded" if step == total
              else f"{name}: resuming at step {step}/{total}", flush=True)
    return trainer.fit(resume=resume)


def fit_with_cosine_schedule(model, optimizer, loss_fn, args: argparse.Namespace, out: Path,
                             name: str, eval_fn, *, log_every: int,
                             distributed: bool = False, after_step=None) -> dict:
    """Trains ``model`` for ``args.steps`` steps with ``optimizer``, its learning rates warmed up
    over the fraction ``args.warmup`` of the steps and then decayed to 0 along a cosine
    (:func:`rpm.training.schedule.cosine_schedule`), through a
    :class:`rpm.training.trainer.Trainer` writing to ``out``: ``eval_fn`` at the start and
    every ``args.eval_every`` steps (logged as ``val``), a checkpoint every
    ``args.checkpoint_every`` steps, resumed on ``args.resume`` (:func:`fit_or_resume`).

    :param model: the module trained (its ``state_dict`` is checkpointed).
    :param optimizer: a ``torch.optim`` optimizer over its parameters.
    :param loss_fn: the step's loss, a function of the step.
    :param args: the command's flags (``steps``, ``warmup``, ``eval_every``,
        ``checkpoint_every``, ``progress``, ``resume``).
    :param out: the model's folder.
    :param str name: the model's name in the progress lines.
    :param eval_fn: the validation scores, a function of the step.
    :param int log_every: steps between logged losses.
    :param bool distributed: train under ``torch.distributed`` (the Trainer's ``distributed``).
    :param after_step: called with the step after each optimiser step (the Trainer's
        ``after_step``: e.g. a queue's push), or None.
    :return: the training history.
    """
    import torch

    from rpm.training.schedule import cosine_schedule
    from rpm.training.trainer import Trainer

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  cosine_schedule(args.steps, args.warmup))
    trainer = Trainer(
        model, optimizer, loss_fn, out_dir=out, num_steps=args.steps, scheduler=scheduler,
        eval_fn=eval_fn, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
        log_every=log_every, progress=args.progress, description=name,
        eval_at_start=True, eval_label="val", distributed=distributed, after_step=after_step,
    )
    return fit_or_resume(trainer, args.resume, name)


def derived_seed(seed: int, purpose: str, index: int = 0) -> int:
    """The seed of one random stream of a run: a 63-bit integer drawn from
    ``numpy.random.SeedSequence([seed, purpose number, index])``, so that distinct purposes and
    indices give statistically independent streams and any stream can be redrawn alone (a
    resumed run needs no sampler state).

    The scheme of every experiment: :func:`seed_everything` with the run seed before building
    each model (so a model's initialisation does not depend on which others run with it), and
    ``derived_seed(seed, purpose, index)`` for every other stream (the data, the minibatches of
    chunk or epoch ``index``, the held-out sets).

    :param int seed: the run seed, >= 0.
    :param str purpose: one of :data:`SEED_PURPOSES`.
    :param int index: e.g. the chunk or epoch number, >= 0.
    """
    import numpy as np

    check_choice("purpose", purpose, SEED_PURPOSES)
    seed = check_int("seed", seed, minimum=0)
    index = check_int("index", index, minimum=0)
    words = np.random.SeedSequence([seed, SEED_PURPOSES.index(purpose), index]).generate_state(
        2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def seed_everything(seed: int) -> None:
    """Seed Python's :mod:`random`, NumPy's global generator, torch (CPU and CUDA) and Pyro.

    :param int seed: in [0, 2**32 - 1].
    """
    import random

    import numpy as np
    import pyro
    import torch

    seed = check_int("seed", seed, minimum=0, maximum=2**32 - 1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    pyro.set_rng_seed(seed)


# --------------------------------------------------------------------------- results
def _git_commit() -> str | None:
    """The commit of the source tree rpm is imported from, with ``+dirty`` when it has
    uncommitted changes; ``None`` outside a git work tree or without git."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def environment(device) -> dict:
    """What ``results.json`` records about where a run ran: the versions of Python, torch,
    Pyro, NumPy and rpm, the git commit of rpm's source when it is a git work tree, the
    platform, the device (with the GPU's name), torch's CPU threads and the number of
    processes (``torchrun``'s world size).

    :param torch.device device: the training device.
    """
    import numpy as np
    import pyro
    import torch

    import rpm

    device = torch.device(device)
    world_size = 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world_size = torch.distributed.get_world_size()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "numpy": np.__version__,
        "rpm": rpm.__version__,
        "git_commit": _git_commit(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically (temporary file, ``fsync``, rename).

    :param path-like path: destination file.
    :param obj: a JSON-serialisable object (non-finite floats are written as ``NaN`` /
        ``Infinity``, which Python's :mod:`json` reads back).
    :raises TypeError: if ``obj`` is not JSON-serialisable (the destination is untouched).
    """
    from rpm.training.checkpoint import atomic_write

    text = json.dumps(obj, indent=2).encode() + b"\n"
    return atomic_write(path, lambda f: f.write(text))
