r"""Gaussian priors of the Gaussian RPM (``docs/theory.md#gaussian-rpm``): explicit densities
that, with the moment-matched Gaussian marginals (``rpm.RPM(..., marginal="gaussian")``), give a
well-defined ELBO for deterministic encoders.

* :class:`GaussianPairPrior`: :math:`P(z) = \mathcal N(0, I)`,
  :math:`P(z'|z) = \mathcal N(\rho z, (1 - \rho^2) I)`, so that both views are
  :math:`\mathcal N(0, I)` and each coordinate of one view has correlation :math:`\rho` with the
  same coordinate of the other (G3);
* :class:`GaussianStarPrior`: J views sharing a content y, :math:`z_j = y + s \epsilon_j`,
  :math:`y, \epsilon_j \sim \mathcal N(0, I)`, with y integrated out (SimVAE's model, G6):
  :math:`\operatorname{vec} z_{1:J} \sim \mathcal N(0, \mathbf 1 \mathbf 1^\top \otimes I +
  s^2 I_{JD})`.

Their ELBO with Delta recognition and the moment-matched marginals is (G4)

.. math::

    \frac{\mathcal L}{N} = \operatorname{mean}_n \log P(z_{n,1:J})
        + \sum_j \Big[\tfrac D2 (1 + \log 2\pi) + \tfrac12 \log\det S_j\Big],

with :math:`S_j` the batch covariance of view j (normaliser 1/N,
:class:`~rpm.marginals.MomentMatchedMarginal`). Under the minibatch-mixture marginal they are
explicit densities like any other and need stochastic encoders (Appendix B).
"""

from __future__ import annotations

import pyro
import torch
from pyro.distributions import LowRankMultivariateNormal, Normal, TorchDistribution, TransformedDistribution
from pyro.nn import PyroParam
from torch.distributions import constraints
from torch.distributions.transforms import ReshapeTransform

from rpm._validation import check_bool, check_positive_int, check_real
from rpm.priors._base import Prior, SequencePrior, positive_hyperparameter

__all__ = ["GaussianPairPrior", "GaussianStarPrior"]


def _latent_like(q: TorchDistribution | None, parameter: torch.Tensor) -> tuple:
    """(dtype, device) to compute in: the recognition distributions' when given, else the
    parameter's."""
    if q is None:
        return parameter.dtype, parameter.device
    mean = q.mean
    return mean.dtype, mean.device


class GaussianPairPrior(Prior):
    r"""The Gaussian pair prior,

    .. math::

        P(z) = \mathcal N(z; 0, I), \qquad
        P(z'|z) = \mathcal N\big(z';\ \rho z,\ (1 - \rho^2) I\big),
        \qquad\text{(G3)}

    the joint of two standard Gaussians whose coordinates have correlation :math:`\rho`:
    :math:`\log P(z, z') = -D \log 2\pi - \tfrac D2 \log(1 - \rho^2) - \tfrac12 \lVert z
    \rVert^2 - \lVert z' - \rho z \rVert^2 / (2 (1 - \rho^2))`, the last term the invariance
    (for :math:`\rho \to 1`, :math:`\lVert z' - z \rVert^2` weighted by :math:`1 / (2(1 -
    \rho^2))`). An explicit density (no analytic cancellation: the ELBO traces it).

    With ``rpm.RPM(DeltaRecognition(net), GaussianPairPrior(D), marginal="gaussian")`` the
    ELBO per pair is (G4) :math:`\operatorname{mean}_n \log P(z_n, z'_n) + D (1 + \log 2\pi) +
    \tfrac12 \log\det S + \tfrac12 \log\det S'`: the invariance against the anti-collapse
    log-determinants of each view's batch covariance, VICReg's terms read as a bound
    (``docs/theory.md#gaussian-rpm``). Under the mixture marginal it needs stochastic encoders
    (Appendix B); :class:`~rpm.RPM` refuses a deterministic one and names the fix.

    :param int dim: D.
    :param float correlation: :math:`\rho \in (-1, 1)`, fixed, or the initial value with
        ``learn_correlation``.
    :param bool learn_correlation: learn :math:`\rho` (a ``PyroParam`` constrained to
        (-1, 1)); else it is a buffer.
    """

    #: D (always set).
    dim: int

    def __init__(self, dim: int, correlation: float = 0.9, learn_correlation: bool = False):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        value = torch.tensor(_check_correlation(correlation), dtype=torch.float64)
        if check_bool("learn_correlation", learn_correlation):
            self.correlation: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
                value, constraints.interval(-1.0, 1.0))
        else:
            self.register_buffer("correlation", value)

    def forward(self, q: TorchDistribution | None = None, q2: TorchDistribution | None = None):
        r"""Declares ``"z"`` :math:`\sim \mathcal N(0, I)` and ``"z2"`` :math:`\sim \mathcal
        N(\rho z, (1 - \rho^2) I)`, each of event_shape (D,); returns ``(z, z2)``."""
        rho = self.correlation
        dtype, device = _latent_like(q, rho)
        rho = rho.to(dtype=dtype, device=device)
        zeros = torch.zeros(self.dim, dtype=dtype, device=device)
        z = pyro.sample("z", Normal(zeros, torch.ones_like(zeros)).to_event(1))
        z2 = pyro.sample("z2", Normal(rho * z, (1.0 - rho.square()).sqrt().expand_as(zeros))
                         .to_event(1))
        return z, z2


class GaussianStarPrior(SequencePrior):
    r"""The Gaussian star prior over J views (SimVAE's model): the views share a content y,

    .. math::

        z_j = y + s\, \epsilon_j, \quad y, \epsilon_j \sim \mathcal N(0, I), \qquad
        \operatorname{vec} z_{1:J} \sim \mathcal N\big(0,\ \mathbf 1_J \mathbf 1_J^\top
        \otimes I_D + s^2 I_{JD}\big)
        \qquad\text{(G6)}

    with y integrated out (a ``LowRankMultivariateNormal``, factor :math:`\mathbf 1_J \otimes
    I_D`, diagonal :math:`s^2`, reshaped to event_shape (J, D)): each view is
    :math:`\mathcal N(0, (1 + s^2) I)` and any two views' coordinates have correlation
    :math:`1 / (1 + s^2)`. Given the views, :math:`\log P` is the spread of the views about
    their mean, :math:`-\sum_j \lVert z_j - \bar z \rVert^2 / (2 s^2)`, plus a norm term of
    :math:`\bar z` (``docs/theory.md#gaussian-rpm``). J is the number of views of the batch (any
    J >= 2). An explicit density: the ELBO traces it.

    With ``rpm.RPM(DeltaRecognition(net), GaussianStarPrior(D), marginal="gaussian")`` the ELBO
    per instance is (G4) :math:`\operatorname{mean}_n \log P(z_{n,1:J}) + \sum_j [\tfrac D2 (1 +
    \log 2\pi) + \tfrac12 \log\det S_j]`.

    :param int dim: D.
    :param float scale: s > 0, fixed, or the initial value with ``learn_scale``.
    :param bool learn_scale: learn s (a positive ``PyroParam``); else it is a buffer.
    """

    #: D (always set).
    dim: int

    def __init__(self, dim: int, scale: float = 1.0 / 3.0, learn_scale: bool = False):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        value = positive_hyperparameter("scale", scale)
        if check_bool("learn_scale", learn_scale):
            self.scale: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
                value, constraints.positive)
        else:
            self.register_buffer("scale", value)

    def joint(self, num_views: int, dtype: torch.dtype | None = None,
              device: torch.device | None = None) -> TorchDistribution:
        r"""The law (G6) of the J = ``num_views`` latents of one instance: batch_shape (),
        event_shape (J, D)."""
        if isinstance(num_views, bool) or not isinstance(num_views, int) or num_views < 2:
            raise ValueError(f"the star prior is over J >= 2 views, got num_views={num_views!r}")
        scale = self.scale.to(dtype=dtype, device=device)
        size = num_views * self.dim
        eye = torch.eye(self.dim, dtype=scale.dtype, device=scale.device)
        content = LowRankMultivariateNormal(
            torch.zeros(size, dtype=scale.dtype, device=scale.device),
            cov_factor=eye.repeat(num_views, 1),                       # 1_J (x) I_D, (J D, D)
            cov_diag=scale.square().expand(size))
        return TransformedDistribution(
            content, [ReshapeTransform(torch.Size([size]), torch.Size([num_views, self.dim]))])

    def forward(self, q: TorchDistribution, marginal=None) -> torch.Tensor:
        r"""Declares ``"z"`` :math:`\sim` (G6) with event_shape (J, D), J = ``q.batch_shape[1]``;
        returns its value, (N, J, D)."""
        dtype, device = _latent_like(q, self.scale)
        return pyro.sample("z", self.joint(q.batch_shape[-1], dtype, device))


def _check_correlation(correlation) -> float:
    """The correlation as a float in the open interval (-1, 1)."""
    value = check_real("correlation", correlation)
    if not -1.0 < value < 1.0:
        raise ValueError(
            f"correlation must lie in the open interval (-1, 1), got {value}: at |rho| = 1 "
            "P(z'|z) has no density; pass e.g. correlation=0.9 (or learn_correlation=True "
            "with an initial value inside the interval)")
    return value
