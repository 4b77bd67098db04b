"""Inference: the RPM ELBO and the reference InfoNCE loss."""

from rpm.inference.elbo import RPMELBO, rpm_log_ratio
from rpm.inference.losses import info_nce

__all__ = [
    "RPMELBO",
    "info_nce",
    "rpm_log_ratio",
]
