r"""The run-folder contract: one writer at a time, a record of what made the folder, and the
integrity of its configuration.

A run folder ``DIR`` holds, besides what the experiment writes:

``DIR/.rpm-lock``
    the lock file. A process that writes ``DIR`` holds an exclusive :func:`fcntl.flock` lock on
    it for its whole life and writes its pid, host, command line and start time into it. The
    operating system releases the lock when the process ends, however it ends (SIGKILL
    included), so a lock is never stale: the file of a dead process is simply locked again. A
    second process is refused with :class:`RunFolderError` naming the holder. (On systems
    without :mod:`fcntl` the lock is not enforced.)
``DIR/.rpm-run``
    the run record (JSON): the command that made the folder (``bouncing-balls``,
    ``identifiability``), a copy of ``config.json`` as last written by rpm with its SHA-256, and
    the segments of the run, one per process that wrote it (a fresh start and each
    ``--resume``): command line, start time, wall time and how it ended. An edited
    ``config.json`` differs from the copy and is refused, naming the keys; another command's
    ``--resume`` is refused before anything is written.

The checkpoints' own integrity (SHA-256 digests checked on load) is kept by
:mod:`rpm.training.checkpoint`.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = [
    "LOCK_NAME",
    "RECORD_NAME",
    "RunFolderError",
    "RunLock",
    "config_digest",
    "new_record",
    "read_record",
    "verify_config",
    "write_record",
]

#: The lock file inside a run folder.
LOCK_NAME = ".rpm-lock"
#: The run record inside a run folder (older rpm wrote a one-line text marker of this name).
RECORD_NAME = ".rpm-run"
_FORMAT = "rpm-run"
_VERSION = 1


class RunFolderError(ValueError):
    """A run folder cannot be used as asked: another process holds it, it was made by another
    command or an older rpm, or its configuration was edited. The message says what to do."""


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z")


class RunLock:
    """An exclusive, process-lifetime lock on a run folder (module docstring).

    :param path-like folder: the run folder; it must exist.
    :param str command_line: what the holder runs, shown to a refused second process.
    """

    def __init__(self, folder: str | os.PathLike, command_line: str) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.command_line = str(command_line)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def holder(self) -> dict:
        """What the lock file says about its holder (empty if unreadable)."""
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunFolderError` naming the process that holds it.

        :raises RunFolderError: if another process (or another :class:`RunLock` of this one)
            holds the folder, or the lock file cannot be created.
        """
        if self._fd is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise RunFolderError(f"cannot create the lock file {self.path} ({err.strerror}): "
                                 "choose a writable --out") from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                holder = self.holder()
                who = (f"process {holder.get('pid', '?')} on {holder.get('host', '?')} "
                       f"(`{holder.get('command', '?')}`, started {holder.get('started', '?')})")
                raise RunFolderError(
                    f"{self.folder} is in use by {who}: wait for it to finish or stop it, or "
                    "choose another --out") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command_line,
                "started": _now()}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(info) + "\n").encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Release the lock (the operating system does it too when the process ends)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass  # e.g. the folder became read-only: the lock itself is released by close
        os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


# --------------------------------------------------------------------------- record
def config_digest(config: dict) -> str:
    """SHA-256 of a configuration's canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def new_record(command: str | None) -> dict:
    """A fresh run record for ``command`` (no configuration, no segment yet)."""
    return {"format": _FORMAT, "version": _VERSION, "command": command, "created": _now(),
            "config": None, "config_sha256": None, "previous_config": None, "segments": []}


def read_record(folder: str | os.PathLike) -> dict | None:
    """The run record of ``folder``; ``None`` if there is none.

    :raises RunFolderError: if the record is the text marker of an older rpm or unreadable.
    """
    path = Path(folder) / RECORD_NAME
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = None
    if not (isinstance(record, dict) and record.get("format") == _FORMAT
            and isinstance(record.get("segments"), list)):
        raise RunFolderError(
            f"{Path(folder)} was written by an older rpm or its record {RECORD_NAME} is damaged, "
            "so it cannot be continued safely: start afresh with --overwrite")
    return record


def write_record(folder: str | os.PathLike, record: dict) -> None:
    """Write the run record atomically."""
    from rpm.training.checkpoint import atomic_write

    text = json.dumps(record, indent=2).encode() + b"\n"
    atomic_write(Path(folder) / RECORD_NAME, lambda f: f.write(text))


def verify_config(folder: str | os.PathLike, record: dict, config_name: str = "config.json") -> dict:
    """Read ``config.json`` and check it against the copy in the run record.

    The copy is the configuration rpm last wrote (or, after a process died between the two
    writes of a resume, the one before it). Anything else (a hand-edited value, a deleted key,
    a file that is not a JSON object) is refused, naming the keys.

    :returns: the configuration.
    :raises RunFolderError: on a missing, malformed or edited ``config.json``.
    """
    path = Path(folder) / config_name
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RunFolderError(f"{path} is missing: the run cannot be resumed; start afresh with "
                             "--overwrite") from None
    except OSError as err:
        raise RunFolderError(f"cannot read {path} ({err.strerror})") from None
    try:
        config = json.loads(text)
    except ValueError as err:
        raise RunFolderError(f"{path} is not valid JSON ({err}): it was edited or damaged; "
                             "restore it or start afresh with --overwrite") from None
    if not isinstance(config, dict):
        raise RunFolderError(f"{path} holds a {type(config).__name__}, not the run's "
                             "configuration (a JSON object): restore it or start afresh with "
                             "--overwrite")
    recorded = record.get("config")
    if not isinstance(recorded, dict):
        return config  # made by a process that died before writing its configuration
    if config_digest(recorded) != record.get("config_sha256"):
        raise RunFolderError(
            f"the run record {Path(folder) / RECORD_NAME} was edited (its configuration does not "
            "match its SHA-256): start afresh with --overwrite")
    if config == recorded or config == record.get("previous_config"):
        return config
    keys = sorted(key for key in set(config) | set(recorded)
                  if config.get(key, _MISSING) != recorded.get(key, _MISSING))
    described = []
    for key in keys[:6]:
        if key not in config:
            described.append(f"{key} (deleted)")
        elif key not in recorded:
            described.append(f"{key} (added)")
        else:
            described.append(f"{key} ({recorded[key]!r} became {config[key]!r})")
    raise RunFolderError(
        f"{path} differs from the configuration the run was made with: "
        + ", ".join(described) + (", ..." if len(keys) > 6 else "")
        + "; --resume continues the run only as recorded: restore the file (or change a flag "
        "on the command line where --resume allows it), or start afresh with --overwrite")


_MISSING = object()
