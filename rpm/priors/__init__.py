r"""Priors P(z, z') over the latents of a pair (Eq. 9 and 21-22 of Aitchison & Ganev;
``docs/theory.md#implicit-prior``).

A prior is a :class:`Prior`: inside the model's plate over the N pairs it declares the sample
sites ``"z"`` and ``"z2"`` and returns their values; q and q2 are the batch's recognition
distributions (the implicit prior uses them, explicit priors ignore them). Its other hooks (the
analytic log-ratio, whether Delta encoders are allowed, the latent dimension, the marginals the
likelihood divides by) and those of an :class:`Energy` are documented in :mod:`rpm.priors.base`.
"""

from rpm.priors.base import Energy, Prior
from rpm.priors.circular_step import BallDynamicsPrior, CircularStep
from rpm.priors.energies import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
    squared_distances,
)
from rpm.priors.explicit import GaussianRandomWalkPrior, LinearDynamicsPrior
from rpm.priors.implicit import ImplicitConditional, ImplicitPrior, implicit_log_ratio
from rpm.priors.pooled import PooledImplicitPrior
from rpm.priors.sequence import (
    MarkovChain,
    MarkovImplicitChain,
    MarkovImplicitPrior,
    MarkovPrior,
    SequencePrior,
)
from rpm.priors.state_space import GaussianStateSpace, StateSpacePosterior, StateSpacePrior

__all__ = [
    "AnisotropicEnergy",
    "BallDynamicsPrior",
    "BilinearEnergy",
    "CircularStep",
    "CosineEnergy",
    "Energy",
    "GaussianRandomWalkPrior",
    "GaussianStateSpace",
    "ImplicitConditional",
    "ImplicitPrior",
    "LinearDynamicsPrior",
    "LpEnergy",
    "MarkovChain",
    "MarkovImplicitChain",
    "MarkovImplicitPrior",
    "MarkovPrior",
    "NeuralEnergy",
    "PooledImplicitPrior",
    "Prior",
    "RBFEnergy",
    "SequencePrior",
    "StateSpacePosterior",
    "StateSpacePrior",
    "implicit_log_ratio",
    "squared_distances",
]
