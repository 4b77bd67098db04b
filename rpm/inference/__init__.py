"""Inference: the RPM ELBO, reference contrastive losses and the training loop."""

from rpm.inference.elbo import RPMELBO, rpm_log_ratio
from rpm.inference.losses import info_nce, rpm_elbo_per_pair
from rpm.inference.optim import FusedAdam, FusedPyroOptim
from rpm.inference.trainer import NonFiniteLossError, Trainer, TrainingInterrupted

__all__ = [
    "FusedAdam",
    "FusedPyroOptim",
    "NonFiniteLossError",
    "RPMELBO",
    "Trainer",
    "TrainingInterrupted",
    "info_nce",
    "rpm_elbo_per_pair",
    "rpm_log_ratio",
]
