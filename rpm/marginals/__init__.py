r"""Estimates of the recognition marginal Q(z) (Eq. 11 of Aitchison & Ganev): the minibatch
mixtures and their moment-matched Gaussian (:class:`MomentMatchedMarginal`).

The kernels that evaluate them live in :mod:`rpm.ops` (:func:`~rpm.ops.gaussian_mixture_log_prob`,
:func:`~rpm.ops.distribution_mixture_log_prob`). The candidates of the normalisers (the batch, the
global batch over processes, a queue of earlier batches) are :class:`Candidates` and
:class:`LatentQueue`."""

from rpm.marginals._candidates import Candidates, LatentQueue
from rpm.marginals._concatenated import ConcatenatedBatch
from rpm.marginals._mixture_marginal import (
    MixtureMarginal,
    delta_mixture_log_prob,
    recognition_components,
)
from rpm.marginals._moment_matched import MomentMatchedMarginal
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal

__all__ = [
    "Candidates",
    "ConcatenatedBatch",
    "LatentQueue",
    "MixtureMarginal",
    "MomentMatchedMarginal",
    "SequenceMixtureMarginal",
    "delta_mixture_log_prob",
    "recognition_components",
]
