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

The objectives over J = 4 views and the other recognition models:

=============  ============================================================================
objective      trained on
=============  ============================================================================
star           J = 4 views (2 global, 2 local), the star prior averaged over centres with
               the multi-crop rule (:class:`~rpm.priors.StarImplicitPrior`, cosine,
               ``global_views=2``: a local view's positives and candidates are the global
               views only; SwAV, DINO)
lejepa         :class:`rpm.losses.LeJEPALoss` over the same J = 4 views: SIGReg and the
               invariance to the global views' centroid, the surrogate of the Gaussian star
               RPM (``gaussian_star``; its ``elbo``); lightly's defaults but
               :data:`SIGREG_DIRECTIONS` = 256 random directions a step (of 1,024): the sketch
               of the same statistic with fewer slices, a quarter of the cost
gaussian_star  the Gaussian star prior over the same J = 4 views
               (:class:`~rpm.priors.GaussianStarPrior`, :math:`s = 1/3`: any two views
               correlated 0.9) with moment-matched Gaussian marginals
               (``marginal="gaussian"``)
discrete       the discrete RPM (:class:`rpm.DiscreteRPM`, learned :math:`p(Z)`) with
               :class:`rpm.CategoricalRecognition` of the encoder's output as logits over
               :data:`DISCRETE_CLASSES` = 10 classes (the datasets' ten labels; the head
               outputs K instead of D numbers), F over the batch, trained on minus the
               exact log-likelihood per pair :math:`-\log P(x, x')/N` (Walker et al.)
mcinfonce      MC-InfoNCE: von Mises-Fisher recognition :math:`\mathrm{vMF}(\hat z(x),
               \kappa(x))` (:class:`rpm.VonMisesFisherRecognition`; :math:`\kappa(x) =
               \kappa_0 e^{w^\top h + b}`, a linear head on the backbone starting at zero,
               :math:`\kappa_0` = :data:`INITIAL_CONCENTRATION_PER_DIM` D) with
               ``simclr``'s implicit prior (cosine energy, :math:`\kappa_+ = 1/\tau`), trained
               by ``RPMELBO(num_particles=S, importance_weighted=True)`` (each
               particle's own normaliser, ``docs/theory.md`` C3), S =
               :data:`MC_PARTICLES` (Kirchhof et al.)
=============  ============================================================================

**Views.** Every objective sees the pair of views of its dataset
(:func:`rpm.experiments.benchmark.data.view_pair`) but ``star``, ``lejepa`` and
``gaussian_star``, which see that pair as their global views and :data:`LOCAL_VIEWS` local ones
(:func:`rpm.experiments.benchmark.data.multi_views`: for ``digits`` 4 x 4 crops, for
``mnist1d`` windows of the augmented sequence stretched back to its length).

**Latents scored.** kNN reads the output of :meth:`BenchmarkObjective.latent`: z for every objective but
``discrete``, whose latent is the class probabilities :math:`f(Z|x)` (the recognition
factor itself, the quantity the model defines; its logits are defined only up to an additive
constant, which changes their cosine distances); for ``mcinfonce`` the cosine distance of z
is that of the mean direction :math:`\hat z`. The linear probe reads the backbone's h for
every row.

The baselines (``raw``: the inputs themselves; ``untrained``: the encoder at its
initialisation) train nothing.

References:
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition parameterised
    model".
    S. Greydanus and D. Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024.
    W. I. Walker, H. Soulat, C. Yu and M. Sahani, "Unsupervised representation learning with
    recognition-parametrised probabilistic models", AISTATS 2023.
    M. Kirchhof, E. Kasneci and S. J. Oh, "Probabilistic contrastive learning recovers the
    correct aleatoric uncertainty of ambiguous inputs", ICML 2023.
    R. Balestriero and Y. LeCun, "LeJEPA: provable and scalable self-supervised learning
    without the heuristics", 2025.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

import rpm
from rpm._validation import check_positive, check_positive_int
from rpm.priors import (
    AnisotropicEnergy,
    CosineEnergy,
    GaussianPairPrior,
    GaussianStarPrior,
    ImplicitPrior,
    PooledImplicitPrior,
    RBFEnergy,
    StarImplicitPrior,
)

__all__ = ["BASELINES", "DISCRETE_CLASSES", "INITIAL_CONCENTRATION_PER_DIM", "LATENT_DIMS",
           "LOCAL_VIEWS", "MC_PARTICLES", "OBJECTIVES", "SIGREG_DIRECTIONS", "TRAINED",
           "BenchmarkObjective", "Mnist1dEncoder", "VonMisesFisherHeads", "build_encoder",
           "encoder_latent_dim"]

#: The trained objectives (module table), in the table's order.
TRAINED = ("simclr", "ntxent", "vmf", "rbf", "aninfonce", "gaussian", "vicreg", "barlow", "dcl",
           "star", "lejepa", "gaussian_star", "discrete", "mcinfonce")
#: The baselines, trained on nothing.
BASELINES = ("raw", "untrained")
#: Every row name of the table.
OBJECTIVES = (*BASELINES, *TRAINED)
#: The latent dimension D of each dataset's encoder.
LATENT_DIMS = {"mnist1d": 16, "digits": 64}
#: The local views of the objectives over J views (after the pair of global views); the others
#: see the pair only.
LOCAL_VIEWS = {"star": 2, "lejepa": 2, "gaussian_star": 2}
#: K, the classes of the ``discrete`` objective's latent (the datasets' ten labels).
DISCRETE_CLASSES = 10
#: S, the particles of ``mcinfonce``'s importance-weighted ELBO (its cost grows with S).
MC_PARTICLES = 4
#: K, the random directions of ``lejepa``'s SIGReg a step (lightly's default 1,024 took a third
#: of the default table's time).
SIGREG_DIRECTIONS = 256
#: :math:`\kappa_0 / D`, ``mcinfonce``'s initial concentration per latent dimension: a mean
#: resultant length :math:`A_D(\kappa_0) \approx 1 - (D - 1)/(2 \kappa_0) \approx 0.88`.
INITIAL_CONCENTRATION_PER_DIM = 4.0


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


def encoder_latent_dim(dataset: str, objective: str) -> int:
    """The width of the head's output of ``objective``'s encoder on ``dataset``: K =
    :data:`DISCRETE_CLASSES` logits for ``discrete``, else D = :data:`LATENT_DIMS`."""
    return DISCRETE_CLASSES if objective == "discrete" else LATENT_DIMS[dataset]


def build_encoder(dataset: str, length: int = 40, latent_dim: int | None = None) -> nn.Module:
    """The encoder of ``dataset`` (module docstring), with ``backbone`` and ``head``.

    :param str dataset: ``mnist1d`` or ``digits``.
    :param int length: the MNIST-1D sequences' length.
    :param latent_dim: the head's outputs; None: the dataset's D (:data:`LATENT_DIMS`).
    """
    if dataset not in LATENT_DIMS:
        raise ValueError(f"dataset must be mnist1d or digits, got {dataset!r}")
    dim = LATENT_DIMS[dataset] if latent_dim is None else latent_dim
    if dataset == "mnist1d":
        return Mnist1dEncoder(length, dim)
    if dataset == "digits":
        from rpm.experiments.digits.model import DigitsEncoder

        return DigitsEncoder(16, dim)
    raise ValueError(f"dataset must be mnist1d or digits, got {dataset!r}")


class VonMisesFisherHeads(nn.Module):
    r"""The network of ``mcinfonce``'s :class:`rpm.VonMisesFisherRecognition` (``concentration=
    "raw"``): x -> (the encoder's z, the direction; :math:`\kappa(x) = \kappa_0 \exp(w^\top
    h + b)`), one pass through the backbone for both, :math:`w` and :math:`b` zero at the start.

    :param nn.Module encoder: an encoder of :func:`build_encoder` (``backbone``, ``head``).
    :param float initial_concentration: :math:`\kappa_0 > 0`.
    """

    def __init__(self, encoder: nn.Module, initial_concentration: float) -> None:
        super().__init__()
        self.encoder = encoder
        head = cast(nn.Module, encoder.head)
        width = next(m for m in head.modules() if isinstance(m, nn.Linear)).in_features
        self.log_concentration = nn.Linear(width, 1)
        nn.init.zeros_(self.log_concentration.weight)
        nn.init.zeros_(self.log_concentration.bias)
        self.log_initial = math.log(check_positive("initial_concentration", initial_concentration))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r""":returns: the directions (N, D) and :math:`\kappa` (N,)."""
        h = cast(nn.Module, self.encoder.backbone)(x)
        direction = cast(nn.Module, self.encoder.head)(h)
        return direction, torch.exp(self.log_initial + self.log_concentration(h)[:, 0])


class BenchmarkObjective(nn.Module):
    """One trained objective of the table (module docstring) on an encoder: :meth:`loss` of a
    pair of views, and every trained parameter (the encoder's and the prior's) in
    ``parameters()``.

    :param str name: one of :data:`TRAINED`.
    :param nn.Module encoder: the encoder, giving z of shape (N, D) (``discrete``: the logits,
        (N, K), :func:`encoder_latent_dim`).
    :param int latent_dim: D (``discrete``: K).
    :param float temperature: :math:`\\tau` of the cosine energy (``simclr``, ``ntxent``,
        ``dcl``, ``mcinfonce``; ``vmf``: the initial :math:`1/\\kappa`).
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
        self.discrete: rpm.DiscreteRPM | None = None
        self.elbo = rpm.RPMELBO()
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
        elif name == "dcl":
            self.surrogate = rpm.losses.DCLLoss(temperature=temperature)
        elif name == "star":
            self.rpm = rpm.RPM(delta, StarImplicitPrior(cosine, global_views=2))
        elif name == "lejepa":
            self.surrogate = rpm.losses.LeJEPALoss(sigreg_num_vectors=SIGREG_DIRECTIONS)
        elif name == "gaussian_star":
            self.rpm = rpm.RPM(delta, GaussianStarPrior(latent_dim), marginal="gaussian")
        elif name == "discrete":
            self.discrete = rpm.DiscreteRPM(
                rpm.CategoricalRecognition(encoder, latent_dim, validate=False))
        else:  # mcinfonce
            net = VonMisesFisherHeads(encoder, INITIAL_CONCENTRATION_PER_DIM * latent_dim)
            recognition = rpm.VonMisesFisherRecognition(net, concentration="raw", validate=False)
            self.rpm = rpm.RPM(recognition, ImplicitPrior(cosine))
            self.elbo = rpm.RPMELBO(num_particles=MC_PARTICLES, importance_weighted=True)

    def loss(self, views: list[torch.Tensor]) -> torch.Tensor:
        """The loss of one minibatch: the negative ELBO per instance of the RPM (``discrete``:
        minus its exact log-likelihood per instance), or the surrogate's value.

        :param views: the views, each (N, ...): the pair, or for the objectives of
            :data:`LOCAL_VIEWS` the two global views then the local ones.
        """
        count = views[0].shape[0]
        if self.rpm is not None:
            inputs = views if len(views) == 2 else (views,)  # a pair, or a list of J views
            return self.elbo.differentiable_loss(self.rpm.model, self.rpm.guide, *inputs) / count
        if self.discrete is not None:
            return -self.discrete.log_marginal(*views) / count
        assert self.surrogate is not None
        if self.name == "lejepa":
            latents = torch.stack([self.encoder(view) for view in views])        # (J, N, D)
            return self.surrogate(global_proj=latents[:2], local_proj=latents[2:])
        return self.surrogate(self.encoder(views[0]), self.encoder(views[1]))

    def latent(self) -> nn.Module:
        """The module whose output kNN reads (module docstring): the encoder (z), or for
        ``discrete`` the encoder then a softmax (the class probabilities :math:`f(Z|x)`)."""
        return nn.Sequential(self.encoder, nn.Softmax(dim=-1)) if self.name == "discrete" \
            else self.encoder
