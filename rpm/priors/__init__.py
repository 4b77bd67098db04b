r"""Priors P(z, z') over the latents of a pair (SPEC section 3).

A prior is any callable ``prior(q, q2)`` that, inside the model's plate over the N pairs,
declares the sample sites ``"z"`` and ``"z2"`` and returns their values; q and q2 are the
batch's recognition distributions (the implicit prior uses them, explicit priors ignore them).
"""

from rpm.priors.circular_step import BallDynamicsPrior, CircularStep
from rpm.priors.energies import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    Energy,
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
    "RBFEnergy",
    "SequencePrior",
    "StateSpacePosterior",
    "StateSpacePrior",
    "implicit_log_ratio",
    "squared_distances",
]
