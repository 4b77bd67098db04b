r"""The recognition parameterised model (RPM) over J >= 2 views as a Pyro model and guide
(``docs/theory.md#pyro-model-and-guide``; J views and sequences).

Generative model (Eq. 9 of Aitchison & Ganev, with J views): :math:`P(x_{1:J}, z_{1:J}) =
P(z_{1:J}) \prod_j P(x_j|z_j)` with the likelihood defined from the recognition joint (Eq. 10):

.. math::

    P(x_j|z_j) = \frac{Q(z_j|x_j)\, P_\text{true}(x_j)}{Q_j(z_j)},

where :math:`Q_j` is the minibatch-mixture recognition marginal of view j (Eq. 11; the prior
may choose another estimate of it, :meth:`~rpm.priors._base.Prior.likelihood_marginals`, or
the views may pool theirs). :math:`P_\text{true}(x)` is constant in every parameter and is left
out, so the likelihood enters the model as the factor :math:`\log Q(z_j|x_j) - \log Q_j(z_j)`.
With the recognition models as the guide, :math:`\prod_j Q(z_j|x_j)` (Eq. 14), Pyro's
``Trace_ELBO`` on ``(model, guide)`` computes Eq. 15 summed over the batch:

.. math::

    \sum_i \mathbb{E}_{\prod_j Q(z_{i,j}|x_{i,j})}\Big[\log P(z_{i,1:J})
        - \sum_j \log Q_j(z_{i,j})\Big].

Pairs under a pair prior (:class:`~rpm.priors._base.Prior`) keep two sites ``"z"``, ``"z2"``
and two factors ``"x"``, ``"x2"``; J views under a prior over J views
(:class:`~rpm.priors._base.SequencePrior`) have one site ``"z"`` of event_shape (J, D) and one
factor ``"x"``. Ordered views (the frames of a
sequence) and unordered ones (augmentations) are the same model with different priors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import pyro
import torch
from pyro.distributions import Delta, TorchDistribution
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule
from torch.distributions import Distribution

from rpm._objective import (
    GAUSSIAN_TAKES_NO_QUEUE,
    ObjectiveInputs,
    check_marginal,
    likelihood_factor,
    likelihood_marginals,
    refuses_delta,
)
from rpm._validation import check_bool
from rpm.marginals._candidates import Candidates, LatentQueue
from rpm.marginals._mixture_marginal import recognition_components
from rpm.marginals._moment_matched import MomentMatchedMarginal
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal, stack_components
from rpm.models._base import GuideOwnerCheck, RPMBase, guide_site_infer
from rpm.models._checked_batches import (
    check_values,
    full_checks,
    passed,
    remember,
    signature,
    skipped_checks,
)
from rpm.models._recognition import CategoricalRecognition, DeltaRecognition
from rpm.models._views import (
    ENCODER_CALLS,
    call_encoder,
    check_inputs,
    recognise_views,
)
from rpm.nn import NamedModuleList, _structure_version, pyro_method
from rpm.priors._base import (
    SequencePrior,
    declare_prior,
    delta_with_density_message,
    hook,
    is_sequence_prior,
    refuse_energy,
)
from rpm.priors._multiview import MultiViewImplicitPrior

__all__ = ["RPM"]

_GUIDES = ("recognition", "structured")
_PAIR_PLATE, _JOINT_PLATE = "pairs", "instances"


class _Dispatch(NamedTuple):
    """What a model decides once per ``rpm.nn._structure_version`` (decided again after
    any assignment of a module or an attribute of the package's modules): its prior, its
    recognition models and the prior's protocol."""

    #: The structure version it was decided under.
    version: int
    #: The prior, or None when it is not a PyroModule (read through the attribute each time:
    #: a plain torch.nn.Module is registered with Pyro by that access).
    prior: object
    #: The recognition models in the order ``groups`` indexes them, or None when one is not a
    #: PyroModule (read each time, as the prior).
    modules: tuple | None
    #: The prior is a prior over J views (``rpm.priors._base.is_sequence_prior``).
    sequence: bool


def _particle_rows(value: torch.Tensor, event_dim: int) -> torch.Tensor:
    """A whole-batch event under an outer plate (vectorised particles, Predictive) has
    batch_shape (..., 1): the 1 is the model's plate slot. Its N rows take that slot."""
    return value.squeeze(-event_dim - 1) if value.dim() > event_dim else value


class RPM(RPMBase):
    r"""A recognition parameterised model of N instances with J >= 2 views each and a prior
    over their latents.

    .. code-block:: python

        # pairs (SimCLR, InfoNCE): today's sites "z", "z2" and factors "x", "x2"
        model = RPM(DeltaRecognition(encoder), ImplicitPrior(CosineEnergy(kappa=10.0)))
        svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 1e-3}), RPMELBO())
        svi.step(x, x2)   # x, x2: (N, ...) paired views

        # J views of different shapes, one encoder per group, a prior over the J latents
        model = RPM([global_net, local_net], MarkovImplicitPrior(RBFEnergy()),
                    groups=[0, 0, 1, 1, 1, 1, 1, 1])
        svi.step([g1, g2, l1, l2, l3, l4, l5, l6])   # a list of J tensors (N, ...)

    **Calls.** ``model(x_1, ..., x_J)`` and ``model([x_1, ..., x_J])`` are the same J >= 2
    views (tensors with one batch axis N, of any shapes; a pair prior takes J = 2,
    ``model(x, x2)``). Under a prior over J views (:class:`~rpm.priors.SequencePrior`) one
    tensor x of shape (N, J, ...) is the J views stacked on axis 1 (the frames of N
    sequences), ``model(x)``. ``guide``, ``objective_inputs``, ``recognise`` and
    :meth:`encode_views` take the same arguments; :meth:`encode` embeds a batch of single
    inputs (N, ...). View j of instance i is ``views[j][i]``.

    **Sites.** For a pair prior (J = 2, :class:`~rpm.priors._base.Prior`): the prior's sites
    ``"z"`` and ``"z2"`` and, inside ``pyro.plate("pairs", N)``, the likelihood factors ``"x"``
    and ``"x2"`` with log-densities :math:`\log Q(z|x) - \log Q(z)` and :math:`\log Q(z'|x') -
    \log Q(z')` (Eq. 10), Q being the marginals the prior names
    (:meth:`~rpm.priors._base.Prior.likelihood_marginals`); ``guide`` samples ``"z" ~ Q(z|x)``
    and ``"z2" ~ Q(z'|x')``. For a prior over J views (any J,
    :class:`~rpm.priors._base.SequencePrior`): the prior's site ``"z"`` with event_shape (J, D)
    and, inside ``pyro.plate("instances", N)``, the factor ``"x"``, :math:`\sum_j [\log
    Q(z_j|x_j) - \log Q_j(z_j)]`; ``guide`` samples ``"z"`` from the recognition distributions
    made independent over the views (event (J, D)), or, with ``guide="structured"``, from the
    prior's own posterior (:meth:`~rpm.priors._base.SequencePrior.posterior`, e.g. the Kalman
    smoother of the state-space prior). The prior's sites are per instance (inside the plate)
    unless the prior couples the instances (:attr:`~rpm.priors._base.PriorBase.joint_over_batch`,
    the implicit priors): then they are whole-batch events ((N, D) per pair site, (N, J, D) for
    the J views' site) in model and guide alike. Pyro's ``Trace_ELBO``, ``TraceGraph_ELBO``,
    ``JitTrace_ELBO`` and ``Predictive`` see honest shapes; :class:`~rpm.RPMELBO` computes the
    same ELBO with each encoder evaluated once (``rpm._objective``).

    **Marginals over J views.** By default :math:`Q_j` is the mixture over the j-th views
    of the batch (N components per view): with J = 2 the model *is* the pair model, and it stays
    correct when the views are not exchangeable (one encoder per group, augmentations of
    different kinds, a non-stationary sequence). ``pooled_marginal=True`` uses the mixture over
    all N J views instead: when the views are exchangeable (a stationary video through one
    shared encoder) it estimates the same Q with J times as many components.

    **The estimate of the marginals.** ``marginal="mixture"`` (the default) is the minibatch
    mixture above (Eq. 11). ``marginal="gaussian"`` replaces each :math:`Q_j` by the Gaussian
    with that mixture's mean and covariance (the "estimated marginal" of Aitchison & Ganev's
    appendix, :class:`~rpm.marginals.MomentMatchedMarginal`, normaliser 1/N; pooled over the
    views with ``pooled_marginal=True``), in the likelihood factors, the traced ELBO and
    :class:`~rpm.RPMELBO` alike. It is a density even for Delta recognition, so an explicit prior
    with a deterministic encoder has a well-defined ELBO (``docs/theory.md#gaussian-rpm``):
    for a Gaussian prior (:class:`~rpm.priors.GaussianPairPrior`,
    :class:`~rpm.priors.GaussianStarPrior`)

    .. math::

        \frac{\mathcal L}{N} = \operatorname{mean}_n \log P(z_{n,1:J})
            - \sum_j \operatorname{mean}_n \log \mathcal N(z_{n,j}; m_j, S_j).

    It needs N >= D + 1 instances for Delta recognition (a nonsingular S), moments of the batch
    (or, ``RPMELBO(global_batch=True)``, of every process's batch; no queue), and a prior that
    is a density of its own (an implicit prior cancels the mixture analytically and is refused).

    **Encoders.** One recognition model for every view, one per view (a list of J), or one
    per group (a list of G and ``groups``); how the views reach them is ``encoder_calls``
    (``rpm.models._views``: one call per view, the pair default, or one call per group on the
    concatenated views, as SimCLR implementations do; they differ under batch normalisation).

    **Parameters.** The model's ``name`` prefixes its parameters in Pyro's param store
    (``"a.prior.energy.lengthscale"``, ``"a.recognition.net$$$0.weight"`` for ``name="a"``), as
    a :class:`~pyro.nn.PyroModule`'s do; the default names are unique in the process. So two
    RPMs, or two RPMs sharing one encoder network, train side by side under ``SVI`` (with
    ``Trace_ELBO``, ``TraceGraph_ELBO``, ``JitTrace_ELBO`` or :class:`~rpm.RPMELBO`) or a
    ``torch.optim`` loop over ``rpm.parameters()``, with no ``pyro.clear_param_store()``
    between them, and ``pyro.get_param_store().save()`` holds all of them. To restore a model,
    use ``rpm.state_dict()`` and ``load_state_dict()`` (learned hyperparameters included):
    Pyro does not copy a loaded param store back into a module's ``nn.Parameter`` s (see the
    README's section on parameters).

    **Checks.** Under ``pyro.enable_validation`` every batch is checked: the recognition
    models' outputs (finite, of the prior's dimension; a non-finite one makes every check run,
    which names the input rows that hold NaN or infinite entries) and the prior's
    requirements. Without validation the structural checks run on the first batch of each
    shape, dtype and device after the last assignment of a module or attribute (assigning
    ``model.prior`` or a recognition model runs them again; ``rpm.models._checked_batches``).

    **Missing frames.** ``model``, ``guide``, ``encode_views`` (and :class:`~rpm.RPMELBO` through
    ``objective_inputs``) take ``mask=``, a bool tensor (N, J), True where view j of instance i
    is observed, for a prior that marginalises missing views
    (:attr:`~rpm.priors._base.SequencePrior.accepts_mask`, e.g. the state-space prior). A missing
    view's input is never read (it may hold anything, NaN included; the encoder sees zeros
    there); its recognition distribution is masked out (Pyro's ``q.mask(mask)``): it has no
    likelihood factor, no marginal term and is no component of the mixture marginals; the
    prior's site is the density of the observed views' latents (for the state-space prior the
    Kalman filter skips the missing frames' updates), and the structured guide conditions on
    the observed frames only and imputes the others. So the ELBO is that of the RPM of the
    observed views (``docs/theory.md``, sequences).

    **Candidates.** ``queue``, a :class:`~rpm.marginals._candidates.LatentQueue`, adds K latents
    of earlier batches to the implicit prior's normaliser (MoCo); it is a submodule, so
    ``state_dict()`` carries it. Push into it after each step (``queue.push(...)``).

    :param recognition: Q(z|x), a :class:`~rpm.GaussianRecognition` or
        :class:`~rpm.DeltaRecognition` (any module returning a batch of distributions with
        batch_shape (N,) and event_shape (D,)), or a list of them (one per view, or per group).
    :param prior: a pair prior, :class:`~rpm.priors._base.Prior` (or a plain callable
        ``prior(q, q2) -> (z, z2)`` declaring the sites ``"z"`` and ``"z2"``, a pair prior with
        the hooks' defaults), or a prior over J views, :class:`~rpm.priors._base.SequencePrior`.
    :param recognition2: :math:`Q(z'|x')` for the second view of a pair (model index 1 of
        ``groups``); by default the first view's model is shared.
    :param groups: for a list of G recognition models, ``groups[j]`` is the index of view j's
        model (a list of J integers); default: view j uses model j.
    :param str encoder_calls: ``"per_view"`` (default) or ``"concat"``.
    :param bool pooled_marginal: a prior over J views: pool the marginals over all views (see
        above).
    :param str guide: a prior over J views: ``"recognition"`` (Eq. 14) or ``"structured"`` (the prior's
        posterior).
    :param str marginal: ``"mixture"`` (default) or ``"gaussian"`` (see above).
    :param queue: a :class:`~rpm.marginals._candidates.LatentQueue` or None.
    :param name: the prefix of the model's parameters in Pyro's param store; by default
        ``"rpm"``, ``"rpm_1"``, ... (unique in the process, :class:`~rpm.models._base.RPMBase`).
    :raises TypeError: for an :class:`~rpm.priors._base.Energy` given as the prior (wrap it:
        ``ImplicitPrior(energy)``), or a prior class that mixes the two protocols or still sets
        rpm 0.1's ``joint_views`` (``rpm.priors._base.is_sequence_prior``).
    :raises ValueError: for a deterministic encoder (Delta, no noise) with a prior that is an
        explicit continuous density under the mixture marginal (Appendix B of Aitchison &
        Ganev), a structured guide the prior does not have, or an unknown ``marginal`` (or
        ``"gaussian"`` with an implicit prior or a queue).
    """

    def __init__(self, recognition, prior, recognition2=None, *, groups: list[int] | None = None,
                 encoder_calls: str = "per_view", pooled_marginal: bool = False,
                 guide: str = "recognition", queue: LatentQueue | None = None,
                 marginal: str = "mixture", name: str | None = None):
        super().__init__(name)
        per_view = isinstance(recognition, (list, tuple, torch.nn.ModuleList))
        modules = list(recognition) if per_view else [recognition]
        if recognition2 is not None:
            if per_view:
                raise ValueError("give either a list of recognition models or recognition2, "
                                 "not both")
            modules.append(recognition2)
        if per_view and len(modules) < 1:
            raise ValueError("the list of recognition models is empty; pass one module to share "
                             "it over the views, or one per view or group")
        for index, module in enumerate(modules):
            if not callable(module):
                label = "recognition" if index == 0 else f"recognition{index + 1}"
                raise TypeError(f"{label} must be callable (x -> distribution), got {module!r}")
            if isinstance(module, CategoricalRecognition):
                raise TypeError(
                    "CategoricalRecognition is the factor of a discrete latent, which rpm.RPM's "
                    "continuous priors do not take; use rpm.DiscreteRPM(recognition, num_views=J)")
        if not callable(prior):
            raise TypeError(f"prior must be callable as prior(q, q2), got {prior!r}")
        refuse_energy(prior)
        sequence = is_sequence_prior(prior)  # the protocol; TypeError for a class mixing both
        if groups is not None:
            if not (isinstance(groups, (list, tuple)) and all(
                    isinstance(g, int) and not isinstance(g, bool) and 0 <= g < len(modules)
                    for g in groups)):
                raise ValueError(
                    f"groups must be a list of integers in [0, {len(modules)}) (the index of "
                    f"each view's recognition model), got {groups!r}")
            groups = list(groups)
        if encoder_calls not in ENCODER_CALLS:
            raise ValueError(f"encoder_calls must be one of {ENCODER_CALLS}, got {encoder_calls!r}")
        check_bool("pooled_marginal", pooled_marginal)
        if guide not in _GUIDES:
            raise ValueError(f"guide must be one of {_GUIDES}, got {guide!r}")
        check_marginal(marginal, prior)
        if marginal == "gaussian" and queue is not None:
            raise ValueError(GAUSSIAN_TAKES_NO_QUEUE)
        if queue is not None:
            if not isinstance(queue, LatentQueue):
                raise TypeError(f"queue must be an rpm.inference.LatentQueue, got {queue!r}")
            if isinstance(prior, MultiViewImplicitPrior):
                raise ValueError(
                    f"{type(prior).__name__} holds its own queue: build it with "
                    f"{type(prior).__name__}(energy, queue=LatentQueue(K, D)) and give the RPM none")
            if not hook(prior, "accepts_queue"):
                raise ValueError(
                    f"the prior {type(prior).__name__} takes no queue of earlier latents (its "
                    "normaliser is not an estimate over candidates of the marginal); use "
                    "ImplicitPrior for MoCo's queue")
        if guide == "structured" and (not sequence
                                      or type(prior).posterior is SequencePrior.posterior):
            raise ValueError(
                f"guide='structured' needs a prior with a structured posterior; "
                f"{type(prior).__name__} has none (use guide='recognition', or StateSpacePrior)")
        if not sequence and (pooled_marginal or guide != "recognition"):
            raise ValueError(
                "pooled_marginal and guide='structured' belong to priors over J views "
                f"(rpm.priors.SequencePrior, e.g. StateSpacePrior); {type(prior).__name__} is a "
                "pair prior (its likelihood_marginals hook chooses the marginals)")
        self.adopt(recognition=NamedModuleList(modules) if per_view else recognition,
                   recognition2=recognition2, prior=prior)
        self.per_view = per_view
        self.groups = groups
        self.encoder_calls = encoder_calls
        self.pooled_marginal = pooled_marginal
        self.guide_kind = guide
        self.marginal_kind = marginal
        self.queue = queue
        if refuses_delta(prior, marginal):
            for index, module in enumerate(modules):
                if isinstance(module, DeltaRecognition) and module.is_deterministic:
                    label = "recognition" if index == 0 else f"recognition{index + 1}"
                    raise ValueError(delta_with_density_message(label, prior))

    # -- the views -----------------------------------------------------------------------------

    @property
    def modules_list(self) -> list:
        """The recognition models, in the order ``groups`` indexes them."""
        recognition = self._child("recognition")
        if self.per_view:
            return list(recognition)
        recognition2 = self._child("recognition2")
        if recognition2 is not None:
            return [recognition, recognition2]
        return [recognition]

    def _dispatch(self) -> _Dispatch:
        """The model's :class:`_Dispatch`, kept while the structure version is the same."""
        version = _structure_version()
        decided = self.__dict__.get("_rpm_dispatch")
        if decided is None or decided.version != version:
            prior = self._child("prior")
            modules = tuple(self.modules_list)
            decided = _Dispatch(
                version, prior if isinstance(prior, PyroModule) else None,
                modules if all(isinstance(m, PyroModule) for m in modules) else None,
                is_sequence_prior(prior))
            self.__dict__["_rpm_dispatch"] = decided
        return decided

    def _views(self, args: tuple) -> tuple[list[str], list[torch.Tensor], torch.Tensor | None]:
        """The views of a call: names, the J tensors (N, ...), and the stacked input (N, J, ...)
        when the call gave one tensor (a prior over J views only).

        ``(x_1, ..., x_J)`` and ``([x_1, ..., x_J],)`` are the same J views, named ``"x"``,
        ``"x2"``, ..., ``"xJ"`` in error messages."""
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            args = tuple(args[0])
            if len(args) < 2:
                raise ValueError(f"an RPM needs J >= 2 views per instance, got a list of "
                                 f"{len(args)}")
        if len(args) >= 2:
            return ["x"] + [f"x{j + 1}" for j in range(1, len(args))], list(args), None
        if len(args) == 1:
            x = args[0]
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"x must be a torch.Tensor or a list of views, got "
                                f"{type(x).__name__}")
            if not self._dispatch().sequence:
                raise ValueError(
                    f"one tensor of shape {tuple(x.shape)} is read as views stacked on axis 1 "
                    f"(N, J, ...) only under a prior over J views (rpm.priors.SequencePrior); "
                    f"{type(self._child('prior')).__name__} is a pair prior: call it with the "
                    f"two views (x, x2)")
            if x.dim() < 3:
                raise ValueError(
                    f"x of shape {tuple(x.shape)} is read as (N, J, ...), J views stacked on axis "
                    f"1, which leaves no axis for the frame itself: the view axis is missing. "
                    f"For two paired views call it with (x, x2); for J views pass x of shape "
                    f"(N, T, features), or the views as a list [x_1, ..., x_J] (for scalar "
                    f"frames, x.unsqueeze(-1))")
            if x.shape[1] < 2:
                raise ValueError(f"an RPM needs J >= 2 views per instance (T >= 2 views per "
                                 f"sequence), got x of shape {tuple(x.shape)} (T = {x.shape[1]}); "
                                 f"to embed a batch of single frames (N, ...) call encode(x)")
            return [f"x[:, {j}]" for j in range(x.shape[1])], list(x.unbind(1)), x
        raise TypeError(
            f"{type(self).__name__} takes J >= 2 views (x_1, ..., x_J) or a list of them (or, "
            f"under a prior over J views, one tensor (N, J, ...) of stacked views); got none")

    def _groups(self, num_views: int, modules: Sequence) -> list[int]:
        if self.groups is not None:
            if len(self.groups) != num_views:
                raise ValueError(f"groups names a recognition model for {len(self.groups)} views "
                                 f"but the batch has J = {num_views} views")
            return self.groups
        if len(modules) == 1:
            return [0] * num_views
        if len(modules) != num_views:
            raise ValueError(
                f"the model has {len(modules)} recognition models but the batch has J = "
                f"{num_views} views; give one per view, or groups=[...] naming each view's model")
        return list(range(num_views))

    def _child(self, name: str):
        """The submodule ``name``; a :class:`~pyro.nn.PyroModule` is read from ``_modules``
        directly (``PyroModule.__getattr__`` would only return it, after a few dictionary
        lookups per access), anything else through the attribute (a plain
        ``torch.nn.Module`` prior is registered with Pyro by that access)."""
        module = self._modules.get(name)
        return module if isinstance(module, PyroModule) else getattr(self, name, None)

    def _mask(self, mask, prior, views: list, stacked, batch_size: int):
        """Checks a mask over views and zeroes the missing views' inputs (never read)."""
        if not (isinstance(prior, SequencePrior) and prior.accepts_mask):
            raise ValueError(
                f"mask= needs a prior over J views that marginalises missing views "
                f"(accepts_mask, e.g. StateSpacePrior); {type(prior).__name__} does not")
        shape = (batch_size, len(views))
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != shape:
            got = (f"{mask.dtype} of shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor)
                   else type(mask).__name__)
            raise ValueError(f"mask must be a bool tensor of shape (N, J) = {shape}, True where "
                             f"the view is observed; got {got}")

        def zeroed(tensor, observed):
            observed = observed.reshape(*observed.shape, *([1] * (tensor.dim() - observed.dim())))
            return torch.where(observed, tensor, torch.zeros((), dtype=tensor.dtype,
                                                             device=tensor.device))
        if stacked is not None:
            stacked = zeroed(stacked, mask)
            return list(stacked.unbind(1)), stacked
        return [zeroed(view, mask[:, j]) for j, view in enumerate(views)], None

    def _encode(self, args: tuple, mask: torch.Tensor | None = None
                ) -> tuple[list[TorchDistribution], TorchDistribution | None]:
        """A pair prior: the two views' recognition distributions (each batch (N,)) and None;
        a prior over J views: [] and the J views' as one distribution (batch (N, J)), masked over the
        views by ``mask`` (N, J) when given (Pyro's ``q.mask(mask)``).

        The structural checks run on the first batch of each signature (shapes, dtypes and
        devices of the views, the structure version); under validation every batch's values
        are checked too (``rpm.models._checked_batches``)."""
        names, views, stacked = self._views(args)
        dispatch = self._dispatch()
        modules = self.modules_list if dispatch.modules is None else dispatch.modules
        prior = self._child("prior") if dispatch.prior is None else dispatch.prior
        groups = self._groups(len(views), modules)
        if mask is not None:
            if all(isinstance(view, torch.Tensor) and view.dim() > 0 for view in views):
                views, stacked = self._mask(mask, prior, views, stacked, views[0].shape[0])
            return _masked(self._encode_checked(names, views, stacked, modules, groups, prior,
                                                dispatch.sequence), mask)
        return self._encode_checked(names, views, stacked, modules, groups, prior, dispatch.sequence)

    def _encode_checked(self, names, views, stacked, modules, groups, prior, sequence: bool):
        """:meth:`_encode` without a mask.

        A batch of a signature that passed the structural checks before is encoded with the
        recognition models' own checks off; under validation its values (the recognition
        parameters, through which the objective reads the views) are then checked in one
        reduction
        (:func:`~rpm.models._checked_batches.check_values`), and a batch that fails it (or a
        distribution's own argument check) is encoded again with every check, which names the
        rows or the encoder."""
        key = signature(views, _structure_version())
        if passed(self, key):
            validating = is_validation_enabled()
            try:
                with skipped_checks():
                    parts = self._encode_views(names, views, stacked, modules, groups,
                                               views[0].shape[0], sequence, check=False)
                if not validating or check_values(parts[0] or (parts[1],)):
                    return parts
            except ValueError:  # e.g. a distribution's own argument check
                if not validating:
                    raise
            with full_checks():
                return self._encode_checked(names, views, stacked, modules, groups, prior, sequence)
        batch_size = check_inputs(names, views)
        if not sequence and len(views) != 2:
            raise ValueError(
                f"the prior {type(prior).__name__} is a pair prior (sites 'z' and 'z2') but "
                f"the batch has J = {len(views)} views; use a prior over J views "
                "(rpm.priors.SequencePrior, e.g. MarkovImplicitPrior, StateSpacePrior)")
        parts = self._encode_views(names, views, stacked, modules, groups, batch_size, sequence,
                                   check=True)
        if sequence:  # parameters (loc, scale) per view
            dim = parts[1].event_shape[0]
            deltas = [isinstance(parts[1], Delta)] * len(views)
        else:
            dim = parts[0][0].event_shape[0]
            deltas = [isinstance(dist, Delta) for dist in parts[0]]
        prior_dim = hook(prior, "dim")
        if prior_dim is not None and prior_dim != dim:
            raise ValueError(
                f"the prior was built for latent dimension {prior_dim} but the encoder outputs "
                f"dimension {dim}; make them agree (e.g. dim={dim})"
            )
        if refuses_delta(prior, self.marginal_kind):
            for j, delta in enumerate(deltas):
                if delta:
                    name = "recognition" if groups[j] == 0 else f"recognition{groups[j] + 1}"
                    raise ValueError(delta_with_density_message(name, prior))
        remember(self, key)
        return parts

    def _encode_views(self, names, views, stacked, modules, groups, batch_size: int,
                      sequence: bool, check: bool):
        """The encoder calls of :meth:`_encode` (``check``: the distributions' shapes are
        checked)."""
        if stacked is not None and self.encoder_calls == "concat" and len(modules) == 1:
            # One call on all N J frames in their memory order (N, J, ...) -> (N J, ...).
            flat = stacked.reshape(batch_size * len(views), *stacked.shape[2:])
            dist = call_encoder(modules[0], flat, "x")
            parts = _split_rows(dist, batch_size, len(views))
        else:
            parts = recognise_views(names, views, modules, groups, self.encoder_calls,
                                    batch_size, components=sequence, check=check)
        if sequence:
            return [], stack_components(parts)
        return parts, None

    def recognise(self, *args, mask: torch.Tensor | None = None):
        """Validates a batch and returns its recognition distributions: for a pair prior
        ``(q, q2)``, each with batch_shape (N,) and event_shape (D,); for a prior over J views
        the J views' distributions as one, batch_shape (N, J), event_shape (D,) (masked over
        the views by ``mask``, (N, J) bool, True = observed)."""
        encoded, stacked = self._encode(args, mask)
        return stacked if stacked is not None else tuple(encoded)

    def candidates(self, global_batch: bool = False) -> Candidates:
        """The step's :class:`~rpm.marginals._candidates.Candidates`: the batch, every process's
        batch (``global_batch``), and this model's queue."""
        return Candidates(global_batch=global_batch, queue=self.queue)

    def marginal(self, q: TorchDistribution, block_size: int | None = None,
                 candidates: Candidates | None = None
                 ) -> SequenceMixtureMarginal | MomentMatchedMarginal:
        r"""A prior over J views' recognition marginals :math:`\prod_j Q_j` (per view or pooled;
        the mixtures, or their moment-matched Gaussians under ``marginal="gaussian"``)."""
        if self.marginal_kind == "gaussian":
            return MomentMatchedMarginal(q, pooled=self.pooled_marginal, candidates=candidates)
        return SequenceMixtureMarginal(q, pooled=self.pooled_marginal, block_size=block_size,
                                       candidates=candidates)

    def pair_marginals(self, q: TorchDistribution, q2: TorchDistribution,
                       candidates: Candidates | None = None) -> tuple:
        r"""A pair prior's marginals :math:`(Q_1, Q_2)`: the prior's
        (:meth:`~rpm.priors.Prior.likelihood_marginals`, the minibatch mixtures by default), or
        under ``marginal="gaussian"`` each view's moment-matched Gaussian."""
        if self.marginal_kind == "gaussian":
            return (MomentMatchedMarginal(q, candidates=candidates),
                    MomentMatchedMarginal(q2, candidates=candidates))
        return likelihood_marginals(self.prior, q, q2)

    def guide_distribution(self, q: TorchDistribution) -> TorchDistribution:
        """A prior over J views' guide distribution of ``"z"``: batch_shape (N,), event_shape (J, D)."""
        if self.guide_kind == "structured":
            return self.prior.posterior(q)
        return q.to_event(1)

    # -- the Pyro program ---------------------------------------------------------------------

    def _prior_args(self, *args):
        """The prior's arguments, with the candidates when a queue is set."""
        return (*args, self.candidates()) if self.queue is not None else args

    @pyro_method
    def sample_prior(self, q: TorchDistribution, q2: TorchDistribution):
        """Runs the pair prior inside the current plate and checks it declared ``"z"``
        and ``"z2"`` (``rpm.priors._base.declare_prior``)."""
        return declare_prior(self.prior, *self._prior_args(q, q2), sites=("z", "z2"))

    @pyro_method
    def model(self, *args, mask: torch.Tensor | None = None):
        r"""The generative model of Eq. 9-10 (class docstring): a pair prior's sites
        ``"z"``, ``"z2"`` and likelihood factors ``"x"``, ``"x2"``; a prior over J views' site
        ``"z"`` (event (J, D)) and the factor ``"x"`` (over the observed views of ``mask``,
        (N, J) bool, when given).

        Run with the guide of another model (Pyro's replay of a guide's trace: ``Trace_ELBO``,
        ``TraceMeanField_ELBO``, ``JitTrace_ELBO``), it raises a :class:`ValueError` naming
        both models: the guide's sites record their model (:meth:`guide`)."""
        with GuideOwnerCheck(self):
            return self._model(args, mask)

    def _model(self, args: tuple, mask: torch.Tensor | None):
        encoded, q = self._encode(args, mask)
        batch_size = (encoded[0] if q is None else q).batch_shape[0]
        joint_over_batch = hook(self.prior, "joint_over_batch")
        if q is not None:  # a prior over J views
            marginal = self.marginal(q)
            plate = pyro.plate(_JOINT_PLATE, batch_size)
            if joint_over_batch:
                z = declare_prior(self.prior, q, marginal, sites=("z",))
                rows = _particle_rows(z, 3)
            else:
                with plate:
                    z = rows = declare_prior(self.prior, q, marginal, sites=("z",))
            with plate:
                pyro.factor("x", likelihood_factor(q.log_prob(rows).sum(-1), marginal.log_prob(rows)))
            return z
        q, q2 = encoded
        pairs = pyro.plate(_PAIR_PLATE, batch_size)
        if joint_over_batch:
            z, z2 = self.sample_prior(q, q2)
            rows, rows2 = _particle_rows(z, 2), _particle_rows(z2, 2)
        else:
            with pairs:
                z, z2 = self.sample_prior(q, q2)
            rows, rows2 = z, z2
        marginal, marginal2 = self.pair_marginals(q, q2)
        with pairs:
            pyro.factor("x", likelihood_factor(q.log_prob(rows), marginal.log_prob(rows)))
            pyro.factor("x2", likelihood_factor(q2.log_prob(rows2), marginal2.log_prob(rows2)))
        return z, z2

    @pyro_method
    def guide(self, *args, mask: torch.Tensor | None = None):
        r"""The approximate posterior: the recognition models (Eq. 14), per instance inside the
        plate, or as whole-batch events for a prior that is
        :attr:`~rpm.priors._base.PriorBase.joint_over_batch` (the same draws, the same log-density
        summed over the instances); for a prior over J views optionally the prior's structured
        posterior. With ``mask`` the log-density is that of the observed views' latents.
        Each sample site's ``infer`` records this model (``rpm.models._base.GUIDE_OWNER``), so
        that another model's :meth:`model` refuses these draws."""
        encoded, q = self._encode(args, mask)
        batch_size = (encoded[0] if q is None else q).batch_shape[0]
        joint_over_batch = hook(self.prior, "joint_over_batch")
        if q is not None:
            guide = self.guide_distribution(q)
            if joint_over_batch:
                return pyro.sample("z", guide.to_event(1), infer=guide_site_infer(self))
            with pyro.plate(_JOINT_PLATE, batch_size):
                return pyro.sample("z", guide, infer=guide_site_infer(self))
        q, q2 = encoded
        if joint_over_batch:
            z = pyro.sample("z", q.to_event(1), infer=guide_site_infer(self))
            z2 = pyro.sample("z2", q2.to_event(1), infer=guide_site_infer(self))
        else:
            with pyro.plate(_PAIR_PLATE, batch_size):
                z = pyro.sample("z", q, infer=guide_site_infer(self))
                z2 = pyro.sample("z2", q2, infer=guide_site_infer(self))
        return z, z2

    # -- what the objective needs (rpm._objective) -------------------------------------

    def objective_inputs(self, *args, global_batch: bool = False,
                         block_size: int | None = None,
                         mask: torch.Tensor | None = None) -> ObjectiveInputs:
        """The recognition distributions, the guide's distributions (in its order) and the
        candidates of one batch, each encoder evaluated once (for :class:`~rpm.RPMELBO`);
        ``mask`` as for :meth:`model`."""
        candidates = self.candidates(global_batch)
        encoded, q = self._encode(args, mask)
        prior = self._child("prior")
        if q is None:
            pair = tuple(encoded)
            marginals = (self.pair_marginals(pair[0], pair[1], candidates)
                         if self.marginal_kind == "gaussian" else None)
            return ObjectiveInputs(prior=prior, guides=pair, recognitions=pair, plate=_PAIR_PLATE,
                                   candidates=candidates, sequence=False, marginals=marginals)
        marginal = self.marginal(q, block_size=block_size, candidates=candidates)
        guide = self.guide_distribution(q)
        return ObjectiveInputs(prior=prior, guides=(guide,), recognitions=(q, marginal),
                               plate=_JOINT_PLATE, candidates=candidates,
                               structured=self.guide_kind == "structured", sequence=True)

    @pyro_method
    def encode(self, x: torch.Tensor, *, group: int = 0) -> torch.Tensor:
        r"""The learned representation of a batch of single inputs: the recognition means
        :math:`\mathbb{E}_{Q(z|x_n)}[z]`, shape (N, D), whatever the prior (pairs, J views or
        sequences: x is N inputs as one view takes them, never stacked views).

        :param torch.Tensor x: N inputs (N, ...), each as one view takes it.
        :param int group: which recognition model embeds them (the index in ``groups``, 0 for
            the first or only one).
        :raises TypeError: for views (a list, or more than one tensor): use
            :meth:`encode_views`.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"encode takes one tensor of inputs (N, ...), got "
                            f"{type(x).__name__}; for the views of a batch use encode_views(...)")
        modules = self.modules_list
        if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < len(modules):
            raise ValueError(f"group must be an integer in [0, {len(modules)}) for this model's "
                             f"{len(modules)} recognition model(s), got {group!r}")
        return modules[group](x).mean

    def encode_views(self, *views, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The recognition means of every view of a batch, shape (N, J, D), the views given as
        :meth:`model` takes them: ``(x_1, ..., x_J)``, a list, or under a prior over J views
        one tensor (N, J, ...) (the T frames of N sequences). With ``mask`` (N, J) the missing
        views' entries are imputed: the mean of the prior's structured posterior given the
        observed views (:meth:`~rpm.priors._base.SequencePrior.posterior`; for the state-space prior the
        Kalman smoother of the recognition means)."""
        encoded, q = self._encode(views, mask)
        if q is not None and mask is not None:
            posterior = self.prior.posterior(q)
            if posterior is None:
                raise ValueError(
                    f"encode_views(..., mask=) imputes the missing views from the prior's "
                    f"structured posterior; {type(self.prior).__name__} has none")
            return torch.where(mask.unsqueeze(-1), q.mean, posterior.mean)
        if q is not None:
            return q.mean
        return torch.stack([dist.mean for dist in encoded], dim=1)

def _masked(parts: tuple, mask: torch.Tensor) -> tuple:
    """A prior over J views' recognition distributions masked over the views (``q.mask(mask)``)."""
    encoded, q = parts
    return encoded, q.mask(mask)


def _split_rows(dist: TorchDistribution, batch_size: int, num_views: int) -> list[tuple]:
    """Recognition distributions of N J frames in (N, J) order, split into the J views'
    parameters ``(loc (N, D), scale (N, D) or None)``."""
    if not isinstance(dist, Distribution) or dist.batch_shape != (batch_size * num_views,):
        got = tuple(dist.batch_shape) if isinstance(dist, Distribution) else type(dist).__name__
        raise ValueError(
            f"the recognition model returned batch_shape {got} for {batch_size * num_views} "
            "frames; it must return batch_shape (N,) for N frames")
    loc, scale = recognition_components(dist)
    loc = loc.reshape(batch_size, num_views, -1)
    scale = None if scale is None else scale.reshape(loc.shape)
    return [(loc[:, j], None if scale is None else scale[:, j]) for j in range(num_views)]
