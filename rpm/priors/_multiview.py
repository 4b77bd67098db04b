r"""Implicit priors over J views of an instance: the star prior averaged over centres (SupCon's
:math:`L_\text{out}`) and the mixture-of-partners prior (:math:`L_\text{in}`), with pooled or
cross-view candidates, the multi-crop rule and a queue of earlier latents
(``docs/theory.md#j-view-priors-star-and-mixture-of-partners``).

N instances with J views each have latents :math:`z_{i,1:J}`; the recognition marginals
:math:`Q_j` are the model's (:class:`~rpm.marginals.SequenceMixtureMarginal`, per view or pooled).
A centre view c is drawn from its marginal, :math:`P(z_c) = Q_c(z_c)`, and the other views from
implicit conditionals of the centre (Eq. 21-22 of Aitchison & Ganev):

* **star** (:class:`StarImplicitPrior`): every positive p independently,
  :math:`P(z_p | z_c) = Q_p(z_p) e^{f(z_c, z_p)} / Z(z_c)`;
* **mixture of partners** (:class:`PartnerMixturePrior`): one partner chosen uniformly among the
  :math:`|P(c)|` positives is linked to the centre, the others are drawn from their marginals,
  :math:`P(z_{-c} | z_c) = \prod_{p} Q_p(z_p) \cdot \frac{1}{|P(c)|} \sum_{p}
  e^{f(z_c, z_p)} / Z(z_c)`.

The marginals cancel in the ELBO (Eq. 15) as in Eq. 23-25, the normaliser
:math:`Z(z_c) = \mathbb{E}_{Q}[e^{f(z_c, z')}]` is estimated over the centre's candidates
:math:`C(c)` (:mod:`rpm.priors._multiview_terms`), and the ELBO of each centre is its
:math:`r_c`. The prior averages the ELBOs of its centres (every view by default), so with
:math:`D = |C(k)|` the same for every anchor,

.. math::

    \frac{\mathcal{L}}{N (J - 1)} = -L_\text{out} + \log D \quad\text{(star)}, \qquad
    \frac{\mathcal{L}}{N} = -L_\text{in} + \log\frac{D}{J - 1} \quad\text{(mixture)},

exactly, for every energy; with J = 2 and pooled candidates both are NT-Xent,
:math:`\mathcal{L}/N = -\text{NT-Xent} + \log(2N - 1)` (:class:`~rpm.priors.PooledImplicitPrior`).
As for the pair's implicit priors, the sample site is a proper distribution (the model's
marginals) and the coupling a factor (``docs/theory.md#normalised-sample-sites``).

**One Pyro model for the average.** The average over centres of the ELBOs under one guide is the
ELBO of the model whose prior log-density is the average of the centres' (as
:class:`~rpm.priors.PooledImplicitPrior` averages its two directions): every centre's prior is
:math:`\prod_j Q_j(z_j)` times its tilt :math:`e^{r_c}`, so the model declares ``"z"`` (one
event (N, J, D) over the batch, :attr:`~rpm.priors.PriorBase.joint_over_batch`) from the model's
marginals and adds the averaged tilt as the factor ``"z_views"``.

**The queue** (MoCo). A :class:`~rpm.marginals._candidates.LatentQueue` of K latents of earlier
batches joins every anchor's candidates: :math:`\hat Z` then runs over :math:`D_k + K` samples of
the marginal. With ``candidates="positives"``, ``centres=[0]`` and J = 2 the candidates are the
anchor's own positive and the queue, and :math:`\mathcal{L}/N = -L_\text{MoCo} + \log(K + 1)`.
The queued latents come from earlier versions of the encoder: they are a second estimate of the
same marginal, of the older encoder's, so :math:`\hat Z` is biased towards
:math:`\mathbb{E}_{Q_\text{old}}[e^{f(z_c, z')}]` by as much as the encoder moved while the queue
filled (K / (N J) steps); the bias vanishes when it stops moving, and no gradient flows into the
queue. The prior owns the queue (a submodule: ``state_dict()`` and checkpoints carry it); the
training loop pushes into it, after the optimiser step, the latents of that step's forward:
``prior.push(z)`` (:meth:`MultiViewImplicitPrior.push`) appends the detached latents of the
partner views (those that are some centre's positive), gathered from every process over a
global batch. Evaluating the prior never pushes, in training or evaluation mode (the state
rule, :mod:`rpm.marginals._candidates`):

.. code-block:: python

    z = model.encode_views(views)                       # (N, J, D), this step's latents
    loss = -rpm.inference.rpm_elbo(model.prior, z) / len(z)
    loss.backward()
    optimiser.step()
    model.prior.push(z)                                 # after the step

**Explicit negatives** (info-nce-pytorch's unpaired ``negative_keys``): with
``candidates="positives"`` and no queue, the step's
``Candidates(negatives=n)`` (:class:`~rpm.marginals._candidates.Candidates`) supply the latents
appended to each anchor's positives, with their gradient.
"""

from __future__ import annotations

import pyro
import torch
from pyro.distributions import TorchDistribution

from rpm._validation import check_int
from rpm.marginals._candidates import Candidates, LatentQueue
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal
from rpm.priors._base import Energy, SequencePrior
from rpm.priors._energy_range import check_implicit_log_ratio
from rpm.priors._implicit import tilt_factor
from rpm.priors._multiview_terms import (
    CANDIDATE_SETS,
    AnchorTerms,
    multiview_anchor_terms,
    multiview_masks,
    positive_index,
)

__all__ = ["MultiViewImplicitPrior", "PartnerMixturePrior", "StarImplicitPrior"]


class MultiViewImplicitPrior(SequencePrior):
    r"""Base of the implicit priors over J views (module docstring): the star prior
    (:class:`StarImplicitPrior`) and the mixture of partners (:class:`PartnerMixturePrior`),
    which differ in :attr:`form` only.

    :param Energy energy: f(z, z'), e.g. :class:`~rpm.priors.CosineEnergy`.
    :param str candidates: ``"pooled"`` (all N J - 1 latents but the anchor), ``"cross_view"``
        (the other views' N (J - 1) columns) or ``"positives"`` (the anchor's own positives;
        needs a queue, or explicit negatives in the step's candidates).
    :param global_views: G: views 0..G-1 are global crops and the others local; a local crop's
        positives and candidates are the global crops only (SwAV, DINO). None: no such rule.
    :param centres: the views that are centres (anchors), a list of indices; None: every view.
    :param queue: a :class:`~rpm.marginals._candidates.LatentQueue` of earlier latents, or None.
    """

    #: ``"star"`` or ``"mixture"``; set by the subclasses.
    form: str = ""

    #: The conditionals are defined relative to the recognition marginals: Delta encoders are fine.
    accepts_delta_recognition = True

    #: The normaliser runs over the batch's latents: ``"z"`` is one event (N, J, D).
    joint_over_batch = True

    #: The prior holds its own queue (``queue=``), not the model's.
    accepts_queue = False

    def __init__(self, energy: Energy, candidates: str = "pooled", global_views: int | None = None,
                 centres: list[int] | None = None, queue: LatentQueue | None = None):
        super().__init__()
        if not isinstance(energy, torch.nn.Module) or not callable(energy):
            raise TypeError(
                f"{type(self).__name__} needs an energy module mapping (z (N, D), z2 (M, D)) to "
                f"an (N, M) matrix, e.g. rpm.priors.CosineEnergy(); got {type(energy).__name__}")
        if candidates not in CANDIDATE_SETS:
            raise ValueError(f"candidates must be one of {CANDIDATE_SETS} (pooled: NT-Xent's; "
                             f"cross_view: the other views only; positives: MoCo's, with a queue), "
                             f"got {candidates!r}")
        if global_views is not None:
            global_views = check_int("global_views", global_views, minimum=1)
        if centres is not None:
            if not (isinstance(centres, (list, tuple)) and centres and all(
                    isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in centres)
                    and len(set(centres)) == len(centres)):
                raise ValueError(f"centres must be a non-empty list of distinct view indices >= 0, "
                                 f"got {centres!r}")
            centres = sorted(centres)
        if queue is not None and not isinstance(queue, LatentQueue):
            raise TypeError(f"queue must be an rpm.inference.LatentQueue or None, got {queue!r}")
        if queue is not None and energy_dim(energy) not in (None, queue.dim):
            raise ValueError(f"the queue holds latents of dimension {queue.dim} but the energy was "
                             f"built for {energy_dim(energy)}")
        self.energy = energy
        self.candidates = candidates
        self.global_views = global_views
        self.centres = centres
        self.queue = queue

    # read-only, the energy's: PriorBase's dim is a plain attribute that other priors set
    @property
    def dim(self) -> int | None:  # type: ignore[override]
        """The energy's latent dimension (None for an energy built for any)."""
        return energy_dim(self.energy)

    # -- the views -----------------------------------------------------------------------------

    def centre_views(self, num_views: int) -> list[int]:
        """The centres among J views (every view by default)."""
        if self.centres is None:
            return list(range(num_views))
        if self.centres[-1] >= num_views:
            raise ValueError(f"{type(self).__name__} has centres {self.centres} but the batch has "
                             f"J = {num_views} views")
        return list(self.centres)

    def partner_views(self, num_views: int) -> list[int]:
        """The views that are the positive of some centre (what the queue takes)."""
        globals_ = num_views if self.global_views is None else self.global_views
        return [v for v in range(num_views) if any(
            v != c and (c < globals_ or v < globals_) for c in self.centre_views(num_views))]

    def _check(self, z: torch.Tensor) -> None:
        if not isinstance(z, torch.Tensor) or z.dim() != 3 or z.shape[1] < 2:
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise ValueError(f"{type(self).__name__} takes latents of shape (N, J, D) with J >= 2, "
                             f"got {got}")
        if self.global_views is not None and self.global_views >= z.shape[1]:
            raise ValueError(f"global_views={self.global_views} leaves no local crop among J = "
                             f"{z.shape[1]} views; give global_views < J (or None)")
        if self.queue is not None and z.shape[2] != self.queue.dim:
            raise ValueError(f"the queue holds latents of dimension {self.queue.dim}, the encoder "
                             f"outputs {z.shape[2]}")

    # -- the terms -----------------------------------------------------------------------------

    def anchor_terms(self, z: torch.Tensor, candidates: Candidates | None = None) -> AnchorTerms:
        r"""The per-anchor terms :math:`r_k` of this process's centres, instance-major (row
        :math:`i J_c + c` is centre c of instance i), over this batch or a global batch
        (``rpm.priors._multiview_terms.multiview_anchor_terms``); with
        ``candidates="positives"`` over the anchor's own instance's views (and the queue) only.

        :param torch.Tensor z: latents, shape (N, J, D).
        :param candidates: a :class:`~rpm.marginals._candidates.Candidates` with a global batch
            or explicit negatives (appended to every anchor's candidates), or None (this batch).
        :returns: the anchors' terms, a named tuple.
        :raises ValueError: for candidates with a queue (the prior holds its own), explicit
            negatives beside the prior's queue, or ``candidates="positives"`` with neither.
        """
        self._check(z)
        num, num_views, dim = z.shape
        centres = self.centre_views(num_views)
        rows = z[:, centres].reshape(num * len(centres), dim)                     # (R, D)
        if self.candidates == "positives":
            # every positive and candidate is a view of the anchor's own instance: the
            # instance's block of the logits, (R, J), not the batch's (R, M J)
            own = z.unsqueeze(1).expand(num, len(centres), num_views, dim).reshape(-1, dim)
            logits = self.energy.paired(rows.repeat_interleave(num_views, dim=0), own)
            logits = logits.reshape(-1, num_views)                                 # (R, J)
            positives, allowed, index = self._masks(num, 1, 0, num_views, z.device, own=True)
        else:
            columns, offset = z, 0
            if candidates is not None and candidates.is_global:
                columns = candidates.gather(z)                                    # (M, J, D)
                offset = candidates.offset(num)
            logits = self.energy(rows, columns.reshape(-1, dim))                   # (R, M J)
            positives, allowed, index = self._masks(num, columns.shape[0], offset, num_views,
                                                    z.device)
        queue_logits = None
        appended = self._appended(z, candidates)
        if appended is not None:
            queue_logits = self.energy(rows, appended)                              # (R, K)
        return multiview_anchor_terms(logits, positives, allowed, self.form, queue_logits, index)

    def _masks(self, num: int, num_columns: int, offset: int, num_views: int, device,
               own: bool = False) -> tuple:
        """The positives and candidates masks and the positives' index
        (:func:`~rpm.priors._multiview_terms.positive_index`) of a batch's shape, cached (they
        depend on the shapes only); ``own``: of each anchor's own instance's J columns only
        (``num_columns`` 1, every row's instance 0)."""
        key = (num, num_columns, offset, num_views, str(device), own)
        cache = self.__dict__.setdefault("_mask_cache", {})
        if key not in cache:
            centres = self.centre_views(num_views)
            row_instance = torch.arange(offset, offset + num, device=device).repeat_interleave(
                len(centres))
            if own:
                row_instance = torch.zeros_like(row_instance)
            row_view = torch.tensor(centres, device=device).repeat(num)
            col_instance = torch.arange(num_columns, device=device).repeat_interleave(num_views)
            col_view = torch.arange(num_views, device=device).repeat(num_columns)
            positives, allowed = multiview_masks(row_instance, row_view, col_instance, col_view,
                                                 self.candidates, self.global_views)
            if len(cache) >= 8:
                cache.clear()
            cache[key] = (positives, allowed, positive_index(positives))
        return cache[key]

    def queued(self, like: torch.Tensor) -> torch.Tensor | None:
        """The queue's latents (K, D) as a copy in ``like``'s dtype and device (a push before
        the backward pass does not touch it), or None without a queue or while it is empty."""
        if self.queue is None or len(self.queue) == 0:
            return None
        return self.queue.latents().to(like).clone()

    def _appended(self, z: torch.Tensor, candidates: Candidates | None) -> torch.Tensor | None:
        """The latents appended to every anchor's candidates: the queue's (:meth:`queued`) or
        the step's explicit negatives (as given, in z's dtype), or None."""
        name = type(self).__name__
        if candidates is not None and candidates.queue is not None:
            raise ValueError(f"{name} holds its own queue (queue=...); do not pass one to rpm.RPM "
                             "or to the step's Candidates as well")
        negatives = None if candidates is None else candidates.explicit_negatives
        if negatives is not None:
            if self.queue is not None:
                raise ValueError(f"{name} holds its own queue (queue=...): the step's explicit "
                                 "negatives would be a second set of appended candidates; build "
                                 "the prior without a queue to use Candidates(negatives=...)")
            if negatives.shape[-1] != z.shape[-1]:
                raise ValueError(f"the explicit negatives have dimension {negatives.shape[-1]}, "
                                 f"the latents {z.shape[-1]}")
            return negatives.to(z.dtype)
        if self.candidates == "positives" and self.queue is None:
            raise ValueError(f"{name}(candidates='positives') estimates the normaliser from the "
                             "positives and appended latents: build it with "
                             "queue=LatentQueue(K, D) (MoCo), or pass the step's "
                             "Candidates(negatives=tensor (M, D))")
        return self.queued(z)

    def push(self, z: torch.Tensor, candidates: Candidates | None = None) -> None:
        """Appends the detached latents of the partner views of z (N, J, D) (the views that
        are some centre's positive, :meth:`partner_views`) to the queue, instance-major
        (row :math:`i |P| + p`), gathered from every process over a global batch. The training
        loop calls it after the optimiser step with that step's latents; no evaluation of the
        prior pushes (module docstring).

        :param torch.Tensor z: latents, shape (N, J, D).
        :param candidates: the step's :class:`~rpm.marginals._candidates.Candidates`; with a
            global batch every process's partner views are pushed, in rank order.
        :raises ValueError: for a prior without a queue, or z not of shape (N, J, D).
        """
        if self.queue is None:
            raise ValueError(f"{type(self).__name__} has no queue to push into: build it with "
                             f"{type(self).__name__}(energy, ..., queue=LatentQueue(K, D)) to "
                             "keep earlier latents, or do not push")
        self._check(z)
        partners = z.detach()[:, self.partner_views(z.shape[1])]
        if candidates is not None and candidates.is_global:
            partners = candidates.gather(partners)
        self.queue.push(partners.reshape(-1, z.shape[2]))

    def _ratio(self, z: torch.Tensor, candidates: Candidates | None = None) -> torch.Tensor:
        """Per-instance ELBO terms (N,): the centres' :math:`r_c` averaged."""
        num_centres = len(self.centre_views(z.shape[1]))
        terms = self.anchor_terms(z, candidates)
        ratio = terms.ratio.reshape(z.shape[0], num_centres).sum(-1) / num_centres
        check_implicit_log_ratio(type(self).__name__, self.energy, [z.reshape(-1, z.shape[2])], ratio)
        return ratio

    def sequence_log_ratio(self, z: torch.Tensor, q: TorchDistribution | None = None,
                           marginal: SequenceMixtureMarginal | None = None,
                           candidates: Candidates | None = None,
                           block_size: int | None = None) -> torch.Tensor:
        r"""Per-instance :math:`\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})` after the
        cancellation of the marginals: the average over the centres c of :math:`r_{i,c}`
        (module docstring), shape (N,). Over a global batch the candidates are every
        process's latents and the value is this process's share. Changes no state (the queue
        is pushed by the training loop, :meth:`push`).

        :param torch.Tensor z: latents, shape (N, J, D).
        :param q: recognition distributions (unused: the marginals cancel).
        :param marginal: the model's marginals (unused: they cancel).
        :param candidates: the step's :class:`~rpm.marginals._candidates.Candidates`.
        :param block_size: unused (the logits are dense, (N J_c, M J)).
        """
        return self._ratio(z, candidates)

    def forward(self, q: TorchDistribution, marginal: SequenceMixtureMarginal) -> torch.Tensor:
        """Declares ``"z"`` from the model's marginals :math:`\\prod_j Q_j`, one event (N, J, D)
        over the batch, and the factor ``"z_views"``, the centres' averaged tilt (module
        docstring); returns z. Changes no state (the queue is pushed by the training loop)."""
        z = pyro.sample("z", marginal.to_event(1))
        tilt_factor("z_views", self._ratio, z, event_dim=3)
        return z


def energy_dim(energy) -> int | None:
    """The energy's latent dimension, or None."""
    return energy.dim if isinstance(energy, Energy) else None


class StarImplicitPrior(MultiViewImplicitPrior):
    r"""The star prior over J views, averaged over centres: each centre's other views are drawn
    independently from its implicit conditional (module docstring). SupCon's
    :math:`L_\text{out}` (Khosla et al. 2020, Eq. 2) as an RPM:

    .. math::

        \frac{\mathcal{L}}{N (J - 1)} = -L_\text{out} + \log D, \qquad
        L_\text{out} = \operatorname*{mean}_{k,\ p \in P(k)}
        -\log \frac{e^{f(u_k, u_p)}}{\sum_{m \in C(k)} e^{f(u_k, u_m)}},

    :math:`D = |C(k)|` (pooled: :math:`NJ - 1`; cross-view: :math:`N (J - 1)`); with J = 2 and
    pooled candidates, NT-Xent.

    .. code-block:: python

        prior = rpm.priors.StarImplicitPrior(rpm.priors.CosineEnergy(kappa=1 / 0.5))
        model = rpm.RPM(rpm.DeltaRecognition(encoder), prior)
        loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, [x1, x2, x3, x4])
        # loss / (N (J - 1)) = L_out - log(N J - 1)

        # 2 global and 4 local crops, one encoder per group, the SwAV/DINO rule:
        prior = rpm.priors.StarImplicitPrior(energy, global_views=2)
        model = rpm.RPM([global_net, local_net], prior, groups=[0, 0, 1, 1, 1, 1])

        # MoCo: a queue of K earlier latents, candidates {own positive} + queue, view 0 the anchor;
        # the loop pushes after each optimiser step: prior.push(z) (module docstring)
        prior = rpm.priors.StarImplicitPrior(energy, candidates="positives", centres=[0],
                                             queue=rpm.inference.LatentQueue(4096, 128))

    :param Energy energy: f(z, z').
    :param str candidates: ``"pooled"``, ``"cross_view"`` or ``"positives"`` (with a queue).
    :param global_views: G global crops first (multi-crop rule), or None.
    :param centres: the centre views, or None (every view).
    :param queue: a :class:`~rpm.marginals._candidates.LatentQueue`, or None.
    """

    form = "star"


class PartnerMixturePrior(MultiViewImplicitPrior):
    r"""The mixture-of-partners prior over J views, averaged over centres: each centre links to
    one other view chosen uniformly, the rest drawn from their marginals (module docstring).
    SupCon's :math:`L_\text{in}` (Khosla et al. 2020, Eq. 3; solo-learn's multi-crop SimCLR) as
    an RPM:

    .. math::

        \frac{\mathcal{L}}{N} = -L_\text{in} + \log \frac{D}{J - 1}, \qquad
        L_\text{in} = \operatorname*{mean}_{k}
        -\log \frac{\sum_{p \in P(k)} e^{f(u_k, u_p)}}{\sum_{m \in C(k)} e^{f(u_k, u_m)}},

    :math:`D = |C(k)|`; with J = 2 and pooled candidates, NT-Xent.

    .. code-block:: python

        prior = rpm.priors.PartnerMixturePrior(rpm.priors.CosineEnergy(kappa=1 / 0.5))
        model = rpm.RPM(rpm.DeltaRecognition(encoder), prior)
        loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, [x1, x2, x3, x4])
        # loss / N = L_in - log((N J - 1) / (J - 1))

    :param Energy energy: f(z, z').
    :param str candidates: ``"pooled"``, ``"cross_view"`` or ``"positives"`` (with a queue).
    :param global_views: G global crops first (multi-crop rule), or None.
    :param centres: the centre views, or None (every view).
    :param queue: a :class:`~rpm.marginals._candidates.LatentQueue`, or None.
    """

    form = "mixture"
