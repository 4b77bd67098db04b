r"""Training and scoring of ``rpm identifiability`` on given positive pairs: :func:`fit` for
arrays (a notebook), :func:`train_and_score` for the command, one implementation
(:func:`~rpm.experiments.identifiability.train.train_energy`).

The arrays: ``views`` (N, 2, ...), N positive pairs of observations (each flattened to P
numbers); optional ``latents`` (N, K), the true latents of each pair's first view, for the
scores only; optional ``held_out`` (N,) boolean, the pairs scored and not trained on. Without
``held_out`` the last :math:`\max(1, \lfloor N/5 \rfloor)` pairs are held out when there are
latents, none without. The held-out pairs' first views and latents are both the validation set
(the progress display, ``scores.png``) and the test set (``r2``, ``mcc``, the baselines): with
given data there are no fresh samples to draw. Each training step takes ``--batch-size``
distinct training pairs (:class:`~rpm.experiments.identifiability.data.ArrayPairStream`). The
encoder maps P numbers to n = ``--dim`` latents (default: the latents' K, else P).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from rpm.experiments.common import GIVEN_FLAGS, resolve_device, torch_threads
from rpm.experiments.data_file import command_options, float_array, held_out_split, read_arrays
from rpm.experiments.identifiability.command import ARRAYS
from rpm.experiments.identifiability.data import ArrayPairStream
from rpm.experiments.identifiability.train import train_energy
from rpm.experiments.lds.fitting import run_folder

__all__ = ["ARRAYS", "GENERATION_FLAGS", "IdentifiabilityFit", "PairData", "check_arrays", "fit",
           "load_data", "train_and_score"]

#: The flags of the generated pairs, which ``--data`` replaces.
GENERATION_FLAGS = ("space", "marginal", "marginal_param", "conditional", "conditional_param",
                    "gennorm_beta", "concentrations", "eval_samples")
#: The default split holds out the last N // 5 pairs.
HELD_OUT_SHARE = 5


class PairData(NamedTuple):
    """Checked pairs (module docstring).

    :ivar torch.Tensor train: the training pairs, (M, 2, P), in the default dtype.
    :ivar held_out: ``(z, x)``, the held-out latents (n, K) and first views (n, P); or None.
    :ivar int dim: n, the encoder's output dimension.
    """

    train: torch.Tensor
    held_out: tuple[torch.Tensor, torch.Tensor] | None
    dim: int


class IdentifiabilityFit(NamedTuple):
    """Trained models and their results, one per energy.

    :ivar dict models: energy -> the trained :class:`~rpm.RPM`, in evaluation mode
        (``model.encode(x)`` embeds observations (M, P)).
    :ivar dict results: energy -> the JSON-ready result of
        :func:`~rpm.experiments.identifiability.train.train_energy` (``r2``, ``mcc`` ... None
        without latents).
    :ivar scores_skipped: why the scores are None, else None.
    """

    models: dict
    results: dict
    scores_skipped: str | None


def check_arrays(views: Any, latents: Any, held_out: Any, batch_size: int,
                 dim: int | None) -> PairData:
    """The checked pairs (module docstring); every problem is a one-line :class:`ValueError`
    naming the array and the expected shape: a wrong layout, NaN or infinity, fewer training
    pairs than ``batch_size``, too few held-out pairs for the affine R^2 fit, a ``dim`` smaller
    than the latents' K, a ``held_out`` that is not boolean of shape (N,), an empty split.

    :param views: (N, 2, ...).
    :param latents: (N, K) or None.
    :param held_out: (N,) boolean or None.
    :param int batch_size: pairs per training step.
    :param dim: n, or None for the default (the latents' K, else P).
    """
    x = float_array("views", views, range(3, 33), "(N, 2, ...)", np.float32)
    if x.shape[1] != 2:
        raise ValueError(f"views must have shape (N, 2, ...), the two views of each pair, got "
                         f"shape {tuple(x.shape)}")
    x = x.reshape(len(x), 2, -1)  # (N, 2, P)
    num = len(x)
    z = None
    if latents is not None:
        z = float_array("latents", latents, (2,), "(N, K)")
        if len(z) != num:
            raise ValueError(f"latents must have shape (N, K) = ({num}, K) like views, got shape "
                             f"{tuple(z.shape)}")
    mask = held_out_split(held_out, num, "pairs", share=HELD_OUT_SHARE,
                          scored_by=None if z is None else "latents")
    train = int((~mask).sum())
    if train < batch_size:
        raise ValueError(f"{train} training pairs, fewer than --batch-size {batch_size}: use "
                         f"--batch-size {train} or less")
    dim = dim or (z.shape[1] if z is not None else x.shape[2])
    dtype = torch.get_default_dtype()
    if z is None:
        return PairData(torch.as_tensor(x[~mask]).to(dtype), None, dim)
    tested, size = int(mask.sum()), z.shape[1]
    if tested < 2 * size + 4:
        raise ValueError(f"{tested} held-out pairs are too few for the affine R^2 fit of {size} "
                         f"latents: hold out at least {2 * size + 4} (held_out)")
    if dim < size:
        raise ValueError(f"--dim {dim} is smaller than the latents' {size}: the MCC matches each "
                         f"latent to its own output coordinate; use --dim {size} or more")
    held = (torch.as_tensor(z[mask]).to(dtype), torch.as_tensor(x[mask, 0]).to(dtype))
    return PairData(torch.as_tensor(x[~mask]).to(dtype), held, dim)


def load_data(path: str, batch_size: int, dim: int | None) -> PairData:
    """The checked arrays of ``rpm identifiability --data path`` (:data:`ARRAYS`,
    :func:`check_arrays`)."""
    arrays = read_arrays(path, *ARRAYS)
    return check_arrays(arrays["views"], arrays.get("latents"), arrays.get("held_out"),
                        batch_size, dim)


def data_dim(args) -> int | None:
    """``--dim`` when it was given (on the command line or as an option), else None."""
    return args.dim if "dim" in getattr(args, GIVEN_FLAGS, ()) else None


def train_and_score(data: PairData, args, out, device: torch.device) -> IdentifiabilityFit:
    """Trains every energy of the resolved flags ``args`` on ``data``'s training pairs, each
    in ``out / energy``, and scores it on the held-out pairs (module docstring).

    :param PairData data: the checked pairs.
    :param args: the resolved flags of ``rpm identifiability`` (``args.energies``).
    :param out: the folder of the energies' checkpoints and histories.
    :param torch.device device: the training device.
    """
    args.dim = data.dim
    stream = ArrayPairStream(data.train.to(device), args.batch_size, args.seed)
    held_out = None
    if data.held_out is not None:
        pair = tuple(t.to(device) for t in data.held_out)
        held_out = {"eval": pair, "test": pair}
    models, results = {}, {}
    for name in args.energies:
        results[name], models[name] = train_energy(name, args, stream, held_out, out / name,
                                                   device, in_dim=data.train.shape[-1])
    return IdentifiabilityFit(models, results, None if held_out else "no latents given")


def fit(views: Any, latents: Any = None, held_out: Any = None, *, out: str | None = None,
        **options: Any) -> IdentifiabilityFit:
    r"""Trains the encoder of ``rpm identifiability`` on the positive pairs ``views`` and scores
    it against ``latents`` (module docstring): what ``rpm identifiability --data FILE`` does,
    without the run folder's results and figures.

    :param views: (N, 2, ...), N positive pairs (NumPy or torch).
    :param latents: (N, K), the true latents of the first views, for the scores only; or None.
    :param held_out: (N,) boolean, the pairs held out from training and scored; default the
        last N // 5 with latents, none without.
    :param out: a folder for the checkpoints and histories (kept); default a temporary one.
    :param options: the flags of ``rpm identifiability`` by name (``energy``,
        ``compare_energies``, ``dim``, ``tau``, ``p``, ``learn_temperature``,
        ``encoder_space``, ``hidden``, ``depth``, ``steps``, ``batch_size``, ``lr``,
        ``energy_lr``, ``warmup``, ``eval_every``, ``seed``, ``device``, ``threads``,
        ``progress``, ``checkpoint_every``, ...), each with the command's default.
    :raises ValueError: a bad array or option, in one line.
    """
    from rpm.experiments.identifiability.command import _resolve, add_parser

    args = command_options(add_parser, "identifiability", options, exclude=GENERATION_FLAGS)
    setattr(args, GIVEN_FLAGS, frozenset(options))
    args = _resolve(args)
    data = check_arrays(views, latents, held_out, args.batch_size, data_dim(args))
    with run_folder(out) as folder, torch_threads(args.threads):
        return train_and_score(data, args, folder, resolve_device(args.device))

