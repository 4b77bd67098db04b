r"""Model of ``rpm masks``: a convolutional encoder and the implicit prior whose energy is a
random walk's step density, normal, Laplace or generalized normal with a learned shape.

The RPM is :math:`Q(z|x) = \delta(z - h(x))` with the implicit prior (Eq. 21-22 of Aitchison &
Ganev)

.. math::

    P(z) = Q(z), \qquad P(z'|z) = \frac{Q(z')\, p(z' - z)}{Z(z)}, \qquad
    p(z' - z) = \prod_d p(z'_d - z_d),

:class:`~rpm.priors.RandomWalkEnergy` of the walks of ``rpm.priors._explicit``: its negative
ELBO per pair is InfoNCE with the critic :math:`\log p(z' - z)` minus :math:`\log N` (Eq. 23-25),
Zimmermann et al.'s loss with a normal, a Laplace or a generalized-normal conditional.

Why not the walks as explicit priors, :math:`P(z) = \mathcal{N}(0, s^2 I)` with recognition
noise :math:`\epsilon` (Appendix B): their ELBO rewards latents that are small against the
batch's spread, and with the encoder's outputs standardised over the batch the encoder met that
by heavy tails (most frames packed within a few :math:`\epsilon`, a few far out), its steps
then far from the factors' (test MCC about 0.5 after 750 steps, on the CPU, for both the normal
and the Laplace walk). The implicit prior has no :math:`\epsilon` and its normaliser contrasts
the positive with the batch, which the packed latents would fail.
"""

from __future__ import annotations

import torch
from torch import nn

import rpm
from rpm._validation import check_positive_int
from rpm.priors import (
    GaussianRandomWalkPrior,
    GeneralizedNormalRandomWalkPrior,
    ImplicitPrior,
    LaplaceRandomWalkPrior,
    MarkovImplicitPrior,
    RandomWalkEnergy,
)

__all__ = ["PRIORS", "MaskEncoder", "build_rpm", "build_walk", "model_from_arguments",
           "walk_parameters"]

#: The priors ``rpm masks`` compares: normal, Laplace and generalized-normal (learned shape) steps.
PRIORS = ("normal", "laplace", "learned")


class MaskEncoder(nn.Module):
    r"""Binary frames (N, 1, S, S) to latents (N, D): stride-2 4 x 4 convolutions (ReLU) down
    to 4 x 4, a hidden layer (ReLU) and a linear read-out.

    :param int image_size: S, a power of 2 >= 8.
    :param int dim: latent dimension D.
    :param int channels: channels of the convolutions.
    :param int hidden: width of the hidden layer.
    """

    def __init__(self, image_size: int, dim: int, channels: int = 16, hidden: int = 128):
        super().__init__()
        size = check_positive_int("image_size", image_size)
        if size < 8 or size & (size - 1):
            raise ValueError(f"image_size must be a power of 2 >= 8, got {size}")
        layers, width, in_channels = [], size, 1
        while width > 4:
            layers += [nn.Conv2d(in_channels, channels, 4, 2, 1), nn.ReLU()]
            in_channels, width = channels, width // 2
        self.net = nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * 16, hidden),
                                 nn.ReLU(), nn.Linear(hidden, check_positive_int("dim", dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build_walk(name: str, dim: int, step: float = 0.1, shape: float = 1.0):
    """The random walk ``name`` (one of :data:`PRIORS`) with step scale ``step`` at the start;
    ``learned`` starts at ``shape`` (1: the Laplace walk)."""
    if name == "normal":
        return GaussianRandomWalkPrior(dim, step=step)
    if name == "laplace":
        return LaplaceRandomWalkPrior(dim, step=step)
    if name == "learned":
        return GeneralizedNormalRandomWalkPrior(dim, step=step, shape=shape)
    raise ValueError(f"prior must be one of {PRIORS}, got {name!r}")


def build_rpm(encoder: nn.Module, walk, window: int = 2) -> rpm.RPM:
    r"""The RPM of the Delta recognition ``encoder`` and the implicit prior of ``walk``'s
    :class:`~rpm.priors.RandomWalkEnergy`: over pairs (``window`` 2), or over windows of
    ``window`` frames the Markov chain of implicit conditionals
    (:class:`~rpm.priors.MarkovImplicitPrior`, :math:`P(z_{t+1}|z_t) \propto Q(z_{t+1})
    p(z_{t+1} - z_t)`, the sum of the consecutive frames' InfoNCE terms). Recognition-output
    validation is off: the training loop draws its own batches."""
    energy = RandomWalkEnergy(walk)
    prior = ImplicitPrior(energy) if window == 2 else MarkovImplicitPrior(energy)
    return rpm.RPM(rpm.DeltaRecognition(encoder, validate=False), prior)


def model_from_arguments(arguments: dict) -> rpm.RPM:
    """The untrained model of ``rpm masks`` from its model record
    (:mod:`rpm.experiments.trained`): :func:`build_rpm` of the :class:`MaskEncoder`
    ``(image_size, dim, channels, hidden)`` and the walk :func:`build_walk` ``(prior, dim)``.

    :param dict arguments: ``prior`` (one of :data:`PRIORS`), ``image_size``, ``dim`` (the
        factors), ``channels``, ``hidden`` and ``window`` (frames per instance).
    """
    encoder = MaskEncoder(arguments["image_size"], arguments["dim"], arguments["channels"],
                          arguments["hidden"])
    walk = build_walk(arguments["prior"], arguments["dim"])
    return build_rpm(encoder, walk, arguments["window"])


@torch.no_grad()
def walk_parameters(walk) -> dict:
    """The walk's learned step scale and (generalized normal) shape, as floats."""
    values = {"step_scale": float(walk.step)}
    if isinstance(walk, GeneralizedNormalRandomWalkPrior):
        values["shape"] = float(walk.shape)
    return values
