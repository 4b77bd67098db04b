r"""The encoders of ``rpm pendulum``: small convolutional networks with a constant recognition
noise :math:`\sigma` (a buffer, as in :class:`~rpm.experiments.lds.model.GaussianMLPEncoder`: the
scale of the means is free).

**Keypoints** (:class:`GaussianKeypointEncoder`, the default): convolutions at full resolution
give K maps of logits :math:`h_{k,ij}`; a softmax over the pixels of each map and its centre of
mass (the spatial soft-argmax of Levine et al. 2016 and Finn et al. 2016,
:class:`~rpm.experiments.center_of_mass.CenterOfMass`) give K points,

.. math::

    w_{k,ij} = \frac{\exp h_{k,ij}}{\sum_{i'j'} \exp h_{k,i'j'}}, \qquad
    (\bar x_k, \bar y_k) = \sum_{ij} w_{k,ij}\, (x_j, y_i), \qquad
    \mu = W [\bar x; \bar y] + b\ (+\ \mathrm{MLP}([\bar x; \bar y])),

pixel-centre coordinates in (-1, 1). A map that peaks on the bob puts its point at the bob,
:math:`0.72\,(\sin\theta, \cos\theta)` in these units (:mod:`rpm.data.pendulum`): the state
the experiment reads out is then an affine function of the means from the first step, and the
RPM's objective has to learn which maps follow the pendulum rather than a circle embedding. The
optional MLP (output layer started at zero) lets the means carry nonlinear functions of the
points (harmonics of the angle), which a linear smoother turns into a better velocity.

**Flat** (:class:`GaussianConvEncoder`): two strided convolutions, a hidden layer and a linear
output,

.. math::

    Q(z_t | x_t) = \mathcal{N}\big(\mu(x_t), \sigma^2 I\big), \qquad
    \mu = W_4\, \mathrm{ReLU}(W_3\, \mathrm{vec}\, \mathrm{ReLU}(K_2 * \mathrm{ReLU}(K_1 * x))),

two 5 x 5 convolutions of stride 2 (``channels`` and ``2 channels`` maps, S x S -> S/4 x S/4),
a hidden layer of ``hidden`` units and a linear output of D. Measured on ``rpm pendulum`` it
reaches a held-out :math:`R^2` of 0.6-0.8 where the keypoints reach 0.93 (``benchmarks/README.md``).

Neither uses batch normalisation, so that a frame's code does not depend on its batch.

References:
    S. Levine, C. Finn, T. Darrell, P. Abbeel, "End-to-end training of deep visuomotor
    policies", JMLR 2016 (the spatial soft-argmax).
    C. Finn, X. Y. Tan, Y. Duan et al., "Deep spatial autoencoders for visuomotor learning",
    ICRA 2016.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rpm._validation import check_int, check_positive, check_positive_int
from rpm.experiments.center_of_mass import CenterOfMass

__all__ = ["ENCODERS", "GaussianConvEncoder", "GaussianKeypointEncoder", "build_encoder",
           "model_from_arguments"]

#: The encoders of ``--encoder``.
ENCODERS = ("keypoints", "flat")


class GaussianConvEncoder(nn.Module):
    r"""The convolutional Gaussian encoder (module docstring).

    :param image_size: the frames' side S, or their (height, width), each >= 8.
    :type image_size: int or tuple[int, int]
    :param int out_dim: D, the latent dimension.
    :param int channels: maps of the first convolution (the second has twice as many).
    :param int hidden: units of the hidden layer.
    :param float noise: :math:`\sigma > 0`.
    :param int in_channels: C, the frames' channels.

    Shape: input (M, C, H, W); output ``(loc, scale)``, each (M, D).
    """

    def __init__(self, image_size: int | tuple[int, int] = 28, out_dim: int = 4,
                 channels: int = 16, hidden: int = 64, noise: float = 0.1,
                 in_channels: int = 1) -> None:
        super().__init__()
        sides = image_size if isinstance(image_size, (tuple, list)) else (image_size, image_size)
        if len(sides) != 2:
            raise ValueError(f"image_size must be a side or (height, width), got {image_size!r}")
        height, width = (check_int("image_size", side, minimum=8) for side in sides)
        check_positive_int("out_dim", out_dim)
        check_positive_int("channels", channels)
        check_positive_int("hidden", hidden)
        check_positive("noise", noise)
        check_positive_int("in_channels", in_channels)
        height, width = ((height + 1) // 2 + 1) // 2, ((width + 1) // 2 + 1) // 2  # two strides
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, channels, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 5, stride=2, padding=2), nn.ReLU(),
            nn.Flatten(), nn.Linear(2 * channels * height * width, hidden), nn.ReLU(),
            nn.Linear(hidden, out_dim))
        self.register_buffer("log_scale", torch.full((out_dim,), math.log(noise)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.net(x)
        return loc, self.log_scale.exp().expand_as(loc)


class GaussianKeypointEncoder(nn.Module):
    r"""The keypoint encoder (module docstring): K spatial soft-argmax points of convolutional
    maps, an affine map (plus an optional MLP) to D means, a constant noise :math:`\sigma`.

    The maps: a 5 x 5 convolution to ``channels`` maps, ReLU, a 3 x 3 convolution to ``channels``
    maps, ReLU, a 1 x 1 convolution to ``keypoints`` maps of logits, all at the frame's
    resolution (padding keeps S x S).

    :param int out_dim: D, the latent dimension.
    :param int channels: maps of the two hidden convolutions.
    :param int keypoints: K, the points (2K features).
    :param int hidden: units of the MLP added to the affine map; 0: the affine map alone.
    :param float noise: :math:`\sigma > 0`.
    :param int in_channels: C, the frames' channels.

    Shape: input (M, C, H, W) for any H, W; output ``(loc, scale)``, each (M, D).
    """

    def __init__(self, out_dim: int = 4, channels: int = 16, keypoints: int = 8,
                 hidden: int = 0, noise: float = 0.1, in_channels: int = 1) -> None:
        super().__init__()
        check_positive_int("out_dim", out_dim)
        check_positive_int("channels", channels)
        check_positive_int("keypoints", keypoints)
        check_int("hidden", hidden, minimum=0)
        check_positive("noise", noise)
        check_positive_int("in_channels", in_channels)
        self.maps = nn.Sequential(
            nn.Conv2d(in_channels, channels, 5, padding=2), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, keypoints, 1))
        self.center_of_mass = CenterOfMass(normalized=True, eps=0.0)
        self.linear = nn.Linear(2 * keypoints, out_dim)
        self.mlp = None
        if hidden:
            self.mlp = nn.Sequential(nn.Linear(2 * keypoints, hidden), nn.Tanh(),
                                     nn.Linear(hidden, out_dim))
            nn.init.zeros_(self.mlp[2].weight)
            nn.init.zeros_(self.mlp[2].bias)
        self.register_buffer("log_scale", torch.full((out_dim,), math.log(noise)))

    def keypoints(self, x: torch.Tensor) -> torch.Tensor:
        r"""The K points :math:`(\bar x_1, \bar y_1, \dots, \bar x_K, \bar y_K)` in (-1, 1).

        Shape: input (M, C, H, W); output (M, 2K)."""
        logits = self.maps(x)  # (M, K, S, S)
        weights = logits.flatten(2).softmax(-1).view_as(logits)  # each map sums to 1
        return self.center_of_mass(weights)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        points = self.keypoints(x)  # (M, 2K)
        loc = self.linear(points)
        if self.mlp is not None:
            loc = loc + self.mlp(points)
        return loc, self.log_scale.exp().expand_as(loc)


def build_encoder(kind: str, image_size: int | tuple[int, int], out_dim: int, channels: int,
                  hidden: int, keypoints: int, noise: float, in_channels: int = 1) -> nn.Module:
    """The encoder of ``--encoder``: ``"keypoints"`` (:class:`GaussianKeypointEncoder` with
    ``hidden`` MLP units) or ``"flat"`` (:class:`GaussianConvEncoder` with a hidden layer of
    ``hidden`` units; ``keypoints`` unused), for frames of ``in_channels`` channels and side
    ``image_size`` (or (height, width)).

    :param str kind: one of :data:`ENCODERS`.
    """
    if kind == "keypoints":
        return GaussianKeypointEncoder(out_dim, channels, keypoints, hidden, noise, in_channels)
    if kind == "flat":
        return GaussianConvEncoder(image_size, out_dim, channels, hidden, noise, in_channels)
    raise ValueError(f"encoder must be one of {ENCODERS}, got {kind!r}")


def model_from_arguments(arguments: dict):
    r"""The untrained model of ``rpm pendulum`` from its model record
    (:mod:`rpm.experiments.trained`): the encoder of :func:`build_encoder` and the
    :class:`~rpm.RPM` of :func:`~rpm.experiments.lds.model.build_sequence_model` with D
    = ``latent_dim`` latents and H = ``state_dim`` hidden states.

    :param dict arguments: ``encoder``, ``image_size`` (a side, or [height, width]),
        ``latent_dim``, ``channels``, ``hidden``, ``keypoints``, ``recognition_noise``,
        ``in_channels`` (:func:`build_encoder`; 1 if absent, as in the records of one-channel
        runs written before it), ``state_dim``, ``marginal``, ``prior``.
    :rtype: rpm.RPM
    """
    from rpm.experiments.lds.model import build_sequence_model

    image_size = arguments["image_size"]
    if isinstance(image_size, list):
        image_size = tuple(image_size)
    encoder = build_encoder(arguments["encoder"], image_size, arguments["latent_dim"],
                            arguments["channels"], arguments["hidden"], arguments["keypoints"],
                            arguments["recognition_noise"],
                            in_channels=arguments.get("in_channels", 1))
    return build_sequence_model(encoder, arguments["latent_dim"], arguments["state_dim"],
                                marginal=arguments["marginal"], prior=arguments["prior"])
