r"""Minibatch-mixture estimates of the recognition marginal Q(z) (SPEC section 1)."""

from rpm.marginals.gaussian_mixture import gaussian_mixture_log_prob
from rpm.marginals.mixture_marginal import (
    MixtureMarginal,
    delta_mixture_log_prob,
    recognition_components,
)
from rpm.marginals.normalizer import streaming_matmul_logsumexp
from rpm.marginals.streaming import streaming_gaussian_mixture_log_prob

__all__ = [
    "MixtureMarginal",
    "delta_mixture_log_prob",
    "gaussian_mixture_log_prob",
    "recognition_components",
    "streaming_gaussian_mixture_log_prob",
    "streaming_matmul_logsumexp",
]
