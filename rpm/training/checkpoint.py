r"""Atomic, safe checkpoints and the random-number-generator state of a training run.

A run is resumable bit for bit when everything that decides its future is saved together:
parameters, optimiser and scheduler state, the step counter, and the state of every random
number generator the loss draws from. This module saves such a state atomically and captures or
restores the generators.

Safety: a checkpoint holds only tensors, numbers, strings, ``None``, lists, tuples and dicts
(the generators' states included: NumPy's and Python's are stored as lists of integers), so
that it is read with ``torch.load(path, weights_only=True)``, which never runs code from the
file. :func:`save_checkpoint` refuses any other object, naming where it sits in the state, and
:func:`load_checkpoint` refuses a file that carries a pickled object.

Atomicity: the file is written to a temporary file in the destination folder, flushed and
``fsync``-ed, then moved over the destination with :func:`os.replace`, which is atomic on POSIX
and Windows. A process killed at any moment therefore leaves either the previous checkpoint or
the new one, never a truncated file (at worst a stray ``.NAME.*.tmp`` file, which
:func:`remove_stale_temporaries` deletes).

Integrity: every checkpoint's SHA-256 is recorded in a manifest next to it,
``NAME.sha256`` (JSON), and checked by :func:`load_checkpoint`: a damaged file (flipped bytes
that still unpickle) is refused, never loaded. The previous checkpoint is kept as
``NAME.prev`` (a hard link, or a copy). A save announces the new digest in the manifest before
the checkpoint replaces the old one and commits it afterwards, so that a process killed at any
moment leaves files whose digests the manifest accepts. :func:`load_latest_checkpoint` falls
back to the previous checkpoint, with a message, when the latest is damaged or missing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import re
import secrets
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

__all__ = [
    "CheckpointError",
    "atomic_write",
    "capture_rng_state",
    "checkpoint_expected",
    "load_checkpoint",
    "load_latest_checkpoint",
    "remove_stale_temporaries",
    "restore_rng_state",
    "save_checkpoint",
]

_FORMAT = "rpm-checkpoint"
_VERSION = 2
#: The leaf types a checkpoint may hold (besides tensors); containers are lists, tuples, dicts.
_SAFE_LEAVES = (bool, int, float, str, type(None))

#: Random number generators a run may register besides the global ones.
Generator = torch.Generator | np.random.Generator


class CheckpointError(ValueError):
    """A checkpoint file exists but cannot be read: truncated, corrupt, or not an rpm checkpoint."""


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}."


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    r"""Write a file atomically: to a temporary file in the same folder, ``fsync``, then
    :func:`os.replace` it over ``path``.

    If ``write`` raises (or the process dies) the previous content of ``path`` is untouched; on
    an exception the temporary file is removed before the exception propagates.

    :param path-like path: destination file; its folder is created if missing.
    :param callable write: ``write(f)`` writes the content to the binary file object ``f``.
    :returns: the destination as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = path.parent / f"{_temporary_prefix(path)}{secrets.token_hex(8)}.tmp"
    # os.open rather than tempfile.mkstemp so that the file gets the usual umask permissions.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp_name, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(path.parent)
    return path


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable on POSIX; folders cannot be opened on Windows.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete temporary files left next to ``path`` by a writer that was killed mid-write.

    Only files named like the temporaries of :func:`atomic_write` for this very ``path``
    (``.NAME.*.tmp``) are touched. Call it only when no other process writes ``path``.

    :param path-like path: the destination whose stale temporaries to delete.
    :returns: the deleted files.
    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    removed = []
    for stale in path.parent.glob(_temporary_prefix(path) + "*.tmp"):
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()
            removed.append(stale)
    return removed


def _check_safe(obj: Any, where: str) -> None:
    if isinstance(obj, (torch.Tensor, *_SAFE_LEAVES)):
        return
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _check_safe(item, f"{where}[{i}]")
        return
    if isinstance(obj, dict):
        for key, item in obj.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(
                    f"checkpoint state {where} has the key {key!r} of type "
                    f"{type(key).__name__}; keys must be strings or integers"
                )
            _check_safe(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"checkpoint state {where} is a {type(obj).__module__}.{type(obj).__qualname__}; a "
        "checkpoint holds only tensors, numbers, strings, None, lists, tuples and dicts (so that "
        "torch.load(..., weights_only=True) can read it without running code): convert it, "
        "e.g. an array to a tensor or a list"
    )


# --------------------------------------------------------------------------- integrity
_MANIFEST_FORMAT = "rpm-checkpoint-sha256"


def _manifest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _previous_path(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def _read_manifest(path: Path) -> dict | None:
    manifest = _manifest_path(path)
    if not manifest.exists():
        return None
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        data = None
    if not (isinstance(data, dict) and data.get("format") == _MANIFEST_FORMAT):
        raise CheckpointError(f"the checksum manifest {manifest} is damaged, so the checkpoint "
                              "cannot be verified: start the run afresh with --overwrite")
    return data


def _write_manifest(path: Path, current: Any, previous: Any, pending: Any) -> None:
    text = json.dumps({"format": _MANIFEST_FORMAT, "current": current, "previous": previous,
                       "pending": pending}).encode()
    atomic_write(_manifest_path(path), lambda f: f.write(text))


def _accepted(manifest: dict) -> dict[str, int]:
    """digest -> step of every checkpoint the manifest accepts."""
    accepted = {}
    for key in ("current", "previous", "pending"):
        entry = manifest.get(key)
        if isinstance(entry, list) and len(entry) == 2:
            accepted[str(entry[0])] = entry[1]
    return accepted


def _keep_previous(path: Path) -> None:
    # NAME.prev becomes the current checkpoint (another name for the same file), atomically.
    previous = _previous_path(path)
    tmp = path.parent / f"{_temporary_prefix(previous)}{secrets.token_hex(8)}.tmp"
    try:
        os.link(path, tmp)
    except OSError:
        shutil.copyfile(path, tmp)
    os.replace(tmp, previous)


def checkpoint_expected(path: str | os.PathLike) -> bool:
    """Whether a checkpoint was ever committed at ``path`` (its manifest says so), so that a
    missing file means it was deleted rather than never written."""
    path = Path(path)
    manifest = _read_manifest(path)
    return manifest is not None and (manifest.get("current") is not None
                                     or manifest.get("previous") is not None)


def save_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """Save a training state atomically with :func:`torch.save`, with its SHA-256 in the
    manifest ``NAME.sha256`` and the previous checkpoint kept as ``NAME.prev``.

    The state is wrapped with a format tag so that :func:`load_checkpoint` can tell an rpm
    checkpoint from any other file.

    :param path-like path: destination, conventionally ``RUN_DIR/MODEL/checkpoint.pt``.
    :param dict state: tensors, numbers, strings, ``None``, and lists, tuples and dicts of them
        (state dicts, the output of :func:`capture_rng_state`, a history).
    :returns: the destination as a :class:`~pathlib.Path`.
    :raises TypeError: if ``state`` is not a dict or holds any other object (the message says
        where), since such a file could only be read by unpickling arbitrary code.
    """
    if not isinstance(state, dict):
        raise TypeError(f"save_checkpoint expects the state as a dict, got {type(state).__name__}")
    _check_safe(state, "state")
    payload = {"format": _FORMAT, "version": _VERSION, "state": state}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    new = [hashlib.sha256(data).hexdigest(), state.get("step")]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        manifest = _read_manifest(path)
    except CheckpointError:
        manifest = None  # a damaged manifest is replaced: this checkpoint is good
    current = None if manifest is None else manifest.get("current")
    previous = None if manifest is None else manifest.get("previous")
    # 1. announce the new digest; 2. keep the current file as NAME.prev; 3. replace it;
    # 4. commit. Killed between any two, every file on disk has an accepted digest.
    _write_manifest(path, current, previous, new)
    if path.is_file() and current is not None:
        _keep_previous(path)
        previous = current
    atomic_write(path, lambda f: f.write(data))
    _write_manifest(path, new, previous, None)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: Any = None, verify: bool = True
                    ) -> dict:
    """Load a state saved by :func:`save_checkpoint`, with ``torch.load(...,
    weights_only=True)``: the file is never unpickled as arbitrary Python objects, so a
    checkpoint from someone else cannot run code. Its SHA-256 is then checked against the
    manifest written with it.

    :param path-like path: the checkpoint file.
    :param map_location: passed to :func:`torch.load`, e.g. ``"cpu"`` to load a GPU run's
        tensors on the CPU.
    :param bool verify: check the SHA-256 against the manifest ``NAME.sha256``.
    :returns: the saved state dict.
    :raises FileNotFoundError: if there is no file at ``path``.
    :raises CheckpointError: if the file carries a pickled object (any type other than
        tensors, numbers, strings, lists, tuples and dicts), is truncated, empty, a folder,
        corrupt, not an rpm checkpoint, or (``verify``) has no manifest or another digest.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file: move it away (or "
                              "start the run afresh with --overwrite)")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: the file does not exist")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path} ({err.strerror})") from None
    if not data:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): the file is truncated; "
                              "delete it, or start the run afresh with --overwrite")
    try:
        # weights_only: parsing an untrusted file runs no code, so it comes before the digest
        payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" not in str(err).lower():
            raise CheckpointError(
                f"cannot read checkpoint {path} (UnpicklingError: {err}); the file is truncated "
                "or corrupt: delete it, or start the run afresh with --overwrite"
            ) from err
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        raise CheckpointError(
            f"refusing to load {path}: it carries a pickled Python object"
            + (f" ({found.group(1)})" if found else "")
            + ", and unpickling it could run arbitrary code. rpm checkpoints hold only tensors, "
            "numbers, strings, lists and dicts; a file written by an older rpm or by other code "
            "cannot be resumed: start the run afresh with --overwrite"
        ) from None
    except Exception as err:  # torch raises RuntimeError, EOFError, ...
        raise CheckpointError(
            f"cannot read checkpoint {path} ({type(err).__name__}: {err}); the file is "
            "truncated or corrupt: delete it, or start the run afresh with --overwrite"
        ) from err
    if not (isinstance(payload, dict) and payload.get("format") == _FORMAT):
        raise CheckpointError(
            f"{path} is not an rpm checkpoint (expected a file written by save_checkpoint)"
        )
    if payload.get("version") != _VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {payload.get('version')!r}, this rpm reads "
            f"version {_VERSION}; start the run afresh with --overwrite"
        )
    if verify:
        _verify(path, data)
    return payload["state"]


def _verify(path: Path, data: bytes) -> None:
    shown = path
    if path.name.endswith(".prev"):  # the previous checkpoint shares the manifest of the latest
        path = path.with_name(path.name[: -len(".prev")])
    manifest = _read_manifest(path)
    if manifest is None:
        raise CheckpointError(
            f"checkpoint {shown} has no checksum manifest ({_manifest_path(path).name}), so it "
            "cannot be verified: it was not written by this rpm's save_checkpoint (or the "
            "manifest was deleted); start the run afresh with --overwrite")
    digest = hashlib.sha256(data).hexdigest()
    if digest not in _accepted(manifest):
        raise CheckpointError(
            f"checkpoint {shown} is damaged: its SHA-256 ({digest[:12]}...) is not the one "
            f"recorded when it was written ({_manifest_path(path).name}); it is not loaded. "
            "Restore it from a copy, or start the run afresh with --overwrite")


def load_latest_checkpoint(path: str | os.PathLike,
                           map_location: Any = None) -> tuple[dict, Path, str | None]:
    """Load the checkpoint at ``path``, verified; if it is damaged or missing although its
    manifest records it, fall back to the previous one (``NAME.prev``) when that one verifies.

    :returns: ``(state, the file loaded, a message when the previous one was used)``.
    :raises FileNotFoundError: if no checkpoint was ever written at ``path``.
    :raises CheckpointError: if neither the checkpoint nor the previous one can be used.
    """
    path = Path(path)
    previous = _previous_path(path)
    if not path.exists() and not checkpoint_expected(path):
        raise FileNotFoundError(f"no checkpoint at {path}: the file does not exist")
    try:
        return load_checkpoint(path, map_location), path, None
    except (CheckpointError, FileNotFoundError) as err:
        problem = err
    if previous.is_file():
        try:
            state = load_checkpoint(previous, map_location)
        except CheckpointError:
            pass
        else:
            what = "missing" if isinstance(problem, FileNotFoundError) else "damaged"
            return state, previous, (
                f"the checkpoint {path} is {what}; continuing from the previous checkpoint "
                f"{previous.name} (step {state.get('step')})")
    if isinstance(problem, FileNotFoundError):
        raise CheckpointError(
            f"the checkpoint {path} is missing although its manifest records that it was "
            "written (and no verified previous checkpoint exists): restore it, or start the "
            "run afresh with --overwrite") from None
    raise problem


def _encode_numpy_state(state: Any) -> Any:
    # NumPy's bit-generator states are dicts of integers and uint32 arrays: arrays become
    # {"array": [...], "dtype": "uint32"} so that the state holds only lists and numbers.
    if isinstance(state, np.ndarray):
        return {"array": state.tolist(), "dtype": str(state.dtype)}
    if isinstance(state, dict):
        return {key: _encode_numpy_state(value) for key, value in state.items()}
    if isinstance(state, np.generic):
        return state.item()
    return state


def _decode_numpy_state(state: Any) -> Any:
    if isinstance(state, dict):
        if set(state) == {"array", "dtype"}:
            return np.asarray(state["array"], dtype=state["dtype"])
        return {key: _decode_numpy_state(value) for key, value in state.items()}
    return state


def _encode_python_state(state: tuple) -> list:
    # random.getstate() is (version, tuple of 625 ints, gauss_next).
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def _decode_python_state(state: list) -> tuple:
    version, internal, gauss_next = state
    return (version, tuple(internal), gauss_next)


def _check_generators(generators: Mapping[str, Generator] | None) -> dict[str, Generator]:
    if generators is None:
        return {}
    if not isinstance(generators, Mapping):
        raise TypeError(
            f"generators must be a mapping name -> generator, got {type(generators).__name__}"
        )
    for name, gen in generators.items():
        if not isinstance(name, str):
            raise TypeError(f"generator names must be strings, got {name!r}")
        if not isinstance(gen, (torch.Generator, np.random.Generator)):
            raise TypeError(
                f"generator {name!r} must be a torch.Generator or numpy.random.Generator, "
                f"got {type(gen).__name__}"
            )
    return dict(generators)


def capture_rng_state(generators: Mapping[str, Generator] | None = None) -> dict:
    """Capture the state of every random number generator a training step may use.

    Captured: the global torch CPU generator (which Pyro samples from), the global NumPy and
    Python :mod:`random` generators, the CUDA generators of every device when CUDA has been
    initialised in this process, and each registered generator.

    :param dict generators: extra generators by name, ``torch.Generator`` (any device) or
        ``numpy.random.Generator``.
    :returns: a dict of tensors, numbers, lists and dicts for :func:`restore_rng_state` (and
        :func:`save_checkpoint`).
    """
    generators = _check_generators(generators)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": _encode_numpy_state(np.random.get_state(legacy=False)),
        "random": _encode_python_state(random.getstate()),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        "generators": {},
    }
    for name, gen in generators.items():
        if isinstance(gen, torch.Generator):
            state["generators"][name] = {"kind": "torch", "state": gen.get_state()}
        else:
            state["generators"][name] = {
                "kind": "numpy", "state": _encode_numpy_state(gen.bit_generator.state)}
    return state


def restore_rng_state(state: dict, generators: Mapping[str, Generator] | None = None) -> None:
    """Restore the generators captured by :func:`capture_rng_state`.

    The registered generators must be exactly those that were captured (same names, same
    kinds): a resumed run that draws from other generators would not reproduce the original.

    :param dict state: the output of :func:`capture_rng_state`.
    :param dict generators: the same generators by name, restored in place.
    :raises ValueError: if the registered generators differ from the captured ones.
    """
    generators = _check_generators(generators)
    missing = {"torch", "numpy", "random", "cuda", "generators"} - set(state)
    if missing:
        raise ValueError(
            f"RNG state lacks the entries {sorted(missing)}: not from capture_rng_state"
        )
    saved = state["generators"]
    if set(saved) != set(generators):
        raise ValueError(
            f"the checkpoint holds RNG states for generators {sorted(saved)} but the run "
            f"registers {sorted(generators)}; register the same generators to resume"
        )
    for name, gen in generators.items():
        kind = "torch" if isinstance(gen, torch.Generator) else "numpy"
        if saved[name]["kind"] != kind:
            raise ValueError(
                f"generator {name!r} was saved as a {saved[name]['kind']} generator but is "
                f"now a {kind} generator"
            )
    torch.set_rng_state(state["torch"])
    np.random.set_state(_decode_numpy_state(state["numpy"]))
    random.setstate(_decode_python_state(state["random"]))
    if state["cuda"] is not None:
        if torch.cuda.is_available() and torch.cuda.device_count() >= len(state["cuda"]):
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            warnings.warn(
                f"the checkpoint holds CUDA RNG states of {len(state['cuda'])} device(s) but "
                f"{torch.cuda.device_count()} are available: they are not restored and the "
                "resumed run will not reproduce the original exactly",
                stacklevel=2,
            )
    for name, gen in generators.items():
        if isinstance(gen, torch.Generator):
            gen.set_state(saved[name]["state"])
        else:
            gen.bit_generator.state = _decode_numpy_state(saved[name]["state"])
