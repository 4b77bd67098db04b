r"""Priors over the latents of J >= 2 views (Eq. 9 and 21-22 of Aitchison & Ganev;
``docs/theory.md#implicit-prior``, J views and sequences).

A prior is a :class:`Prior`, one protocol with two call forms: the pair form (``forward(q, q2)``
declares the sample sites ``"z"`` and ``"z2"`` and returns their values; q and q2 are the batch's
recognition distributions, which the implicit prior uses and explicit priors ignore) and the
joint form over J views (:class:`SequencePrior`: ``forward(q, marginal)`` declares ``"z"`` with
event shape (J, D)). Its other hooks (the analytic log-ratio and the candidates of its
normaliser, whether Delta encoders are allowed, the latent dimension, the marginals the
likelihood divides by, a structured posterior) and those of an :class:`Energy` are documented in
:mod:`rpm.priors.base`.
"""

from rpm.priors.base import Energy, Prior
from rpm.priors.energies import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
)
from rpm.priors.explicit import (
    GaussianRandomWalkPrior,
    GeneralizedNormalRandomWalkPrior,
    LaplaceRandomWalkPrior,
    LinearDynamicsPrior,
    RandomWalkEnergy,
)
from rpm.priors.implicit import ImplicitPrior
from rpm.priors.multiview import MultiViewImplicitPrior, PartnerMixturePrior, StarImplicitPrior
from rpm.priors.pooled import PooledImplicitPrior
from rpm.priors.sequence import (
    MarkovChain,
    MarkovImplicitPrior,
    MarkovPrior,
    SequencePrior,
)
from rpm.priors.state_space import LinearGaussianPrior, StateSpacePrior
from rpm.priors.stationary import StationaryStateSpacePrior

__all__ = [
    "AnisotropicEnergy",
    "BilinearEnergy",
    "CosineEnergy",
    "Energy",
    "GaussianRandomWalkPrior",
    "GeneralizedNormalRandomWalkPrior",
    "ImplicitPrior",
    "LaplaceRandomWalkPrior",
    "LinearDynamicsPrior",
    "LinearGaussianPrior",
    "LpEnergy",
    "MarkovChain",
    "MarkovImplicitPrior",
    "MarkovPrior",
    "MultiViewImplicitPrior",
    "NeuralEnergy",
    "PartnerMixturePrior",
    "PooledImplicitPrior",
    "Prior",
    "RBFEnergy",
    "RandomWalkEnergy",
    "SequencePrior",
    "StarImplicitPrior",
    "StateSpacePrior",
    "StationaryStateSpacePrior",
]
