r"""Minibatch-mixture estimates of the recognition marginal Q(z) (Eq. 11 of Aitchison & Ganev).

The kernels that evaluate them live in :mod:`rpm.ops` (:func:`~rpm.ops.gaussian_mixture_log_prob`,
:func:`~rpm.ops.distribution_mixture_log_prob`)."""

from rpm.marginals.concatenated import ConcatenatedBatch
from rpm.marginals.mixture_marginal import (
    MixtureMarginal,
    delta_mixture_log_prob,
    recognition_components,
)
from rpm.marginals.sequence_marginal import SequenceMixtureMarginal

__all__ = [
    "ConcatenatedBatch",
    "MixtureMarginal",
    "SequenceMixtureMarginal",
    "delta_mixture_log_prob",
    "recognition_components",
]
