r"""Models of the ``rpm digits`` experiment: a small CNN with a projection head, and the RPMs
(and the plain-torch NT-Xent loss) that train it.

The encoder is :math:`e(x) = p(g(x))`: the backbone :math:`g` (three 3 x 3 convolutions with
batch normalisation, a 2 x 2 max-pool after the second, global average pooling; any input side
from 2 pixels on, so the smaller crops of multi-crop pass through it too) gives the
representation :math:`h = g(x)` that is evaluated, and the projection head :math:`p` (a
two-layer MLP) gives the latent :math:`z` that the objective sees (Chen et al., 2020, Section
4.2: the representation before the head transfers better).

The methods, each an RPM with the recognition model :math:`Q(z|x)` built on :math:`e`
(Aitchison & Ganev, Eq. 9-15) unless said otherwise:

==============  ==========================================================================
method          objective
==============  ==========================================================================
infonce         Delta recognition, implicit prior with the cosine energy
                :math:`f(z, z') = \hat z^\top \hat z' / \tau` over the other view's latents:
                :math:`\mathrm{ELBO}/N = -\mathrm{InfoNCE} + \log N` (Eq. 23-25)
ntxent          Delta recognition, the pooled implicit prior with the same energy: every
                latent of both views is a candidate, :math:`\mathrm{ELBO}/N =
                -\text{NT-Xent} + \log(2N - 1)` (SimCLR's loss; docs/theory.md)
rbf             Delta recognition, implicit prior with the RBF energy
                :math:`f(z, z') = -\lVert z - z'\rVert^2 / (2 l^2)`, :math:`l = 1`
gaussian        Gaussian recognition :math:`\mathcal{N}(\mu(x), \mathrm{diag}\,\sigma(x)^2)`
                (the head outputs :math:`\mu` and :math:`\sigma` = softplus + 1e-3), implicit
                prior with the cosine energy; :math:`z` is sampled (reparameterised); the
                recognition model warns (:class:`rpm.ScaleFloorWarning`) when the scale
                reaches its floor
torch_ntxent    not an RPM: NT-Xent written in plain torch in this module
                (:func:`torch_ntxent_loss`), the same objective as ``ntxent``, trained from the
                same initialisation on the same batches: a check of rpm's implementation
star4           J = 4 views of each image, Delta recognition, the star prior averaged over
                centres (:class:`~rpm.priors.StarImplicitPrior`, pooled candidates, cosine
                energy): :math:`\mathcal{L} / (N (J - 1)) = -L_\text{out} + \log(N J - 1)`
                (SupCon's :math:`L_\text{out}` with the views of an image as its positives)
mixture4        J = 4 views, the mixture-of-partners prior
                (:class:`~rpm.priors.PartnerMixturePrior`, pooled, cosine):
                :math:`\mathcal{L}/N = -L_\text{in} + \log((N J - 1)/(J - 1))`
multicrop       2 global views (8 x 8) and 4 local crops (4 x 4, a fifth to a half of the
                image's area), the star prior with the multi-crop rule (``global_views=2``: a
                local crop's positives and candidates are the global views only; SwAV, DINO)
queue           MoCo as an RPM: the star prior over J = 2 views with centre the first view,
                its positive the second, and the normaliser over the positive and a queue of
                the K = 1024 latest second views (:class:`~rpm.marginals._candidates.LatentQueue`,
                pushed by the training loop after each step): :math:`\mathcal{L}/N = -L_\text{MoCo} +
                \log(K + 1)`, no momentum encoder
==============  ==========================================================================

References:
    T. Chen, S. Kornblith, M. Norouzi and G. Hinton, "A simple framework for contrastive learning
    of visual representations", ICML 2020.
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition parameterised
    model".
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import rpm
from rpm._validation import check_positive, check_positive_int
from rpm.marginals._candidates import LatentQueue
from rpm.priors import (
    CosineEnergy,
    ImplicitPrior,
    PartnerMixturePrior,
    PooledImplicitPrior,
    RBFEnergy,
    StarImplicitPrior,
)

__all__ = ["METHODS", "QUEUE_SIZE", "RPM_METHODS", "VIEWS", "DigitsEncoder", "build_method",
           "method_from_arguments", "model_from_arguments", "torch_ntxent_loss"]

#: The RPM methods (module table), then the plain-torch reference.
RPM_METHODS = ("infonce", "ntxent", "rbf", "gaussian", "star4", "mixture4", "multicrop", "queue")
METHODS = (*RPM_METHODS, "torch_ntxent")
#: The views of each method: ``(global views, local crops)``; the pairs are ``(2, 0)``.
VIEWS = {name: (2, 0) for name in METHODS} | {"star4": (4, 0), "mixture4": (4, 0), "multicrop": (2, 4)}
#: K, the latents kept by the ``queue`` method's queue.
QUEUE_SIZE = 1024
#: The smallest standard deviation of the Gaussian encoder.
MIN_SCALE = 1e-3


class DigitsEncoder(nn.Module):
    r"""The CNN :math:`e = p \circ g` (module docstring).

    :param int width: channels of the first convolution (then 2x and 4x); the representation
        :math:`h` has ``4 * width`` dimensions.
    :param int latent_dim: dimension D of :math:`z`.
    :param bool gaussian: the head also outputs a standard deviation per dimension, and
        ``forward`` returns ``(loc, scale)``.
    :param int in_channels: C, the images' channels.
    """

    def __init__(self, width: int = 16, latent_dim: int = 64, gaussian: bool = False,
                 in_channels: int = 1) -> None:
        super().__init__()
        w = check_positive_int("width", width)
        check_positive_int("in_channels", in_channels)
        self.latent_dim = check_positive_int("latent_dim", latent_dim)
        self.gaussian = bool(gaussian)
        self.backbone = nn.Sequential(
            nn.Conv2d(in_channels, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(),  # (N, w, s, s)
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(),
            nn.MaxPool2d(2),  # (N, 2w, s/2, s/2)
            nn.Conv2d(2 * w, 4 * w, 3, padding=1), nn.BatchNorm2d(4 * w), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),  # (N, 4w): the representation h
        )
        out = latent_dim * (2 if self.gaussian else 1)
        self.head = nn.Sequential(nn.Linear(4 * w, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, out))

    def forward(self, x: torch.Tensor):
        """:param torch.Tensor x: images. Shape: (N, C, H, W), H, W >= 2.
        :returns: the latents, shape (N, D); or ``(loc, scale)``, each (N, D), when Gaussian."""
        out = self.head(self.backbone(x))
        if not self.gaussian:
            return out
        loc, raw = out.chunk(2, dim=-1)
        return loc, F.softplus(raw) + MIN_SCALE

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The latents z of images x (the means for a Gaussian encoder), as
        :meth:`rpm.RPM.encode` gives them for the RPMs built on this encoder.

        :param torch.Tensor x: images. Shape: (N, C, H, W), H, W >= 2.
        :returns: shape (N, D)."""
        out = self(x)
        return out[0] if self.gaussian else out


def torch_ntxent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    r"""SimCLR's NT-Xent in plain torch, minus :math:`\log(2N - 1)` so that it equals rpm's
    negative ELBO per pair of the pooled implicit prior (docs/theory.md):

    .. math::

        \frac{1}{2N} \sum_{k=1}^{2N} -\log \frac{e^{s_{k,p(k)}}}{\sum_{m \ne k} e^{s_{km}}}
        - \log(2N - 1), \qquad s_{km} = \frac{\hat u_k^\top \hat u_m}{\tau},

    over the pooled latents :math:`u = (z_1, \dots, z_N, z'_1, \dots, z'_N)`, :math:`p(k)` the
    other view of :math:`u_k`'s image. Written with ``F.cross_entropy``, as lightly's
    ``NTXentLoss`` is.

    :param torch.Tensor z1: first views' latents. Shape: (N, D).
    :param torch.Tensor z2: second views' latents. Shape: (N, D).
    :param float temperature: :math:`\tau`.
    :rtype: torch.Tensor
    """
    n = z1.shape[0]
    u = F.normalize(torch.cat([z1, z2]), dim=1)  # (2N, D)
    logits = (u @ u.T / temperature).fill_diagonal_(float("-inf"))  # (2N, 2N), no self-pairs
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z1.device)  # (2N,)
    return F.cross_entropy(logits, targets) - math.log(2 * n - 1)


def build_method(name: str, width: int, latent_dim: int, temperature: float,
                 in_channels: int = 1) -> tuple[nn.Module, DigitsEncoder]:
    """The trained module of method ``name`` (an :class:`rpm.RPM`, or the encoder itself for
    ``torch_ntxent``) and its encoder (whose ``backbone`` is evaluated).

    :param str name: one of :data:`METHODS`.
    :param int width: the encoder's width.
    :param int latent_dim: D.
    :param float temperature: :math:`\\tau` of the cosine energy (:math:`\\kappa = 1/\\tau`).
    :param int in_channels: the images' channels.
    """
    temperature = check_positive("temperature", temperature)
    encoder = DigitsEncoder(width, latent_dim, gaussian=name == "gaussian",
                            in_channels=in_channels)
    if name == "torch_ntxent":
        return encoder, encoder
    cosine = CosineEnergy(kappa=1.0 / temperature)
    delta = rpm.DeltaRecognition(encoder, validate=False)  # no per-step checks (device syncs)
    if name == "infonce":
        model = rpm.RPM(delta, ImplicitPrior(cosine))
    elif name == "ntxent":
        model = rpm.RPM(delta, PooledImplicitPrior(cosine))
    elif name == "rbf":
        model = rpm.RPM(delta, ImplicitPrior(RBFEnergy(lengthscale=1.0)))
    elif name == "gaussian":
        recognition = rpm.GaussianRecognition(encoder, validate=False, min_scale=MIN_SCALE)
        model = rpm.RPM(recognition, ImplicitPrior(cosine))
    elif name == "star4":
        model = rpm.RPM(delta, StarImplicitPrior(cosine))
    elif name == "mixture4":
        model = rpm.RPM(delta, PartnerMixturePrior(cosine))
    elif name == "multicrop":
        model = rpm.RPM(delta, StarImplicitPrior(cosine, global_views=VIEWS[name][0]))
    elif name == "queue":
        queue = LatentQueue(QUEUE_SIZE, latent_dim)
        model = rpm.RPM(delta, StarImplicitPrior(cosine, candidates="positives", centres=[0], queue=queue))
    else:
        raise ValueError(f"method must be one of {METHODS}, got {name!r}")
    return model, encoder


def method_from_arguments(arguments: dict) -> tuple[nn.Module, DigitsEncoder]:
    """:func:`build_method` ``(method, width, latent_dim, temperature, in_channels)`` of a
    model record of ``rpm digits`` (:mod:`rpm.experiments.trained`): the module and its
    encoder. ``in_channels`` is 1 if absent (the records of the one-channel bundled digits
    written before ``--data``)."""
    return build_method(arguments["method"], arguments["width"], arguments["latent_dim"],
                        arguments["temperature"], in_channels=arguments.get("in_channels", 1))


def model_from_arguments(arguments: dict) -> nn.Module:
    """The untrained module of an ``rpm digits`` method from its model record
    (:mod:`rpm.experiments.trained`): the first of :func:`method_from_arguments`, an
    :class:`rpm.RPM` or, for ``torch_ntxent``, the :class:`DigitsEncoder`.

    :param dict arguments: ``method``, ``width``, ``latent_dim``, ``temperature``,
        ``in_channels`` (the images' channels; the size of the images does not change the
        network).
    """
    module, _ = method_from_arguments(arguments)
    return module
