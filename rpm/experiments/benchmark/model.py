r"""The encoders and objectives of ``rpm benchmark``.

**Encoders** (one per dataset, the same for every objective on it): the encoder is
:math:`e = p \circ g`, the backbone :math:`g` giving the representation :math:`h` the linear
probe reads and the head :math:`p` giving the latent :math:`z` the objective (and kNN) sees.

* ``mnist1d``: :class:`Mnist1dEncoder`, the network of the MNIST-1D self-supervised notebook's
  SimCLR: three 1-D convolutions of 25 channels (kernel 5, then 3 and 3; stride 2, padding 1;
  ReLU), flattened to :math:`h \in \mathbb R^{125}` for length 40, then a projector of 125 ReLU
  units and a linear layer to :math:`z \in \mathbb R^{16}`.
* ``digits``: :class:`rpm.experiments.digits.model.DigitsEncoder` of ``rpm digits`` (width 16,
  :math:`h \in \mathbb R^{64}`, :math:`z \in \mathbb R^{64}`).

**Objectives**, each the prior of an RPM (Aitchison & Ganev) with Delta recognition
:math:`Q(z|x) = \delta(z - e(x))` on the encoder, trained on the negative ELBO per pair of two
augmented views of each input, or the lightly-style loss of :mod:`rpm.losses` that is a
surrogate or a variant of one (the cosine energy :math:`f(z, z') = \hat z^\top \hat z' /
\tau`):

==========  ===============================================================================
objective   trained on
==========  ===============================================================================
simclr      the implicit prior with the cosine energy at :math:`\kappa = 1/\tau`
            (:class:`~rpm.priors.ImplicitPrior`, :class:`~rpm.priors.CosineEnergy`):
            :math:`\mathcal L/N = -\text{InfoNCE} + \log N`, one direction, each latent of the
            first view against the second view's N latents (its positive and N - 1
            negatives): the loss of the MNIST-1D notebook's SimCLR
ntxent      the pooled implicit prior (:class:`~rpm.priors.PooledImplicitPrior`, cosine):
            :math:`\mathcal L/N = -\text{NT-Xent} + \log(2N - 1)`, SimCLR's symmetric loss
            over the 2N - 1 other latents of both views
vmf         the implicit prior with the cosine energy and a learned concentration
            :math:`\kappa` (initialised at :math:`1/\tau`): vMF-InfoNCE
rbf         the implicit prior with the RBF energy :math:`f = -\lVert z - z'\rVert^2 / 2`
aninfonce   the implicit prior with the learned anisotropic energy
            (:class:`~rpm.priors.AnisotropicEnergy`, on :math:`\hat z`): AnInfoNCE
gaussian    the Gaussian pair prior (:class:`~rpm.priors.GaussianPairPrior`, :math:`\rho =
            0.9`) with moment-matched Gaussian marginals (``marginal="gaussian"``): the
            bound whose surrogates VICReg and Barlow Twins are
vicreg      :class:`rpm.losses.VICRegLoss` (lightly's defaults)
barlow      :class:`rpm.losses.BarlowTwinsLoss` (lightly's defaults)
dcl         :class:`rpm.losses.DCLLoss`: the pooled prior's log-ratio without the positive
            among the candidates
==========  ===============================================================================

The baselines (``raw``: the inputs themselves; ``untrained``: the encoder at its
initialisation) train nothing.

References:
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition parameterised
    model".
    S. Greydanus and D. Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024.
"""

from __future__ import annotations

import torch
from torch import nn

import rpm
from rpm._validation import check_positive, check_positive_int
from rpm.priors import (
    AnisotropicEnergy,
    CosineEnergy,
    GaussianPairPrior,
    ImplicitPrior,
    PooledImplicitPrior,
    RBFEnergy,
)

__all__ = ["BASELINES", "LATENT_DIMS", "OBJECTIVES", "TRAINED", "BenchmarkObjective",
           "Mnist1dEncoder", "build_encoder"]

#: The trained objectives (module table), in the table's order.
TRAINED = ("simclr", "ntxent", "vmf", "rbf", "aninfonce", "gaussian", "vicreg", "barlow", "dcl")
#: The baselines, trained on nothing.
BASELINES = ("raw", "untrained")
#: Every row name of the table.
OBJECTIVES = (*BASELINES, *TRAINED)
#: The latent dimension D of each dataset's encoder.
LATENT_DIMS = {"mnist1d": 16, "digits": 64}


class Mnist1dEncoder(nn.Module):
    r"""The MNIST-1D notebook's SimCLR network as an encoder :math:`e = p \circ g` (module
    docstring): the convolutional backbone :math:`g`, then the projector :math:`p(h) = W_2\,
    \mathrm{ReLU}(W_1 h + b_1) + b_2`.

    :param int length: L, the sequences' length (40); :math:`h` has 25 * L' dimensions, L'
        the length after the three strided convolutions (5 for L = 40).
    :param int latent_dim: D, the dimension of :math:`z`.
    :param int channels: the convolutions' channels.
    :param int hidden: the projector's hidden units.
    """

    def __init__(self, length: int = 40, latent_dim: int = 16, channels: int = 25,
                 hidden: int = 125) -> None:
        super().__init__()
        check_positive_int("length", length)
        check_positive_int("latent_dim", latent_dim)
        check_positive_int("channels", channels)
        check_positive_int("hidden", hidden)
        self.backbone = nn.Sequential(
            nn.Unflatten(1, (1, length)),                                      # (N, 1, L)
            nn.Conv1d(1, channels, 5, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(),                                                      # (N, 25 L')
        )
        with torch.no_grad():
            width = self.backbone(torch.zeros(1, length)).shape[1]
        self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(),
                                  nn.Linear(hidden, latent_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """:param torch.Tensor x: sequences, shape (N, L). :returns: z, shape (N, D)."""
        return self.head(self.backbone(x))


def build_encoder(dataset: str, length: int = 40) -> nn.Module:
    """The encoder of ``dataset`` (module docstring), with ``backbone`` and ``head``.

    :param str dataset: ``mnist1d`` or ``digits``.
    :param int length: the MNIST-1D sequences' length.
    """
    if dataset == "mnist1d":
        return Mnist1dEncoder(length, LATENT_DIMS[dataset])
    if dataset == "digits":
        from rpm.experiments.digits.model import DigitsEncoder

        return DigitsEncoder(16, LATENT_DIMS[dataset])
    raise ValueError(f"dataset must be mnist1d or digits, got {dataset!r}")


class BenchmarkObjective(nn.Module):
    """One trained objective of the table (module docstring) on an encoder: :meth:`loss` of a
    pair of views, and every trained parameter (the encoder's and the prior's) in
    ``parameters()``.

    :param str name: one of :data:`TRAINED`.
    :param nn.Module encoder: the encoder, giving z of shape (N, D).
    :param int latent_dim: D.
    :param float temperature: :math:`\\tau` of the cosine energy (``simclr``, ``ntxent``,
        ``dcl``; ``vmf``: the initial :math:`1/\\kappa`).
    """

    def __init__(self, name: str, encoder: nn.Module, latent_dim: int, temperature: float) -> None:
        super().__init__()
        if name not in TRAINED:
            raise ValueError(f"objective must be one of {', '.join(TRAINED)}, got {name!r}")
        temperature = check_positive("temperature", temperature)
        self.name = name
        self.encoder = encoder
        self.rpm: rpm.RPM | None = None
        self.surrogate: nn.Module | None = None
        delta = rpm.DeltaRecognition(encoder, validate=False)  # no per-step checks
        cosine = CosineEnergy(kappa=1.0 / temperature)
        if name == "simclr":
            self.rpm = rpm.RPM(delta, ImplicitPrior(cosine))
        elif name == "ntxent":
            self.rpm = rpm.RPM(delta, PooledImplicitPrior(cosine))
        elif name == "vmf":
            self.rpm = rpm.RPM(delta, ImplicitPrior(CosineEnergy(kappa=1.0 / temperature,
                                                                 learn_kappa=True)))
        elif name == "rbf":
            self.rpm = rpm.RPM(delta, ImplicitPrior(RBFEnergy(lengthscale=1.0)))
        elif name == "aninfonce":
            self.rpm = rpm.RPM(delta, ImplicitPrior(AnisotropicEnergy(latent_dim)))
        elif name == "gaussian":
            self.rpm = rpm.RPM(delta, GaussianPairPrior(latent_dim), marginal="gaussian")
        elif name == "vicreg":
            self.surrogate = rpm.losses.VICRegLoss()
        elif name == "barlow":
            self.surrogate = rpm.losses.BarlowTwinsLoss()
        else:  # dcl
            self.surrogate = rpm.losses.DCLLoss(temperature=temperature)

    def loss(self, views: list[torch.Tensor]) -> torch.Tensor:
        """The loss of one minibatch: the negative ELBO per pair of the RPM, or the surrogate's
        value.

        :param views: the two views, each (N, ...).
        """
        if self.rpm is not None:
            elbo = rpm.RPMELBO().differentiable_loss(self.rpm.model, self.rpm.guide, *views)
            return elbo / views[0].shape[0]
        assert self.surrogate is not None
        return self.surrogate(self.encoder(views[0]), self.encoder(views[1]))
