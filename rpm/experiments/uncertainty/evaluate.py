r"""The scores of ``rpm uncertainty``.

**Controlled process** (N fresh inputs, true posteriors :math:`\mathrm{vMF}(\mu, \kappa)`,
learned :math:`\mathrm{vMF}(\hat\mu, \hat\kappa)`):

* ``rank_correlation``: Spearman's :math:`\rho` between :math:`\hat\kappa(x_n)` and
  :math:`\kappa(x_n)` over the N inputs;
* ``means_rank_correlation``: Spearman's :math:`\rho` between the pairwise cosines
  :math:`\hat\mu_i^\top \hat\mu_j` and :math:`\mu_i^\top \mu_j` over the pairs :math:`i > j` of
  the first M inputs. The learned sphere is identified up to a rotation (Kirchhof et al.,
  Theorem 1), which leaves every cosine as it is, so the cosines are compared directly (the
  reference code's ``cosdist_rankcorr``);
* ``cosine_mse`` and ``cosine_mean_absolute_error``: the mean of :math:`(\hat c_{ij} -
  c_{ij})^2` and of :math:`|\hat c_{ij} - c_{ij}|` over the same pairs (the reference code's
  ``cosdist_mse`` computes the second, as the mean of :math:`\sqrt{(\hat c - c)^2}`).

**Digits**: :func:`nested_crop_order` (the share of pairs of nested crops of one image where
the smaller crop has the lower :math:`\hat\kappa`), and the linear probe's predictive
(:func:`posterior_predictive`) scored by :func:`rpm.evaluation.expected_calibration_error`.
"""

from __future__ import annotations

import numpy as np
import torch

from rpm.distributions import VonMisesFisher

__all__ = ["mean_cosines", "nested_crop_order", "posterior_predictive", "spearman"]


def spearman(a, b) -> float | None:
    """Spearman's rank correlation of two sequences of numbers (``scipy.stats.spearmanr``);
    None when either is constant (an untrained encoder's concentration), where it is
    undefined."""
    from scipy.stats import spearmanr

    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b)[0])


def mean_cosines(mu: torch.Tensor) -> torch.Tensor:
    r""":math:`\mu_i^\top \mu_j` for every pair :math:`i > j` of the rows of ``mu`` (unit vectors
    (M, D)), in the order of ``torch.tril_indices(M, M, -1)``. Shape: (M (M - 1) / 2,)."""
    rows, cols = torch.tril_indices(len(mu), len(mu), -1)
    return (mu[rows] * mu[cols]).sum(-1)


def nested_crop_order(kappa: torch.Tensor) -> float:
    r"""The share of pairs of crop levels, over every image, where the smaller crop has the
    lower concentration.

    :param kappa: :math:`\hat\kappa` of each image (row) at each crop level (column), the
        levels from the largest window to the smallest, each window inside the previous one.
        Shape: (N, L).
    :returns: the mean over images and pairs of levels :math:`l < m` of
        :math:`[\hat\kappa_{n,m} < \hat\kappa_{n,l}]`.
    """
    levels = kappa.shape[1]
    lower = [(kappa[:, m] < kappa[:, l]).double().mean()
             for l in range(levels) for m in range(l + 1, levels)]
    return float(torch.stack(lower).mean())


@torch.no_grad()
def posterior_predictive(probe, mu: torch.Tensor, kappa: torch.Tensor | None, samples: int,
                         seed: int) -> np.ndarray:
    r"""The linear probe's class probabilities for each input: at the posterior mean direction,
    :math:`p(y \mid \hat\mu)`, when ``kappa`` is None; else averaged over the posterior,
    :math:`\frac1K \sum_k p(y \mid z_k)`, :math:`z_k \sim \mathrm{vMF}(\hat\mu, \hat\kappa)`,
    K = ``samples`` draws per input.

    :param probe: a fitted scikit-learn classifier with ``predict_proba`` on features (the
        pipeline of :func:`rpm.evaluation.fit_linear_probe`).
    :param mu: unit directions. Shape: (N, D).
    :param kappa: concentrations, or None. Shape: (N,).
    :param int samples: K.
    :param int seed: the seed of the draws (the global generator is left as it was).
    :returns: probabilities. Shape: (N, classes).
    """
    if kappa is None:
        return probe.predict_proba(mu.double().cpu().numpy())
    loc = torch.nn.functional.normalize(mu.double().cpu(), dim=-1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        z = VonMisesFisher(loc, kappa.double().cpu()).sample((samples,))  # (K, N, D)
    flat = probe.predict_proba(z.reshape(-1, z.shape[-1]).numpy())
    return flat.reshape(samples, len(mu), -1).mean(0)
