"""Inference: the RPM ELBO (:mod:`rpm.inference.objective`, :class:`RPMELBO`), the candidates of
its normalisers (the batch, the global batch, a queue; :mod:`rpm.marginals.candidates`,
re-exported here)."""

from rpm.inference.elbo import RPMELBO
from rpm.inference.objective import elbo, rpm_elbo
from rpm.marginals.candidates import Candidates, LatentQueue

__all__ = [
    "RPMELBO",
    "Candidates",
    "LatentQueue",
    "elbo",
    "rpm_elbo",
]
