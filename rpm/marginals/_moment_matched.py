r"""The moment-matched Gaussian estimate of the pooled recognition marginal of a batch of
sequences.

The recognition marginal of a stationary sequence seen through one shared Gaussian encoder is
the same at every frame, :math:`Q(z) = E_{P_\text{true}(x)}[Q(z|x)]` (Eq. 11 of Aitchison &
Ganev; ``docs/theory.md``, sequences). The pooled minibatch mixture
(:class:`~rpm.marginals.SequenceMixtureMarginal` with ``pooled=True``) estimates it by the
:math:`M = N T` components of the batch. This module estimates it by the Gaussian with the
mixture's first two moments,

.. math::

    Q(z) \approx \mathcal{N}(z;\ m, S), \qquad
    m = \frac1M \sum_k \mu_k, \qquad
    S = \frac1M \sum_k \Big[(\mu_k - m)(\mu_k - m)^\top + \operatorname{diag}\sigma_k^2\Big],

over the components :math:`\mathcal{N}(\mu_k, \operatorname{diag}\sigma_k^2)` of the batch's
observed frames.

**When it is exact.** If the recognition means :math:`\mu(x)` are Gaussian over the data and
the noise :math:`\sigma` is constant (an affine encoder of a linear-Gaussian system, ``rpm
lds``), the population marginal *is* :math:`\mathcal{N}(E\mu, \operatorname{Cov}\mu + \sigma^2
I)`, and (m, S) are its moment estimates over the batch: a consistent estimate of the exact
marginal with D + D(D+1)/2 numbers instead of M components. Otherwise the Gaussian has the
largest entropy among densities of those moments, and :math:`-E\log Q` over the marginal's
draws is over-estimated by the marginal's non-Gaussianity (its negentropy): an approximation,
not a bound.

**Why it matters.** Once the M components are separated by more than their widths,
:math:`-\log` of the mixture at a latent drawn near its own component is about :math:`\log M`
plus that component's entropy whatever the spread: the mixture rewards at most about
:math:`\log M` nats per frame of information in the latents (the InfoNCE ceiling). The
Gaussian's :math:`-\log Q` keeps growing with :math:`\tfrac12 \log\det S`. Measured on
``rpm lds --size medium`` (latent 5): with the pooled mixture (M = 1600) the encoder's means
lose the state while the ELBO rises (held-out :math:`R^2` 0.99 -> 0.6); with this estimate
they keep it (``benchmarks/README.md``).

**Missing frames.** With the recognition distributions masked over frames (``q.mask(mask)``,
(N, T) bool, True = observed) only observed frames are components, and a missing frame's term
is 0, as for the mixture.
"""

from __future__ import annotations

import torch
from pyro.distributions import MultivariateNormal, TorchDistribution
from torch.distributions import constraints

from rpm.marginals._sequence_marginal import sequence_components, sequence_mask

__all__ = ["MomentMatchedMarginal"]


class MomentMatchedMarginal(TorchDistribution):
    r""":math:`\prod_t \mathcal{N}(z_t;\ m, S)`, the moment-matched Gaussian of the pooled
    minibatch mixture at every frame (module docstring).

    ``batch_shape`` (N,) (one draw per sequence of the model's plate), ``event_shape`` (T, D);
    ``log_prob`` of a value (N, T, D) is :math:`\sum_t \log\mathcal{N}(z_{n,t}; m, S)` over
    the observed frames, shape (N,); :meth:`view_log_prob` gives the terms, shape (N, T).

    :param q: Gaussian recognition distributions, ``Normal(loc, scale).to_event(1)`` with
        batch_shape (N, T) and event_shape (D,), optionally masked over frames.
    """

    arg_constraints: dict = {}
    support = constraints.independent(constraints.real, 2)
    has_rsample = False

    def __init__(self, q: TorchDistribution, validate_args=None):
        loc, scale = sequence_components(q)
        if scale is None:
            raise ValueError("the moment-matched marginal needs Gaussian recognition "
                             "(rpm.GaussianRecognition); Delta recognition has no covariance "
                             "to add: use the mixture marginal (SequenceMixtureMarginal)")
        self.loc, self.scale = loc, scale
        self.frame_mask = sequence_mask(q)  # (N, T) bool, or None: every frame observed
        num_sequences, num_views, dim = loc.shape
        means, variances = loc.reshape(-1, dim), scale.reshape(-1, dim).square()  # (N T, D)
        if self.frame_mask is not None:
            keep = self.frame_mask.expand(num_sequences, num_views).reshape(-1)
            if not bool(keep.any()):
                raise ValueError("every frame of the batch is missing: the marginal has no "
                                 "component; drop such batches")
            means, variances = means[keep], variances[keep]
        centre = means.mean(0)  # m, (D,)
        deviations = means - centre
        covariance = (deviations.T @ deviations / len(means)
                      + torch.diag(variances.mean(0)))  # S, (D, D)
        self.gaussian = MultivariateNormal(centre, covariance_matrix=covariance)
        super().__init__(torch.Size([num_sequences]), torch.Size([num_views, dim]),
                         validate_args=validate_args)

    @property
    def covariance_matrix(self) -> torch.Tensor:
        """S, (D, D)."""
        return self.gaussian.covariance_matrix

    @property
    def mean(self) -> torch.Tensor:
        """m at every frame, (N, T, D)."""
        return self.gaussian.loc.expand(self.batch_shape + self.event_shape)

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != self.batch_shape:
            raise ValueError(
                f"the marginals of {self.batch_shape[0]} sequences cannot be expanded to "
                f"{tuple(batch_shape)}; use a plate of the number of sequences")
        return self

    def view_log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\mathcal{N}(z_{n,t}; m, S)` for a value (N, T, D); 0 at missing frames;
        returns (N, T)."""
        if value.shape[-3:] != self.loc.shape:
            raise ValueError(f"the marginals are evaluated at the batch's latents, shape "
                             f"{tuple(self.loc.shape)}; got {tuple(value.shape)}")
        terms = self.gaussian.log_prob(value)  # (..., N, T)
        if self.frame_mask is not None:
            terms = torch.where(self.frame_mask, terms, torch.zeros((), dtype=terms.dtype,
                                                              device=terms.device))
        return terms

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.view_log_prob(value).sum(-1)
