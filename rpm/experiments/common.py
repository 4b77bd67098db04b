"""What every experiment shares: command-line flags, argument checks, the run folder, the
device, seeding and atomic JSON files.

An experiment module's ``run(args)`` typically starts with::

    out = prepare_run_dir(args.out, resume=args.resume, overwrite=args.overwrite)
    save_run_config(out, args, resume=args.resume)
    device = resolve_device(args.device)
    seed_everything(args.seed)

Errors the user can fix by changing the command line raise :class:`ConfigurationError`, which
the ``rpm`` command prints as a one-line message with exit status 2, like an argparse error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch

from rpm._validation import check_int
from rpm.training.checkpoint import atomic_write

__all__ = [
    "ConfigurationError",
    "RUN_MARKER",
    "add_common_arguments",
    "contrastive_batch_size",
    "device_name",
    "nonnegative_float",
    "nonnegative_int",
    "positive_float",
    "positive_int",
    "prepare_run_dir",
    "probability",
    "resolve_device",
    "save_run_config",
    "seed_everything",
    "seed_value",
    "write_json_atomic",
]

#: Hidden file that marks a folder as an rpm run folder (written by :func:`prepare_run_dir`).
RUN_MARKER = ".rpm-run"
#: Files an rpm run writes, recognised in a folder without the marker.
_RUN_FILES = frozenset({"checkpoint.pt", "history.json", "config.json", "results.json"})
_RUN_TEMPORARY = re.compile(
    r"^\.(checkpoint\.pt|history\.json|config\.json|results\.json)\..*\.tmp$"
)
_CONFIG_NAME = "config.json"
#: Flags that may change when a run is resumed.
_RESUMABLE_FLAGS = frozenset(
    {"out", "resume", "overwrite", "device", "checkpoint_every", "progress", "func", "command"}
)


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


def probability(text: str) -> float:
    """argparse ``type=``: a number in the closed interval [0, 1]."""
    value = _parse_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}")
    return value


_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def device_name(text: str) -> str:
    """argparse ``type=``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def add_common_arguments(
    parser: argparse.ArgumentParser,
    *,
    default_out: str | None = None,
    default_seed: int = 0,
    default_checkpoint_every: int = 1000,
) -> None:
    """Add the flags every experiment shares.

    ``--out DIR`` (required unless ``default_out`` is given), ``--resume`` / ``--overwrite``
    (mutually exclusive), ``--checkpoint-every STEPS`` (>= 0, 0 = only at the end),
    ``--seed INT``, ``--device {auto,cpu,cuda,cuda:N}`` and ``--no-progress`` (sets
    ``args.progress = False``).

    :param argparse.ArgumentParser parser: the experiment's sub-command parser.
    :param str default_out: default run folder; ``None`` makes ``--out`` required.
    :param int default_seed: default of ``--seed``.
    :param int default_checkpoint_every: default of ``--checkpoint-every``.
    """
    group = parser.add_argument_group("run")
    group.add_argument(
        "--out",
        metavar="DIR",
        required=default_out is None,
        default=default_out,
        help="run folder for checkpoint, history, results and figures"
        + ("" if default_out is None else f" (default: {default_out})"),
    )
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its checkpoint"
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
        help="where to train; auto: cuda if available, else cpu (default: auto)",
    )
    group.add_argument(
        "--no-progress", dest="progress", action="store_false", help="hide the progress bar"
    )


# --------------------------------------------------------------------------- run folder
def _is_ours(entry: Path) -> bool:
    return entry.is_file() and (
        entry.name in _RUN_FILES
        or entry.name == RUN_MARKER
        or bool(_RUN_TEMPORARY.match(entry.name))
    )


def _clear(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _mark(folder: Path) -> None:
    (folder / RUN_MARKER).write_text("rpm run folder: rpm --overwrite may delete its content\n")


def prepare_run_dir(out: str | os.PathLike, resume: bool = False, overwrite: bool = False) -> Path:
    """Check and prepare the run folder ``out``.

    * fresh run (neither flag): ``out`` must not exist or be empty; it is created;
    * ``resume``: ``out/checkpoint.pt`` must exist;
    * ``overwrite``: the previous run's content is deleted, but only if ``out`` is a run folder
      (it holds the :data:`RUN_MARKER` written here, or only files an rpm run writes);
      any other non-empty folder is refused, never deleted.

    :param path-like out: the run folder.
    :param bool resume: continue a previous run.
    :param bool overwrite: start afresh, deleting the previous run.
    :returns: the folder, as a :class:`~pathlib.Path`.
    :raises ConfigurationError: on any of the conflicts above, naming the flag to use.
    """
    out = Path(out)
    if resume and overwrite:
        raise ConfigurationError("--resume and --overwrite exclude each other: choose one")
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"--out {out} is a file, not a folder: choose another --out")
    if resume:
        if not (out / "checkpoint.pt").is_file():
            raise ConfigurationError(
                f"--resume: there is no checkpoint at {out / 'checkpoint.pt'}; start a fresh run "
                "without --resume (add --overwrite if the folder holds a failed run)"
            )
        return out
    entries = sorted(e for e in out.iterdir() if e.name != RUN_MARKER) if out.is_dir() else []
    if entries and not overwrite:
        raise ConfigurationError(
            f"--out {out} already holds a run ({', '.join(e.name for e in entries[:4])}"
            f"{', ...' if len(entries) > 4 else ''}): pass --resume to continue it or "
            "--overwrite to delete it and start afresh"
        )
    if entries:
        if not (out / RUN_MARKER).is_file():
            foreign = [e.name for e in entries if not _is_ours(e)]
            if foreign:
                raise ConfigurationError(
                    f"refusing to --overwrite {out}: it is not an rpm run folder (no "
                    f"{RUN_MARKER} marker) and holds files rpm did not write "
                    f"({', '.join(foreign[:4])}{', ...' if len(foreign) > 4 else ''}); "
                    "choose another --out or delete the folder yourself"
                )
        _clear(out)
    out.mkdir(parents=True, exist_ok=True)
    _mark(out)
    return out


def save_run_config(
    out: str | os.PathLike,
    args: argparse.Namespace,
    resume: bool = False,
    may_change: Iterable[str] = (),
) -> dict:
    """Record the command-line configuration in ``out/config.json``; on resume, check that it
    has not changed, since a resumed run must continue the same experiment.

    :param path-like out: the run folder.
    :param argparse.Namespace args: the parsed arguments (``func`` and other non-JSON values
        are skipped).
    :param bool resume: compare with the saved configuration instead of writing it.
    :param may_change: further argument names allowed to differ on resume (``out``,
        ``resume``, ``overwrite``, ``device``, ``checkpoint_every`` and ``progress`` always may).
    :returns: the configuration as a dict.
    :raises ConfigurationError: if a resumed run's arguments differ from the saved ones.
    """
    config = {}
    for key, value in sorted(vars(args).items()):
        if key in ("func", "command"):
            continue
        if isinstance(value, Path):
            value = str(value)
        try:
            json.dumps(value)
        except TypeError:
            continue
        config[key] = value
    path = Path(out) / _CONFIG_NAME
    if resume and path.is_file():
        saved = json.loads(path.read_text())
        allowed = _RESUMABLE_FLAGS | set(may_change)
        changed = [
            f"--{key.replace('_', '-')}: was {saved.get(key)!r}, now {config.get(key)!r}"
            for key in sorted(set(saved) | set(config))
            if key not in allowed and saved.get(key) != config.get(key)
        ]
        if changed:
            raise ConfigurationError(
                "--resume must continue the same experiment, but "
                + "; ".join(changed)
                + f" (saved in {path}); rerun with the original values"
            )
        return config
    write_json_atomic(path, config)
    return config


# --------------------------------------------------------------------------- device, seed, json
def resolve_device(name: str | torch.device) -> torch.device:
    """The torch device for ``--device``: ``auto`` is ``cuda`` when available, else ``cpu``.

    :param str name: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    :raises ConfigurationError: if CUDA (or device N) is asked for but not available.
    """
    name = str(name)
    if not _DEVICE.match(name):
        raise ConfigurationError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
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


def seed_everything(seed: int) -> None:
    """Seed Python's :mod:`random`, NumPy's global generator, torch (CPU and CUDA) and Pyro.

    :param int seed: in [0, 2**32 - 1].
    """
    seed = check_int("seed", seed, minimum=0, maximum=2**32 - 1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    pyro.set_rng_seed(seed)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically (temporary file, ``fsync``, rename).

    :param path-like path: destination file.
    :param obj: a JSON-serialisable object (non-finite floats are written as ``NaN`` /
        ``Infinity``, which Python's :mod:`json` reads back).
    :raises TypeError: if ``obj`` is not JSON-serialisable (the destination is untouched).
    """
    text = json.dumps(obj, indent=2).encode() + b"\n"
    return atomic_write(path, lambda f: f.write(text))
