r"""The views of the ``rpm peer-supervision`` experiment.

**Peers** (J >= 2): an instance is J *different* training images of the same digit, an anchor
and J - 1 partners drawn uniformly without replacement from the other images of its digit
(:func:`peer_partners`). The digit is the only thing the J images share, so the latent the
model infers from them is the digit: the labels decide which images go together and are never
shown to the model (Walker et al., 2023, Sec. 5: "peer supervision").

**Augmentations** (``--views 1``): an instance is one training image and its two views are two
random augmentations of it, the views of ``rpm digits``' pair methods
(:class:`rpm.data.augment.RandomView`'s defaults: small rotations, shifts, zooms and shears,
pixel noise, no flips): the self-supervised clustering setting, in which nothing but the image
itself says what its views share.

Every draw is a pure function of the seed and the step (:func:`step_views`: a CPU generator
seeded with ``derived_seed(seed, "train", step)``), so a resumed run needs no sampler state and
every restart of a setting sees the same minibatches.
"""

from __future__ import annotations

import torch

from rpm._validation import check_int, check_positive_int
from rpm.data.augment import MultiViewTransform, RandomView
from rpm.experiments.common import derived_seed

__all__ = ["augmented_pair", "peer_partners", "selection_views", "step_views"]


def augmented_pair() -> MultiViewTransform:
    """Two random views of an image, each :class:`~rpm.data.augment.RandomView` with its
    defaults (the views of ``rpm digits``' pair methods)."""
    return MultiViewTransform([RandomView(), RandomView()])


def peer_partners(labels: torch.Tensor, anchors: torch.Tensor, num_views: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
    """J - 1 partners of every anchor: distinct images with the anchor's label, other than
    the anchor, drawn uniformly without replacement (each J - 1 subset of the other images of
    its class equally likely).

    :param torch.Tensor labels: the label of every image, int64. Shape: (M,).
    :param torch.Tensor anchors: indices into ``labels``. Shape: (B,).
    :param int num_views: J >= 2; every class of an anchor needs at least J images.
    :param torch.Generator generator: CPU generator of the draw.
    :returns: J - 1 index tensors, partner j of every anchor. Shape: (B,) each.
    """
    num_views = check_int("num_views", num_views, minimum=2)
    order = torch.argsort(labels, stable=True)  # the images grouped by class
    counts = torch.bincount(labels)  # (C,)
    starts = torch.cumsum(counts, 0) - counts
    position = torch.empty_like(order)
    position[order] = torch.arange(order.shape[0])  # an image's place in the sorted order
    classes = labels[anchors]  # (B,)
    size = counts[classes]  # (B,) images of the anchor's class
    if bool((size < num_views).any()):
        raise ValueError(f"a class has {int(size.min())} images, fewer than the J = {num_views} "
                         "distinct images of an instance; use fewer views")
    offset_in_class = position[anchors] - starts[classes]  # (B,)
    # uniform keys for the offsets 1..size-1 (the other images); the smallest J - 1 win
    keys = torch.rand(anchors.shape[0], int(counts.max()) - 1, generator=generator)
    keys[torch.arange(keys.shape[1]) >= (size - 1).unsqueeze(1)] = 2.0  # offsets past the class
    offsets = keys.argsort(dim=1)[:, :num_views - 1] + 1  # (B, J-1), distinct in 1..size-1
    return [order[starts[classes] + (offset_in_class + offsets[:, j]) % size]
            for j in range(num_views - 1)]


def _views(images: torch.Tensor, labels: torch.Tensor, views: int, rows: torch.Tensor,
           generator: torch.Generator) -> list[torch.Tensor]:
    if views == 1:
        return augmented_pair()(images[rows.to(images.device)], generator)
    partners = peer_partners(labels, rows, views, generator)
    return [images[index.to(images.device)] for index in (rows, *partners)]


def step_views(images: torch.Tensor, labels: torch.Tensor, views: int, batch_size: int,
               seed: int, step: int) -> list[torch.Tensor]:
    """The views of the minibatch of step ``step`` (module docstring): ``batch_size`` anchors
    drawn uniformly without replacement from the training images, then their partners (J >= 2)
    or two augmentations of each (``views`` = 1).

    :param torch.Tensor images: the training images, on the training device. Shape: (M, 1, 8, 8).
    :param torch.Tensor labels: their labels, on the CPU. Shape: (M,).
    :param int views: J >= 2 images of one digit, or 1 (two augmentations of one image).
    :returns: the J views (2 for ``views`` = 1). Shape: (batch_size, 1, 8, 8) each.
    """
    check_positive_int("batch_size", batch_size)
    generator = torch.Generator().manual_seed(derived_seed(seed, "train", step))
    rows = torch.randperm(images.shape[0], generator=generator)[:batch_size]
    return _views(images, labels, views, rows, generator)


def selection_views(images: torch.Tensor, labels: torch.Tensor, views: int,
                    seed: int) -> list[torch.Tensor]:
    """Every training image with its partners (or two augmentations), drawn once from
    ``derived_seed(seed, "eval")``: the instances on which the restarts' log-likelihoods are
    compared."""
    generator = torch.Generator().manual_seed(derived_seed(seed, "eval"))
    return _views(images, labels, views, torch.arange(images.shape[0]), generator)
