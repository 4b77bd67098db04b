r"""The extension points of the package: the two prior protocols, :class:`Prior` (a prior over
the latents of a pair of views) and :class:`SequencePrior` (a prior over the latents of J
views), with their common base :class:`PriorBase`, and :class:`Energy`, the coupling function
of the uniform-implicit prior.

Each hook is a method or attribute with a documented default; :class:`~rpm.RPM` and
:class:`~rpm.RPMELBO` call the hooks and never probe for them, so a subclass states what it can
do by overriding them.

**Prior** :math:`P(z, z')` (Eq. 9 of Aitchison & Ganev). The ELBO of the RPM (Eq. 15) is

.. math::

    \mathcal{L} = \sum_i \mathbb{E}\big[\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)\big]
    + \text{const},

with Q the minibatch-mixture recognition marginal. A prior must declare the sample sites
``"z"`` and ``"z2"`` (:meth:`Prior.forward`); the ELBO then traces it and subtracts the mixture
marginals. A prior whose log-density cancels against the marginals analytically (the implicit
prior, Eq. 23-25) also returns the per-pair remainder from :meth:`Prior.log_ratio`, which the
ELBO then uses instead of tracing. The marginals that the likelihood :math:`P(x|z) = Q(z|x)
P_\text{true}(x) / Q(z)` (Eq. 10) divides by are the prior's to choose
(:meth:`Prior.likelihood_marginals`): by default each view's own mixture.

**SequencePrior** :math:`P(z_1, \dots, z_J)` over J >= 2 views (``docs/theory.md``,
sequences): the terms of the ELBO are :math:`\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})`. It
declares one site ``"z"`` with event_shape (J, D) (:meth:`SequencePrior.forward`) and may return
the analytic remainder from :meth:`SequencePrior.sequence_log_ratio`. The two protocols share
no method: a prior follows one (``is_sequence_prior``).

**Energy** :math:`f(z, z')` of the implicit prior :math:`P(z'|z) = Q(z') e^{f(z, z')} / Z(z)`
(Eq. 21-22). It returns the whole matrix :math:`F_{ij} = f(z_i, z'_j)`; its diagonal
:meth:`Energy.paired` and, when f is a matrix product plus a row offset, the factors of
:meth:`Energy.logit_factors` let the InfoNCE normaliser be evaluated without the matrix
(streamed in blocks of O((N + M) D) memory).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from pyro import poutine
from pyro.distributions import TorchDistribution, Unit
from pyro.infer.util import is_validation_enabled

from rpm.marginals import MixtureMarginal
from rpm.marginals._candidates import Candidates
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal
from rpm.nn import NamedModule

__all__ = [
    "Energy",
    "Prior",
    "PriorBase",
    "SequencePrior",
    "declare_prior",
    "delta_with_density_message",
    "is_sequence_prior",
    "positive_hyperparameter",
    "refuse_energy",
]


def positive_hyperparameter(name: str, value) -> torch.Tensor:
    """A positive hyperparameter (or the initial value of a positive parameter) given as a
    number, as a float64 scalar tensor.

    Held in float64 whatever the default dtype, a Python float keeps its full value (``1/0.07``
    stays 14.285714285714286 after ``module.double()``); the priors and energies cast it to the
    latents' dtype where they use it.

    :raises TypeError: if ``value`` is not a number.
    :raises ValueError: if it is not finite and > 0.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not 0.0 < number < float("inf"):
        raise ValueError(
            f"{name} must be a finite positive number, got {number}; pass a value > 0 (for a "
            "learned parameter, its initial value)"
        )
    return torch.tensor(number, dtype=torch.float64)


class PriorBase(NamedModule):
    r"""What the two prior protocols share: the attributes that tell :class:`~rpm.RPM` and the
    objective (``rpm._objective``) what a prior allows.

    A prior follows one of two protocols, each a subclass of this class:

    * :class:`Prior`, a prior :math:`P(z, z')` over the latents of a pair of views
      (``forward(q, q2) -> (z, z2)``, :meth:`Prior.log_ratio`);
    * :class:`SequencePrior`, a prior :math:`P(z_1, \dots, z_J)` over the latents of J >= 2
      views, ordered (the frames of a sequence) or not (augmentations)
      (``forward(q, marginal) -> z``, :meth:`SequencePrior.sequence_log_ratio`).

    Which protocol a prior follows is ``isinstance(prior, SequencePrior)``
    (``is_sequence_prior``); a plain callable ``prior(q, q2)`` is a pair prior with
    :class:`Prior`'s defaults. Subclass :class:`Prior` or :class:`SequencePrior`, not this
    class.

    ==================================  =======================================================
    attribute                           default
    ==================================  =======================================================
    :attr:`accepts_delta_recognition`   ``False``: the prior is a density on
                                        :math:`\mathbb{R}^{J D}`, so Delta encoders are refused
                                        (Appendix B)
    :attr:`dim`                         ``None``: any latent dimension
    :attr:`joint_over_batch`            ``False``: the sites are per instance, declared inside
                                        the model's plate over the N instances
    :attr:`accepts_queue`               ``False``: the normaliser takes no queued latents
    ==================================  =======================================================
    """

    #: True when the prior is defined relative to the recognition marginals (as the implicit
    #: prior's :math:`P(z) = Q(z)`, :math:`P(z'|z) \propto Q(z') e^{f}`), so that
    #: deterministic (Delta) encoders give a well-defined ELBO. False for densities on
    #: :math:`\mathbb{R}^{J D}`, which need Q(z) to have a density too (Appendix B of
    #: Aitchison & Ganev): :class:`~rpm.RPM` then refuses ``DeltaRecognition`` without noise
    #: under the minibatch-mixture marginal (its moment-matched Gaussian,
    #: ``marginal="gaussian"``, is a density and accepts it).
    accepts_delta_recognition: bool = False

    #: The latent dimension D the prior was built for, or None for any; :class:`~rpm.RPM`
    #: checks the encoders' output against it.
    dim: int | None = None

    #: False (the default): the instances are independent under the prior, and ``forward`` is
    #: called inside the model's ``pyro.plate`` over the N instances, declaring per-instance
    #: sites (batch (N,)). True when the prior couples the instances of a batch (the implicit
    #: priors' normaliser runs over the batch's own latents): ``forward`` is then called outside
    #: the plate and declares each site as one event over the whole batch ((N, D) for a site of
    #: a pair prior, (N, J, D) for the site of a prior over J views), and the
    #: :class:`~rpm.RPM`'s guide declares its sites the same way, so that model and guide agree
    #: on every site's shape and Pyro's batch semantics hold.
    joint_over_batch: bool = False

    #: True when the normaliser of the prior's analytic log-ratio and of its ``forward`` takes
    #: the latents of a :class:`~rpm.marginals._candidates.LatentQueue` as extra candidates (the
    #: implicit prior: MoCo); :class:`~rpm.RPM` refuses a queue for a prior that does not.
    accepts_queue: bool = False


class Prior(PriorBase):
    r"""Base class of priors :math:`P(z, z')` over the latents of a pair of views (Eq. 9 of
    Aitchison & Ganev).

    The ELBO of the RPM of N pairs with the recognition models as the guide (Eq. 15) is

    .. math::

        \mathcal{L} = \sum_{i=1}^N \mathbb{E}_{Q(z_i|x_i) Q(z'_i|x'_i)}\big[\log P(z_i, z'_i)
        - \log Q_1(z_i) - \log Q_2(z'_i)\big] + \text{const},

    with :math:`Q_1, Q_2` the views' recognition marginals (the minibatch mixtures of Eq. 11,
    or those of :meth:`likelihood_marginals`).

    **Protocol.** ``forward(q, q2)`` declares the sample sites ``"z"`` and ``"z2"`` and returns
    their values ``(z, z2)``, q and q2 being the two views' recognition distributions
    (batch_shape (N,), event_shape (D,)). Implement :meth:`forward`; override the other hooks
    when their defaults do not fit:

    ==================================  =======================================================
    hook                                default
    ==================================  =======================================================
    :meth:`forward` (required)          declares ``"z"`` and ``"z2"``, returns ``(z, z2)``
    :meth:`log_ratio`                   ``None``: no analytic cancellation, the ELBO traces
                                        :meth:`forward` and subtracts the mixture marginals
                                        (``rpm._objective.prior_log_ratio``)
    :meth:`log_ratio_sum`               the sum of :meth:`log_ratio` (None when it is None)
    :meth:`likelihood_marginals`        each view's own minibatch mixture
    attributes of :class:`PriorBase`    ``accepts_delta_recognition``, ``dim``,
                                        ``joint_over_batch``, ``accepts_queue``
    ==================================  =======================================================

    A plain callable ``prior(q, q2)`` (not a :class:`PriorBase`) is accepted by
    :class:`~rpm.RPM` as a pair prior with all the defaults. A prior over J views is a
    :class:`SequencePrior` (the other protocol; a class cannot follow both).
    """

    def forward(self, q: TorchDistribution, q2: TorchDistribution):
        r"""Declares the sample sites ``"z"`` and ``"z2"``, each (N, D), inside the model's plate
        over the N pairs (or as whole-batch events, :attr:`~PriorBase.joint_over_batch`), and
        returns their values ``(z, z2)``.

        Each site is a normalised distribution whose ``sample`` draws from the density its
        ``log_prob`` defines, so that Pyro's tools (``Importance``, ``Predictive``,
        ``trace.log_prob_sum()``) read the model correctly; a term of the log-density that is
        not normalised (the implicit priors' tilt :math:`f(z, z') - \log \hat Z(z)`, with its
        normaliser estimated on the batch) enters as a ``pyro.factor`` of another name
        (``docs/theory.md#normalised-sample-sites``).

        :param q: the first view's recognition distributions, batch_shape (N,), event_shape
            (D,) (the implicit prior's marginal is built from them; explicit priors ignore them).
        :param q2: the second view's, likewise.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement forward(q, q2), declaring the sample sites "
            "'z' and 'z2' and returning (z, z2)"
        )

    def log_ratio(
        self, z: torch.Tensor, z2: torch.Tensor, q: TorchDistribution, q2: TorchDistribution,
        candidates: Candidates | None = None, block_size: int | None = None,
    ) -> torch.Tensor | None:
        r"""The per-pair ELBO term after analytic cancellation, or None (the default).

        .. math::

            \log P(z_i, z'_i) - \log Q_1(z_i) - \log Q_2(z'_i)

        (Eq. 15 of Aitchison & Ganev, the terms inside the expectation), for a prior whose
        log-density cancels the recognition marginals in closed form: the implicit prior
        returns :math:`f(z_i, z'_i) - \log \frac1M \sum_j e^{f(z_i, z'_j)}` (Eq. 23-25)
        without evaluating any mixture. Returning None makes the ELBO trace :meth:`forward`
        with its sites conditioned on the samples and subtract the minibatch-mixture marginals
        (``rpm._objective.prior_log_ratio``); both routes must agree with
        ``Trace_ELBO``.

        :param torch.Tensor z: first-view latents, shape (N, D).
        :param torch.Tensor z2: second-view latents, shape (N, D), paired with z.
        :param q: first-view recognition distributions, batch_shape (N,).
        :param q2: second-view recognition distributions, batch_shape (N,).
        :param candidates: where the normaliser's candidates come from
            (:class:`~rpm.marginals._candidates.Candidates`: the batch, every process's batch,
            a queue); None means the batch's own z2.
        :param block_size: stream the O(N M) parts in blocks of this many rows; None decides by
            size.
        :return: shape (N,), or None.
        """
        return None

    def log_ratio_sum(
        self, z: torch.Tensor, z2: torch.Tensor, q: TorchDistribution, q2: TorchDistribution,
        candidates: Candidates | None = None, block_size: int | None = None,
    ) -> torch.Tensor | None:
        r"""The sum over the N pairs of :meth:`log_ratio`, or None when it is None.

        .. math::

            \sum_{i=1}^N \big[\log P(z_i, z'_i) - \log Q_1(z_i) - \log Q_2(z'_i)\big]

        (Eq. 15 of Aitchison & Ganev): what the ELBO of a batch reads
        (``rpm._objective.prior_log_ratio``; :meth:`log_ratio` itself serves the
        per-instance terms). The default sums :meth:`log_ratio`; a prior overrides it only to
        compute the same sum without the N terms, and a subclass that redefines
        :meth:`log_ratio` must get the sum of its own terms.

        :param z: as for :meth:`log_ratio`; likewise ``z2``, ``q``, ``q2``, ``candidates`` and
            ``block_size``.
        :return: a scalar tensor, or None.
        """
        ratio = self.log_ratio(z, z2, q, q2, candidates, block_size)
        return None if ratio is None else ratio.sum()

    def likelihood_marginals(
        self, q: TorchDistribution, q2: TorchDistribution
    ) -> tuple[MixtureMarginal, MixtureMarginal]:
        r"""The recognition marginals :math:`(Q_1, Q_2)` that the likelihood factors divide by.

        .. math::

            P(x_i|z_i) = \frac{Q(z_i|x_i)\, P_\text{true}(x_i)}{Q_1(z_i)}, \qquad
            P(x'_i|z'_i) = \frac{Q(z'_i|x'_i)\, P_\text{true}(x'_i)}{Q_2(z'_i)}

        (Eq. 10 of Aitchison & Ganev): the :class:`~rpm.RPM`'s factors ``"x"`` and ``"x2"`` are
        :math:`\log Q(z_i|x_i) - \log Q_1(z_i)` and :math:`\log Q(z'_i|x'_i) - \log Q_2(z'_i)`,
        and the traced ELBO (when :meth:`log_ratio` returns None) subtracts
        :math:`\log Q_1(z_i) + \log Q_2(z'_i)`. The default is each view's own minibatch mixture,
        :math:`Q_1 = \frac1N \sum_n Q(z|x_n)` and :math:`Q_2 = \frac1N \sum_n Q(z'|x'_n)`
        (Eq. 11). A prior built on another estimate of the recognition marginal returns that one
        (the pooled prior of NT-Xent: the mixture over both views, for both).

        :param q: first-view recognition distributions, batch_shape (N,), event_shape (D,).
        :param q2: second-view recognition distributions, likewise.
        :return: two :class:`~rpm.marginals.MixtureMarginal` with batch_shape (N,) and
            event_shape (D,), whose log-densities at the N latents of a view are that view's
            :math:`\log Q_v(z_i)`.
        """
        return MixtureMarginal(q), MixtureMarginal(q2)


class SequencePrior(PriorBase):
    r"""Base class of priors :math:`P(z_1, \dots, z_J)` over the latents of J >= 2 views of an
    instance: a sequence of J views, ordered (the T frames of a video window) or not (J
    augmentations of an image) (``docs/theory.md``, sequences; J views and the encoders).

    The ELBO of the RPM of N instances (Eq. 12 and 15 of Aitchison & Ganev with J views) is

    .. math::

        \mathcal{L} = \sum_{i=1}^N \mathbb{E}_{Q(z_{i,1:J}|x_{i,1:J})}\Big[\log P(z_{i,1:J})
            + \sum_j \big(\log Q(z_{i,j}|x_{i,j}) - \log Q_j(z_{i,j})\big)
            - \log Q(z_{i,1:J}|x_{i,1:J})\Big] + \text{const},

    with :math:`Q_j` the recognition marginal of view j (the model's
    :class:`~rpm.marginals.SequenceMixtureMarginal`, per view or pooled over the views); with
    the recognition models as the guide the middle and last terms cancel and the terms are
    :math:`\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})`. With J = 2 this is
    :class:`Prior`'s pair ELBO.

    **Protocol.** ``forward(q, marginal)`` declares one sample site ``"z"`` with event_shape
    (J, D) and returns its value, (N, J, D); q holds the J views' recognition distributions,
    batch_shape (N, J), and ``marginal`` is the model's :math:`\prod_j Q_j`. Implement
    :meth:`forward`; override the other hooks when their defaults do not fit:

    ==================================  =======================================================
    hook                                default
    ==================================  =======================================================
    :meth:`forward` (required)          declares ``"z"`` (event (J, D)), returns its value
    :meth:`sequence_log_ratio`          ``None``: no analytic cancellation, the ELBO traces
                                        :meth:`forward` and subtracts the marginals
                                        (``rpm._objective.prior_log_ratio``)
    :meth:`posterior`                   ``None``: no structured guide of the prior's own
    :meth:`posterior_log_ratio`         ``None``: the structured guide's terms are computed from
                                        the prior's and the posterior's log-densities
    :attr:`accepts_mask`                ``False``: every view of an instance is observed
    attributes of :class:`PriorBase`    ``accepts_delta_recognition``, ``dim``,
                                        ``joint_over_batch``, ``accepts_queue``
    ==================================  =======================================================

    The analytic term is :meth:`sequence_log_ratio`, not :class:`Prior`'s ``log_ratio``: the
    two protocols share no method, and a class cannot follow both.
    """

    #: True when the prior marginalises missing views exactly: called with recognition
    #: distributions masked over the views (``q.mask(mask)``, mask (N, J), True = observed;
    #: ``rpm.marginals._sequence_marginal.sequence_mask``), its site's log-density is that of
    #: the observed views' latents (the state-space prior: the Kalman filter without the missing
    #: frames' updates). :class:`~rpm.RPM` refuses ``mask=`` for a prior that does not (an
    #: implicit prior's InfoNCE terms pair consecutive views and have no marginal over a missing
    #: one).
    accepts_mask: bool = False

    def forward(self, q: TorchDistribution, marginal: SequenceMixtureMarginal) -> torch.Tensor:
        r"""Declares the sample site ``"z"`` with event_shape (J, D) inside the model's plate
        over the N instances (or as one event (N, J, D) for a prior that is
        :attr:`~PriorBase.joint_over_batch`) and returns its value, (N, J, D).

        The site is a normalised distribution whose ``sample`` draws from the density its
        ``log_prob`` defines; a term that is not normalised (an implicit prior's tilt) enters as
        a ``pyro.factor`` of another name (``docs/theory.md#normalised-sample-sites``).

        :param q: the recognition distributions, batch_shape (N, J), event_shape (D,).
        :param marginal: the model's recognition marginals :math:`\prod_j Q_j`, batch_shape
            (N,), event_shape (J, D) (implicit priors are built from them).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement forward(q, marginal), declaring the sample "
            "site 'z' with event_shape (J, D) and returning its value")

    def sequence_log_ratio(self, z: torch.Tensor, q: TorchDistribution,
                           marginal: SequenceMixtureMarginal,
                           candidates: Candidates | None = None,
                           block_size: int | None = None) -> torch.Tensor | None:
        r"""The per-instance ELBO term after analytic cancellation, or None (the default).

        .. math::

            \log P(z_{i,1:J}) - \sum_{j=1}^J \log Q_j(z_{i,j})

        for a prior whose log-density cancels the marginals in closed form (the Markov implicit
        prior: the sum of the InfoNCE terms of consecutive views, Eq. 23-25 per step). None
        makes the ELBO trace :meth:`forward` with ``"z"`` conditioned on the samples and
        subtract ``marginal.log_prob(z)`` (``rpm._objective.prior_log_ratio``);
        both routes must agree with ``Trace_ELBO``.

        :param torch.Tensor z: latents, shape (N, J, D).
        :param q: recognition distributions, batch_shape (N, J), event_shape (D,).
        :param marginal: the model's marginals :math:`\prod_j Q_j`.
        :param candidates: the step's :class:`~rpm.marginals._candidates.Candidates` (the batch,
            every process's batch, a queue); None means the batch.
        :param block_size: block edge of the O(N^2) kernels; None decides by size.
        :return: shape (N,), or None.
        """
        return None

    def posterior(self, q: TorchDistribution) -> TorchDistribution | None:
        r"""A structured guide :math:`Q(z_{1:J}|x_{1:J})` built from the recognition
        distributions (q of batch_shape (N, J)), with batch_shape (N,) and event_shape (J, D);
        None (the default) when the prior has none."""
        return None

    def posterior_log_ratio(self, z: torch.Tensor, q: TorchDistribution,
                            posterior: TorchDistribution) -> torch.Tensor | None:
        r"""Under the structured guide (:meth:`posterior`), the per-instance terms of the ELBO
        that do not involve the marginals, after analytic cancellation, or None (the default).

        .. math::

            \log P(z_{1:J}) + \sum_j \log Q(z_j|x_j) - \log Q(z_{1:J}|x_{1:J})

        (Eq. 12 with the likelihood of Eq. 10, less the marginals). None makes the ELBO compute
        the three log-densities (the prior's traced); a prior whose posterior is the prior
        conditioned on the recognition factors knows the sum in closed form (the state-space
        prior: the Kalman likelihood of the recognition means, one filter instead of three).

        :param torch.Tensor z: the guide's sample, (N, J, D).
        :param q: the recognition distributions, batch_shape (N, J).
        :param posterior: the guide's distribution, ``self.posterior(q)``.
        :return: shape (N,), or None.
        """
        return None


def is_sequence_prior(prior) -> bool:
    """Which protocol ``prior`` follows: True for a prior over J views (a
    :class:`SequencePrior`), False for a pair prior (a :class:`Prior`, or a plain callable
    ``prior(q, q2)``).

    :raises TypeError: for a class that derives from both :class:`Prior` and
        :class:`SequencePrior`; for one that still sets rpm 0.1's ``joint_views`` flag (a prior
        over J views subclasses :class:`SequencePrior`); and for a :class:`SequencePrior` with
        a method ``log_ratio`` (0.1's name of :meth:`SequencePrior.sequence_log_ratio`, which
        the objective would otherwise never call).
    """
    if not isinstance(prior, PriorBase):
        return False
    cls = type(prior)
    name = cls.__name__
    sequence = isinstance(prior, SequencePrior)
    if sequence and isinstance(prior, Prior):
        raise TypeError(
            f"{name} derives from both rpm.priors.Prior (a prior over a pair) and "
            "rpm.priors.SequencePrior (a prior over J views); a prior follows one protocol: "
            "derive from one of them")
    if hasattr(cls, "joint_views"):
        if cls.joint_views and not sequence:
            raise TypeError(
                f"{name} sets joint_views = True (rpm 0.1's flag of a prior over J views), which "
                "rpm no longer reads: subclass rpm.priors.SequencePrior instead of "
                "rpm.priors.Prior and rename its log_ratio to sequence_log_ratio(z, q, "
                "marginal, candidates=None, block_size=None)")
        raise TypeError(
            f"{name} sets joint_views, which rpm no longer reads: remove it (a pair prior "
            "subclasses rpm.priors.Prior, a prior over J views rpm.priors.SequencePrior)")
    if sequence and hasattr(cls, "log_ratio"):
        raise TypeError(
            f"{name} is a prior over J views (rpm.priors.SequencePrior) with a method "
            "log_ratio, the pair prior's name; rename it sequence_log_ratio(z, q, marginal, "
            "candidates=None, block_size=None)")
    return sequence


class Energy(NamedModule):
    r"""Base class of energies :math:`f(z, z')` of the implicit prior (Eq. 21-22 of Aitchison &
    Ganev).

    Implement :meth:`forward`; override the other hooks when their defaults do not fit:

    ==========================  =============================================================
    hook                        default
    ==========================  =============================================================
    :meth:`forward` (required)  the matrix :math:`F_{ij} = f(z_i, z'_j)`, shape (N, M)
    :meth:`paired`              the diagonal of :meth:`forward` (builds the N x N matrix)
    :meth:`logit_factors`       ``None``: f is not written as a matrix product, the
                                normaliser is ``logsumexp`` of the full matrix
    :meth:`logit_bound`         ``None``: no bound on f is known (the valid range of latent
                                norms is not checked, a non-finite loss is still diagnosed)
    :attr:`dim`                 ``None``: any latent dimension
    ==========================  =============================================================

    :meth:`forward` is the definition of the energy: the hooks are shortcuts for what it
    computes, and the ELBO uses a hook only where it describes *this* class's :meth:`forward`
    (``rpm.priors._energy_paths``; the rule is decided once per class from its MRO):

    * a hook defined in the same class as :meth:`forward` is trusted;
    * a hook defined in a subclass of the class that defines :meth:`forward` (a subclass that
      overrides the factorisation only) is checked against :meth:`forward` on a few rows and
      columns of the first batch that uses it (once per class): a disagreement raises
      ValueError;
    * a hook inherited from above the class that defines :meth:`forward` is ignored: a
      subclass that overrides :meth:`forward` only (``class ScaledRBF(RBFEnergy)`` with a new
      ``forward``) gets the generic path, which evaluates :meth:`forward` on tiles of
      ``block_size`` rows and columns (O(N M / block) memory plus one tile, so large batches
      still work). To get the factorised fast path back, override :meth:`paired` and
      :meth:`logit_factors` in the same class as :meth:`forward`.

    :meth:`forward` must be pairwise: entry (i, j) depends on :math:`z_i` and :math:`z'_j`
    only (no statistics of the batch), since the streamed paths evaluate it on blocks.
    """

    #: The latent dimension D the energy was built for (its parameters' size), or None.
    dim: int | None = None

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        r""":math:`F_{ij} = f(z_i, z'_j)`.

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (M, D).
        :return: shape (N, M).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement forward(z, z2) returning the (N, M) matrix "
            "f(z_i, z2_j)"
        )

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        r""":math:`f(z_i, z'_i)` for aligned pairs (the positives of InfoNCE).

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (N, D).
        :return: shape (N,).
        """
        if z.shape != z2.shape:
            raise ValueError(
                f"paired energies need z and z2 of equal shapes, got {tuple(z.shape)} and "
                f"{tuple(z2.shape)}"
            )
        return torch.diagonal(self(z, z2))

    def logit_factors(
        self, z: torch.Tensor, z2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        r"""Factors of the energy matrix as a matrix product plus a row offset, or None.

        .. math::

            f(z_i, z'_j) = a_i^\top b_j + c_i,

        so that the InfoNCE normaliser :math:`\log \sum_j e^{f(z_i, z'_j)} = c_i +
        \log \sum_j e^{a_i^\top b_j}` is streamed in blocks
        (:func:`~rpm.ops.streaming_matmul_logsumexp`) without the (N, M) matrix. Return None
        when f has no such form or when the factors would be inaccurate for these inputs (the
        normaliser then uses :meth:`forward`).

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (M, D).
        :return: ``(a (N, K), b (M, K), c (N,) or None)``, or None.
        """
        return None

    def logit_bound(self, radius: torch.Tensor) -> torch.Tensor | None:
        r"""An upper bound on the size of the energy and of its gradients for latents of
        Euclidean norm R, or None (unknown, the default).

        .. math::

            B(R) \ge \max\big(|f(z, z')|,\ \lVert \nabla_z f \rVert,\
            \lVert \nabla_\theta f \rVert\big) \quad \text{for } \lVert z \rVert,
            \lVert z' \rVert \le R

        (the gradient in the unconstrained parameters :math:`\theta`), and for latents whose
        norms lie between two values, the larger of B at those values bounds them (true of a
        B monotone in R, or of one like :math:`\kappa \max(1, 1/R)`). The implicit priors
        check, under Pyro's validation, that the loss of N pairs and its gradients (at most
        :math:`16 N B` in size) fit the latents' dtype, and raise a ValueError that names the
        valid range of latent norms otherwise (``rpm.priors._energy_range``); with None only
        a non-finite loss is diagnosed.

        :param torch.Tensor radius: latent norms R, float64, any shape.
        :return: B(R), float64, the shape of ``radius``; or None.
        """
        return None

    def check_latents(self, z: torch.Tensor, z2: torch.Tensor) -> None:
        """Raises ValueError unless z is (N, D) and z2 is (M, D), with D equal to :attr:`dim`
        when it is set. For use at the top of :meth:`forward` and the other hooks."""
        if not isinstance(z, torch.Tensor) or not isinstance(z2, torch.Tensor):
            raise TypeError(
                f"an energy takes tensors z and z2, got {type(z).__name__} and "
                f"{type(z2).__name__}"
            )
        if z.dim() != 2 or z2.dim() != 2 or z.shape[1] != z2.shape[1]:
            raise ValueError(
                "an energy takes latents z of shape (N, D) and z2 of shape (M, D), got "
                f"{tuple(z.shape)} and {tuple(z2.shape)}"
            )
        if self.dim is not None and z.shape[1] != self.dim:
            raise ValueError(
                f"this energy was built for latents of dimension {self.dim} but the encoder "
                f"produced dimension {z.shape[1]}; build the energy with dim={z.shape[1]} or "
                "change the encoder's output size"
            )


# ----------------------------------------------------------------------------------------------
# Running a prior by its protocol: shared by the RPM's Pyro program and the objective
# (rpm._objective, which holds the likelihood and the ELBO's terms), so that the
# checks and the messages exist once.
# ----------------------------------------------------------------------------------------------

def hook(prior, name: str):
    """The prior's attribute ``name`` (one of :class:`PriorBase`'s, or of its protocol's), or
    :class:`Prior`'s default for a plain callable (a pair prior)."""
    return getattr(prior if isinstance(prior, PriorBase) else Prior, name)


def delta_with_density_message(what: str, prior) -> str:
    """The one error message for a deterministic encoder under an explicit density prior
    (Appendix B of Aitchison & Ganev), naming the three fixes."""
    return (
        f"{what} is deterministic (DeltaRecognition with noise_scale=0) but the prior "
        f"{type(prior).__name__} is an explicit continuous density: the recognition marginal "
        "Q(z) is then a discrete distribution on the batch points and log P(z) - log Q(z) is "
        "ill-defined (Appendix B of Aitchison & Ganev). Use DeltaRecognition(net, "
        "noise_scale=1e-2) (any eps > 0) or a GaussianRecognition, or an implicit prior "
        "(ImplicitPrior, MarkovImplicitPrior), or keep it and use the moment-matched Gaussian "
        "marginal, a density: marginal='gaussian'"
    )


def refuse_energy(prior, what: str = "prior", wrapper: str = "ImplicitPrior") -> None:
    """Refuses an :class:`Energy` passed where a prior is expected.

    An energy :math:`f(z, z')` is callable on two latents, so without this check it would be run
    as a prior and fail later with a misleading message (e.g. that a deterministic encoder needs
    noise). The error says to wrap it in ``wrapper`` (the implicit prior of Eq. 21-22).

    :param prior: what was passed as the prior.
    :param str what: its name in the message (``"prior"``, ``"pair_prior"``).
    :param str wrapper: the implicit prior that takes the energy.
    :raises TypeError: when ``prior`` is an :class:`Energy`.
    """
    if not isinstance(prior, Energy):
        return
    name = type(prior).__name__
    shown = repr(prior)
    if "\n" in shown or len(shown) > 40 or not shown.startswith(name + "("):
        shown = f"{name}(...)"
    raise TypeError(
        f"{what} is an energy ({name}, a score f(z, z') of two latents), not a prior: wrap it "
        f"in an implicit prior, {wrapper}({shown})"
    )


def declare_prior(prior, *args, sites: tuple[str, ...] = ("z", "z2")):
    r"""Runs ``prior(*args)`` (inside whatever plate is active) and checks that it declared
    ``sites`` and returned one value per site.

    A site whose distribution has the latent axis D as a batch dimension (a prior that forgot
    ``.to_event(1)``) makes Pyro's plate refuse the shapes; that is reported here, in one line
    naming the fix.

    The sites' latent size (the last axis of each site's event) must be the recognition's D
    (``args[0]``'s event_shape (D,)), and the returned values must be the sites' values in the
    order of ``sites`` (the model pairs them with the views' likelihood factors): a prior
    returning ``(z2, z)`` is refused. A site must be a distribution, not a ``pyro.factor``
    (the latents are drawn from distributions, the unnormalised couplings are factors of other
    names: :meth:`Prior.forward`, :meth:`SequencePrior.forward`).

    :return: the prior's return value: ``(z, z2)`` for a pair prior (sites ``("z", "z2")``),
        z for a prior over J views (site ``("z",)``).
    :raises ValueError: for a missing site, a wrong return value, a site of another latent size
        than the encoder's, or a site that does not fit the plate.
    """
    return _run_prior(prior, args, sites)[0]


def _run_prior(prior, args: tuple, sites: tuple[str, ...]):
    """:func:`declare_prior`, returning the prior's return value and its trace (whose sites
    hold the conditioned values under an enclosing ``poutine.condition``)."""
    name = type(prior).__name__
    try:
        with poutine.trace() as tracer:
            result = prior(*args)
    except ValueError as error:
        if "Shape mismatch inside plate" not in str(error):
            raise
        raise ValueError(
            f"the prior {name} declared a site whose batch shape does not fit the model's plate "
            f"over the batch ({str(error).splitlines()[0]}): each instance's latent is one event "
            "of D numbers, so declare it with .to_event(1), e.g. pyro.sample('z', "
            "dist.Normal(loc, scale).to_event(1))"
        ) from None
    missing = [site for site in sites if site not in tracer.trace.nodes]
    if missing:
        calls = " and ".join(f"pyro.sample({site!r}, ...)" for site in sites)
        raise ValueError(
            f"the prior {name} did not declare the sample site(s) {missing}; a prior must call "
            f"{calls} and return {'(z, z2)' if len(sites) == 2 else 'z'}"
        )
    if len(sites) == 2 and not (isinstance(result, tuple) and len(result) == 2):
        got = type(result).__name__
        if isinstance(result, (tuple, list)):
            got += f" of length {len(result)}"
        raise ValueError(
            f"the prior {name} must return the pair (z, z2), got {got}; end its forward with "
            "`return z, z2`"
        )
    nodes = [tracer.trace.nodes[site] for site in sites]
    for node in nodes:
        if isinstance(node["fn"], Unit):
            raise ValueError(
                f"the prior {name} declared {node['name']!r} with pyro.factor; declare the "
                f"latent from a distribution, pyro.sample({node['name']!r}, ...), and a coupling "
                f"that is not normalised as a factor of another name, e.g. "
                f"pyro.factor('{node['name']}_tilt', log_weight)"
            )
    _check_latent_size(name, nodes, args)
    _check_returned_values(name, result if len(sites) == 2 else (result,), nodes)
    return result, tracer.trace


def _check_latent_size(name: str, nodes: Sequence[Mapping[str, Any]], args: tuple) -> None:
    """Raises ValueError when a site's latent size (the last axis of its event) is not the
    recognition's D (``args[0]``, the first view's distributions, event_shape (D,))."""
    q = args[0] if args else None
    if not (isinstance(q, torch.distributions.Distribution) and len(q.event_shape) == 1):
        return
    dim = q.event_shape[0]
    for node in nodes:
        event_shape: tuple[int, ...] = getattr(node["fn"], "event_shape", ())
        if len(event_shape) and event_shape[-1] != dim:
            raise ValueError(
                f"the prior {name} declares site {node['name']!r} with latents of size "
                f"{event_shape[-1]} but the encoder outputs latents of size {dim}; make them "
                f"agree (build the prior for size {dim}, or the encoder with {event_shape[-1]} "
                "outputs)"
            )


def _check_returned_values(name: str, returned: tuple, nodes: Sequence[Mapping[str, Any]]) -> None:
    """Raises ValueError unless ``returned[i]`` is the value of site ``nodes[i]`` (the sites in
    the order ``"z"``, ``"z2"``): the model uses the returned values as the latents of the
    views' likelihood factors, so values in another order would pair each view's likelihood
    with the other view's latent. Identity is checked on every call (free); a returned tensor
    that is not a site's value object is compared by value under ``pyro.enable_validation``."""
    sites = [node["name"] for node in nodes]
    expected = "(" + ", ".join(sites) + ")"
    for i, (value, node) in enumerate(zip(returned, nodes, strict=True)):
        if value is node["value"]:
            continue
        other = next((n["name"] for n in nodes if value is n["value"]), None)
        if other is not None:
            raise ValueError(
                f"the prior {name} returned the value of site {other!r} in position {i + 1}; "
                f"return the sites' values in the order {expected}: end its forward with "
                f"`return {', '.join(sites)}`"
            )
        if is_validation_enabled() and not (
                isinstance(value, torch.Tensor) and value.shape == node["value"].shape
                and torch.equal(value, node["value"])):
            raise ValueError(
                f"the prior {name} returned in position {i + 1} a value that is not the sample "
                f"of site {node['name']!r}; return the sites' values in the order {expected}: "
                f"end its forward with `return {', '.join(sites)}`"
            )
