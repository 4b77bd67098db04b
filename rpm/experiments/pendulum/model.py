r"""The encoder of ``rpm pendulum``: a small convolutional network with a constant recognition
noise,

.. math::

    Q(z_t | x_t) = \mathcal{N}\big(\mu(x_t), \sigma^2 I\big), \qquad
    \mu = W_4\, \mathrm{ReLU}(W_3\, \mathrm{vec}\, \mathrm{ReLU}(K_2 * \mathrm{ReLU}(K_1 * x))),

two 5 x 5 convolutions of stride 2 (``channels`` and ``2 channels`` maps, S x S -> S/4 x S/4),
a hidden layer of ``hidden`` units and a linear output of D. No batch normalisation, so that a
frame's code does not depend on its batch. :math:`\sigma` is a constant (a buffer), as in
:class:`~rpm.experiments.lds.model.GaussianMLPEncoder`: the scale of the means is free.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rpm._validation import check_int, check_positive, check_positive_int

__all__ = ["GaussianConvEncoder"]


class GaussianConvEncoder(nn.Module):
    r"""The convolutional Gaussian encoder (module docstring).

    :param int image_size: S, the side of the (one-channel) frames, >= 8.
    :param int out_dim: D, the latent dimension.
    :param int channels: maps of the first convolution (the second has twice as many).
    :param int hidden: units of the hidden layer.
    :param float noise: :math:`\sigma > 0`.

    Shape: input (M, 1, S, S); output ``(loc, scale)``, each (M, D).
    """

    def __init__(self, image_size: int = 28, out_dim: int = 4, channels: int = 16,
                 hidden: int = 64, noise: float = 0.1) -> None:
        super().__init__()
        check_int("image_size", image_size, minimum=8)
        check_positive_int("out_dim", out_dim)
        check_positive_int("channels", channels)
        check_positive_int("hidden", hidden)
        check_positive("noise", noise)
        side = (image_size + 1) // 2
        side = (side + 1) // 2
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 5, stride=2, padding=2), nn.ReLU(),
            nn.Flatten(), nn.Linear(2 * channels * side * side, hidden), nn.ReLU(),
            nn.Linear(hidden, out_dim))
        self.register_buffer("log_scale", torch.full((out_dim,), math.log(noise)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.net(x)
        return loc, self.log_scale.exp().expand_as(loc)
