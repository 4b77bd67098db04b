r"""Identifiability metrics (``docs/theory.md#evaluation``; Zimmermann et al., 2021; Hyvarinen &
Morioka, 2016, for the MCC).

* **Affine identifiability**, :func:`r2`: fit :math:`z \approx A \hat z + b` by least squares on a
  training split, then the coefficient of determination per true dimension on the held-out split,

  .. math::

      R^2_d = 1 - \frac{\sum_{i \in \text{test}} (z_{id} - (A \hat z_i + b)_d)^2}
                      {\sum_{i \in \text{test}} (z_{id} - \bar z_d)^2},
      \qquad R^2 = \frac1n \sum_d R^2_d,

  with :math:`\bar z_d` the test mean (``sklearn.metrics.r2_score`` with uniform averaging).
* **Permutation identifiability**, :func:`mcc`: Pearson correlations
  :math:`\rho_{dk} = \mathrm{corr}(z_d, \hat z_k)`, the one-to-one matching :math:`\pi` maximising
  :math:`\sum_d |\rho_{d\pi(d)}|` (Hungarian algorithm,
  ``scipy.optimize.linear_sum_assignment``), and
  :math:`\mathrm{MCC} = \frac1n \sum_d |\rho_{d\pi(d)}|`.
* **Block identifiability**, :func:`block_r2` (von Kügelgen et al., 2021): how much of a block of
  true latents (the content, or the style) a representation holds, the held-out :math:`R^2` of
  the block regressed on :math:`\hat z`, linearly (:func:`r2`) or nonlinearly (kernel ridge
  regression with an RBF kernel, its :math:`\alpha` and :math:`\gamma` chosen by
  cross-validation on the training split).

Inputs are torch tensors on any device; all computation is float64 on the CPU (these are
evaluation-time metrics), results are Python floats (per-dimension results: float64 CPU tensors).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from scipy.optimize import linear_sum_assignment

from rpm._validation import check_int

__all__ = ["BLOCK_R2_ALPHAS", "BLOCK_R2_GAMMAS", "MatchedCorrelation", "block_r2", "mcc",
           "mcc_per_dimension", "r2", "r2_per_dimension"]

#: Ridge penalties of the cross-validated kernel ridge regression of :func:`block_r2`.
BLOCK_R2_ALPHAS = (1.0, 0.1, 0.01, 0.001)
#: RBF inverse squared lengthscales (on standardised inputs) of :func:`block_r2`.
BLOCK_R2_GAMMAS = (0.01, 0.1, 1.0, 10.0)


def _as_float64(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (num_samples, dim), got {tuple(x.shape)}")
    if not (x.dtype.is_floating_point or x.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"{name} must be a real tensor, got dtype {x.dtype}")
    x = x.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(x).all()):
        bad = (~torch.isfinite(x)).any(dim=0).nonzero().flatten().tolist()
        raise ValueError(f"{name} contains NaN or infinite values (columns {bad}); remove those "
                         "samples or fix the model producing them")
    return x


def _num_train(n_samples: int, train_fraction: float, num_train: int | None) -> int:
    """The training split of a read-out: ``num_train`` if given (an int), else
    ``round(train_fraction * n_samples)`` with ``train_fraction`` in (0, 1)."""
    if num_train is not None:
        return check_int("num_train", num_train)
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction!r}")
    return int(round(train_fraction * n_samples))


def _check_pair(z_true: object, z_hat: object) -> tuple[torch.Tensor, torch.Tensor]:
    zt, zh = _as_float64("z_true", z_true), _as_float64("z_hat", z_hat)
    if zt.shape[0] != zh.shape[0]:
        raise ValueError(f"z_true and z_hat must have the same number of samples, got "
                         f"{zt.shape[0]} and {zh.shape[0]}")
    return zt, zh


def r2_per_dimension(z_true: torch.Tensor, z_hat: torch.Tensor, train_fraction: float = 0.5,
                     num_train: int | None = None) -> torch.Tensor:
    r"""Held-out :math:`R^2_d` of the affine regression of each true dimension on ``z_hat``
    (module docstring). The first ``num_train`` samples train, the rest test; shuffle beforehand
    if the samples are not exchangeable.

    :param torch.Tensor z_true: ground-truth latents. Shape: ``(N, n)``.
    :param torch.Tensor z_hat: recovered latents. Shape: ``(N, m)``.
    :param float train_fraction: fraction of samples used to fit, in (0, 1); ignored when
        ``num_train`` is given.
    :param num_train: explicit number of training samples (the first ones).
    :type num_train: int or None
    :returns: :math:`R^2_d` (at most 1, unbounded below), float64 on the CPU. Shape: ``(n,)``.
    :rtype: torch.Tensor
    """
    zt, zh = _check_pair(z_true, z_hat)
    n_samples, m = zh.shape
    num_train = _num_train(n_samples, train_fraction, num_train)
    if num_train < m + 2 or n_samples - num_train < 2:
        raise ValueError(f"too few samples for an affine fit of {m} regressors: need at least "
                         f"{m + 2} training and 2 test samples, got {num_train} and "
                         f"{n_samples - num_train} (of {n_samples}); pass more samples")
    design = torch.cat([zh, torch.ones(n_samples, 1, dtype=torch.float64)], dim=1)  # (N, m+1)
    coef = torch.linalg.lstsq(design[:num_train], zt[:num_train], driver="gelsd").solution
    test_true = zt[num_train:]                                                        # (T, n)
    residual = test_true - design[num_train:] @ coef
    total = (test_true - test_true.mean(dim=0)).pow(2).sum(dim=0)
    if bool((total == 0).any()):
        bad = (total == 0).nonzero().flatten().tolist()
        raise ValueError(f"true dimensions {bad} are constant on the test split, so R^2 is "
                         "undefined; drop them")
    return 1.0 - residual.pow(2).sum(dim=0) / total


def r2(z_true: torch.Tensor, z_hat: torch.Tensor, train_fraction: float = 0.5,
       num_train: int | None = None) -> float:
    r"""Affine identifiability: mean over true dimensions of the held-out :math:`R^2_d`
    (:func:`r2_per_dimension`, whose arguments it takes).

    :param torch.Tensor z_true: ground-truth latents. Shape: ``(N, n)``.
    :param torch.Tensor z_hat: recovered latents. Shape: ``(N, m)``.
    :param float train_fraction: fraction of samples used to fit.
    :param num_train: explicit number of training samples (the first ones).
    :type num_train: int or None
    :returns: :math:`R^2`, 1 for a perfect affine recovery, about 0 (or below) for none.
    :rtype: float
    """
    return float(r2_per_dimension(z_true, z_hat, train_fraction, num_train).mean())


class MatchedCorrelation(NamedTuple):
    """Result of :func:`mcc_per_dimension`."""

    abs_correlation: torch.Tensor  #: :math:`|\rho_{d\pi(d)}|`, float64. Shape: (n,)
    index: torch.Tensor            #: matched recovered dimension :math:`\pi(d)`. Shape: (n,)


def mcc_per_dimension(z_true: torch.Tensor, z_hat: torch.Tensor) -> MatchedCorrelation:
    r"""Pearson correlations of every true with every recovered dimension, matched one to one by
    the Hungarian algorithm on :math:`|\rho|` (module docstring).

    :param torch.Tensor z_true: ground-truth latents. Shape: ``(N, n)``.
    :param torch.Tensor z_hat: recovered latents, :math:`m \ge n`. Shape: ``(N, m)``.
    :returns: the matched absolute correlations and the matched column of ``z_hat`` for each
        true dimension. Shape: ``(n,)`` each.
    :rtype: MatchedCorrelation
    """
    zt, zh = _check_pair(z_true, z_hat)
    if zh.shape[1] < zt.shape[1]:
        raise ValueError(f"z_hat needs at least as many dimensions as z_true to match each true "
                         f"dimension, got {zh.shape[1]} < {zt.shape[1]}")
    if zt.shape[0] < 3:
        raise ValueError(f"too few samples for correlations: need at least 3, got {zt.shape[0]}")

    def standardise(name: str, x: torch.Tensor) -> torch.Tensor:
        x = x - x.mean(dim=0)
        norm = torch.linalg.vector_norm(x, dim=0)
        if bool((norm == 0).any()):
            bad = (norm == 0).nonzero().flatten().tolist()
            raise ValueError(f"{name} columns {bad} are constant, so their correlation is "
                             "undefined; drop them")
        return x / norm

    corr = standardise("z_true", zt).T @ standardise("z_hat", zh)          # (n, m) Pearson
    abs_corr = corr.abs().clamp(max=1.0)
    rows, cols = linear_sum_assignment(abs_corr.numpy(), maximize=True)
    rows_t, cols_t = torch.as_tensor(rows), torch.as_tensor(cols)
    order = torch.argsort(rows_t)
    return MatchedCorrelation(abs_corr[rows_t, cols_t][order], cols_t[order])


def mcc(z_true: torch.Tensor, z_hat: torch.Tensor) -> float:
    r"""Mean correlation coefficient: :math:`\frac1n \sum_d |\rho_{d\pi(d)}|` with the optimal
    one-to-one matching :math:`\pi` (:func:`mcc_per_dimension`).

    :param torch.Tensor z_true: ground-truth latents. Shape: ``(N, n)``.
    :param torch.Tensor z_hat: recovered latents, :math:`m \ge n`. Shape: ``(N, m)``.
    :returns: MCC in [0, 1]; 1 for a recovery up to permutation, sign and scale of each dimension.
    :rtype: float
    """
    return float(mcc_per_dimension(z_true, z_hat).abs_correlation.mean())


def block_r2(z_block: torch.Tensor, z_hat: torch.Tensor, nonlinear: bool = False,
             train_fraction: float = 0.5, num_train: int | None = None,
             alphas: tuple[float, ...] = BLOCK_R2_ALPHAS,
             gammas: tuple[float, ...] = BLOCK_R2_GAMMAS, folds: int = 3) -> float:
    r"""Held-out :math:`R^2` of a block of true latents regressed on the representation: the
    linear one is :func:`r2`; the nonlinear one fits, on the training split (the first
    ``num_train`` samples), kernel ridge regression of the standardised block on the
    standardised :math:`\hat z` (both with the training split's means and deviations),

    .. math::

        \hat y(u) = k(u, U)\,(K + \alpha I)^{-1} Y, \qquad
        k(u, v) = e^{-\gamma \lVert u - v \rVert^2},

    with :math:`(\alpha, \gamma)` in ``alphas`` x ``gammas`` chosen by ``folds``-fold
    cross-validation of the mean :math:`R^2` (scikit-learn's ``GridSearchCV`` and
    ``KernelRidge``), and reports :math:`\frac1n \sum_d R^2_d` on the test split (the module
    docstring's :math:`R^2`; standardising the targets does not change it).
    ``O(num_train^3)`` time: a few thousand training samples take seconds.

    :param torch.Tensor z_block: true latents of the block. Shape: ``(N, n)``.
    :param torch.Tensor z_hat: the representation. Shape: ``(N, m)``.
    :param bool nonlinear: kernel ridge instead of the affine least-squares fit.
    :param float train_fraction: fraction of samples used to fit; ignored when ``num_train``
        is given.
    :param num_train: explicit number of training samples (the first ones).
    :type num_train: int or None
    :param alphas: the ridge penalties :math:`\alpha > 0` tried.
    :param gammas: the kernel's :math:`\gamma > 0` tried.
    :param int folds: cross-validation folds, >= 2.
    :returns: :math:`R^2`, at most 1 (about 0 when :math:`\hat z` holds nothing of the block).
    :rtype: float
    """
    if not nonlinear:
        return r2(z_block, z_hat, train_fraction, num_train)
    import numpy as np
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.model_selection import GridSearchCV

    zt, zh = _check_pair(z_block, z_hat)
    n_samples = zt.shape[0]
    num_train = _num_train(n_samples, train_fraction, num_train)
    folds = check_int("folds", folds, minimum=2)
    for name, grid in (("alphas", alphas), ("gammas", gammas)):
        if len(grid) == 0 or not all(float(v) > 0 and math.isfinite(float(v)) for v in grid):
            raise ValueError(f"{name} must be a non-empty sequence of finite numbers > 0, got "
                             f"{tuple(grid)!r}")
    if num_train < 2 * folds or n_samples - num_train < 2:
        raise ValueError(f"too few samples for a {folds}-fold kernel ridge fit: need at least "
                         f"{2 * folds} training and 2 test samples, got {num_train} and "
                         f"{n_samples - num_train} (of {n_samples}); pass more samples")

    def standardise(x: torch.Tensor, name: str) -> torch.Tensor:
        mean, std = x[:num_train].mean(dim=0), x[:num_train].std(dim=0)
        if bool((std == 0).any()):
            bad = (std == 0).nonzero().flatten().tolist()
            raise ValueError(f"{name} columns {bad} are constant on the training split; drop "
                             "them")
        return (x - mean) / std

    x, y = standardise(zh, "z_hat").numpy(), standardise(zt, "z_block").numpy()
    test = y[num_train:]
    total = ((test - test.mean(axis=0)) ** 2).sum(axis=0)
    if bool((total == 0).any()):
        raise ValueError(f"true dimensions {np.flatnonzero(total == 0).tolist()} are constant on "
                         "the test split, so R^2 is undefined; drop them")
    search = GridSearchCV(KernelRidge(kernel="rbf"),
                          {"alpha": [float(a) for a in alphas], "gamma": [float(g) for g in gammas]},
                          cv=folds, scoring="r2")
    search.fit(x[:num_train], y[:num_train])
    residual = ((test - search.predict(x[num_train:])) ** 2).sum(axis=0)
    return float(np.mean(1.0 - residual / total))
