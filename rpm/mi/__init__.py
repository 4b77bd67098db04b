r"""Mutual-information estimation: the variational bounds of Poole et al. (2019) as functions of
a critic-score matrix (:mod:`rpm.mi.bounds`), the critics that make the scores
(:mod:`rpm.mi.critics`), the correlated Gaussian benchmark (:mod:`rpm.mi.gaussian`), and the
RPM ELBO as an estimator (:mod:`rpm.mi.rpm_estimator`)."""

from rpm.mi.bounds import (
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
from rpm.mi.critics import BilinearCritic, JointCritic, SeparableCritic
from rpm.mi.gaussian import CorrelatedGaussian, rho_for_mi
from rpm.mi.rpm_estimator import GaussianPairPrior, RPMEstimator, gaussian_entropy

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
