r"""Minibatch-mixture estimates of the recognition marginal Q(z) (Eq. 11 of Aitchison & Ganev).

The kernels that evaluate them live in :mod:`rpm.ops`; ``gaussian_mixture_log_prob``,
``streaming_gaussian_mixture_log_prob`` and ``streaming_matmul_logsumexp`` are re-exported here."""

from rpm.marginals.concatenated import ConcatenatedBatch
from rpm.marginals.mixture_marginal import (
    MixtureMarginal,
    delta_mixture_log_prob,
    recognition_components,
)
from rpm.marginals.sequence_marginal import SequenceMixtureMarginal
from rpm.ops import (
    gaussian_mixture_log_prob,
    streaming_gaussian_mixture_log_prob,
    streaming_matmul_logsumexp,
)

__all__ = [
    "ConcatenatedBatch",
    "MixtureMarginal",
    "SequenceMixtureMarginal",
    "delta_mixture_log_prob",
    "gaussian_mixture_log_prob",
    "recognition_components",
    "streaming_gaussian_mixture_log_prob",
    "streaming_matmul_logsumexp",
]
