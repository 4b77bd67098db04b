r"""The recognition marginals :math:`Q_t(z_t)` of a batch of sequences of T views.

For N sequences with recognition distributions :math:`Q(z_t|x_{n,t})` the minibatch estimate of
the t-th view's marginal (Eq. 11 of Aitchison & Ganev, per view; ``docs/theory.md``, sequences)
is the mixture over the batch's t-th views,

.. math::

    Q_t(z) \approx \frac1N \sum_{n=1}^N Q(z | x_{n,t})  \qquad\text{(per view)},

or, when the views are exchangeable (a stationary video seen through one shared encoder, so
that every :math:`Q_t` is the same Q), the pooled mixture over all N T frames,

.. math::

    Q_t(z) \approx \frac{1}{NT} \sum_{n=1}^N \sum_{u=1}^T Q(z | x_{n,u})  \qquad\text{(pooled)},

a lower-variance estimate of the same distribution.

**Missing frames.** Recognition distributions masked over frames (Pyro's ``q.mask(mask)``, a
bool mask (N, T), True = observed; :meth:`rpm.RPM.model` builds it from its ``mask``
argument) leave the missing frames out of both sides: a missing frame is no component of any
mixture (its recognition distribution comes from no data), and its own term
:math:`\log Q_t(z_{n,t})` is dropped (0 in :meth:`SequenceMixtureMarginal.view_log_prob`),
as its likelihood factor is (``docs/theory.md``, sequences). The per-view mixture of view t
then runs over the :math:`N_t` sequences observed at t, with weights :math:`1/N_t`. Over a global batch
(:class:`~rpm.marginals._candidates.Candidates` with ``global_batch``) the mixtures run over
every process's sequences, gathered with gradients, while the batch shape stays this
process's N.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import Delta, Independent, MaskedDistribution, Normal, TorchDistribution
from torch.distributions import constraints

from rpm._validation import check_bool
from rpm.marginals._candidates import Candidates
from rpm.marginals._mixture_marginal import Atoms, delta_mixture_log_prob, recognition_components
from rpm.ops import gaussian_mixture_log_prob

__all__ = [
    "SequenceMixtureMarginal",
    "sequence_components",
    "sequence_mask",
    "stack_components",
    "stack_views",
    "view",
]

# Per-view Gaussian mixtures of at most this many (point, component, view, coordinate) terms are
# evaluated in one broadcast call (small batches: one kernel instead of T); larger ones, or any
# given a block size, by the streamed kernel of rpm.ops one view at a time (O(N D) memory).
_BROADCAST_LIMIT = 2**20


def sequence_mask(q: TorchDistribution) -> torch.Tensor | None:
    """The mask over frames of recognition distributions with batch_shape (N, T): a bool
    tensor (N, T), True = observed, for ``q.mask(mask)``; None when every frame is observed."""
    if isinstance(q, MaskedDistribution):
        mask = q._mask
        if mask is True:
            return None
        if mask is False:
            return torch.zeros(q.batch_shape, dtype=torch.bool)
        return mask
    return None


def sequence_components(q: TorchDistribution) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (loc, scale) of recognition distributions with batch_shape (N, T) and
    event_shape (D,): ``Normal(loc, scale).to_event(1)`` or ``Delta(v, event_dim=1)``, or
    either masked over frames (``q.mask(mask)``, :func:`sequence_mask`); scale is None for
    Delta. Each has shape (N, T, D)."""
    if isinstance(q, MaskedDistribution):
        q = q.base_dist
    if isinstance(q, Independent) and isinstance(q.base_dist, Normal) and (
            q.reinterpreted_batch_ndims == 1 and len(q.batch_shape) == 2):
        return q.base_dist.loc, q.base_dist.scale.expand_as(q.base_dist.loc)
    if isinstance(q, Delta) and q.event_dim == 1 and q.v.dim() == 3:
        return q.v, None
    raise TypeError(
        "sequence recognition must be Normal(loc, scale).to_event(1) or Delta(v, event_dim=1) "
        "with batch_shape (N, T) and event_shape (D,); got "
        f"{type(q).__name__} with batch_shape {tuple(q.batch_shape)} and event_shape "
        f"{tuple(q.event_shape)}. Wrap the encoder in rpm.GaussianRecognition or "
        "rpm.DeltaRecognition"
    )


def view(q: TorchDistribution, t: int) -> TorchDistribution:
    """The recognition distributions of the t-th views, batch_shape (N,), event_shape (D,)."""
    loc, scale = sequence_components(q)
    if sequence_mask(q) is not None:
        raise ValueError("the views of recognition distributions with missing frames are not "
                         "separable into pairs; only a prior that marginalises missing frames "
                         "(accepts_mask, e.g. StateSpacePrior) takes a mask")
    if scale is None:
        return Delta(loc[:, t], event_dim=1)
    return Normal(loc[:, t], scale[:, t]).to_event(1)


class SequenceMixtureMarginal(TorchDistribution):
    r""":math:`\prod_t Q_t(z_t)`, the product of the per-view (or pooled) minibatch mixtures.

    ``batch_shape`` (N,) (one draw per sequence of the model's plate; ``expand`` adds leading
    dimensions, e.g. a plate of particles), ``event_shape`` (T, D). ``log_prob`` of a value
    (..., N, T, D) is :math:`\sum_t \log Q_t(z_{n,t})`, shape (..., N); :meth:`view_log_prob`
    gives the terms, shape (..., N, T); ``sample`` picks a component uniformly for each draw
    (each view's own, or any frame's when pooled) and samples from it. With Delta recognition
    the mixtures are the empirical distributions of the batch points (Appendix A.1).

    :param q: recognition distributions, batch_shape (N, T), event_shape (D,).
    :param bool pooled: one mixture over all N T frames for every view, instead of one mixture
        over the N sequences per view.
    :param block_size: evaluate the Gaussian mixtures in blocks of this many rows
        (:func:`~rpm.ops.gaussian_mixture_log_prob`); None decides by size.
    :param candidates: a :class:`~rpm.marginals._candidates.Candidates` whose global batch
        supplies the mixture components (every process's sequences); None: this batch.

    With ``q`` masked over frames (``q.mask(mask)``, mask (N, T), True = observed) the missing
    frames are no components and their terms are 0 (module docstring); ``frame_mask`` holds it.
    """

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, q: TorchDistribution, pooled: bool = False, block_size: int | None = None,
                 candidates: Candidates | None = None, validate_args=None):
        check_bool("pooled", pooled)
        self.q = q
        self.loc, self.scale = sequence_components(q)
        self.frame_mask = sequence_mask(q)  # (N, T) bool, or None: every frame observed
        self.pooled = pooled
        self.block_size = block_size
        num_sequences, num_views, dim = self.loc.shape
        # The mixture components: this batch's, or every process's (M, T, D).
        self.components = (self.loc, self.scale)
        if candidates is not None and candidates.is_global:
            if self.frame_mask is not None:
                raise ValueError("missing frames (a mask) are not supported with a global batch; "
                                 "train with global_batch=False or without a mask")
            if self.scale is None:
                self.components = (candidates.gather(self.loc), None)
            else:  # one collective for both
                both = candidates.gather(torch.cat([self.loc, self.scale], dim=-1))
                self.components = (both[..., :dim], both[..., dim:])
        super().__init__(torch.Size([num_sequences]), torch.Size([num_views, dim]),
                         validate_args=validate_args)

    @property
    def is_discrete(self) -> bool:
        """True for Delta recognition (no density on R^D)."""
        return self.scale is None

    @property
    def support(self) -> constraints.Constraint:
        """For Delta recognition the batch's atoms (discrete,
        ``rpm.marginals._mixture_marginal.Atoms``: each latent one of the batch points),
        else real (T, D) matrices."""
        if self.scale is None:
            return Atoms(self.components[0].reshape(-1, self.loc.shape[-1]), event_dim=2)
        return constraints.independent(constraints.real, 2)

    def expand(self, batch_shape, _instance=None):
        """The same marginals for leading batch dimensions (e.g. a plate of particles):
        ``batch_shape`` (..., N); the last dimension stays the N sequences."""
        batch_shape = torch.Size(batch_shape)
        if batch_shape[-1:] != self.batch_shape:
            raise ValueError(
                f"the mixture marginals of {self.batch_shape[0]} sequences cannot be expanded "
                f"to {tuple(batch_shape)}; use a plate of the number of sequences")
        if batch_shape == self.batch_shape:
            return self
        new = self._get_checked_instance(SequenceMixtureMarginal, _instance)
        new.__dict__.update({key: value for key, value in self.__dict__.items()
                             if key not in ("_batch_shape", "_event_shape")})
        TorchDistribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _mixture(self, points: torch.Tensor, loc: torch.Tensor,
                 scale: torch.Tensor | None) -> torch.Tensor:
        if scale is None:
            return delta_mixture_log_prob(points, loc)
        return gaussian_mixture_log_prob(points, loc, scale, block_size=self.block_size)

    def view_log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\log Q_t(z_{n,t})` for a value of shape (..., N, T, D) (leading dimensions:
        e.g. a plate of particles); returns (..., N, T)."""
        if value.shape[-3:] != self.loc.shape:
            raise ValueError(
                "the mixture marginals are evaluated at the batch's latents, shape "
                f"(..., {', '.join(map(str, self.loc.shape))}); got {tuple(value.shape)}")
        if value.dim() > 3:  # each row is evaluated on its own: the leading batches as rows
            lead = value.shape[:-3]
            if self.frame_mask is not None:  # the mask pairs row n with sequence n
                flat = value.reshape((-1,) + value.shape[-3:])
                return torch.stack([self.view_log_prob(batch) for batch in flat]).reshape(
                    lead + value.shape[-3:-1])
            rows = self._view_log_prob_rows(value.reshape((-1,) + value.shape[-2:]))
            return rows.reshape(lead + value.shape[-3:-1])
        if self.frame_mask is not None:
            return self._masked_view_log_prob(value, self.frame_mask)
        return self._view_log_prob_rows(value)

    def _view_log_prob_rows(self, value: torch.Tensor) -> torch.Tensor:
        """:meth:`view_log_prob` without a mask, for any number of rows (R, T, D); (R, T)."""
        num_sequences, num_views, dim = value.shape
        loc, scale = self.components
        if self.pooled:
            flat = lambda tensor: None if tensor is None else tensor.reshape(-1, dim)  # noqa: E731
            return self._mixture(value.reshape(-1, dim), loc.reshape(-1, dim), flat(scale)).reshape(
                num_sequences, num_views)
        if scale is not None and self.block_size is None and (
                value.shape[0] * loc.shape[0] * num_views * dim <= _BROADCAST_LIMIT):
            # All T views at once, from the densities themselves: (N, M, T, D) terms, the
            # exact (unexpanded) Gaussian log-density, one logsumexp over the M components.
            terms = Normal(loc[None], scale[None]).log_prob(value[:, None]).sum(-1)   # (N, M, T)
            return torch.logsumexp(terms, dim=1) - math.log(loc.shape[0])
        return torch.stack([
            self._mixture(value[:, t], loc[:, t], None if scale is None else scale[:, t])
            for t in range(num_views)], dim=-1)

    def _masked_view_log_prob(self, value: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
        """view_log_prob with missing frames (``frame_mask``): components and terms of the
        observed frames."""
        num_sequences, num_views, dim = value.shape
        loc, scale = self.components
        mask = frame_mask.expand(num_sequences, num_views)
        if self.pooled:
            keep = mask.reshape(-1)
            flat = lambda tensor: None if tensor is None else tensor.reshape(-1, dim)[keep]  # noqa: E731
            if not bool(keep.any()):
                return value.new_zeros(num_sequences, num_views)
            out = self._mixture(value.reshape(-1, dim), loc.reshape(-1, dim)[keep], flat(scale)).reshape(
                num_sequences, num_views)
        else:
            columns = []
            for t in range(num_views):
                keep = mask[:, t]
                if not bool(keep.any()):  # nobody observed at t: no mixture, no terms
                    columns.append(value.new_zeros(num_sequences))
                    continue
                columns.append(self._mixture(value[:, t], loc[keep, t],
                                             None if scale is None else scale[keep, t]))
            out = torch.stack(columns, dim=-1)
        # A missing frame's own term is dropped (its latent is not that of any data).
        return torch.where(mask, out, torch.zeros((), dtype=out.dtype, device=out.device))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.view_log_prob(value).sum(-1)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)  # sample_shape + (N, T, D)
        num_sequences, num_views, dim = self.loc.shape
        with torch.no_grad():
            if self.frame_mask is not None:  # components: the observed frames only
                weights = self.frame_mask.expand(num_sequences, num_views).to(self.loc.dtype)
                draws = shape[:-1].numel() // num_views
                if self.pooled:
                    index = torch.multinomial(weights.reshape(-1), shape[:-1].numel(), True)
                    index = index.reshape(shape[:-1])
                    loc = self.loc.reshape(-1, dim)[index]
                    scale = None if self.scale is None else self.scale.reshape(-1, dim)[index]
                else:  # a view nobody observed has no mixture: every component, never used
                    weights = torch.where(weights.sum(0) > 0, weights, torch.ones_like(weights))
                    index = torch.multinomial(weights.T, draws, True).T.reshape(shape[:-1])
                    views = torch.arange(num_views, device=self.loc.device).expand_as(index)
                    loc = self.loc[index, views]
                    scale = None if self.scale is None else self.scale[index, views]
            elif self.pooled:
                index = torch.randint(num_sequences * num_views, shape[:-1], device=self.loc.device)
                loc = self.loc.reshape(-1, dim)[index]
                scale = None if self.scale is None else self.scale.reshape(-1, dim)[index]
            else:
                index = torch.randint(num_sequences, shape[:-1], device=self.loc.device)
                views = torch.arange(num_views, device=self.loc.device).expand_as(index)
                loc = self.loc[index, views]
                scale = None if self.scale is None else self.scale[index, views]
            return loc if scale is None else loc + scale * torch.randn_like(loc)


def stack_views(dists: list[TorchDistribution]) -> TorchDistribution:
    """The J views' recognition distributions as one, batch_shape (N, J), event_shape (D,):
    :func:`stack_components` of their parameters."""
    return stack_components([recognition_components(dist) for dist in dists])


def stack_components(parts: list[tuple]) -> TorchDistribution:
    """The J views' recognition parameters ``(loc (N, D), scale (N, D) or None)`` as one
    distribution, batch_shape (N, J), event_shape (D,): ``Delta(loc, event_dim=1)`` or
    ``Normal(loc, scale).to_event(1)`` of the stacked parameters.

    :raises ValueError: when some views are Delta and others Gaussian.
    """
    scales = [scale for _, scale in parts]
    if any(s is None for s in scales) and not all(s is None for s in scales):
        raise ValueError("the views' recognition models must all be Delta (deterministic) or all "
                         "Gaussian; got a mixture of the two")
    loc = torch.stack([loc for loc, _ in parts], dim=1)                          # (N, J, D)
    if scales[0] is None:
        return Delta(loc, event_dim=1)
    return Normal(loc, torch.stack(scales, dim=1)).to_event(1)
