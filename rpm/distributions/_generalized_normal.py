r"""The generalized normal (exponential power) distribution, which neither ``torch.distributions``
nor ``pyro.distributions`` provides.

.. math::

    p(x;\ \mu, \alpha, \beta) = \frac{\beta}{2 \alpha \Gamma(1/\beta)}
        \exp\Big(-\Big|\frac{x - \mu}{\alpha}\Big|^\beta\Big),

location :math:`\mu`, scale :math:`\alpha > 0` and shape :math:`\beta > 0`, the
parameterisation of ``scipy.stats.gennorm(beta, loc, scale)``. :math:`\beta = 2` is a normal
with standard deviation :math:`\alpha / \sqrt 2`, :math:`\beta = 1` a Laplace of scale
:math:`\alpha`, :math:`\beta < 1` is sparser than a Laplace (the transitions of object masks in
natural video fit :math:`\beta \approx 0.5`-:math:`0.7`, Klindt et al. 2021). It is the
transition of :class:`~rpm.priors.GeneralizedNormalRandomWalkPrior` and the density whose
exponent the Lp energy is (:class:`~rpm.priors.LpEnergy`).

Sampling is reparameterised in all three parameters: :math:`|x - \mu|^\beta / \alpha^\beta
\sim \mathrm{Gamma}(1/\beta, 1)` with an independent random sign, the Gamma drawn by
``torch.distributions.Gamma.rsample`` (differentiable in its concentration).

References:
    S. Nadarajah, "A generalized normal distribution", Journal of Applied Statistics, 2005.
    D. Klindt, L. Schott, Y. Sharma, I. Ustyuzhaninov, W. Brendel, M. Bethge and D. Paiton,
    "Towards nonlinear disentanglement in natural data with temporal sparse coding", ICLR 2021.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import Gamma, constraints
from torch.distributions.utils import broadcast_all

__all__ = ["GeneralizedNormal"]


class GeneralizedNormal(TorchDistribution):
    r"""Generalized normal :math:`\mathrm{GN}(\mu, \alpha, \beta)` (module docstring), element
    by element: batch_shape is the broadcast shape of the parameters, event_shape ().

    .. math::

        \log p(x) = \log \beta - \log 2 - \log \alpha - \log\Gamma(1/\beta)
            - \Big|\frac{x - \mu}{\alpha}\Big|^\beta

    At :math:`x = \mu` the gradient of ``log_prob`` in x is taken as 0 (for :math:`\beta < 1`
    the slope there is infinite), as the Lp energy's (``rpm.ops._lp_distances``).

    Mean :math:`\mu`, variance :math:`\alpha^2 \Gamma(3/\beta) / \Gamma(1/\beta)`.

    :param loc: location :math:`\mu`.
    :param scale: scale :math:`\alpha > 0`.
    :param beta: the shape parameter :math:`\beta > 0` (scipy's ``beta``; ``shape`` is Pyro's
        method, ``d.shape()`` the shape of a draw).
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive,
                       "beta": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, beta, validate_args=None):
        self.loc, self.scale, self.beta = broadcast_all(loc, scale, beta)
        super().__init__(self.loc.shape, torch.Size(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(GeneralizedNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.scale = self.scale.expand(batch_shape)
        new.beta = self.beta.expand(batch_shape)
        super(GeneralizedNormal, new).__init__(batch_shape, torch.Size(), validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        inverse = self.beta.reciprocal()
        return self.scale.pow(2) * torch.exp(torch.lgamma(3 * inverse) - torch.lgamma(inverse))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        standard = ((value - self.loc) / self.scale).abs()
        # |0|^beta = 0 with gradient 0 (for beta < 1 the slope at 0 is infinite, and autograd
        # would give inf * 0 = nan): the power is taken of a stand-in 1 at 0, then masked.
        away = standard > 0
        power = torch.where(away, torch.where(away, standard, 1.0).pow(self.beta), 0.0)
        return (self.beta.log() - math.log(2.0) - self.scale.log()
                - torch.lgamma(self.beta.reciprocal()) - power)

    def cdf(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\tfrac12 + \tfrac12 \operatorname{sign}(x - \mu)\, P(1/\beta, |x-\mu|^\beta /
        \alpha^\beta)`, P the regularised lower incomplete gamma function (no gradient in
        :math:`\beta`: torch's ``gammainc`` has none in its first argument)."""
        if self._validate_args:
            self._validate_sample(value)
        centred = value - self.loc
        half = 0.5 * torch.special.gammainc(self.beta.reciprocal().detach(),
                                            (centred.abs() / self.scale).pow(self.beta))
        return 0.5 + torch.sign(centred) * half

    def entropy(self) -> torch.Tensor:
        r""":math:`1/\beta - \log\beta + \log 2\alpha + \log\Gamma(1/\beta)`."""
        inverse = self.beta.reciprocal()
        return inverse - self.beta.log() + torch.log(2 * self.scale) + torch.lgamma(inverse)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        gamma = Gamma(self.beta.reciprocal().expand(shape), torch.ones_like(self.loc).expand(shape))
        magnitude = gamma.rsample().pow(self.beta.reciprocal())        # |x - mu| / alpha
        sign = torch.randint(0, 2, shape, device=self.loc.device).to(self.loc.dtype) * 2 - 1
        return self.loc + self.scale * sign * magnitude
