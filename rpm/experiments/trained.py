r"""A trained model back from a run folder: :func:`load`, and the model record every command
writes for it.

Each model a command trains lives in a subfolder of the run folder (``DIR/NAME/``, or
``DIR/seed{s}/NAME/`` for ``rpm digits --num-seeds K``) with its checkpoint, and with
``model.json``, the *model record*::

    {"format": "rpm-model", "version": 1, "command": "lds", "arguments": {...},
     "input_shape": [5]}

``arguments`` are the keyword arguments from which the command's ``model_from_arguments``
builds the untrained network: everything the architecture depends on, the sizes read from the
data (the colour channels, the observation dimension) included, so that the model is rebuilt
without the data and without ``config.json``. The command builds the model it trains from the
same record (one construction path), so a loaded model is the trained one.
``input_shape`` is the shape of one input the encoder was trained on (a frame, an image, an
observation vector: the axes after the batch axis); the loaded model refuses inputs of another
shape (:func:`load`). Records written before the field existed have none: their models load
and take any shape their layers accept, unchecked.

:func:`load` reads the record, rebuilds the model with the command's builder (named in code by
the command, :data:`BUILDERS`: a record never names code to import), loads the weights of the
model's latest checkpoint (``torch.load(..., weights_only=True)``, SHA-256 verified), moves it
to the device asked for and puts it in eval mode: batch normalisation then uses its running
statistics and every input's code is independent of its batch (in train mode the same inputs
get other codes).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpm.training.run_folder import RECORD_NAME, RunFolderError, read_record, verify_config

if TYPE_CHECKING:
    import torch

__all__ = ["BUILDERS", "MODEL_RECORD", "load", "model_names", "write_model_record"]

#: The model record inside a model's folder.
MODEL_RECORD = "model.json"
_FORMAT = "rpm-model"
_VERSION = 1
#: The module of each command whose ``model_from_arguments(arguments)`` builds its untrained
#: model from a model record's ``arguments``.
BUILDERS = {
    "bouncing-balls": "rpm.experiments.bouncing_balls.command",
    "causal-ident": "rpm.experiments.causal_ident.model",
    "content-style": "rpm.experiments.content_style.model",
    "digits": "rpm.experiments.digits.model",
    "identifiability": "rpm.experiments.identifiability.model",
    "lds": "rpm.experiments.lds.model",
    "masks": "rpm.experiments.masks.model",
    "peer-supervision": "rpm.experiments.peer_supervision.model",
    "pendulum": "rpm.experiments.pendulum.model",
    "rpm-hmm": "rpm.experiments.rpm_hmm.model",
    "uncertainty": "rpm.experiments.uncertainty.model",
}
_CHECKPOINT = "checkpoint.pt"


def write_model_record(folder: str | os.PathLike, command: str, arguments: dict,
                       input_shape: Sequence[int]) -> Path:
    """Write the model record ``folder/model.json`` (module docstring), atomically.

    :param path-like folder: the model's folder inside the run folder (created if missing).
    :param str command: the command that trains it, a key of :data:`BUILDERS`.
    :param dict arguments: the keyword arguments of the command's ``model_from_arguments``
        (JSON: numbers, strings, booleans, lists, dicts).
    :param input_shape: the shape of one input of the encoder, without the batch axis (``(D,)``
        for vectors, ``(C, H, W)`` for images).
    :returns: the record's path.
    :raises ValueError: for a command without a builder, or an ``input_shape`` that is not a
        sequence of positive integers.
    :raises TypeError: if ``arguments`` is not JSON-serialisable.
    """
    from rpm.experiments.common import write_json_atomic

    if command not in BUILDERS:
        raise ValueError(f"command must be one of {sorted(BUILDERS)}, got {command!r}")
    shape = _input_shape(input_shape)
    if shape is None:
        raise ValueError(f"input_shape must be a sequence of positive integers (one input's "
                         f"shape without the batch axis), got {input_shape!r}")
    record = {"format": _FORMAT, "version": _VERSION, "command": command,
              "arguments": dict(arguments), "input_shape": list(shape)}
    return write_json_atomic(Path(folder) / MODEL_RECORD, record)


def _input_shape(value: Any) -> tuple[int, ...] | None:
    """``value`` as a shape of positive integers, or None if it is not one."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return None
    shape = tuple(int(n) if hasattr(n, "__index__") and not isinstance(n, bool) else n
                  for n in value)
    if not shape or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                            for n in shape):
        return None
    return shape


def _refuse_other_shapes(network: torch.nn.Module, shape: tuple[int, ...]) -> None:
    """Makes every encoder of ``network`` (the recognition models of an :class:`rpm.RPM`, or the
    network itself) refuse a batch whose items are not of ``shape``: one ValueError naming
    both shapes, from a forward pre-hook, before any layer runs."""
    def check(module: torch.nn.Module, args: tuple) -> None:
        x: Any = args[0] if args else None
        if hasattr(x, "shape") and tuple(x.shape[1:]) != shape:
            raise ValueError(
                f"this model was trained on inputs of shape {shape} (a batch: (N, "
                f"{', '.join(map(str, shape))})), got inputs of shape {tuple(x.shape[1:])} (a "
                f"batch of shape {tuple(x.shape)}); resize or reshape them to {shape}")

    encoders = getattr(network, "modules_list", None)
    for encoder in encoders if encoders is not None else [network]:
        encoder.register_forward_pre_hook(check)


def model_names(run_folder: str | os.PathLike) -> list[str]:
    """The trained models of a run folder: the paths, relative to it and with ``/``, of the
    folders that hold a model record, sorted (``["rbf", "state-space"]``,
    ``["seed0/infonce", "seed1/infonce"]``)."""
    root = Path(run_folder)
    return sorted(path.parent.relative_to(root).as_posix() for path in root.rglob(MODEL_RECORD)
                  if path.is_file())


def _read_model_record(path: Path, command: str) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise RunFolderError(f"cannot read the model record {path} ({err}): re-run the "
                             "command to write it again") from None
    if not (isinstance(record, dict) and record.get("format") == _FORMAT
            and isinstance(record.get("arguments"), dict)):
        raise RunFolderError(f"{path} is not an rpm model record: re-run the command to write "
                             "it again")
    if record.get("version") != _VERSION:
        raise RunFolderError(f"{path} has model record version {record.get('version')!r}, this "
                             f"rpm reads version {_VERSION}: load it with the rpm that wrote it, "
                             "or re-run the command")
    if "input_shape" in record and _input_shape(record["input_shape"]) is None:
        raise RunFolderError(f"{path} records input_shape {record['input_shape']!r}, not a list "
                             "of positive integers: re-run the command to write it again")
    if record.get("command") != command:
        raise RunFolderError(f"{path} records a model of `rpm {record.get('command')}` in a run "
                             f"of `rpm {command}`: the folder was assembled by hand; re-run the "
                             "command")
    return record


def _device(device: Any) -> torch.device:
    import torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device such as 'cpu', 'cuda' or 'cuda:1', got "
                         f"{device!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r}: CUDA is not available here (torch "
                             f"{torch.__version__}); load with device='cpu'")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device={str(device)!r}: only {count} CUDA device(s) here "
                             f"(cuda:0 to cuda:{count - 1})")
    return device


def load(run_folder: str | os.PathLike, model: str | None = None,
         device: str | torch.device = "cpu") -> torch.nn.Module:
    r"""The trained model of a run folder of any ``rpm`` command, in eval mode, on ``device``.

    The model is rebuilt from its model record (module docstring) and given the weights of
    its latest checkpoint: the trained model when the run finished, the last checkpoint of a
    run that is still training or was interrupted. It is an :class:`rpm.RPM`, with a pair
    prior (``rpm identifiability``, ``rpm digits``, the pair priors of ``rpm bouncing-balls``),
    a prior over J views (``rpm digits``' multi-view priors) or a state-space prior over the
    frames of a sequence (``rpm lds``, ``rpm pendulum``, bouncing-balls' ``state-space``); for
    ``rpm digits``' plain-torch ``torch_ntxent`` it is the trained
    :class:`~rpm.experiments.digits.model.DigitsEncoder` itself. Each embeds new inputs (under
    ``torch.no_grad()`` when no gradient is needed):

    * an :class:`rpm.RPM`, whatever its prior: ``model.encode(x)``, x of shape (N, ...) as one
      frame or image the encoder takes, the recognition means
      :math:`\mathbb{E}_{Q(z|x_n)}[z]`, shape (N, D);
    * an :class:`rpm.RPM` with a prior over the frames of a sequence:
      ``model.encode_views(x)``, x of shape (N, T, ...), the means of every frame, shape
      (N, T, D) (``mask=`` (N, T) imputes missing frames by the prior's smoother);
    * the ``DigitsEncoder``: ``model.encode(x)``, images (N, 1, s, s), the latents z, shape
      (N, D).
    * the :class:`rpm.DiscreteRPM` of ``rpm peer-supervision``: ``model.recognition(x).probs``,
      images (N, 1, 8, 8), the factors :math:`f(Z|x)`, shape (N, K); ``model.posterior(x, x2)``
      the exact posterior of J views.

    Inputs must have the shape the encoder was trained on (the record's ``input_shape``): a
    batch of another frame or image size, e.g. 64 x 64 frames for a model trained on 32 x 32,
    raises a ValueError naming both shapes. A run whose records predate ``input_shape`` loads
    all the same, without that check (``trained["input_shape"]`` is None).

    ``model.config`` is the run's configuration (its ``config.json``: the command's flags),
    ``model.trained`` says what was loaded: ``command``, ``model`` (the name in the run
    folder), ``step`` (the checkpoint's optimiser steps), ``folder`` and ``input_shape``.

    :param path-like run_folder: the ``--out`` folder of an ``rpm`` command.
    :param str model: which model, for runs that train several (``rpm bouncing-balls``'
        priors, ``rpm identifiability --compare-energies``, ``rpm digits``' methods,
        ``seed{s}/METHOD`` with ``--num-seeds``, and ``rpm peer-supervision``'s
        ``SETTING/restart{r}``): a name of :func:`model_names`; None for a run
        of one model.
    :param device: where to put the model (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a
        :class:`torch.device`); a checkpoint written on a GPU loads on the CPU.
    :returns: the model, in eval mode, with ``config`` and ``trained``.
    :raises FileNotFoundError: if ``run_folder`` does not exist.
    :raises RunFolderError: for a folder that is not an rpm run, a run written by an older rpm
        (no model record: re-run it), a ``model`` that is not among the run's models (the
        message lists them), a model without a checkpoint yet, or an edited ``config.json``.
    :raises CheckpointError: for a damaged checkpoint.
    :raises ValueError: for a device that does not exist here.
    """

    from rpm.training.checkpoint import load_checkpoint

    folder = Path(run_folder)
    if not folder.exists():
        raise FileNotFoundError(f"no run folder at {folder}: give the --out folder of an rpm "
                                "command")
    if not folder.is_dir():
        raise RunFolderError(f"{folder} is a file, not a run folder: give the --out folder of "
                             "an rpm command")
    target = _device(device)
    record = read_record(folder)
    if record is None:
        raise RunFolderError(f"{folder} is not an rpm run folder (it has no run record "
                             f"{RECORD_NAME}): give the --out folder of an rpm command")
    command = record.get("command")
    if command not in BUILDERS:
        raise RunFolderError(f"{folder} is a run of `rpm {command}`, which has no model to load "
                             f"(commands with models: {', '.join(sorted(BUILDERS))})")
    names = model_names(folder)
    if not names:
        raise RunFolderError(
            f"{folder} holds no model record ({MODEL_RECORD}): it was written by an older rpm "
            f"or its run stopped before building a model; re-run it with this rpm (`python -m "
            f"rpm {command} --resume --out {folder}` records a finished run's models without "
            "training again) or start afresh")
    if model is None:
        if len(names) > 1:
            raise RunFolderError(f"{folder} holds {len(names)} trained models: choose one with "
                                 f"model=, one of {', '.join(repr(n) for n in names)}")
        name = names[0]
    else:
        name = str(model).strip("/")
        if name not in names:
            raise RunFolderError(f"{folder} has no model {model!r}: choose one of "
                                 f"{', '.join(repr(n) for n in names)}")
    config = verify_config(folder, record)
    model_folder = folder / name
    model_record = _read_model_record(model_folder / MODEL_RECORD, command)
    checkpoint = model_folder / _CHECKPOINT
    if not checkpoint.is_file():
        raise RunFolderError(f"the model {name!r} of {folder} has no checkpoint yet "
                             f"({checkpoint} is missing): wait for its first checkpoint, or "
                             f"finish the run (`python -m rpm {command} --resume --out {folder}`)")
    state = load_checkpoint(checkpoint, map_location="cpu")
    builder = importlib.import_module(BUILDERS[command]).model_from_arguments
    network = builder(model_record["arguments"])
    network.load_state_dict(state["module"])
    network = network.to(target).eval()
    input_shape = _input_shape(model_record.get("input_shape", ()))
    if input_shape is not None:
        _refuse_other_shapes(network, input_shape)
    network.config = config
    network.trained = {"command": command, "model": name, "step": state.get("step"),
                       "folder": str(folder), "input_shape": input_shape}
    return network
