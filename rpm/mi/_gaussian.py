r"""The correlated Gaussian pair of Poole et al.'s benchmark, whose MI and log density ratio
are known in closed form.

:math:`x \sim \mathcal{N}(0, I_D)`, :math:`y = \rho x + \sqrt{1 - \rho^2}\,\epsilon`,
:math:`\epsilon \sim \mathcal{N}(0, I_D)`: D independent pairs of correlation :math:`\rho`, so

.. math::

    I(X; Y) = -\frac D2 \log(1 - \rho^2), \qquad
    \log r(x, y) = \log\frac{p(y|x)}{p(y)} = -\frac D2 \log(1 - \rho^2)
        - \frac{\lVert y - \rho x \rVert^2}{2 (1 - \rho^2)} + \frac{\lVert y \rVert^2}{2}.

The cubic variant observes :math:`(W y)^3 / \sqrt{15}` (elementwise cube, W a fixed orthogonal
matrix; :math:`\mathbb{E}[u^6] = 15` for a standard normal u, so each coordinate has unit
variance) instead of y: an invertible map, so the MI is the same, but :math:`\log r` is no
longer a quadratic form in the observations. Without the scaling the cubes reach magnitudes of
tens in a batch and the critics' exponentials overflow float32.
"""

from __future__ import annotations

import math

import torch

from rpm._validation import check_positive, check_positive_int

__all__ = ["CorrelatedGaussian", "rho_for_mi"]


def rho_for_mi(mi: float, dim: int) -> float:
    r"""The correlation :math:`\rho = \sqrt{1 - e^{-2 I / D}}` that gives D pairs the mutual
    information I (nats).

    :param float mi: I > 0.
    :param int dim: D >= 1.
    """
    mi, dim = check_positive("mi", mi), check_positive_int("dim", dim)
    return math.sqrt(-math.expm1(-2.0 * mi / dim))


class CorrelatedGaussian:
    r"""D independent pairs of standard normals with correlation :math:`\rho` (module
    docstring).

    :param int dim: D.
    :param float rho: in (-1, 1).
    :param cubic: an orthogonal matrix W, shape (D, D): observe :math:`(W y)^3 / \sqrt{15}`
        instead of y; None: observe y.
    """

    def __init__(self, dim: int, rho: float, cubic: torch.Tensor | None = None):
        self.dim = check_positive_int("dim", dim)
        rho = float(rho)
        if not -1.0 < rho < 1.0:
            raise ValueError(f"rho must lie in (-1, 1), got {rho}")
        self.rho = rho
        if cubic is not None and tuple(cubic.shape) != (dim, dim):
            raise ValueError(f"the cubic variant's W must have shape ({dim}, {dim}), got "
                             f"{tuple(cubic.shape)}")
        self.cubic = cubic

    @classmethod
    def with_mi(cls, mi: float, dim: int, cubic: torch.Tensor | None = None
                ) -> CorrelatedGaussian:
        """The pair whose mutual information is ``mi`` nats (:func:`rho_for_mi`)."""
        return cls(dim, rho_for_mi(mi, dim), cubic)

    @property
    def mutual_information(self) -> float:
        r""":math:`I = -\frac D2 \log(1 - \rho^2)` nats."""
        return -0.5 * self.dim * math.log1p(-self.rho**2)

    def sample(self, n: int, generator: torch.Generator | None = None,
               dtype: torch.dtype | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        r"""N pairs (x, y), each of shape (N, D); y is :math:`(W y)^3 / \sqrt{15}` in the cubic
        variant."""
        n = check_positive_int("n", n)
        x = torch.randn(n, self.dim, generator=generator, dtype=dtype)
        noise = torch.randn(n, self.dim, generator=generator, dtype=dtype)
        y = self.rho * x + math.sqrt(1.0 - self.rho**2) * noise
        if self.cubic is not None:
            y = (y @ self.cubic.to(y.dtype).T) ** 3 / math.sqrt(15.0)
        return x.to(device), y.to(device)

    def log_ratio(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r""":math:`\log r(x, y)` of the Gaussian pair (module docstring), broadcast over the
        leading dimensions: x (..., D) and y (..., D) give (...). Scores of every pair of a
        batch: ``log_ratio(x[:, None], y[None])``, shape (N, N). For the pair before the cubic
        map."""
        one_minus = 1.0 - self.rho**2
        return (-0.5 * self.dim * math.log(one_minus)
                - (y - self.rho * x).square().sum(-1) / (2.0 * one_minus)
                + y.square().sum(-1) / 2.0)
