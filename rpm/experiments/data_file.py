r"""A command's own data (``--data FILE.npz``) and its options as keyword arguments: what
``rpm lds``, ``rpm pendulum``, ``rpm identifiability`` and ``rpm digits`` share when they train
on arrays instead of the data they generate.

**The file** is a NumPy archive written by :func:`numpy.savez` (or ``savez_compressed``), one
named array per item: e.g. ``numpy.savez("mine.npz", observations=x, states=s)``. Each command
names the arrays it reads (``rpm lds --help``); every array is checked before the run folder is
created, and each problem is one line that names the array, what it must be and what it is:
:func:`read_arrays` (the file and its names), :func:`float_array` (the layout, finite values),
:func:`held_out_mask` and :func:`held_out_split` (the split). :func:`add_data_file_argument`
adds the flag.

**The split.** An optional boolean array ``held_out`` of one entry per sample (sequence, pair,
image) marks the samples that are scored and never trained on; without it each command applies
its own rule (stated in its ``--help``): the last N // d samples when there is something to score
(:func:`held_out_split`, ``rpm lds``, ``rpm pendulum``, ``rpm identifiability``), a stratified
quarter of the labelled images (``rpm digits``).

**Options** (:func:`command_options`): a command's public ``fit`` function takes the command's
flags as keyword arguments by their names (``batch_size=64`` for ``--batch-size 64``), each
checked by the flag's own parser type, with the flag's default when absent: the command line
and the function share one set of defaults and one set of checks.

This module imports neither torch nor NumPy at import time (``rpm --help`` stays fast).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_data_file_argument", "check_data_file", "command_options", "float_array", "held_out_mask",
           "held_out_split", "read_arrays"]


def add_data_file_argument(group: argparse._ArgumentGroup, instead_of: str) -> None:
    """Adds ``--data FILE.npz`` (default None: the command's own data) to a command's data
    group: the NumPy archive of arrays to train on (:func:`read_arrays`).

    :param group: the command's ``data`` argument group.
    :param str instead_of: what the file replaces, and the flags that then do not apply (e.g.
        ``"generated sequences; --size and --length then do not apply"``).
    """
    group.add_argument("--data", metavar="FILE.npz", default=None,
                       help="train on the arrays of this NumPy archive (numpy.savez) instead of "
                       + instead_of)


def read_arrays(path: str | os.PathLike, required: Sequence[str],
                optional: Sequence[str] = ()) -> dict:
    """The arrays ``required`` and those of ``optional`` present in the NumPy archive ``path``,
    read into memory (no pickled objects).

    :param path-like path: an ``.npz`` file.
    :param required: names that must be in the file.
    :param optional: names read when present.
    :return: ``{name: numpy.ndarray}``.
    :raises ValueError: the file does not exist, is not an ``.npz`` archive, or lacks a required
        array (the message lists the arrays it has); the messages do not repeat the path, which
        the caller names (``rpm lds: error: --data PATH: ...``).
    """
    archive = _open_archive(path, required)
    with archive:
        found = list(archive.files)
        try:
            return {name: archive[name] for name in (*required, *optional) if name in found}
        except ValueError as err:  # an object array needs pickle
            raise ValueError(f"{' '.join(str(err).split())}; save numeric arrays "
                             "only") from None


def _open_archive(path: str | os.PathLike, required: Sequence[str]):
    """The open :class:`numpy.lib.npyio.NpzFile` at ``path`` after checking that it is an
    archive of named arrays holding ``required`` (no array is read yet); the errors of
    :func:`read_arrays`."""
    import zipfile

    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise ValueError("no such file; give an .npz file written by numpy.savez")
    try:
        archive = np.load(path, allow_pickle=False)
    except OSError as err:
        raise ValueError(f"cannot read the file ({err.strerror or err})") from None
    except (ValueError, zipfile.BadZipFile):
        raise ValueError("not a NumPy .npz archive; write it with numpy.savez(path, "
                         f"{required[0]}=array, ...)") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"the file holds a single array, not named arrays; write it with "
                         f"numpy.savez(path, {required[0]}=array, ...)")
    found = list(archive.files)
    missing = [name for name in required if name not in found]
    if missing:
        archive.close()
        raise ValueError(
            f"the file has no array {', '.join(repr(m) for m in missing)} (it has "
            f"{', '.join(repr(f) for f in found) or 'none'}); save it with "
            f"numpy.savez(path, {missing[0]}=array, ...)")
    return archive


def check_data_file(args: argparse.Namespace, required: Sequence[str]) -> None:
    """Refuse a ``--data`` file that cannot be read, is not an archive of named arrays or lacks
    one of ``required``, with NumPy alone: a command calls it first, before torch is imported,
    so that a wrong file is refused at once. The arrays' layouts and values are checked later
    by the command's own checks, still before the run folder is written. Without ``--data``
    (``args.data`` None) it does nothing.

    :param args: the parsed flags.
    :param required: the names of the arrays the command needs.
    :raises ConfigurationError: ``--data PATH: what is wrong; how to fix it``, one line.
    """
    from rpm.experiments.common import ConfigurationError

    path = getattr(args, "data", None)
    if path is None:
        return
    try:
        _open_archive(path, required).close()
    except ValueError as err:
        raise ConfigurationError(f"--data {path}: {err}") from None


def float_array(name: str, value: Any, ndims: Iterable[int], layout: str, dtype=None):
    """``value`` as a floating NumPy array after checking that it is numeric, has one of the
    numbers of axes ``ndims`` and holds no NaN or infinity. Unsigned 8-bit values (images) are
    divided by 255.

    :param str name: the array's name, in the messages.
    :param value: a NumPy array, a torch tensor or anything :func:`numpy.asarray` takes.
    :param ndims: the accepted numbers of axes.
    :param str layout: the expected shape in words, e.g. ``"(N, T, D)"``.
    :param dtype: the floating dtype of the result (default: float64).
    :raises ValueError: naming the expected layout, or the first non-finite entry.
    """
    import numpy as np

    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    ndims = tuple(ndims)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a numeric array of shape {layout}, got dtype "
                         f"{array.dtype}")
    if array.ndim not in ndims:
        raise ValueError(f"{name} must have shape {layout}, got shape {tuple(array.shape)}")
    if 0 in array.shape:
        raise ValueError(f"{name} must have shape {layout} with no empty axis, got shape "
                         f"{tuple(array.shape)}")
    scale = 255.0 if array.dtype == np.uint8 else None
    array = array.astype(dtype or np.float64)
    if scale is not None:
        array /= scale
    bad = ~np.isfinite(array)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} holds {int(bad.sum())} NaN or infinite value(s) (the first at "
                         f"index {index}); remove or fill them")
    return array


def held_out_mask(value: Any, num: int, unit: str = "samples"):
    """The boolean held-out mask ``held_out`` of ``num`` samples.

    :param value: a boolean array of shape (num,).
    :param int num: N, the number of samples.
    :param str unit: what a sample is (``"sequences"``), in the messages.
    :raises ValueError: if it is not boolean or not of shape (num,).
    """
    import numpy as np

    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    mask = np.asarray(value)
    if mask.dtype != np.bool_:
        raise ValueError(f"held_out must be a boolean array (True: held out), got dtype "
                         f"{mask.dtype}; write it as numpy.array([...], dtype=bool)")
    if mask.shape != (num,):
        raise ValueError(f"held_out must have shape ({num},), one entry per {unit[:-1]}, got "
                         f"shape {tuple(mask.shape)}")
    return mask


def held_out_split(held_out: Any, num: int, unit: str, *, share: int, scored_by: str | None):
    r"""The held-out mask of ``num`` samples (True: scored, never trained on) by the split rule
    of ``rpm lds``, ``rpm pendulum`` and ``rpm identifiability``: ``held_out`` when given
    (:func:`held_out_mask`); without it, when there is an array to score against, the last
    :math:`\max(1, \lfloor N / d \rfloor)` samples (d = ``share``), else none (nothing is
    scored, so every sample trains).

    :param held_out: the file's ``held_out`` (a boolean array of shape (num,)), or None.
    :param int num: N, the number of samples.
    :param str unit: what the samples are, plural (``"sequences"``), in the messages.
    :param int share: d >= 2 (d = 1 would hold out every sample).
    :param scored_by: the name of the array scored against (``"states"``), or None without one.
    :return: a boolean NumPy array of shape (num,).
    :raises ValueError: a bad ``held_out``, a split that leaves no sample to train on, or one
        with something to score that holds none out (or cannot: fewer than 2 samples); a
        ``share`` below 2.
    """
    import numpy as np

    if isinstance(share, bool) or not isinstance(share, int) or share < 2:
        raise ValueError(f"held_out_split: share must be an integer >= 2 (the default split holds "
                         f"out the last N // share samples), got {share!r}")
    if held_out is not None:
        mask = held_out_mask(held_out, num, unit)
    else:
        mask = np.zeros(num, dtype=bool)
        if scored_by is not None:
            if num < 2:
                raise ValueError(f"too few {unit} ({num}) to score: the {scored_by} need at least "
                                 f"2 {unit}, one to train on and one held out")
            mask[num - max(1, num // share):] = True
    if mask.all():
        raise ValueError(f"held_out marks all {num} {unit}: none is left to train on")
    if scored_by is not None and not mask.any():
        raise ValueError(f"held_out marks no {unit[:-1]}, but the scores need at least one "
                         f"held-out {unit[:-1]} (or leave out the {scored_by})")
    return mask


def command_options(add_parser: Callable[[argparse._SubParsersAction], None], command: str,
                    options: Mapping[str, Any], exclude: Iterable[str] = ()) -> argparse.Namespace:
    """The parsed flags of ``rpm COMMAND`` with ``options`` in place of the defaults.

    Each option is named as its flag's destination (``batch_size`` for ``--batch-size``) and
    checked as the command line checks it: through the flag's ``type`` (a list is joined with
    commas, as ``--methods a,b`` is written) and its ``choices``; an on/off flag takes a bool.

    :param add_parser: the command's ``add_parser(subparsers)``.
    :param str command: the sub-command's name.
    :param options: the keyword arguments.
    :param exclude: flags that are not options here (the run folder, the generated data).
    :raises ValueError: an unknown or excluded name (the message lists the options), or a value
        the flag refuses.
    """
    parser = argparse.ArgumentParser(prog="rpm", allow_abbrev=False)
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args([command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    excluded = {"out", "resume", "overwrite", "data", *exclude}
    actions = {a.dest: a for a in sub.choices[command]._actions
               if a.dest not in excluded and a.dest != "help"}
    for key, value in options.items():
        action = actions.get(key)
        if action is None:
            raise ValueError(f"unknown option {key}=...; the options of {command} are "
                             f"{', '.join(sorted(actions))}")
        if action.nargs == 0:  # store_true / store_false
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be True or False, got {value!r}")
        elif value is None and action.default is None:
            pass
        else:
            text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            try:
                value = action.type(text) if action.type is not None else text
            except (argparse.ArgumentTypeError, TypeError, ValueError) as err:
                raise ValueError(f"{key}={value!r}: {err}") from None
            if action.choices is not None and value not in action.choices:
                raise ValueError(f"{key} must be one of {', '.join(map(str, action.choices))}, "
                                 f"got {value!r}")
        setattr(args, key, value)
    return args
