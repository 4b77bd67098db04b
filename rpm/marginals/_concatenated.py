r"""Two batches of recognition distributions of any family as one batch: the components of a
pooled mixture (the NT-Xent marginal :math:`Q_\text{pool}` of both views, ``docs/theory.md#nt-xent``).

For Gaussian and Delta recognition the pooled components are built by concatenating their
parameters; for any other family (whose parameters rpm does not know) :class:`ConcatenatedBatch`
concatenates the distributions themselves, through their ``log_prob`` and ``sample``.
"""

from __future__ import annotations

import torch
from pyro.distributions import TorchDistribution

__all__ = ["ConcatenatedBatch"]


class ConcatenatedBatch(TorchDistribution):
    r"""The batch :math:`(Q_1, \dots, Q_N, Q'_1, \dots, Q'_M)` of two batches of distributions.

    batch_shape (N + M,), event_shape (D,). ``log_prob`` of a value of shape (..., N + M, D)
    evaluates row k under component k (the first N rows under ``first``, the rest under
    ``second``); a value of shape (..., 1, D) is broadcast against all N + M components, which
    is how :func:`~rpm.ops.distribution_mixture_log_prob` evaluates a mixture.

    :param first: a batch of distributions with batch_shape (N,) and event_shape (D,).
    :param second: a batch with batch_shape (M,) and the same event_shape, and the same support.
    """

    arg_constraints: dict = {}

    def __init__(self, first: TorchDistribution, second: TorchDistribution, validate_args=None):
        for name, dist in (("first", first), ("second", second)):
            if len(dist.batch_shape) != 1 or len(dist.event_shape) != 1:
                raise ValueError(
                    f"{name} must have batch_shape (N,) and event_shape (D,), got batch_shape "
                    f"{tuple(dist.batch_shape)} and event_shape {tuple(dist.event_shape)}"
                )
        if first.event_shape != second.event_shape:
            raise ValueError(
                f"the two batches have latents of dimensions {first.event_shape[0]} and "
                f"{second.event_shape[0]}; both views' encoders must output the same dimension"
            )
        self.first, self.second = first, second
        self.split = first.batch_shape[0]
        super().__init__(torch.Size([self.split + second.batch_shape[0]]), first.event_shape,
                         validate_args=validate_args)

    @property
    def support(self):
        """The support of the first batch's components (the second's must be the same)."""
        return self.first.support

    # torch declares has_rsample a class attribute; a property, as in torch's own Independent
    @property
    def has_rsample(self) -> bool:  # type: ignore[override]
        return self.first.has_rsample and self.second.has_rsample

    @property
    def mean(self) -> torch.Tensor:
        return torch.cat([self.first.mean, self.second.mean], dim=-2)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if value.dim() < 2 or value.shape[-2] == 1:  # one row against every component
            return torch.cat([self.first.log_prob(value), self.second.log_prob(value)], dim=-1)
        return torch.cat([self.first.log_prob(value[..., :self.split, :]),
                          self.second.log_prob(value[..., self.split:, :])], dim=-1)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        return torch.cat([self.first.sample(sample_shape), self.second.sample(sample_shape)],
                         dim=-2)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        return torch.cat([self.first.rsample(sample_shape), self.second.rsample(sample_shape)],
                         dim=-2)
