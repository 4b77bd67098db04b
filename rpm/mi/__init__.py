r"""Mutual-information estimation: the variational bounds of Poole et al. (2019) as functions of
a critic-score matrix (``rpm.mi._bounds``), the critics that make the scores
(``rpm.mi._critics``), the correlated Gaussian benchmark (``rpm.mi._gaussian``), and the
RPM ELBO as an estimator (``rpm.mi._rpm_estimator``)."""

from rpm.mi._bounds import (
    MINE,
    barber_agakov,
    dv,
    info_nce_bound,
    interpolated,
    js,
    nwj,
    smile,
    tuba,
)
from rpm.mi._critics import BilinearCritic, JointCritic, SeparableCritic
from rpm.mi._gaussian import CorrelatedGaussian, rho_for_mi
from rpm.mi._rpm_estimator import GaussianPairPrior, RPMEstimator, gaussian_entropy

__all__ = [
    "BilinearCritic",
    "CorrelatedGaussian",
    "GaussianPairPrior",
    "JointCritic",
    "MINE",
    "RPMEstimator",
    "SeparableCritic",
    "barber_agakov",
    "dv",
    "gaussian_entropy",
    "info_nce_bound",
    "interpolated",
    "js",
    "nwj",
    "rho_for_mi",
    "smile",
    "tuba",
]
