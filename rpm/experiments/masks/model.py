r"""Model of ``rpm masks``: a convolutional encoder whose outputs are standardised over the
batch, and the three random-walk priors it is trained with.

The RPM is :math:`Q(z|x) = \mathcal{N}(h(x), \epsilon^2 I)` (Delta recognition with noise,
Appendix B of Aitchison & Ganev: the explicit priors need a density) with the random walk
:math:`P(z) = \mathcal{N}(0, s^2 I)`, :math:`P(z'|z) = \prod_d p(z'_d - z_d)`, the step
density p normal, Laplace or generalized normal with a learned shape
(:mod:`rpm.priors.explicit`). Its ELBO (Eq. 15)

.. math::

    \mathcal{L} = \mathbb{E}\big[\log P(z) + \log P(z'|z) - \log Q(z) - \log Q(z')\big]

rewards small latents while their minibatch-mixture marginals stay apart: unconstrained, the
encoder shrinks its outputs until the noise :math:`\epsilon` dominates the steps, and the
steps' shape is lost. :class:`Standardize` pins the scale: each output dimension has mean 0 and
variance 1 over the batch, exactly (no epsilon in the denominator for the encoder to shrink
against), so :math:`\epsilon` is a fixed fraction of the latents' spread.
"""

from __future__ import annotations

import torch
from torch import nn

import rpm
from rpm._validation import check_positive_int
from rpm.priors import (
    GaussianRandomWalkPrior,
    GeneralizedNormalRandomWalkPrior,
    LaplaceRandomWalkPrior,
)

__all__ = ["PRIORS", "MaskEncoder", "Standardize", "build_prior", "build_rpm",
           "prior_parameters"]

#: The priors ``rpm masks`` compares: normal, Laplace and generalized-normal (learned shape) steps.
PRIORS = ("normal", "laplace", "learned")


class Standardize(nn.Module):
    r""":math:`(h - \bar h) / \mathrm{sd}(h)` per column over the batch (unbiased sd, floored at
    1e-12 for a constant column). Shape: (N, D) -> (N, D); N >= 2."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if h.shape[0] < 2:
            raise ValueError(f"Standardize needs a batch of at least 2 rows, got {h.shape[0]}")
        return (h - h.mean(0)) / h.std(0).clamp_min(1e-12)


class MaskEncoder(nn.Module):
    r"""Binary frames (N, 1, S, S) to standardised latents (N, D): stride-2 convolutions (ReLU)
    down to 4 x 4, a hidden layer and a linear read-out, then :class:`Standardize`.

    :param int image_size: S, a power of 2 >= 8.
    :param int dim: latent dimension D.
    :param int channels: channels of the convolutions.
    :param int hidden: width of the hidden layer.
    """

    def __init__(self, image_size: int, dim: int, channels: int = 32, hidden: int = 256):
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
        self.standardize = Standardize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.standardize(self.net(x))


def build_prior(name: str, dim: int, step: float = 0.1, shape: float = 1.0):
    """The random-walk prior ``name`` (one of :data:`PRIORS`), s = 1 and the step's scale
    ``step`` at the start; ``learned`` starts at ``shape`` (1: the Laplace walk)."""
    if name == "normal":
        return GaussianRandomWalkPrior(dim, scale=1.0, step=step)
    if name == "laplace":
        return LaplaceRandomWalkPrior(dim, scale=1.0, step=step)
    if name == "learned":
        return GeneralizedNormalRandomWalkPrior(dim, scale=1.0, step=step, shape=shape)
    raise ValueError(f"prior must be one of {PRIORS}, got {name!r}")


def build_rpm(encoder: nn.Module, prior, noise_scale: float) -> rpm.RPM:
    """The RPM of ``encoder`` with recognition noise ``noise_scale`` and ``prior``
    (recognition-output validation off: the training loop draws its own batches)."""
    return rpm.RPM(rpm.DeltaRecognition(encoder, noise_scale=noise_scale, validate=False), prior)


@torch.no_grad()
def prior_parameters(prior) -> dict:
    """The prior's learned scale s, step scale and (generalized normal) shape, as floats."""
    values = {"scale": float(prior.scale), "step": float(prior.step)}
    if isinstance(prior, GeneralizedNormalRandomWalkPrior):
        values["shape"] = float(prior.shape)
    return values
