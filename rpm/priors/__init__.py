r"""Priors over the latents of J >= 2 views (Eq. 9 and 21-22 of Aitchison & Ganev;
``docs/theory.md#implicit-prior``, J views and sequences).

A prior follows one of two protocols, with distinct methods:

* :class:`Prior`, a prior over a pair: ``forward(q, q2)`` declares the sample sites ``"z"`` and
  ``"z2"`` and returns their values (q and q2 are the batch's recognition distributions, which
  the implicit prior uses and explicit priors ignore); its analytic term is
  :meth:`Prior.log_ratio`;
* :class:`SequencePrior`, a prior over J views (a sequence, ordered or not): ``forward(q,
  marginal)`` declares ``"z"`` with event shape (J, D); its analytic term is
  :meth:`SequencePrior.sequence_log_ratio`.

Their common attributes (whether Delta encoders are allowed, the latent dimension, whether the
prior couples the instances of a batch, whether its normaliser takes a queue) are
:class:`PriorBase`'s; the hooks of each protocol (the analytic log-ratio and the candidates of
its normaliser, the marginals the likelihood divides by, a structured posterior) and those of an
:class:`Energy` are documented in ``rpm.priors._base``.
"""

from rpm.priors._base import Energy, Prior, PriorBase, SequencePrior
from rpm.priors._energies import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
)
from rpm.priors._explicit import (
    GaussianRandomWalkPrior,
    GeneralizedNormalRandomWalkPrior,
    LaplaceRandomWalkPrior,
    LinearDynamicsPrior,
    RandomWalkEnergy,
)
from rpm.priors._gaussian import GaussianPairPrior, GaussianStarPrior
from rpm.priors._implicit import ImplicitPrior
from rpm.priors._multiview import MultiViewImplicitPrior, PartnerMixturePrior, StarImplicitPrior
from rpm.priors._pooled import PooledImplicitPrior
from rpm.priors._sequence import MarkovChain, MarkovImplicitPrior, MarkovPrior
from rpm.priors._state_space import LinearGaussianPrior, StateSpacePrior
from rpm.priors._stationary import StationaryStateSpacePrior

__all__ = [
    "AnisotropicEnergy",
    "BilinearEnergy",
    "CosineEnergy",
    "Energy",
    "GaussianPairPrior",
    "GaussianRandomWalkPrior",
    "GaussianStarPrior",
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
    "PriorBase",
    "RBFEnergy",
    "RandomWalkEnergy",
    "SequencePrior",
    "StarImplicitPrior",
    "StateSpacePrior",
    "StationaryStateSpacePrior",
]
