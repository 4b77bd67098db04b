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
own pairs but the mixture components (or the moments of the moment-matched Gaussian marginal)
and the implicit prior's candidates :math:`z'_j` are gathered from every rank with
:func:`rpm.distributed.all_gather_with_grad`, so the marginals and the InfoNCE normaliser run
over the global batch; the sum of the ranks' losses (and of
their gradients) is the single-process loss of the concatenated batch.
"""

from __future__ import annotations

import functools
import inspect
import weakref

import torch
from pyro.infer import ELBO, Trace_ELBO
from pyro.poutine.runtime import Message, am_i_wrapped, apply_stack

from rpm._objective import check_normaliser
from rpm._objective import elbo as objective_elbo
from rpm._validation import check_bool, check_positive_int, check_positive_int_or_none
from rpm.models._base import RPMBase, mismatched_model_and_guide
from rpm.models._checked_batches import full_checks, values_valid
from rpm.nn import pyro_method
from rpm.priors._energy_range import DeferredValuesError, deferred_value_checks

__all__ = ["RPMELBO"]

#: class -> whether its objective_inputs describes its model and guide (:func:`_describes`).
_DESCRIBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _owning_model(model, guide) -> RPMBase | None:
    """The model whose bound ``model`` and ``guide`` methods ``(model, guide)`` are, when its
    :meth:`~rpm.models._base.RPMBase.objective_inputs` describes them (:func:`_describes`); else
    None (a plain Pyro program, one wrapped in handlers such as ``poutine.scale(m.model, 2)``,
    or a subclass that redefines ``model`` or ``guide`` only: Pyro's ``Trace_ELBO`` runs it)."""
    owner: object = getattr(model, "__self__", None)
    guide_owner: object = getattr(guide, "__self__", None)
    if isinstance(owner, RPMBase) and isinstance(guide_owner, RPMBase) and guide_owner is not owner:
        raise mismatched_model_and_guide(
            owner, (id(guide_owner), type(guide_owner).__name__, guide_owner.name))
    if not isinstance(owner, RPMBase) or guide_owner is not owner:
        return None
    cls = type(owner)
    described = _DESCRIBED.get(cls)
    if described is None:
        described = _DESCRIBED[cls] = _describes(cls)
    if not described or model.__func__ is not cls.model or guide.__func__ is not cls.guide:
        return None
    return owner


def _definer(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO whose body defines ``name``."""
    return next(klass for klass in cls.__mro__ if name in vars(klass))


def _describes(cls: type) -> bool:
    """True when ``cls.objective_inputs`` describes ``cls.model`` and ``cls.guide``: no class
    below the one that defines ``objective_inputs`` redefines ``model`` or ``guide`` (a
    subclass that overrides them overrides what the objective's inputs stand for)."""
    definer = _definer(cls, "objective_inputs")
    return all(not (issubclass(_definer(cls, name), definer) and _definer(cls, name) is not definer)
               for name in ("model", "guide"))


def _handlers_scale() -> float | None:
    """The scale that the Pyro handlers active around the call apply to every log-density
    (the product of ``poutine.scale`` factors, 1.0 without handlers), or None when they do
    more than scale by one number (``poutine.mask``, a ``pyro.plate``, a tensor of scales).

    Asked as Pyro's own :func:`pyro.poutine.runtime.get_mask` asks: one message sent through
    the active handlers with :func:`~pyro.poutine.runtime.apply_stack`. Its type is no site
    type, so traces do not record it and handlers of named sites (``condition``, ``replay``,
    ``do``) do not act on it."""
    if not am_i_wrapped():
        return 1.0
    msg = Message(type="rpm_scale", name="_rpm_scale", fn=_nothing, is_observed=False, args=(),
                  kwargs={}, value=None, infer={}, scale=1.0, mask=None, cond_indep_stack=(),
                  done=False, stop=False, continuation=None)
    apply_stack(msg)
    scale = msg["scale"]
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            return None
        scale = scale.item()
    if msg["mask"] is not None or msg["cond_indep_stack"]:
        return None
    return float(scale)


def _nothing() -> None:
    return None


def _check_arguments(model, owner, args: tuple, kwargs: dict) -> None:
    """Raises a TypeError naming the model's signature when ``args`` do not fit it (e.g. two
    views given to a model that takes one tensor of stacked views)."""
    fn = model
    func = getattr(fn, "__func__", None)  # a bound method: its function, self bound to None
    try:
        if func is not None:
            if not kwargs and _takes_any_positional(func):  # e.g. RPM.model(self, *args)
                return
            _bind(func, len(args), tuple(kwargs))
        else:
            _signature(fn).bind(*args, **kwargs)
    except TypeError:
        name = f"{type(owner).__name__}.{getattr(fn, '__name__', 'model')}"
        raise TypeError(
            f"RPMELBO got {len(args)} data argument(s) ({', '.join(_describe(a) for a in args)}) "
            f"that {name}{inspect.signature(fn)} does not take; pass the model's data as its "
            "model takes it (a sequence model: one tensor x of shape (N, T, ...))"
        ) from None


@functools.lru_cache(maxsize=64)
def _signature(fn) -> inspect.Signature:
    """The signature of a model's function, read once (binding the arguments is cheap)."""
    return inspect.signature(fn)


@functools.lru_cache(maxsize=256)
def _bind(func, num_args: int, keywords: tuple) -> None:
    """Binds ``num_args`` positional arguments and the ``keywords`` to ``func(self, ...)``
    (raises TypeError when they do not fit); whether they fit depends on their number and
    names only, so a success is cached (a TypeError is not)."""
    _signature(func).bind(None, *range(num_args), **dict.fromkeys(keywords))


@functools.lru_cache(maxsize=64)
def _takes_any_positional(func) -> bool:
    """True when ``func(self, *args)`` binds any positional arguments (read once per function)."""
    params = list(_signature(func).parameters.values())[1:]
    return len(params) == 1 and params[0].kind is inspect.Parameter.VAR_POSITIONAL


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)}"
    return type(value).__name__


@pyro_method
def _evaluate(module: RPMBase, elbo: RPMELBO, args: tuple, kwargs: dict) -> torch.Tensor:
    """The ELBO of one batch (``rpm._objective.elbo``), in the model's Pyro context
    (:func:`pyro.nn.pyro_method`, as its model and guide run).

    The value checks of a batch whose structure passed before
    (:func:`~rpm.models._checked_batches.check_values`) are deferred to the implicit prior's
    range check, which makes them in its own reduction, or made here after the objective
    (:func:`~rpm.priors._energy_range.deferred_value_checks`); a batch that fails them, or an
    error raised before they were made, leads to the batch's evaluation with every check
    (:func:`~rpm.models._checked_batches.full_checks`), whose error names the input rows or the
    encoder."""
    with deferred_value_checks() as deferred:
        try:
            value = _objective(module, elbo, args, kwargs)
        except DeferredValuesError:
            valid = False
        except ValueError:
            if all(values_valid(*checks) for checks in deferred.pending):
                raise
            valid = False
        else:
            valid = all(values_valid(*checks) for checks in deferred.pending)
    if valid:
        return value
    with full_checks():
        return _objective(module, elbo, args, kwargs)


def _objective(module: RPMBase, elbo: RPMELBO, args: tuple, kwargs: dict) -> torch.Tensor:
    inputs = module.objective_inputs(*args, global_batch=elbo.global_batch,
                                     block_size=elbo.block_size, **kwargs)
    return objective_elbo(inputs, num_particles=elbo.num_particles, block_size=elbo.block_size,
                          importance_weighted=elbo.importance_weighted,
                          normaliser=elbo.normaliser)


class RPMELBO(ELBO):
    r"""The RPM evidence lower bound (Eq. 15 of Aitchison & Ganev) for ``(rpm.model, rpm.guide)``.

    A :class:`pyro.infer.ELBO`: use it with ``pyro.infer.SVI``, or call ``differentiable_loss``
    in a PyTorch loop, or ``RPMELBO()(rpm.model, rpm.guide)`` for a module whose ``forward``
    returns the differentiable loss. It agrees with ``Trace_ELBO`` on the same model (same
    random samples) to floating-point accuracy, while evaluating each encoder once per step.

    The loss is :math:`-\mathcal{L}`, the negative ELBO summed over the N pairs; with Delta
    encoders and the implicit prior, :math:`\mathcal{L}/N = -\text{InfoNCE} + \log N`.

    ``differentiable_loss(m.model, m.guide, *args)`` returns minus
    ``rpm._objective.elbo`` of ``m.objective_inputs(*args, ...)`` for any
    :class:`~rpm.models._base.RPMBase` ``m`` (:class:`~rpm.RPM`: pairs and J views), evaluated
    in the model's Pyro context (:func:`pyro.nn.pyro_method`: its parameters, and those of its
    prior and energy, are read through Pyro's param store under the model's name).

    Checks: the structural checks run on the first batch of each shape after an assignment of
    a module, and under ``pyro.enable_validation`` every batch's values are checked (the encoders'
    outputs; a non-finite one names the input rows: ``rpm.models._checked_batches``).

    Handlers: with ``(m.model, m.guide)`` of one model, ``poutine.scale`` by one number
    active around the call multiplies the loss, as it does under ``Trace_ELBO``, and
    ``poutine.trace``, ``block`` and ``seed`` do not change it (the active handlers are asked
    with one message, as :func:`pyro.poutine.runtime.get_mask` asks them). Any other program
    (a plain Pyro model and guide, ``m.model`` wrapped in handlers such as
    ``poutine.scale(m.model, 2.0)`` or ``poutine.condition``, or the model and guide of a
    subclass that redefines ``model`` or ``guide`` but not ``objective_inputs``, whose own code
    then runs), and any call under handlers
    that do more than scale by one number (``poutine.mask``, a ``pyro.plate``, a tensor
    scale), is evaluated by Pyro's ``Trace_ELBO``, which honours every handler: the same ELBO,
    with each encoder evaluated twice. Handlers of named sites (``condition``, ``replay``,
    ``do``) act on a program they wrap, not on a call they are active around.

    :param int num_particles: S, the number of samples of the batch's latents per step;
        their ELBOs are averaged (Pyro's ``num_particles``), or, with ``importance_weighted``,
        their weights are averaged inside the logarithm, per pair.
    :param bool importance_weighted: the importance-weighted bound of each pair,
        :math:`\sum_i \log \frac1S \sum_s e^{r^s_i}` with :math:`r^s_i = \log P(z^s_i,
        z'^s_i) - \log Q(z^s_i) - \log Q(z'^s_i)` the log weight of pair i in particle s
        (Burda et al. 2016; ``rpm._objective.elbo``), in place of
        :math:`\frac1S \sum_s \sum_i r^s_i`. Under the implicit prior with a finite
        positive concentration (e.g. ``ImplicitPrior(CosineEnergy(kappa, learn_kappa=True))``)
        and a :class:`~rpm.VonMisesFisherRecognition`, its optimum keeps the posterior's width
        where the averaged ELBO drives it to zero (``docs/theory.md#calibrated-posteriors``).
        It is evaluated for the bound model
        and guide of one model only (Pyro's ``RenyiELBO(alpha=0)`` weights whole traces, i.e.
        the whole batch at once, not each pair). The same as the plain ELBO for S = 1 or
        deterministic encoders.
    :param str normaliser: with ``importance_weighted``, where the implicit prior's
        normaliser :math:`\hat Z^s_i = \frac1M \sum_j e^{f(z^s_i, z'^s_j)}` goes:
        ``"particle"`` (default), inside each particle's weight,
        :math:`r^s_i = f(z^s_i, z'^s_i) - \log \hat Z^s_i`; ``"anchor"``, averaged over the
        anchor's S particles apart from the positives, :math:`\sum_i [\log \frac1S \sum_s
        e^{f(z^s_i, z'^s_i)} - \log \frac1S \sum_s \hat Z^s_i]`: MC-InfoNCE as Kirchhof et
        al. (2023) estimate it, the importance-weighted bound of the model whose pair prior is
        normalised over the anchor's posterior (``docs/theory.md#calibrated-posteriors``, C6),
        whose normaliser is averaged over S M terms and so is far less noisy for small S.
        Implicit prior (:class:`~rpm.priors.ImplicitPrior`) only.
    :param bool global_batch: under ``torch.distributed``, use every rank's batch: the
        mixture marginals, the implicit prior's negatives and the moments of
        ``marginal="gaussian"`` are gathered from all ranks
        (:func:`~rpm.distributed.all_gather_with_grad`) while each rank keeps its own pairs.
        The loss is this rank's share; summed over ranks it is the loss of the concatenated
        batch (``DistributedDataParallel`` averages gradients, i.e. divides that gradient by
        the number of ranks). Without ``torch.distributed`` it changes nothing.
    :param block_size: evaluate the mixture marginals and the InfoNCE normaliser in blocks of
        this many rows and columns (O(N D) memory, :mod:`rpm.ops`); ``None`` streams
        automatically for large batches.
    """

    def __init__(self, num_particles: int = 1, global_batch: bool = False,
                 block_size: int | None = None, importance_weighted: bool = False,
                 normaliser: str = "particle"):
        num_particles = check_positive_int("num_particles", num_particles)
        global_batch = check_bool("global_batch", global_batch)
        importance_weighted = check_bool("importance_weighted", importance_weighted)
        normaliser = check_normaliser(normaliser, importance_weighted)
        block_size = check_positive_int_or_none("block_size", block_size)
        super().__init__(num_particles=num_particles)
        self.global_batch = global_batch
        self.block_size = block_size
        self.importance_weighted = importance_weighted
        self.normaliser = normaliser

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """The negative ELBO as a differentiable scalar tensor; ``args`` are the model's data
        (``(x, x2)`` for an :class:`~rpm.RPM`)."""
        owner = _owning_model(model, guide)
        scale = _handlers_scale() if owner is not None else None
        if scale is None:  # another program, or handlers that do more than scale
            return self._trace_elbo(model, guide, args, kwargs)
        _check_arguments(model, owner, args, kwargs)
        loss = -_evaluate(owner, self, args, kwargs)  # in the model's Pyro context
        return loss if scale == 1.0 else scale * loss

    def _trace_elbo(self, model, guide, args: tuple, kwargs: dict) -> torch.Tensor:
        """Pyro's ``Trace_ELBO`` of ``(model, guide)`` with this ELBO's particles."""
        if self.global_batch:
            raise NotImplementedError(
                "RPMELBO(global_batch=True) evaluates the bound model and guide of an rpm.RPM "
                "without Pyro handlers around them (other than poutine.scale by one number); "
                f"got model={model!r}, guide={guide!r}: call it with model.model, model.guide")
        if self.importance_weighted and self.num_particles > 1:
            raise NotImplementedError(
                "RPMELBO(importance_weighted=True) weights each pair of the bound model and guide "
                "of an rpm.RPM, called without Pyro handlers around them (other than "
                f"poutine.scale by one number); got model={model!r}, guide={guide!r}: call it "
                "with model.model, model.guide")
        elbo = Trace_ELBO(num_particles=self.num_particles, vectorize_particles=False)
        return elbo.differentiable_loss(model, guide, *args, **kwargs)

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
