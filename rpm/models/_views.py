r"""How the J views of a batch reach the encoders (``docs/theory.md``, J views).

A batch holds N instances with J >= 2 views each (two augmentations, 2 global and 6 local
crops, T frames). View j of instance i is the tensor ``views[j][i]``; the views of one batch may
differ in shape (a global crop of 224 px, a local crop of 96 px). Each view has a recognition
model :math:`Q_j(z|x)` chosen by its **group**: one recognition model for all views, or one per
group of views (``groups[j]`` is the index of view j's recognition model), every model giving
latents of one dimension D.

**The rule of encoder calls** (``encoder_calls``):

* ``"per_view"`` (the default for pairs): one call per view, ``recognition(views[j])`` on the
  N inputs of that view;
* ``"concat"``: the views of one group (all of one shape) are concatenated along the batch
  axis and encoded in one call of N J_g inputs, as SimCLR's implementations do; the result is
  split back into the views.

Both give the same distributions for an encoder that treats the inputs of a batch independently
(the ELBOs agree to rounding). They differ under batch normalisation in training mode: per view,
each call normalises with the statistics of that view's N inputs (the two augmentations of
SimCLR are normalised separately); concatenated, with the statistics of all N J_g inputs of the
group, and the running statistics are updated once per group rather than once per view. One
call per group is also faster on an accelerator for small N (fewer, larger kernels).
"""

from __future__ import annotations

import torch
from pyro.distributions import Delta, Normal, TorchDistribution
from pyro.infer.util import is_validation_enabled
from torch.distributions import Distribution

from rpm.marginals._mixture_marginal import recognition_components
from rpm.ops._finite import all_finite

__all__ = [
    "ENCODER_CALLS",
    "call_encoder",
    "check_inputs",
    "recognise_views",
]

#: The values of ``encoder_calls``.
ENCODER_CALLS = ("per_view", "concat")


def _first_parameter_dtype(module) -> torch.dtype | None:
    """The dtype of the module's first floating-point parameter (None without one)."""
    if not isinstance(module, torch.nn.Module):
        return None
    for parameter in module.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return None


def check_inputs(names: list[str], views: list) -> int:
    """Checks the J views of a batch and returns N.

    Each view is a tensor with a batch axis of the same N >= 2 and, under
    ``pyro.enable_validation``, finite (floating-point views). A dtype that the encoder refuses
    is reported when it is called (:func:`recognise_views`).

    :raises TypeError: for a view that is not a tensor.
    :raises ValueError: for a missing batch axis, unequal batch sizes, N < 2, non-finite rows.
    """
    for name, value in zip(names, views, strict=True):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dim() < 1:
            raise ValueError(f"{name} must have a batch dimension, got a scalar")
    sizes = [value.shape[0] for value in views]
    if any(size != sizes[0] for size in sizes[1:]):
        if len(views) == 2:
            raise ValueError(
                f"x and x2 are paired views and need the same batch size, got {sizes[0]} and "
                f"{sizes[1]}; pass the two views of the same N pairs (x[i] and x2[i] form "
                "pair i)"
            )
        raise ValueError(
            f"the {len(views)} views need the same batch size N (view j of instance i is "
            f"views[j][i]), got {sizes}"
        )
    if sizes[0] < 2:
        raise ValueError(
            f"a batch of {sizes[0]} pair or sequence has nothing to contrast: the recognition "
            "marginal is a mixture over the batch, so use at least 2 pairs or at least 2 "
            "sequences (in practice many more)"
        )
    if is_validation_enabled():
        for name, value in zip(names, views, strict=True):
            if value.is_floating_point():
                _check_finite_input(name, value)
    return sizes[0]


#: Fragments of torch's messages for an input whose trailing shape a layer cannot take.
_SHAPE_ERRORS = ("shapes cannot be multiplied", "size mismatch", "Expected size",
                 "expected input", "but got input of size", "Given groups=")


def call_encoder(module, value: torch.Tensor, name: str):
    """``module(value)``; a dtype error of torch inside the encoder (integer or float64 data into
    a float32 network) becomes one TypeError naming the input, its dtype and the fix, and a layer
    refusing the input's trailing shape (a linear layer's feature size, a convolution's channels)
    one ValueError naming the input's shape."""
    try:
        return module(value)
    except RuntimeError as error:
        if any(word in str(error) for word in _SHAPE_ERRORS):
            raise ValueError(
                f"the recognition network refused {name} of shape {tuple(value.shape)} (torch: "
                f"{str(error).splitlines()[0]}); {name} must have the shape the encoder takes "
                "after the batch axis (its feature size or image shape): check the last axes of "
                f"{name}, or the encoder's input size"
            ) from error
        wanted = _first_parameter_dtype(module)
        if wanted is None or value.dtype == wanted or not any(
                word in str(error) for word in ("dtype", "scalar type", "Input type", "type (")):
            raise
        fix = (f"{name}.to({wanted})" + (f" (images: {name}.to({wanted}) / 255)"
                                          if not value.is_floating_point() else "")
               + ("" if not value.is_floating_point() else f", or the model: model.to({value.dtype})"))
        raise TypeError(
            f"{name} has dtype {value.dtype} but the encoder's parameters are {wanted} (torch "
            f"refused the mix: {str(error).splitlines()[0]}); convert the data: {fix}"
        ) from error


def _check_finite_input(name: str, value: torch.Tensor) -> None:
    """Raises ValueError naming the rows of ``value`` (N, ...) that hold NaN or infinite entries."""
    if all_finite(value):  # one reduction per step; the rows only for the message
        return
    finite = torch.isfinite(value).reshape(value.shape[0], -1).all(-1)  # (N,)
    if not finite.all():
        rows = torch.nonzero(~finite).flatten().tolist()
        shown = ", ".join(str(row) for row in rows[:5]) + (", ..." if len(rows) > 5 else "")
        raise ValueError(
            f"{name} has NaN or infinite entries in {len(rows)} of its {value.shape[0]} rows "
            f"(rows {shown}); clean or drop those pairs (or sequences) before training (this check runs "
            "under pyro.enable_validation)"
        )


def _check_distribution(name: str, dist, batch_size: int) -> None:
    if not isinstance(dist, Distribution) or dist.batch_shape != (batch_size,) or len(
            dist.event_shape) != 1:
        got = (f"batch_shape {tuple(dist.batch_shape)} and event_shape {tuple(dist.event_shape)}"
               if isinstance(dist, Distribution) else type(dist).__name__)
        hint = ("; a network that returns latents is a recognition model once wrapped: "
                "rpm.DeltaRecognition(net) (a point per input; rpm.GaussianRecognition takes a "
                "network that returns (loc, scale))" if isinstance(dist, torch.Tensor) else "")
        raise ValueError(
            f"{name} must return a distribution with batch_shape (N,) = ({batch_size},) and "
            f"event_shape (D,), got {got}{hint}"
        )


def _chunks(dist: TorchDistribution, pieces: int) -> list[tuple]:
    """The parameters ``(loc, scale)`` of recognition distributions of batch (pieces N,), in
    ``pieces`` chunks of N rows."""
    loc, scale = recognition_components(dist)
    scales = [None] * pieces if scale is None else scale.chunk(pieces)
    return list(zip(loc.chunk(pieces), scales, strict=True))


def _split(dist: TorchDistribution, pieces: int) -> list[TorchDistribution]:
    """Splits recognition distributions of batch (pieces N,) into ``pieces`` of batch (N,)."""
    loc, scale = recognition_components(dist)
    if scale is None:
        return [Delta(part, event_dim=1) for part in loc.chunk(pieces)]
    return [Normal(part, part_scale).to_event(1)
            for part, part_scale in zip(loc.chunk(pieces), scale.chunk(pieces), strict=True)]


def _label(group: int) -> str:
    """The name of recognition model ``group`` in messages (``recognition``,
    ``recognition2``, ...)."""
    return "recognition" if group == 0 else f"recognition{group + 1}"


def recognise_views(names: list[str], views: list[torch.Tensor], modules: list,
                    groups: list[int], encoder_calls: str, batch_size: int,
                    components: bool = False, check: bool = True) -> list:
    """The recognition distributions of the J views, each with batch_shape (N,) and
    event_shape (D,), by the rule of ``encoder_calls`` (module docstring); with ``components``
    their parameters ``(loc (N, D), scale (N, D) or None for Delta)`` instead (what
    :func:`~rpm.marginals._sequence_marginal.stack_components` takes: a group's call is split
    without building J distributions).

    :param names: the views' names for errors (``"x"``, ``"x2"`` or ``"views[j]"``).
    :param views: J tensors (N, ...).
    :param modules: the recognition models.
    :param groups: ``groups[j]``, the index in ``modules`` of view j's model.
    :param str encoder_calls: ``"per_view"`` or ``"concat"``.
    :param int batch_size: N.
    :param bool components: return the views' ``(loc, scale)``.
    :param bool check: check the distributions' shapes and latent dimensions (a model skips
        it for a batch whose signature passed before, ``rpm.models._checked_batches``).
    """
    if encoder_calls == "per_view" or len(views) == 1:
        dists = [call_encoder(modules[g], value, name)
                 for name, value, g in zip(names, views, groups, strict=True)]
        if check:
            for j, dist in enumerate(dists):
                _check_distribution(_label(groups[j]), dist, batch_size)
        if components:
            dists = [recognition_components(dist) for dist in dists]
    else:
        dists = [None] * len(views)
        for g in sorted(set(groups)):
            members = [j for j in range(len(views)) if groups[j] == g]
            shapes = {tuple(int(size) for size in views[j].shape) for j in members} if check \
                else ()
            if len(shapes) > 1:
                raise ValueError(
                    f"encoder_calls='concat' encodes the views of one group in one call, so they "
                    f"need one shape; the views {[names[j] for j in members]} of "
                    f"{_label(g)} have shapes {sorted(shapes)}: give views of different shapes "
                    "their own group (groups=...), or use encoder_calls='per_view'"
                )
            if len(members) == 1:
                dist = call_encoder(modules[g], views[members[0]], names[members[0]])
                if check:
                    _check_distribution(_label(g), dist, batch_size)
                dists[members[0]] = recognition_components(dist) if components else dist
                continue
            joint = call_encoder(modules[g], torch.cat([views[j] for j in members]),
                          "the views " + ", ".join(names[j] for j in members))
            if check:
                _check_distribution(_label(g), joint, batch_size * len(members))
            parts = _chunks(joint, len(members)) if components else _split(joint, len(members))
            for j, part in zip(members, parts, strict=True):
                dists[j] = part
    if not check:
        return dists
    dims = [int(part[0].shape[-1] if components else part.event_shape[0]) for part in dists]
    if any(dim != dims[0] for dim in dims[1:]):
        if len(dists) == 2:
            raise ValueError(
                f"the two views' latents have different dimensions {dims[0]} and "
                f"{dims[1]}; both encoders must output the same latent dimension"
            )
        raise ValueError(
            f"the views' latents have different dimensions {dims}; every recognition "
            "model must output the same latent dimension D"
        )
    return dists
