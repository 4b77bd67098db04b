"""Inference: :class:`RPMELBO`, Pyro's ELBO for an :class:`~rpm.RPM` (one batch, any number of
particles), and :func:`rpm_elbo`, the same ELBO of embeddings in a plain PyTorch loop; the
candidates of its normalisers (the batch, the global batch, a queue) are
:class:`Candidates` and :class:`LatentQueue`."""

from rpm._objective import rpm_elbo
from rpm.inference._elbo import RPMELBO
from rpm.marginals._candidates import Candidates, LatentQueue

__all__ = [
    "RPMELBO",
    "Candidates",
    "LatentQueue",
    "rpm_elbo",
]
