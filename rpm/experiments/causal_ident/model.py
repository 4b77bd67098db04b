r"""Model of the ``rpm causal-ident`` experiment: an RPM with the implicit prior (its ELBO is
InfoNCE, Aitchison & Ganev Eq. 23-25) on the output of a small convolutional encoder of the
scene images.

Encoder :math:`h`: three 3 x 3 convolutions of stride 2 (``width``, ``2 width``, ``2 width``
channels, batch normalisation, ReLU), then the feature map :math:`F \in \mathbb R^{2 w \times
s/8 \times s/8}` pooled (``pooling``): ``flatten`` keeps every cell (the features know where
they are), ``average`` takes the mean over the cells, :math:`\bar F_c = \frac{64}{s^2}
\sum_{ij} F_{cij}` (a ResNet's global average pooling: features that move with the image
give nearly the same vector); then a hidden layer of ``hidden`` units and a linear map to
``rep_dims``; recognition :math:`Q(z \mid x) = \delta(z - h(x))`. Energy (``energy``):

* ``cosine``: :math:`f(z, z') = \hat z^\top \hat z' / \tau` (unit vectors; SimCLR's critic,
  the paper's);
* ``rbf``: :math:`f(z, z') = -\lVert z - z' \rVert^2 / (2 l^2)` with :math:`l` fixed.

The prior's conditional :math:`P(z' \mid z) \propto Q(z') e^{f(z, z')}` is what the views
define: an augmentation that leaves a factor unchanged makes the learned :math:`h` keep it,
one that redraws it makes :math:`h` drop it (von Kügelgen et al., 2021; ``docs/theory.md``).
"""

from __future__ import annotations

import torch
from torch import nn

import rpm
from rpm._validation import check_choice, check_positive, check_positive_int
from rpm.priors import CosineEnergy, ImplicitPrior, RBFEnergy

__all__ = ["ENERGIES", "POOLINGS", "SceneEncoder", "build_model", "model_from_arguments"]

#: The energies of the implicit prior (module docstring).
ENERGIES = ("cosine", "rbf")
#: How :class:`SceneEncoder` pools its last feature map (module docstring).
POOLINGS = ("flatten", "average")


class SceneEncoder(nn.Module):
    r""":math:`h: [0, 1]^{3 \times s \times s} \to \mathbb R^{m}`, three stride-2 3 x 3
    convolutions with batch normalisation and ReLU, the feature map flattened or averaged over
    its cells, then ``Linear -> ReLU -> Linear`` (module docstring).

    :param int rep_dims: m, the representation's dimension.
    :param int size: s, the side of the images (a multiple of 8).
    :param int width: channels of the first convolution (the others have twice as many).
    :param int hidden: units of the hidden layer.
    :param str pooling: ``"flatten"`` (every cell of the last feature map) or ``"average"``
        (their mean per channel).
    """

    def __init__(self, rep_dims: int, size: int = 32, width: int = 32, hidden: int = 256,
                 pooling: str = "flatten") -> None:
        super().__init__()
        rep_dims, size = check_positive_int("rep_dims", rep_dims), check_positive_int("size", size)
        width, hidden = check_positive_int("width", width), check_positive_int("hidden", hidden)
        if size % 8:
            raise ValueError(f"size must be a multiple of 8 (three halvings), got {size}")
        self.pooling = check_choice("pooling", pooling, POOLINGS)
        self.size = size
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.pool = nn.Flatten() if pooling == "flatten" else nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        cells = (size // 8) ** 2 if pooling == "flatten" else 1
        self.head = nn.Sequential(nn.Linear(2 * width * cells, hidden), nn.ReLU(),
                                  nn.Linear(hidden, rep_dims))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """:param torch.Tensor images: Shape: (N, 3, s, s). :returns: Shape: (N, m)."""
        if images.ndim != 4 or images.shape[1:] != (3, self.size, self.size):
            raise ValueError(f"images must have shape (N, 3, {self.size}, {self.size}), got "
                             f"{tuple(images.shape)}")
        return self.head(self.pool(self.features(images)))


def build_model(encoder: nn.Module, energy: str = "cosine", temperature: float = 0.1) -> rpm.RPM:
    r"""The RPM of the implicit prior with ``energy`` on ``encoder``'s output.

    :param torch.nn.Module encoder: h, images (N, 3, s, s) to (N, m).
    :param str energy: ``"cosine"`` (:math:`\kappa = 1/\tau`) or ``"rbf"`` (:math:`2 l^2 =
        \tau`, so that :math:`f = -\lVert z - z' \rVert^2 / \tau`).
    :param float temperature: :math:`\tau > 0`.
    :return: the RPM, recognition-output validation off (it would synchronise every step).
    """
    check_choice("energy", energy, ENERGIES)
    temperature = check_positive("temperature", temperature)
    if energy == "cosine":
        prior_energy = CosineEnergy(kappa=1.0 / temperature)
    else:
        prior_energy = RBFEnergy(lengthscale=(temperature / 2) ** 0.5, learn_lengthscale=False)
    return rpm.RPM(rpm.DeltaRecognition(encoder, validate=False), ImplicitPrior(prior_energy))


def model_from_arguments(arguments: dict) -> rpm.RPM:
    """The untrained model of ``rpm causal-ident`` from its model record
    (:mod:`rpm.experiments.trained`).

    :param dict arguments: ``rep_dims``, ``size``, ``width``, ``hidden``, ``energy``,
        ``temperature`` and ``pooling`` (absent in the records written before it existed:
        ``"flatten"``, the encoder they were trained with).
    """
    encoder = SceneEncoder(arguments["rep_dims"], arguments["size"], arguments["width"],
                           arguments["hidden"], arguments.get("pooling", "flatten"))
    return build_model(encoder, arguments["energy"], arguments["temperature"])
