"""The rows of the ``rpm causal-ident`` table (von Kügelgen et al., 2021, Table 1; seed 001's
slides): how each row's views are made and the published SimCLR scores beside them. Plain
Python (no torch), so that ``rpm --help`` stays fast."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DEFAULT_ROWS", "FACTORS", "PUBLISHED", "ROWS", "ViewSpec"]

#: The scored factors, in the table's column order (results.json's ``scores`` keys).
FACTORS = ("class", "position_object", "position_spotlight", "hue_object", "hue_spotlight",
           "hue_background", "rotation")


class ViewSpec(NamedTuple):
    """How a row's two views of a scene are made."""

    #: area range of the random resized crop (with a random flip), or None for no crop
    crop_scale: tuple[float, float] | None = None
    colour: bool = False  #: SimCLR's colour distortion (strength 1)
    rotation: bool = False  #: two different quarter turns
    #: the latent groups a latent transformation redraws (empty: the views are data
    #: augmentations of one image)
    change: tuple[str, ...] = ()


SMALL_CROP, LARGE_CROP = (0.08, 1.0), (0.8, 1.0)

#: Every row the renderer expresses, in the published table's order. "change_*": latent
#: transformations (LT), the others data augmentations (DA).
ROWS = {
    "colour": ViewSpec(colour=True),
    "change_hues": ViewSpec(change=("hues",)),
    "crop_large": ViewSpec(crop_scale=LARGE_CROP),
    "crop_small": ViewSpec(crop_scale=SMALL_CROP),
    "change_positions": ViewSpec(change=("positions",)),
    "crop_large+colour": ViewSpec(crop_scale=LARGE_CROP, colour=True),
    "crop_small+colour": ViewSpec(crop_scale=SMALL_CROP, colour=True),
    "change_positions+hues": ViewSpec(change=("positions", "hues")),
    "rotation": ViewSpec(rotation=True),
    "change_rotations": ViewSpec(change=("rotations",)),
    "rotation+colour": ViewSpec(rotation=True, colour=True),
    "change_rotations+hues": ViewSpec(change=("rotations", "hues")),
}

#: The published means (3 seeds, ResNet-18 SimCLR on Blender's Causal3DIdent): class accuracy,
#: the others nonlinear R^2, in :data:`FACTORS` order.
PUBLISHED = {
    "colour": (0.42, 0.61, 0.17, 0.10, 0.01, 0.01, 0.33),
    "change_hues": (1.00, 0.59, 0.91, 0.30, 0.00, 0.00, 0.30),
    "crop_large": (0.28, 0.09, 0.21, 0.87, 0.09, 1.00, 0.02),
    "crop_small": (0.14, 0.00, 0.00, 0.00, 0.00, 1.00, 0.00),
    "change_positions": (1.00, 0.16, 0.00, 0.46, 0.00, 0.97, 0.29),
    "crop_large+colour": (0.97, 0.59, 0.59, 0.28, 0.01, 0.01, 0.74),
    "crop_small+colour": (1.00, 0.69, 0.93, 0.30, 0.00, 0.02, 0.56),
    "change_positions+hues": (1.00, 0.22, 0.07, 0.32, 0.00, 0.02, 0.34),
    "rotation": (0.33, 0.17, 0.23, 0.83, 0.30, 0.99, 0.05),
    "change_rotations": (1.00, 0.53, 0.90, 0.41, 0.00, 0.97, 0.28),
    "rotation+colour": (0.59, 0.58, 0.21, 0.12, 0.01, 0.01, 0.33),
    "change_rotations+hues": (1.00, 0.57, 0.91, 0.30, 0.00, 0.00, 0.28),
}

#: The rows of the default command: the three the floors name.
DEFAULT_ROWS = ("colour", "crop_small", "crop_large+colour")
