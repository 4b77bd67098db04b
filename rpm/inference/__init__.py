"""Inference: the RPM ELBO, reference contrastive losses and the training loop."""

from rpm.inference.elbo import RPMELBO, rpm_log_ratio
from rpm.inference.losses import info_nce, rpm_elbo_per_pair

__all__ = [
    "RPMELBO",
    "info_nce",
    "rpm_elbo_per_pair",
    "rpm_log_ratio",
]
