r"""``RPMELBO``: the RPM ELBO of Eq. 15, each encoder evaluated once, cancellations done by hand.

For an :class:`~rpm.RPM` with recognition models as the guide, Pyro's ``Trace_ELBO`` evaluates

.. math::

    \sum_i \Big[\log P(z_i, z'_i) + \big(\log Q(z_i|x_i) - \log Q(z_i)\big)
      + \big(\log Q(z'_i|x'_i) - \log Q(z'_i)\big) - \log Q(z_i|x_i) - \log Q(z'_i|x'_i)\Big]

with :math:`z_i \sim Q(z|x_i)`, :math:`z'_i \sim Q(z'|x'_i)`, running each encoder twice (guide,
then model). ``RPMELBO`` runs each encoder once, draws the same samples in the same order, and
cancels the recognition log-densities analytically, leaving

.. math::

    \mathcal{L} = \sum_i \big[\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)\big].   \quad\text{(Eq. 15)}

Under the implicit prior the mixture marginals cancel too and the per-pair term is
:math:`F_{ii} - \log\frac1N\sum_j e^{F_{ij}}` (Eq. 23-25), so no O(N^2 D) mixture is evaluated.
Any other prior is traced with ``z``, ``z2`` conditioned on the samples, and its log-density
enters together with the minibatch-mixture marginals. The loss is :math:`-\mathcal{L}`.

Global batch (``RPMELBO(global_batch=True)``, under ``torch.distributed``): each rank keeps its
own pairs but the mixture components and the implicit prior's candidates :math:`z'_j` are
gathered from every rank with :func:`rpm.distributed.all_gather_with_grad`, so the marginals
and the InfoNCE normaliser run over the global batch; the sum of the ranks' losses (and of
their gradients) is the single-process loss of the concatenated batch.
"""

from __future__ import annotations

import inspect

import pyro
import torch
from pyro import poutine
from pyro.infer import ELBO

from rpm.distributed import all_gather_with_grad
from rpm.marginals import (
    MixtureMarginal,
    delta_mixture_log_prob,
    gaussian_mixture_log_prob,
    recognition_components,
)

__all__ = ["RPMELBO", "rpm_log_ratio"]


def _owning_rpm(model, guide):
    from rpm.models.rpm import RPM

    owner = getattr(model, "__self__", model)
    if not isinstance(owner, RPM) or getattr(guide, "__self__", None) is not owner:
        raise TypeError(
            "RPMELBO evaluates an rpm.RPM directly: pass rpm.model and rpm.guide of the same "
            f"RPM (got model={model!r}, guide={guide!r}). For any other model use "
            "pyro.infer.Trace_ELBO"
        )
    return owner


def _marginal_log_prob(
    q, z: torch.Tensor, global_batch: bool, block_size: int | None
) -> torch.Tensor:
    """log Q(z_i) under the mixture of q's components, gathered from every rank if asked."""
    if not global_batch and block_size is None:
        return MixtureMarginal(q).log_prob(z)
    loc, scale = recognition_components(q)  # (N, D), (N, D) or None
    if global_batch:
        if scale is None:
            loc = all_gather_with_grad(loc)
        else:  # one collective for both
            loc, scale = all_gather_with_grad(torch.cat([loc, scale], dim=1)).chunk(2, dim=1)
    if scale is None:
        return delta_mixture_log_prob(z, loc)
    return gaussian_mixture_log_prob(z, loc, scale, block_size=block_size)


def _accepts_global_keywords(prior) -> bool:
    parameters = inspect.signature(prior.log_ratio).parameters
    return any(p.kind is p.VAR_KEYWORD for p in parameters.values()) or {
        "negatives", "block_size"} <= set(parameters)


def rpm_log_ratio(
    rpm, z: torch.Tensor, z2: torch.Tensor, q, q2, global_batch: bool = False,
    block_size: int | None = None,
) -> torch.Tensor:
    r"""Total :math:`\sum_i \log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)` over the batch.

    Uses the prior's own ``log_ratio(z, z2, q, q2)`` (per pair, analytic cancellations) when it
    has one; otherwise traces the prior with the sites ``"z"``, ``"z2"`` conditioned on the
    given values and subtracts the minibatch-mixture marginals.

    :param rpm: the :class:`~rpm.RPM`.
    :param torch.Tensor z: first-view latents, shape (N, D).
    :param torch.Tensor z2: second-view latents, shape (N, D).
    :param q: first-view recognition distributions, batch_shape (N,).
    :param q2: second-view recognition distributions, batch_shape (N,).
    :param bool global_batch: evaluate the marginals (and the implicit prior's normaliser)
        over the batches of every rank, gathered with
        :func:`~rpm.distributed.all_gather_with_grad`; the return value is this rank's share.
    :param block_size: stream the O(N^2) parts in blocks of this size (``None``: by size).
    :return: a scalar.
    """
    prior = rpm.prior
    if hasattr(prior, "log_ratio"):
        if not global_batch and block_size is None:
            return prior.log_ratio(z, z2, q, q2).sum()
        if not _accepts_global_keywords(prior):
            raise TypeError(
                f"global_batch=True or block_size needs a prior whose log_ratio accepts the "
                f"keywords negatives= and block_size= (as rpm.priors.ImplicitPrior's does); "
                f"{type(prior).__name__}.log_ratio does not"
            )
        negatives = all_gather_with_grad(z2) if global_batch else None
        return prior.log_ratio(z, z2, q, q2, negatives=negatives, block_size=block_size).sum()
    conditioned = poutine.condition(rpm.sample_prior, data={"z": z, "z2": z2})
    with pyro.plate("pairs", z.shape[0]):
        trace = poutine.trace(conditioned).get_trace(q, q2)
    trace.compute_log_prob()
    log_prior = sum(
        site["log_prob"].sum()
        for site in trace.nodes.values()
        if site["type"] == "sample"
    )
    log_marginals = (_marginal_log_prob(q, z, global_batch, block_size).sum()
                     + _marginal_log_prob(q2, z2, global_batch, block_size).sum())
    return log_prior - log_marginals


class RPMELBO(ELBO):
    r"""The RPM evidence lower bound (Eq. 15 of Aitchison & Ganev) for ``(rpm.model, rpm.guide)``.

    A :class:`pyro.infer.ELBO`: use it with ``pyro.infer.SVI``, or call ``differentiable_loss``
    in a PyTorch loop, or ``RPMELBO()(rpm.model, rpm.guide)`` for a module whose ``forward``
    returns the differentiable loss. It agrees with ``Trace_ELBO`` on the same model (same
    random samples) to floating-point accuracy, while evaluating each encoder once per step.

    The loss is :math:`-\mathcal{L}`, the negative ELBO summed over the N pairs; with Delta
    encoders and the implicit prior, :math:`\mathcal{L}/N = -\text{InfoNCE} + \log N`.

    :param int num_particles: number of samples per step (averaged).
    :param bool global_batch: under ``torch.distributed``, use every rank's batch: the
        mixture marginals and the implicit prior's negatives are gathered from all ranks
        (:func:`~rpm.distributed.all_gather_with_grad`) while each rank keeps its own pairs.
        The loss is this rank's share; summed over ranks it is the loss of the concatenated
        batch (``DistributedDataParallel`` averages gradients, i.e. divides that gradient by
        the number of ranks). Without ``torch.distributed`` it changes nothing.
    :param block_size: evaluate the mixture marginals and the InfoNCE normaliser in blocks of
        this many rows and columns (O(N D) memory, :mod:`rpm.marginals.streaming`); ``None``
        streams automatically for large batches.
    """

    def __init__(self, num_particles: int = 1, global_batch: bool = False,
                 block_size: int | None = None):
        if isinstance(num_particles, bool) or not isinstance(num_particles, int) or (
            num_particles < 1
        ):
            raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
        if not isinstance(global_batch, bool):
            raise TypeError(f"global_batch must be True or False, got {global_batch!r}")
        if block_size is not None and (
            isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1
        ):
            raise ValueError(f"block_size must be a positive integer or None, got {block_size!r}")
        super().__init__(num_particles=num_particles)
        self.global_batch = global_batch
        self.block_size = block_size

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """The negative ELBO as a differentiable scalar tensor; ``args`` are ``(x, x2)``."""
        rpm = _owning_rpm(model, guide)
        return rpm.call_with_cached_params(self._negative_elbo, rpm, *args, **kwargs)

    def _negative_elbo(self, rpm, *args, **kwargs) -> torch.Tensor:
        q, q2 = rpm.recognise(*args, **kwargs)
        total = 0.0
        for _ in range(self.num_particles):
            z = q.rsample()  # (N, D): the guide's site "z"
            z2 = q2.rsample()  # (N, D): the guide's site "z2"
            total = total - rpm_log_ratio(
                rpm, z, z2, q, q2, global_batch=self.global_batch, block_size=self.block_size
            )
        return total / self.num_particles

    def _get_trace(self, model, guide, args, kwargs):
        """Pyro's ELBO hook; RPMELBO evaluates the RPM directly, so there is no trace to get."""
        raise NotImplementedError(
            "RPMELBO does not trace the model; use Trace_ELBO to inspect traces of an RPM"
        )

    def loss(self, model, guide, *args, **kwargs) -> float:
        """The negative ELBO as a float (no gradients)."""
        with torch.no_grad():
            return self.differentiable_loss(model, guide, *args, **kwargs).item()

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        """Computes the negative ELBO, backpropagates it and returns it as a float."""
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return loss.item()
