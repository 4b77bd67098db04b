r"""The pooled implicit prior: SimCLR's NT-Xent as an RPM.

NT-Xent (Chen et al., 2020, SimCLR) pools the 2N latents of a batch of N pairs,
:math:`u = (z_1, \dots, z_N, z'_1, \dots, z'_N)`; every :math:`u_k` is an anchor whose positive
is its partner :math:`u_{p(k)}` and whose candidates are the 2N - 1 other latents:

.. math::

    \text{NT-Xent} = \frac{1}{2N} \sum_{k=1}^{2N}
    -\log \frac{e^{f(u_k, u_{p(k)})}}{\sum_{m \ne k} e^{f(u_k, u_m)}}.

It is the ELBO of the uniform-implicit prior (Eq. 21-22 of Aitchison & Ganev) built on the
**pooled** recognition marginal, the mixture over both views' recognition distributions,

.. math::

    Q_\text{pool}(z) = \frac{1}{2N} \sum_{k=1}^{2N} Q(z | x_k), \qquad
    (x_1, \dots, x_{2N}) = (x_1, \dots, x_N, x'_1, \dots, x'_N),

with one RPM per direction. Direction view 1 :math:`\to` view 2:

.. math::

    P(z) = Q_\text{pool}(z), \qquad
    P(z'_i | z_i) = \frac{Q_\text{pool}(z'_i)\, e^{f(z_i, z'_i)}}{\hat Z(z_i)}, \qquad
    \hat Z(u_k) = \frac{1}{2N - 1} \sum_{m \ne k} e^{f(u_k, u_m)},

the normaliser :math:`Z(z) = \mathbb{E}_{Q_\text{pool}(z')} e^{f(z, z')}` being estimated, as
NT-Xent does, over the batch's pooled latents except the anchor itself; direction view 2
:math:`\to` view 1 swaps the roles. The two views are two draws from one data distribution, so
the recognition marginal in the likelihood (Eq. 10) is :math:`Q_\text{pool}` as well:
:math:`P(x|z) = Q(z|x) P_\text{true}(x) / Q_\text{pool}(z)`. The marginals then cancel in the
ELBO (Eq. 15), as in Eq. 23-25, and the direction :math:`d` leaves, per pair,

.. math::

    r_i^{1 \to 2} = f(z_i, z'_i) - \log \hat Z(z_i), \qquad
    r_i^{2 \to 1} = f(z'_i, z_i) - \log \hat Z(z'_i).

:class:`PooledImplicitPrior` averages the two directions' ELBOs, so that, summed over the N pairs,

.. math::

    \frac{\mathcal{L}}{N} = \frac{1}{N} \sum_i \tfrac12 \big(r_i^{1 \to 2} + r_i^{2 \to 1}\big)
    = -\text{NT-Xent} + \log(2N - 1)

exactly, for every energy f; the cosine energy with :math:`\kappa = 1/\tau` gives SimCLR's
loss (and lightly's ``NTXentLoss``). By contrast the one-directional, cross-view form of
:class:`~rpm.priors.ImplicitPrior`, whose candidates are the N latents of the other view,
gives :math:`\mathcal{L}/N = -\text{InfoNCE} + \log N` (what info-nce-pytorch computes).

**What the sites are.** As for :class:`~rpm.priors.ImplicitPrior`, every sample site is a
proper distribution and the coupling is a factor (``docs/theory.md#normalised-sample-sites``).
Each direction's prior log-density is :math:`\log Q_\text{pool}(z) + \log Q_\text{pool}(z') +
r^d`, the tilt :math:`r^d` being NT-Xent's estimate (its normaliser :math:`\hat Z` runs over the
batch's other pooled latents). Per pair the ELBO is at most :math:`\log(2N - 1)`; rpm claims
no evidence bound for it (``docs/theory.md#what-each-elbo-bounds``).

**One Pyro model for the average.** The average of the two directions' ELBOs under the same
guide is the ELBO of the model whose prior log-density is the average of the two directions'.
Both directions share the factor :math:`Q_\text{pool}(z)\, Q_\text{pool}(z')`, so

.. math::

    \tfrac12 \log P^{1 \to 2}(z, z') + \tfrac12 \log P^{2 \to 1}(z, z')
    = \log Q_\text{pool}(z) + \log Q_\text{pool}(z') + \tfrac12 r^{1 \to 2} + \tfrac12 r^{2 \to 1}:

the model declares ``"z"`` and ``"z2"`` as N draws each from :math:`Q_\text{pool}`
(``pooled_marginal``) and adds each direction's tilt, summed over the pairs, as a
``pyro.factor`` of weight 1/2 (``"z_to_z2"``, ``"z2_to_z"``). With ``direction="forward"`` (or
``"backward"``) the prior is the single RPM of that direction: the same two sites and the one
factor ``"z_to_z2"`` (or ``"z2_to_z"``) of weight 1.
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro.distributions import Delta, Independent, Normal, TorchDistribution

from rpm.marginals import MixtureMarginal
from rpm.marginals._candidates import Candidates
from rpm.marginals._concatenated import ConcatenatedBatch
from rpm.marginals._mixture_marginal import fast_components
from rpm.ops._dispatch import default_block_size, ieee_float32_matmul, use_streaming
from rpm.ops._logsumexp import safe_logsumexp, streaming_matmul_logsumexp
from rpm.priors._base import Energy
from rpm.priors._energy_paths import blocked_energy_logsumexp, energy_logit_factors, energy_paired
from rpm.priors._energy_range import check_implicit_log_ratio
from rpm.priors._implicit import ImplicitPrior, tilt_factor

__all__ = [
    "PooledImplicitPrior",
    "pooled_log_normalizer",
    "pooled_log_ratios",
    "pooled_marginal",
    "pooled_recognition",
]

_DIRECTIONS = ("both", "forward", "backward")


def pooled_recognition(q: TorchDistribution, q2: TorchDistribution) -> TorchDistribution:
    """The 2N recognition distributions of both views as one batch, (q_1..q_N, q2_1..q2_N):
    parameters concatenated for Gaussian and Delta recognition, the distributions themselves
    (:class:`~rpm.marginals._concatenated.ConcatenatedBatch`) for any other family."""
    fast, fast2 = fast_components(q), fast_components(q2)
    delta, delta2 = isinstance(q, Delta), isinstance(q2, Delta)
    if delta != delta2:
        raise TypeError(
            "the pooled marginal mixes both views' recognition distributions, so both must be "
            "Delta (deterministic) or both have a density; got "
            f"{type(q).__name__} and {type(q2).__name__}"
        )
    if fast is None or fast2 is None:
        return ConcatenatedBatch(q, q2)
    (loc, scale), (loc2, scale2) = fast, fast2
    if scale is None or scale2 is None:  # both Delta (checked above)
        return Delta(torch.cat([loc, loc2]), event_dim=1)
    return Independent(Normal(torch.cat([loc, loc2]), torch.cat([scale, scale2])), 1)


def pooled_log_normalizer(
    energy: Energy, u: torch.Tensor, start: int = 0, stop: int | None = None,
    block_size: int | None = None,
) -> torch.Tensor:
    r"""The NT-Xent log-normaliser of anchors :math:`u_k`, :math:`k \in [\text{start}, \text{stop})`,
    over every other row of the pool:

    .. math::

        \log \sum_{m \ne k} e^{f(u_k, u_m)} = \log \hat Z(u_k) + \log(M - 1),

    with M the number of pooled latents. Dense (``logsumexp`` of the energy matrix with the
    anchor's own entry masked) unless ``block_size`` is given or the matrix is large
    (``rpm.ops._dispatch.use_streaming``); then, for
    energies that are a matrix product :math:`f(u_k, u_m) = a_k^\top b_m + c_k` (their
    :meth:`~rpm.priors._base.Energy.logit_factors` hook), each block of anchor rows is streamed
    against the candidates before and after it (:func:`~rpm.ops.streaming_matmul_logsumexp`)
    and its own diagonal block, with the anchors masked, is dense: O(M D) memory plus one block.
    The factors are used only where they describe the energy's ``forward``
    (``rpm.priors._energy_paths``); otherwise ``forward`` itself runs on tiles with the
    anchors masked (:func:`~rpm.priors._energy_paths.blocked_energy_logsumexp`).

    :param energy: the energy f.
    :param torch.Tensor u: the pooled latents, shape (M, D).
    :param int start: first anchor row.
    :param stop: end of the anchor rows (default M).
    :param block_size: stream in blocks of this many rows; ``None`` decides by size.
    :return: shape (stop - start,).
    :rtype: torch.Tensor
    """
    num = u.shape[0]
    stop = num if stop is None else stop
    if not 0 <= start < stop <= num:
        raise ValueError(f"need 0 <= start < stop <= {num} anchor rows, got {start} and {stop}")
    if num < 2:
        raise ValueError("the pooled normaliser needs at least 2 latents (each anchor needs one "
                         "candidate other than itself)")
    if not use_streaming(stop - start, num, u.device, block_size):
        logits = energy(u[start:stop], u)                                    # (stop - start, M)
        own = torch.arange(start, stop, device=u.device)
        mask = own[:, None] == torch.arange(num, device=u.device)[None, :]
        return safe_logsumexp(logits.masked_fill(mask, -math.inf), dim=-1)
    factors = energy_logit_factors(energy, u, u)
    if factors is None:
        # forward on tiles, the anchor's own entry (column start + i of row i) left out
        return blocked_energy_logsumexp(energy, u[start:stop], u, block_size, mask_shift=start)[0]
    left, right, row_offset = factors
    size = default_block_size(u.device) if block_size is None else block_size
    blocks = []
    for r0 in range(start, stop, size):
        r1 = min(r0 + size, stop)
        with ieee_float32_matmul():
            own = left[r0:r1] @ right[r0:r1].T                               # (b, b)
        eye = torch.eye(r1 - r0, dtype=torch.bool, device=u.device)
        parts = [safe_logsumexp(own.masked_fill(eye, -math.inf), dim=-1)]
        if r0 > 0:
            parts.append(streaming_matmul_logsumexp(left[r0:r1], right[:r0], size))
        if r1 < num:
            parts.append(streaming_matmul_logsumexp(left[r0:r1], right[r1:], size))
        lse = safe_logsumexp(torch.stack(parts), dim=0)
        blocks.append(lse if row_offset is None else lse + row_offset[r0:r1])
    return torch.cat(blocks)


def pooled_log_ratios(
    energy: Energy, z: torch.Tensor, z2: torch.Tensor, direction: str = "both",
    block_size: int | None = None,
    pool: tuple[torch.Tensor, torch.Tensor] | None = None, offset: int = 0,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    r"""The per-pair tilts :math:`(r^{1 \to 2}, r^{2 \to 1})` of the pooled implicit prior's
    directions (module docstring), each of shape (N,); None for a direction not asked for.

    .. math::

        r_i^{1 \to 2} = f(z_i, z'_i) - \log \sum_{m \ne i} e^{f(z_i, u_m)} + \log(2M - 1),

    and likewise from the anchor :math:`z'_i` with positive :math:`z_i`, where
    :math:`u = (Z_1, \dots, Z_M, Z'_1, \dots, Z'_M)` pools the batch's latents: the N pairs
    themselves (M = N), or a global batch of M pairs gathered from every process, of which
    (z, z2) are rows ``offset`` to ``offset + N``.

    :param energy: the energy f.
    :param torch.Tensor z: first-view latents, shape (N, D).
    :param torch.Tensor z2: second-view latents, shape (N, D).
    :param str direction: ``"both"``, ``"forward"`` (1 -> 2) or ``"backward"`` (2 -> 1).
    :param block_size: stream the normaliser in blocks of this many rows; ``None`` by size.
    :param pool: the global batch ``(Z (M, D), Z' (M, D))``; default ``(z, z2)``.
    :param int offset: the row of ``z[0]`` in the global batch.
    """
    if z.dim() != 2 or z.shape != z2.shape:
        raise ValueError(
            f"the pooled prior needs paired latents z and z2 of one shape (N, D), got "
            f"{tuple(z.shape)} and {tuple(z2.shape)}"
        )
    n = z.shape[0]
    big_z, big_z2 = (z, z2) if pool is None else pool
    m = big_z.shape[0]
    if big_z2.shape != big_z.shape or not 0 <= offset <= m - n:
        raise ValueError(
            f"the pooled batch must hold the local {n} pairs at rows {offset}..{offset + n - 1} "
            f"of two (M, D) tensors, got {tuple(big_z.shape)} and {tuple(big_z2.shape)}"
        )
    u = torch.cat([big_z, big_z2])                                           # (2M, D)
    log_candidates = math.log(2 * m - 1)
    forward = backward = None
    if direction != "backward":
        normalizer = pooled_log_normalizer(energy, u, offset, offset + n, block_size)
        forward = energy_paired(energy, z, z2, block_size) - normalizer + log_candidates
    if direction != "forward":
        normalizer = pooled_log_normalizer(energy, u, m + offset, m + offset + n, block_size)
        backward = energy_paired(energy, z2, z, block_size) - normalizer + log_candidates
    return forward, backward


def pooled_marginal(q: TorchDistribution, q2: TorchDistribution) -> MixtureMarginal:
    r"""The pooled recognition marginal :math:`Q_\text{pool}(z) = \frac{1}{2N} \sum_{k=1}^{2N}
    Q(z | x_k)` over both views of a batch of N pairs (:math:`P(z) = Q_\text{pool}(z)` of the
    pooled implicit prior, and the marginal of its likelihood, Eq. 10), as N independent draws:
    the :class:`~rpm.marginals.MixtureMarginal` of the 2N components with batch_shape (N,).

    :param q: first-view recognition distributions, batch_shape (N,), event_shape (D,).
    :param q2: second-view recognition distributions, of the same kind and shape.
    :rtype: ~rpm.marginals.MixtureMarginal
    """
    if q.batch_shape != q2.batch_shape or q.event_shape != q2.event_shape:
        raise ValueError(
            "the two views need recognition distributions of one shape, got batch_shape "
            f"{tuple(q.batch_shape)} and {tuple(q2.batch_shape)}, event_shape "
            f"{tuple(q.event_shape)} and {tuple(q2.event_shape)}"
        )
    return MixtureMarginal(pooled_recognition(q, q2)).expand(q.batch_shape)


def _global_pool(candidates: Candidates | torch.Tensor | None, z: torch.Tensor, z2: torch.Tensor
                 ) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, int]:
    """The global batch ``(Z, Z')`` that (z, z2) are rows ``offset`` on of (``pool`` and
    ``offset`` of :func:`pooled_log_ratios`), or (None, 0) for the batch's own pairs; a queue
    or a tensor of candidates is refused."""
    if isinstance(candidates, Candidates):
        if candidates.appended() is not None:
            raise ValueError(
                "PooledImplicitPrior (NT-Xent) has no queue form: its candidates are the "
                "batch's pooled latents. For a queue of earlier latents (MoCo) or explicit "
                "negatives use ImplicitPrior")
        if candidates.is_global:
            return (candidates.gather(z), candidates.gather(z2)), candidates.offset(z.shape[0])
    elif candidates is not None:
        raise ValueError(
            "PooledImplicitPrior takes its global batch from an rpm.inference.Candidates "
            "(RPMELBO(global_batch=True) under torch.distributed), not from a tensor of "
            "candidates: its candidates are the pooled latents of both views"
        )
    return None, 0


class PooledImplicitPrior(ImplicitPrior):
    r"""The pooled implicit prior, whose RPM ELBO is SimCLR's NT-Xent (module docstring).

    .. math::

        P(z) = Q_\text{pool}(z), \qquad
        P(z'|z) = \frac{Q_\text{pool}(z')\, e^{f(z, z')}}{\hat Z(z)}, \qquad
        \hat Z(u_k) = \frac{1}{2N - 1} \sum_{m \ne k} e^{f(u_k, u_m)},

    one RPM per direction, the two ELBOs averaged: with Delta encoders,
    :math:`\mathcal{L}/N = -\text{NT-Xent} + \log(2N - 1)` for every energy.

    .. code-block:: python

        model = rpm.RPM(rpm.DeltaRecognition(encoder),
                        rpm.priors.PooledImplicitPrior(rpm.priors.CosineEnergy(kappa=1 / 0.5)))
        loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
        # loss / N == NT-Xent(tau=0.5) - log(2N - 1)

    Called by the model as ``prior(q, q2)``, outside its plate over the pairs (the pairs are
    coupled through the normaliser, :attr:`joint_over_batch`), it declares ``"z"`` and ``"z2"``
    as whole-batch events of shape (N, D), each N draws from :math:`Q_\text{pool}`
    (``pooled_marginal``), and the tilts as factors (``rpm.priors._implicit.tilt_factor``):
    with ``direction="both"`` ``"z_to_z2"`` and ``"z2_to_z"`` (each direction's tilt summed
    over the pairs, weight 1/2); with ``"forward"`` (view 1 -> 2) ``"z_to_z2"`` alone, with
    ``"backward"`` ``"z2_to_z"`` alone (weight 1). The RPM's likelihood factors ``"x"``, ``"x2"``
    divide by :math:`Q_\text{pool}` (Eq. 10, :meth:`likelihood_marginals`). :meth:`log_ratio`
    gives the ELBO's per-pair terms after the analytic cancellation, so :class:`~rpm.RPMELBO`
    never evaluates a mixture.

    It is the uniform-implicit prior on the pooled marginal, a subclass of
    :class:`~rpm.priors.ImplicitPrior`: the energy, the latent dimension
    (:attr:`~rpm.priors.ImplicitPrior.dim`), Delta encoders accepted and
    :attr:`~rpm.priors.ImplicitPrior.joint_over_batch` are the implicit prior's; the marginal,
    the candidates of the normaliser and the likelihood marginals are the pooled ones.

    :param energy: f(z, z'), e.g. :class:`~rpm.priors.CosineEnergy` (kappa = 1/tau for
        SimCLR).
    :param str direction: ``"both"`` (NT-Xent, default), ``"forward"`` or ``"backward"``.
    """

    def __init__(self, energy: Energy, direction: str = "both"):
        super().__init__(energy)
        if direction not in _DIRECTIONS:
            raise ValueError(
                f"direction must be one of {_DIRECTIONS} (both: NT-Xent; forward: view 1 -> 2 "
                f"only; backward: view 2 -> 1 only), got {direction!r}"
            )
        self.direction = direction

    def forward(self, q: TorchDistribution, q2: TorchDistribution,
                candidates: Candidates | None = None):
        """Declares ``"z"``, ``"z2"`` (each one event of shape (N, D), outside the plate over
        the pairs: :attr:`joint_over_batch`) and the factors of the class docstring; returns
        ``(z, z2)``. ``candidates`` as for :meth:`log_ratio` (a global batch pools every
        process's pairs in the normalisers; a queue is refused)."""
        marginal = pooled_marginal(q, q2)
        z = pyro.sample("z", marginal.to_event(1))
        z2 = pyro.sample("z2", marginal.to_event(1))
        weight = 0.5 if self.direction == "both" else 1.0

        def tilt(z: torch.Tensor, z2: torch.Tensor, direction: str) -> torch.Tensor:
            """One direction's log P(partners | anchors) - log Q_pool(partners), summed."""
            pool, offset = _global_pool(candidates, z, z2)
            forward, backward = pooled_log_ratios(self.energy, z, z2, direction, pool=pool,
                                                  offset=offset)
            ratio = forward if direction == "forward" else backward
            assert ratio is not None  # the direction asked for
            return weight * ratio

        if self.direction != "backward":
            tilt_factor("z_to_z2", lambda z, z2: tilt(z, z2, "forward"), z, z2)
        if self.direction != "forward":
            tilt_factor("z2_to_z", lambda z, z2: tilt(z, z2, "backward"), z, z2)
        return z, z2

    def likelihood_marginals(
        self, q: TorchDistribution, q2: TorchDistribution
    ) -> tuple[MixtureMarginal, MixtureMarginal]:
        r"""Both views' likelihoods divide by the pooled marginal (Eq. 10 with
        :math:`Q_\text{pool}`): the factors ``"x"`` and ``"x2"`` of the :class:`~rpm.RPM` are
        :math:`\log Q(z_i|x_i) - \log Q_\text{pool}(z_i)` and
        :math:`\log Q(z'_i|x'_i) - \log Q_\text{pool}(z'_i)`.

        :return: ``(pool, pool)``, ``pooled_marginal`` of (q, q2).
        """
        pool = pooled_marginal(q, q2)
        return pool, pool

    #: NT-Xent's normaliser runs over the batch's pooled latents; a queue has no place in it
    #: (the queue's form is ImplicitPrior's, MoCo).
    accepts_queue = False

    def log_ratio(
        self, z: torch.Tensor, z2: torch.Tensor, q=None, q2=None,
        candidates: Candidates | torch.Tensor | None = None, block_size: int | None = None,
    ) -> torch.Tensor:
        r"""Per-pair ELBO terms after the analytic cancellation of the marginals (shape (N,)):

        .. math::

            \tfrac12 \big(r_i^{1 \to 2} + r_i^{2 \to 1}\big), \qquad
            r_i^{1 \to 2} = f(z_i, z'_i) - \log \frac{1}{2N-1} \sum_{m \ne i} e^{f(z_i, u_m)},

        or the one direction asked for (``pooled_log_ratios``).

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (N, D), paired with z.
        :param candidates: None (the batch's own pairs) or a
            :class:`~rpm.marginals._candidates.Candidates` with a global batch: both views'
            latents are then gathered from every process, the candidates are the 2M - 1 other
            latents of the global batch of M pairs, and the return value is this process's share
            (summed over the processes, the single-process value of the concatenated batch). A
            queue or a tensor of candidates is refused (ValueError).
        :param block_size: block edge of the streamed normaliser; ``None`` decides by size.
        """
        pool, offset = _global_pool(candidates, z, z2)
        forward, backward = pooled_log_ratios(self.energy, z, z2, self.direction, block_size,
                                              pool=pool, offset=offset)
        asked = [r for r in (forward, backward) if r is not None]  # one direction or both
        ratio = asked[0] if len(asked) == 1 else 0.5 * (asked[0] + asked[1])
        latents = [z, z2] if pool is None else list(pool)
        check_implicit_log_ratio(type(self).__name__, self.energy, latents, ratio)
        return ratio
