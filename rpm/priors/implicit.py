r"""The uniform-implicit prior of Aitchison & Ganev (Eq. 21-22): the prior under which the RPM
ELBO is InfoNCE.

.. math::

    P(z) = Q(z), \qquad P(z'|z) = \frac{Q(z')\, e^{f(z, z')}}{Z(z)}, \qquad
    Z(z) = \mathbb{E}_{Q(z')} e^{f(z, z')},

with Q the minibatch-mixture recognition marginal. P(z) is the
:class:`~rpm.marginals.MixtureMarginal` of the first view's recognition distributions, a
normalised distribution. :math:`P(z'|z)` is :class:`ImplicitConditional`, the energy-tilted mixture of
the second view's, with Z(z_i) estimated, as InfoNCE does, over the batch's own second-view
latents (positive included): :math:`\hat Z(z_i) = \frac1N \sum_j e^{f(z_i, z'_j)}`. That makes it
the InfoNCE surrogate, not a normalised distribution of the batch for finite N: exact at the
guide's values (the only values an ELBO scores), but its probabilities over its support do not
sum to one (1.478 in the N = 2 example of ``docs/theory.md#what-the-implicit-conditional-is``).
Its sampler draws a normalised distribution: with Delta encoders, for each i independently, the
categorical softmax over the batch points (Eq. 34), the InfoNCE classifier, whose ELBO is the
one computed here; with stochastic encoders, self-normalised importance sampling of the tilted
mixture. What each ELBO bounds: ``docs/theory.md#what-each-elbo-bounds`` (with Delta encoders a
tight ELBO of the batch's empirical distribution; with stochastic encoders an estimate biased
upwards; in expectation over batches, always the InfoNCE lower bound on :math:`I_Q(z; z')`,
and at most :math:`\log N`).

In the ELBO (Eq. 15) :math:`\log Q(z)` and :math:`\log Q(z')` cancel and each pair contributes

.. math::

    f(z_i, z'_i) - \log \frac1N \sum_j e^{f(z_i, z'_j)}
    = -\text{CrossEntropy}(F_{i\cdot}, i) + \log N  \qquad\text{(Eq. 23-25)}.
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro.distributions import Categorical, TorchDistribution
from pyro.nn import PyroModule
from torch.distributions import constraints

from rpm.marginals import MixtureMarginal
from rpm.marginals.candidates import Candidates
from rpm.marginals.mixture_marginal import Atoms
from rpm.ops.dispatch import use_streaming
from rpm.ops.logsumexp import diagonal_log_softmax, safe_logsumexp, streaming_matmul_logsumexp
from rpm.priors.base import Energy, Prior
from rpm.priors.energy_paths import blocked_energy_logsumexp, energy_logit_factors, energy_paired
from rpm.priors.energy_range import check_implicit_log_ratio

__all__ = [
    "ImplicitConditional",
    "ImplicitPrior",
    "TiltedConditional",
    "energy_log_normalizer",
    "energy_logit_factors",
    "energy_paired",
    "implicit_log_ratio",
]

def implicit_log_ratio(energy_matrix: torch.Tensor) -> torch.Tensor:
    r"""Per-pair :math:`\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)` under the implicit prior.

    .. math::

        F_{ii} - \operatorname{logsumexp}_j F_{ij} + \log N

    :param torch.Tensor energy_matrix: :math:`F_{ij} = f(z_i, z'_j)`, shape (N, N).
    :return: shape (N,).
    """
    # one fused kernel pair (rpm.ops.diagonal_log_softmax): the same values as
    # diagonal - safe_logsumexp + log N, without autograd's dozen nodes per step
    return diagonal_log_softmax(energy_matrix, math.log(energy_matrix.shape[-1]))


def energy_log_normalizer(
    energy: Energy, z: torch.Tensor, z2: torch.Tensor, block_size: int | None = None
) -> torch.Tensor:
    r"""The InfoNCE log-normaliser :math:`\log \sum_j e^{f(z_i, z'_j)}` of each row.

    .. math::

        \log \hat Z(z_i) + \log M = \log \sum_{j=1}^M e^{f(z_i, z'_j)}

    (Eq. 23-25 of Aitchison & Ganev, without the :math:`-\log M`). Dense, the log-sum-exp of
    ``energy(z, z2)`` over its rows (:func:`~rpm.ops.safe_logsumexp`), unless ``block_size`` is
    given or the (N, M) matrix is large (:func:`~rpm.ops.dispatch.use_streaming`); then
    streamed in blocks: through the energy's matrix-product factors
    (:func:`energy_logit_factors`, O((N + M) D) memory) when they describe its ``forward``
    (:mod:`rpm.priors.energy_paths`), else from ``forward`` on tiles
    (:func:`~rpm.priors.energy_paths.blocked_energy_logsumexp`). Every path computes what the
    energy's ``forward`` computes.

    :param energy: the energy f.
    :param torch.Tensor z: first-view latents, shape (N, D).
    :param torch.Tensor z2: the candidates :math:`z'_j` (the batch's second-view latents, or a
        gathered global batch), shape (M, D).
    :param block_size: stream in blocks of this many rows and columns; ``None`` decides by size.
    :return: shape (N,).
    :rtype: torch.Tensor
    """
    if not use_streaming(z.shape[0], z2.shape[0], z.device, block_size):
        return safe_logsumexp(energy(z, z2), dim=-1)
    factors = energy_logit_factors(energy, z, z2)
    if factors is None:
        return blocked_energy_logsumexp(energy, z, z2, block_size)[0]
    return _streamed_log_normalizer(factors, block_size)


def _streamed_log_normalizer(factors: tuple, block_size: int | None) -> torch.Tensor:
    """:func:`energy_log_normalizer` from the factors ``(left, right, row_offset)``."""
    left, right, row_offset = factors
    lse = streaming_matmul_logsumexp(left, right, block_size)
    return lse if row_offset is None else lse + row_offset


def _over_leading_dims(fn, *values: torch.Tensor) -> torch.Tensor:
    """``fn`` applied to each (N, D) batch of the broadcast leading dimensions of ``values``
    (e.g. a plate of particles); results stacked, shape leading + fn's result shape."""
    lead = torch.broadcast_shapes(*(value.shape[:-2] for value in values))
    flat = [value.expand(lead + value.shape[-2:]).reshape((-1,) + value.shape[-2:])
            for value in values]
    results = torch.stack([fn(*batch) for batch in zip(*flat, strict=True)])
    return results.reshape(lead + results.shape[1:])


class TiltedConditional(TorchDistribution):
    r"""Base of the implicit priors' conditionals: partners :math:`v_{1:N}` given anchors
    :math:`a_{1:N}`, each partner drawn from a recognition mixture M tilted by the energy, one
    event over the whole batch.

    .. math::

        \log P(v_{1:N} | a_{1:N}) = \sum_i \big[\log M(v_i) + r_i\big], \qquad
        r_i = f(a_i, v_i) - \log \hat Z(a_i),

    where the normaliser :math:`\hat Z(a_i)` is estimated over latents of the batch (Eq. 21-22
    and 23-25 of Aitchison & Ganev), so every row's density depends on every other row: the
    distribution is one event of shape (N, D), batch_shape the leading dimensions of the
    anchors (e.g. a plate of particles), and ``expand`` gives any other. A subclass says which
    latents the normaliser runs over (:meth:`tilt`) and which candidates the sampler picks from
    (:meth:`candidates`).

    ``log_prob`` is a contrastive surrogate (InfoNCE, NT-Xent), not the log-density of a
    normalised distribution for finite N: :math:`\hat Z` is estimated over the evaluated
    partners (or the batch's latents), not integrated over the support, so it is exact at the
    guide's values, which are all an ELBO scores, and its total mass over the support differs
    from 1 elsewhere (``docs/theory.md#what-the-implicit-conditional-is``). ``sample`` draws a
    different, normalised distribution: the candidates :math:`c_{1:C}` and, for each i
    independently, :math:`c_j` with probability :math:`\operatorname{softmax}_j f(a_i, c_j)`
    (self-normalised importance sampling of the tilted mixture, exact as N grows).

    Support: the atoms of M for Delta recognition (discrete,
    :class:`~rpm.marginals.mixture_marginal.Atoms`, off which the log-density is
    :math:`-\infty`), else N rows each in the support of M (:math:`\mathbb{R}^{N \times D}`
    for Gaussian recognition).

    :param torch.Tensor anchor: the anchors :math:`a_{1:N}`, shape (..., N, D).
    :param ~rpm.marginals.MixtureMarginal marginal: M, a mixture of recognition distributions.
    :param energy: the energy f, called with the anchors as first argument.
    :param int num_pairs: N.
    """

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, anchor: torch.Tensor, marginal: MixtureMarginal, energy: Energy,
                 num_pairs: int, validate_args=None):
        event_shape = torch.Size([num_pairs, marginal.event_shape[0]])            # (N, D)
        if not isinstance(anchor, torch.Tensor) or anchor.dim() < 2 or anchor.shape[-2:] != event_shape:
            shape = tuple(anchor.shape) if isinstance(anchor, torch.Tensor) else type(anchor).__name__
            raise ValueError(
                f"{type(self).__name__} of a batch of {num_pairs} pairs takes anchors (the "
                f"conditioning view's latents) of shape (..., {num_pairs}, {event_shape[1]}), "
                f"got {shape}"
            )
        self.anchor = anchor
        self.marginal = marginal
        self.energy = energy
        super().__init__(anchor.shape[:-2], event_shape, validate_args=validate_args)

    @property
    def support(self) -> constraints.Constraint:
        """The atoms of M (event_dim 2, discrete) for Delta recognition, else N rows each in
        the support of M (real (N, D) matrices for Gaussian recognition)."""
        if self.marginal.family == "delta":
            return Atoms(self.marginal.loc, event_dim=2)
        return constraints.independent(self.marginal.support, 1)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = self._get_checked_instance(type(self), _instance)
        new.__dict__.update(self.__dict__)            # the subclass's arguments, shared
        new.anchor = self.anchor.expand(batch_shape + self.event_shape)
        TorchDistribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def tilt(self, anchor: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        r"""The per-pair tilts :math:`r_i = f(a_i, v_i) - \log \hat Z(a_i)` of one batch.

        :param torch.Tensor anchor: shape (N, D).
        :param torch.Tensor value: the partners, shape (N, D).
        :return: shape (N,).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement tilt(anchor, value)")

    def candidates(self) -> torch.Tensor:
        """The candidates of one batch's draw, shape (C, D), drawn from M."""
        raise NotImplementedError(f"{type(self).__name__} must implement candidates()")

    def log_tilt(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\sum_i r_i`, the log-density without the mixture terms :math:`\log M(v_i)`,
        shape: the broadcast leading dimensions of the anchors and ``value`` (..., N, D)."""
        return _over_leading_dims(lambda a, v: self.tilt(a, v).sum(), self.anchor, value)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            if value.dim() < 2 or value.shape[-2:] != self.event_shape:
                raise ValueError(
                    f"{type(self).__name__} is evaluated at a whole batch of partners, shape "
                    f"(..., {self.event_shape[0]}, {self.event_shape[1]}); got "
                    f"{tuple(value.shape)}"
                )
            self._validate_sample(value)
        return _over_leading_dims(
            lambda a, v: (self.marginal.log_prob(v) + self.tilt(a, v)).sum(), self.anchor, value)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)     # sample_shape + batch_shape + (N, D)
        anchors = self.anchor.expand(shape).reshape((-1,) + self.event_shape)
        with torch.no_grad():
            draws = []
            for anchor in anchors:
                candidates = self.candidates()                                # (C, D)
                index = Categorical(logits=self.energy(anchor, candidates)).sample()  # (N,)
                draws.append(candidates[index])
            return torch.stack(draws).reshape(shape)


class ImplicitConditional(TiltedConditional):
    r"""The conditional :math:`P(z'_{1:N}|z_{1:N}) \propto \prod_i Q(z'_i) e^{f(z_i, z'_i)} /
    \hat Z(z_i)` of the implicit prior, one event over the whole batch
    (:class:`TiltedConditional`).

    The normaliser of pair i is estimated, as InfoNCE does, over the batch's own second-view
    latents, :math:`\hat Z(z_i) = \frac1N \sum_j e^{f(z_i, z'_j)}`
    (``docs/theory.md#pyro-model-and-guide``), so every row's density depends on every other
    row: the distribution is one event of shape (N, D) (batch_shape () for one batch, or the
    leading dimensions of ``z``, e.g. a plate of particles). Its log-density at a batch
    :math:`z'_{1:N}` is

    .. math::

        \sum_i \Big[\log Q(z'_i) + f(z_i, z'_i) - \log \frac1N \sum_j e^{f(z_i, z'_j)}\Big].

    This is the InfoNCE surrogate of the tilted mixture :math:`Q(z') e^{f(z_i, z')} / Z(z_i)`,
    not a normalised distribution of the batch for finite N: the normaliser runs over the
    evaluated partners :math:`z'_j`, so at the guide's value (the batch's own z2, all an ELBO
    scores) it gives the InfoNCE terms, but its probabilities over the support do not sum to
    one. With Delta recognition, N = 2, anchors (-4.2, 4.8), atoms (0, 1) and the RBF energy
    with l = 1, they sum to 1.478, and any assignment whose partners are all one atom gets
    :math:`1/N^N` (1/4) whatever the energy (``docs/theory.md#what-the-implicit-conditional-is``).

    ``sample`` draws one candidate :math:`c_j` from each of the N recognition distributions of
    the second view, :math:`Q(z'|x'_j)`, and, for each i independently, picks candidate j with
    probability :math:`\operatorname{softmax}_j f(z_i, c_j)`. With Delta recognition that is
    the normalised categorical of Eq. 34, whose probability equals ``exp(log_prob)`` exactly at
    the permutations of the atoms (the guide's value among them) and nowhere else (in the
    example it draws (0, 0) with probability 0.013 where ``log_prob`` says 0.25); with
    stochastic recognition it is self-normalised importance sampling of the tilted mixture.

    Support: the atoms of the second view's Delta recognition (discrete) or N rows each in
    the support of the recognition distributions (:math:`\mathbb{R}^{N \times D}` for Gaussian
    recognition); off the atoms the log-density is :math:`-\infty`.

    With ``queued`` latents :math:`c_{1:K}` (a :class:`~rpm.marginals.candidates.LatentQueue`,
    MoCo) the normaliser runs over the batch's N latents and the K queued ones,
    :math:`\hat Z(z_i) = \frac{1}{N + K} (\sum_j e^{f(z_i, z'_j)} + \sum_k e^{f(z_i, c_k)})`.

    :param torch.Tensor z: first-view latents, shape (..., N, D).
    :param q2: second-view recognition distributions, batch_shape (N,), event_shape (D,).
    :param Energy energy: the energy f.
    :param queued: extra candidates of the normaliser, shape (K, D), detached; or None.
    """

    def __init__(self, z: torch.Tensor, q2: TorchDistribution, energy: Energy,
                 queued: torch.Tensor | None = None, validate_args=None):
        self.q2 = q2
        self.queued = queued
        marginal = MixtureMarginal(q2)
        super().__init__(z, marginal, energy, marginal.batch_shape[0], validate_args=validate_args)

    @property
    def z(self) -> torch.Tensor:
        """The first-view latents, the anchors (..., N, D)."""
        return self.anchor

    def tilt(self, anchor: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        r""":math:`f(z_i, z'_i) - \log \frac1N \sum_j e^{f(z_i, z'_j)}` (:func:`implicit_log_ratio`),
        the queued latents joining the normaliser's candidates."""
        if self.queued is None:
            return implicit_log_ratio(self.energy(anchor, value))
        logits = torch.cat([self.energy(anchor, value), self.energy(anchor, self.queued)], -1)
        return diagonal_log_softmax(logits, math.log(logits.shape[-1]))

    def candidates(self) -> torch.Tensor:
        """One draw from each second-view recognition distribution, shape (N, D)."""
        return self.q2.sample()


class ImplicitPrior(Prior):
    r"""The uniform-implicit prior with energy f (Eq. 21-22 of Aitchison & Ganev).

    .. math::

        P(z) = Q(z), \qquad P(z'|z) = Q(z') e^{f(z,z')} / Z(z).

    Called as ``prior(q, q2)``, it declares the sample sites ``"z"`` (the N draws of the
    :class:`~rpm.marginals.MixtureMarginal` as one event) and ``"z2"`` (an
    :class:`ImplicitConditional`), each of shape (N, D), and returns their values. Its
    conditional couples the pairs of the batch, so it is :attr:`joint_over_batch`: the
    :class:`~rpm.RPM` calls it outside its plate over the pairs and its guide declares the same
    two sites as whole-batch events. Its ELBO is InfoNCE with critic f: per pair,
    ELBO = -CrossEntropy + log N (Eq. 23-25): the one-directional, cross-view form that
    info-nce-pytorch computes (SimCLR's NT-Xent is :class:`~rpm.priors.PooledImplicitPrior`).
    Its site ``"z2"`` is the InfoNCE surrogate (:class:`ImplicitConditional`): exact where the
    ELBO scores it, not a normalised distribution elsewhere. The ELBO is a tight ELBO of the
    batch's empirical distribution with Delta encoders, an upward-biased estimate with
    stochastic ones, and in expectation over batches the InfoNCE lower bound on the mutual
    information :math:`I_Q(z; z')` (``docs/theory.md#what-each-elbo-bounds``).

    :param Energy energy: f(z, z'), e.g. :class:`~rpm.priors.CosineEnergy`.
    """

    #: :math:`P(z'|z)` is a density relative to Q(z'), so deterministic (Delta) encoders are fine.
    accepts_delta_recognition = True

    #: The conditional is normalised over the batch's own z2: the sites are whole-batch events.
    joint_over_batch = True

    #: The normaliser may take a queue's latents as extra candidates (MoCo).
    accepts_queue = True

    @property
    def dim(self) -> int | None:
        """The energy's latent dimension (None for an energy built for any)."""
        return self.energy.dim if isinstance(self.energy, Energy) else None

    def __init__(self, energy: Energy):
        super().__init__()
        if not isinstance(energy, torch.nn.Module) or not callable(energy):
            raise TypeError(
                f"{type(self).__name__} needs an energy module mapping (z (N, D), z2 (M, D)) to "
                f"an (N, M) matrix, e.g. rpm.priors.RBFEnergy(); got {type(energy).__name__}"
            )
        self.energy = energy

    def forward(self, q: TorchDistribution, q2: TorchDistribution,
                candidates: Candidates | None = None):
        """Declares ``z ~ Q(z)`` and ``z2 ~ P(z'|z)``, each one event over the batch (shape
        (N, D), outside the plate over the pairs, :attr:`joint_over_batch`); returns
        ``(z, z2)``. The queue of ``candidates``, if any, joins the normaliser."""
        queued = None if candidates is None else candidates.queued()
        z = pyro.sample("z", MixtureMarginal(q).to_event(1))
        z2 = pyro.sample("z2", ImplicitConditional(z, q2, self.energy, queued=queued))
        return z, z2

    def log_ratio(
        self, z: torch.Tensor, z2: torch.Tensor, q=None, q2=None,
        candidates: Candidates | torch.Tensor | None = None, block_size: int | None = None,
        negatives: torch.Tensor | None = None,
    ) -> torch.Tensor:
        r"""Per-pair :math:`\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)`, the terms of Eq. 15
        that remain after the analytic cancellation (shape (N,)):

        .. math::

            f(z_i, z'_i) - \log \sum_{j=1}^{M} e^{f(z_i, z'_j)} + \log M,

        with the candidates :math:`z'_{1:M}` the batch's own z2 or, for a global batch across
        processes, ``negatives`` (every rank's z2, gathered with
        :func:`rpm.distributed.all_gather_with_grad`). The normaliser is streamed for large
        batches (:func:`energy_log_normalizer`). Under Pyro's validation a result or gradients
        that would not be finite in the latents' dtype raise a ValueError naming the valid
        range of latent norms (:func:`~rpm.priors.energy_range.check_implicit_log_ratio`).

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (N, D), paired with z.
        :param candidates: a :class:`~rpm.marginals.candidates.Candidates` (every process's z2,
            then a queue's latents: :meth:`~rpm.marginals.candidates.Candidates.negatives`), or
            the candidate latents themselves, shape (M, D); default the batch's z2.
        :param block_size: block edge of the streamed normaliser; ``None`` decides by size.
        :param negatives: the candidate latents, shape (M, D) (the same as a tensor given as
            ``candidates``).
        """
        if isinstance(negatives, Candidates):  # an override passing the candidates on by the old name
            candidates, negatives = negatives, None
        if isinstance(candidates, Candidates):
            negatives = None if candidates.is_local else candidates.negatives(z2)
        elif candidates is not None:
            negatives = candidates
        candidates = z2 if negatives is None else negatives
        energy = self._modules.get("energy")  # a PyroModule's __getattr__ would only return it
        if not isinstance(energy, PyroModule):
            energy = self.energy  # a plain module: registered with Pyro by the access
        ratio = self._log_ratio(z, z2, candidates, negatives is None, block_size, energy)
        check_implicit_log_ratio(type(self).__name__, energy, [z, z2, candidates], ratio)
        return ratio

    def _log_ratio(self, z: torch.Tensor, z2: torch.Tensor, candidates: torch.Tensor,
                   own: bool, block_size: int | None, energy: Energy | None = None
                   ) -> torch.Tensor:
        """:meth:`log_ratio` with the candidates given (``own``: they are z2)."""
        if energy is None:
            energy = self.energy
        if not use_streaming(z.shape[0], candidates.shape[0], z.device, block_size):
            if own:
                # Dense: one N x N matrix gives both the positives and the normaliser.
                return implicit_log_ratio(energy(z, z2))
            positive = energy_paired(energy, z, z2)
            normalizer = safe_logsumexp(energy(z, candidates), dim=-1)
        else:
            factors = energy_logit_factors(energy, z, candidates)
            if factors is not None:
                positive = energy_paired(energy, z, z2, block_size)
                normalizer = _streamed_log_normalizer(factors, block_size)
            else:
                # forward on tiles; the positives come from the same tiles for the batch's own z2
                normalizer, positive = blocked_energy_logsumexp(
                    energy, z, candidates, block_size, positive_shift=0 if own else None)
                if positive is None:
                    positive = energy_paired(energy, z, z2, block_size)
        return positive - normalizer + math.log(candidates.shape[0])
