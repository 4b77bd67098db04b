r"""The bouncing-balls encoder of Aitchison & Ganev (Appendix D, Fig. 2).

Two batch-normalised convolutions turn a frame into ``num_maps`` feature maps in ``(0, 1)``,

.. math::

    h = \mathrm{ReLU}(\mathrm{BN}(W_1 * x)), \qquad m = \sigma(\mathrm{BN}(W_2 * h)),

and the soft centre of mass of each map (:class:`~rpm.experiments.center_of_mass.CenterOfMass`)
gives its ``(x, y)``: ``2 * num_maps`` numbers, six for three balls, read as the balls'
positions. :class:`BallEncoder` is the deterministic network (for ``rpm.DeltaRecognition``);
:class:`GaussianBallEncoder` adds a learned per-dimension standard deviation and returns
``(loc, scale)`` (for ``rpm.GaussianRecognition``).

**Units.** Coordinates are in pixel units by default (``x`` in ``(0, W)``), the units of the
true centres from :func:`rpm.data.bouncing_balls.generate_bouncing_balls`. This also trains
better: with the RBF energy initialised at lengthscale 1, pixel units gave held-out
:math:`R^2` 0.983-0.987 over three seeds (benchmarks/bouncing_balls_prototype.py, 32 x 32
frames), normalised coordinates 0.60-0.99, since the lengthscale then has to shrink from 1 to
about 0.2 (in pixel units it ends near 0.7, close to its initial value).

Both are plain :class:`torch.nn.Module` s: register them with Pyro (``pyro.module``) or let
the recognition wrapper do so. Because of batch normalisation, encode both views of a batch
in one call (``torch.cat``) so that they share the batch statistics.

References:
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition
    parameterised model", Section 5, Appendix D, Fig. 2.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rpm._validation import check_positive, check_positive_int
from rpm.experiments.center_of_mass import CenterOfMass

__all__ = ["BallEncoder", "GaussianBallEncoder"]


class BallEncoder(nn.Module):
    r"""Convolutional encoder with a centre-of-mass read-out (Appendix D of Aitchison & Ganev).

    .. math::

        z = \mathrm{CoM}\Big(\sigma\big(\mathrm{BN}(W_2 * \mathrm{ReLU}(\mathrm{BN}(W_1 * x)))
        \big)\Big) \in \mathbb{R}^{2K}

    Convolutions use ``padding="same"`` (the maps have the frame's size) and no bias (batch
    normalisation's shift replaces it). The output is ordered ``(x_1, y_1, ..., x_K, y_K)``,
    in pixel units (``x`` in ``(0, W)``, ``y`` in ``(0, H)``, the convention of
    :mod:`rpm.data.bouncing_balls`) or in ``(-1, 1)`` with ``normalized=True``.

    :param int in_channels: channels ``C`` of the frames (one per ball in the default data).
    :param int hidden_channels: channels of the hidden layer.
    :param int kernel_size: side of both (square) convolution kernels.
    :param int num_maps: number ``K`` of feature maps (balls); the output has ``2K`` numbers.
    :param bool normalized: coordinates in ``(-1, 1)`` instead of pixel units.
    :param float eps: constant added to each map's mass in the centre of mass.

    Shape: input (N, C, H, W); output (N, 2K).
    """

    def __init__(
        self,
        in_channels: int = 3,
        hidden_channels: int = 16,
        kernel_size: int = 5,
        num_maps: int = 3,
        normalized: bool = False,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("hidden_channels", hidden_channels),
                            ("kernel_size", kernel_size), ("num_maps", num_maps)):
            check_positive_int(name, value)
        self.in_channels = in_channels
        self.num_maps = num_maps
        self.conv1 = nn.Conv2d(in_channels, hidden_channels, kernel_size, padding="same",
                               bias=False)
        self.bn1 = nn.BatchNorm2d(hidden_channels)
        self.conv2 = nn.Conv2d(hidden_channels, num_maps, kernel_size, padding="same",
                               bias=False)
        self.bn2 = nn.BatchNorm2d(num_maps)
        self.center_of_mass = CenterOfMass(normalized=normalized, eps=eps)

    @property
    def output_dim(self) -> int:
        """Number of outputs, ``2 * num_maps``."""
        return 2 * self.num_maps

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() == 3 and x.shape[0] == self.in_channels:
            raise ValueError(
                f"x must have shape (N, {self.in_channels}, H, W), got {tuple(x.shape)}: one "
                "image without its batch axis; add it with x.unsqueeze(0)")
        if x.dim() != 4:
            raise ValueError(
                f"x must have shape (N, {self.in_channels}, H, W), got {tuple(x.shape)}")
        if x.shape[1] != self.in_channels:
            raise ValueError(
                f"x must have shape (N, {self.in_channels}, H, W), got {tuple(x.shape)}: this "
                f"encoder takes {self.in_channels} channels on axis 1 (the network was built "
                f"with in_channels={self.in_channels}), not {x.shape[1]}")

    def feature_maps(self, x: torch.Tensor) -> torch.Tensor:
        r""":math:`m = \sigma(\mathrm{BN}(W_2 * \mathrm{ReLU}(\mathrm{BN}(W_1 * x))))`, for plotting.

        :param torch.Tensor x: frames. Shape: (N, C, H, W).
        :return: feature maps in ``(0, 1)``. Shape: (N, K, H, W).
        :rtype: torch.Tensor
        """
        self._check_input(x)
        h = torch.relu(self.bn1(self.conv1(x)))  # (N, hidden, H, W)
        return torch.sigmoid(self.bn2(self.conv2(h)))  # (N, K, H, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """:param torch.Tensor x: frames. Shape: (N, C, H, W).
        :return: centres of mass ``(x_1, y_1, ..., x_K, y_K)``. Shape: (N, 2K).
        :rtype: torch.Tensor
        """
        return self.center_of_mass(self.feature_maps(x))  # (N, 2K)


class GaussianBallEncoder(nn.Module):
    r""":class:`BallEncoder` with a learned per-dimension standard deviation.

    .. math::

        Q(z \mid x) = \mathcal{N}\big(\mu(x), \operatorname{diag}\sigma^2\big),
        \qquad \mu(x) = \text{BallEncoder}(x),\quad \sigma_d = \exp(s_d),

    with :math:`s \in \mathbb{R}^{2K}` an unconstrained parameter (the scale does not depend on
    ``x``: the position read-out is equally certain for every frame).

    :param int in_channels: channels ``C`` of the frames.
    :param int hidden_channels: channels of the hidden layer.
    :param int kernel_size: side of both convolution kernels.
    :param int num_maps: number ``K`` of feature maps.
    :param bool normalized: coordinates in ``(-1, 1)`` instead of pixel units.
    :param float init_scale: initial standard deviation, in the units of the coordinates.
    :param float eps: constant added to each map's mass in the centre of mass.

    Shape: input (N, C, H, W); output ``(loc, scale)``, each (N, 2K), ``scale > 0``.
    """

    def __init__(
        self,
        in_channels: int = 3,
        hidden_channels: int = 16,
        kernel_size: int = 5,
        num_maps: int = 3,
        normalized: bool = False,
        init_scale: float = 0.5,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        init_scale = check_positive("init_scale", init_scale)
        self.encoder = BallEncoder(in_channels, hidden_channels, kernel_size, num_maps,
                                   normalized, eps)
        self.log_scale = nn.Parameter(torch.full((2 * num_maps,), math.log(init_scale)))

    @property
    def output_dim(self) -> int:
        """Number of latent dimensions, ``2 * num_maps``."""
        return self.encoder.output_dim

    def feature_maps(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's feature maps, for plotting. Shape: (N, C, H, W) -> (N, K, H, W)."""
        return self.encoder.feature_maps(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:param torch.Tensor x: frames. Shape: (N, C, H, W).
        :return: ``(loc, scale)``, the mean and standard deviation. Shape: (N, 2K) each.
        :rtype: tuple[torch.Tensor, torch.Tensor]
        """
        loc = self.encoder(x)  # (N, 2K)
        scale = self.log_scale.exp().expand_as(loc)  # (N, 2K)
        return loc, scale
