"""Small networks, constructors and closed forms shared by the tests."""

import math

import numpy as np
import torch


class GaussianHead(torch.nn.Module):
    """x -> (loc, scale): a linear map and a softplus scale with a floor."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.linear = torch.nn.Linear(in_dim, 2 * dim)

    def forward(self, x):
        loc, raw = self.linear(x).chunk(2, dim=-1)
        return loc, torch.nn.functional.softplus(raw) + 0.05


def float64_bank_loss(*args, **kwargs):
    """An ``rpm.losses.NTXentLoss(*args, **kwargs)`` built under float64 as the default dtype:
    its memory bank's starting rows are drawn in float64, unit to float64's precision, as the
    float64 loops that check it take them."""
    from rpm.losses import NTXentLoss

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return NTXentLoss(*args, **kwargs)
    finally:
        torch.set_default_dtype(before)


def _gaussian_marginal_terms(z: np.ndarray) -> float:
    """-mean_n log N(z_n; m, S) for the batch's own mean and 1/N covariance: the Mahalanobis
    terms average to D, so it is D/2 (1 + log 2 pi) + 1/2 log det S."""
    dim = z.shape[1]
    centred = z - z.mean(0)
    cov = centred.T @ centred / len(z)
    return 0.5 * dim * (1.0 + math.log(2 * math.pi)) + 0.5 * np.linalg.slogdet(cov)[1]


def gaussian_pair_closed_form(z: np.ndarray, z2: np.ndarray, rho: float) -> float:
    """ELBO / N of the Gaussian pair RPM with Delta recognition: log N(z; 0, I) + log N(z';
    rho z, (1 - rho^2) I) averaged, plus each view's marginal term."""
    dim = z.shape[1]
    log_prior = (-dim * math.log(2 * math.pi) - 0.5 * dim * math.log(1 - rho ** 2)
                 - 0.5 * (z ** 2).sum(1) - ((z2 - rho * z) ** 2).sum(1) / (2 * (1 - rho ** 2)))
    return log_prior.mean() + _gaussian_marginal_terms(z) + _gaussian_marginal_terms(z2)


def gaussian_star_closed_form(z: np.ndarray, scale: float) -> float:
    """ELBO / N of the Gaussian star RPM with Delta recognition: the stacked J views under
    N(0, 1 1^T (x) I + s^2 I_{JD}) (the content integrated out), plus each view's marginal term."""
    num, views, dim = z.shape
    cov = np.kron(np.ones((views, views)), np.eye(dim)) + scale ** 2 * np.eye(views * dim)
    flat = z.reshape(num, views * dim)
    quad = np.einsum("ni,ij,nj->n", flat, np.linalg.inv(cov), flat)
    log_prior = -0.5 * (views * dim * math.log(2 * math.pi) + np.linalg.slogdet(cov)[1] + quad)
    return log_prior.mean() + sum(_gaussian_marginal_terms(z[:, j]) for j in range(views))
