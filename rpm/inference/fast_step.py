r"""The specialised evaluation of an RPM step that :class:`~rpm.RPMELBO` takes when it provably
computes what the model's own code computes (private).

For the step that SSL training runs most, an :class:`~rpm.RPM` with deterministic encoders
(:class:`~rpm.DeltaRecognition`) and an implicit prior on a small batch, the ELBO of Eq. 15 of
Aitchison & Ganev is, per pair (Eq. 23-25),

.. math::

    \mathcal{L} = \sum_i \Big[f(z_i, z'_i) - \log \frac1N \sum_j e^{f(z_i, z'_j)}\Big],
    \qquad z_i = \mu(x_i),\ z'_i = \mu(x'_i),

and over J views under :class:`~rpm.priors.MarkovImplicitPrior` the sum of these terms over
the consecutive views. The arithmetic is a handful of kernels; the generic evaluation
(:func:`rpm.inference.objective.elbo` on :meth:`rpm.RPM.objective_inputs`) wraps it in module
calls, distribution objects and the prior's dispatch, about as much Python time again for a
small model (``benchmarks/README.md``, step overhead). :func:`evaluate` computes the same
number with the same kernels, in the same order, directly: the encoder networks are called
(through their own ``__call__``, so their hooks run), the energy's own ``forward`` is called
without its module call, and the loss is the sum of :math:`-\log N - \log
\operatorname{softmax}(F)_{ii}`, bit for bit minus the InfoNCE terms of
:func:`~rpm.ops.diagonal_log_softmax`, the implicit priors' dense path (:func:`evaluate`
returns the loss, minus the ELBO).

**When.** :func:`plan` returns a plan only when every piece of code the generic path would run
is the library's own, so that skipping it changes nothing:

* the model's class is :class:`~rpm.RPM` or a subclass that overrides none of its methods
  (its ``model``, ``guide``, ``objective_inputs``, the encoding: every attribute defined by
  ``RPM`` and its bases in this package, compared by the class that defines it; ``__init__``
  may differ); the prior is an unmodified :class:`~rpm.priors.ImplicitPrior` (pairs) or
  :class:`~rpm.priors.MarkovImplicitPrior` (J views) without a queue, on the batch's own
  candidates (``RPMELBO(global_batch=False)``), dense (no ``block_size``, a matrix below the
  streaming threshold of :func:`~rpm.ops.dispatch.use_streaming`), one particle;
* the energy is a built-in energy or a subclass whose ``forward`` is a built-in one (as
  :mod:`rpm.priors.energy_paths` decides for its hooks; a subclass that overrides ``forward``
  takes the generic path), and the recognition models are unmodified
  :class:`~rpm.DeltaRecognition` or :class:`~rpm.GaussianRecognition` (only deterministic
  Delta encoders are evaluated inline; the others are called as the generic path calls them);
* the modules whose call is skipped (the energy, the recognition models) have no forward or
  backward hooks, global ones included, are not compiled, and share the model's Pyro context;
* the batch's signature passed the model's structural checks before, under the current
  :func:`~rpm.nn.structure_version` (:mod:`rpm.models.checked_batches`): the first batch of
  each shape, dtype and device after an assignment takes the generic path. Under
  ``pyro.enable_validation`` every step checks its values too: the latents' shapes, and the
  finiteness of the views and latents in the one reduction of the implicit priors' range
  check (:func:`~rpm.priors.energy_range.check_implicit_log_ratio`); a step it refuses is
  evaluated again by :class:`~rpm.RPMELBO` with every check, which names what is wrong;
* no call arguments beyond the views (no ``mask``), not while tracing or compiling.

Anything else is the generic path, unchanged. The class checks are decided once per
:func:`~rpm.nn.structure_version` (cached on the model, decided again after any assignment);
the hooks, the batch's signature and the sizes at every step. The private torch and Pyro
state these checks read is read through ``rpm._pyro_compat``.
The evaluation runs in the model's Pyro context, as the generic path does, unless nothing in
it reads Pyro state (:func:`needs_context`). Pyro's messages are the same on both paths (the
recognition networks' registration, the energy's parameters), so ``SVI``'s parameter capture
and the handlers :class:`~rpm.RPMELBO` honours see the same parameters. ``RPMELBO(fast_path=
False)`` always takes the generic path.
"""

from __future__ import annotations

import math
import weakref
from contextlib import nullcontext
from typing import NamedTuple

import pyro
import torch
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule
from pyro.poutine.runtime import am_i_wrapped

from rpm._pyro_compat import (
    calls_forward_only,
    has_pyro_samples,
    pyro_name,
    shares_pyro_context,
)
from rpm.inference.objective import _rsample
from rpm.models.checked_batches import passed, signature, skipped_checks
from rpm.models.recognition import (
    DeltaRecognition,
    GaussianRecognition,
    _check_batch,
    _check_finite,
    _network,
)
from rpm.models.rpm import RPM
from rpm.models.views import call_encoder, encode_views
from rpm.nn import structure_version
from rpm.ops.dispatch import use_streaming
from rpm.priors.energies import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
)
from rpm.priors.energy_range import check_implicit_log_ratio
from rpm.priors.implicit import ImplicitPrior
from rpm.priors.sequence import _STACKED_LIMIT, MarkovImplicitPrior

__all__ = ["Plan", "evaluate", "needs_context", "plan"]

#: The energies whose ``forward`` the fast path calls directly.
_BUILTIN_ENERGIES = (AnisotropicEnergy, BilinearEnergy, CosineEnergy, LpEnergy, NeuralEnergy,
                     RBFEnergy)
#: Attributes a subclass may redefine without changing what a step computes.
_FREE = frozenset({"__init__", "__doc__", "__module__", "__qualname__", "__dict__", "__weakref__",
                   "__annotations__", "__firstlineno__", "__static_attributes__", "default_name"})
#: (class, library class) -> whether the class overrides nothing of the library class.
_UNMODIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: energy class -> whether its forward is a built-in energy's and its call is the module call.
_ENERGIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: The views' names of a pair (RPM._views).
_PAIR_NAMES = ("x", "x2")
#: The attribute of a model holding :func:`plan`'s decision for its modules.
_CACHE = "_rpm_fast_step"


class Plan(NamedTuple):
    """What :func:`evaluate` needs of one step (built by :func:`plan`)."""

    #: The prior (:class:`~rpm.priors.ImplicitPrior` or :class:`~rpm.priors.MarkovImplicitPrior`).
    prior: object
    #: The energy f.
    energy: object
    #: The recognition models, in the order ``groups`` indexes them.
    modules: tuple
    #: ``groups[j]``, the index of view j's recognition model.
    groups: list
    #: The views' names (for the encoder's dtype error).
    names: list
    #: The J views, each (N, ...).
    views: list
    #: The stacked input (N, J, ...) when the call gave one tensor, else None.
    stacked: torch.Tensor | None
    #: True when every recognition model is a deterministic Delta (evaluated inline).
    deltas: bool
    #: True for a prior over J views (MarkovImplicitPrior), False for a pair prior.
    joint: bool


def _owner(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO whose body defines ``name`` (None if none does)."""
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def unmodified(cls: type, library: type) -> bool:
    """True when ``cls`` is ``library`` or a subclass that redefines none of the attributes of
    ``library`` and its bases (methods, properties, class attributes; ``__init__`` and
    ``default_name`` aside): every call of the library's methods then runs the library's
    code. Cached per class."""
    cached = _UNMODIFIED.get(cls)
    if cached is not None and library in cached:
        return cached[library]
    result = cls is library
    if not result and issubclass(cls, library):
        names = {name for klass in library.__mro__ if klass is not object for name in vars(klass)}
        result = all(_owner(cls, name) is _owner(library, name) for name in names - _FREE)
    _UNMODIFIED.setdefault(cls, {})[library] = result
    return result


def _builtin_energy(cls: type) -> bool:
    """True when ``cls.forward`` is a built-in energy's and a call of it is the module call (no
    override of ``__call__`` or torch's call machinery). Cached per class."""
    cached = _ENERGIES.get(cls)
    if cached is None:
        cached = (_owner(cls, "forward") in _BUILTIN_ENERGIES
                  and _owner(cls, "__call__") is PyroModule
                  and _owner(cls, "_call_impl") is torch.nn.Module
                  and _owner(cls, "_wrapped_call_impl") is torch.nn.Module)
        _ENERGIES[cls] = cached
    return cached


class _Decision(NamedTuple):
    """What :func:`plan` decides once for a model's modules, under one
    :func:`~rpm.nn.structure_version` (decided again after any assignment of a module or an
    attribute): whether their classes allow the fast path."""

    #: The structure version it was decided under.
    version: int
    #: The prior, its pair prior (itself for a pair prior) and the energy.
    prior: object
    pair: object
    energy: object
    #: The recognition models in the order ``groups`` indexes them.
    modules: tuple
    #: Whether every class is the library's own (module docstring) and every module whose
    #: call is skipped runs in the model's Pyro context.
    eligible: bool
    #: A prior over J views (MarkovImplicitPrior) rather than a pair prior.
    joint: bool
    #: Every recognition model is a DeltaRecognition (deterministic when its noise_scale is 0).
    delta_classes: bool
    #: The modules whose call the fast path skips (the energy, the recognition models).
    plain: tuple


def _children(model) -> tuple:
    """The model's prior, its pair prior (itself for a pair prior) and its energy, read from
    the modules' dictionaries."""
    prior = model._modules.get("prior")
    inner = getattr(prior, "_modules", {})
    pair = inner.get("pair") if isinstance(prior, MarkovImplicitPrior) else prior
    energy = getattr(pair, "_modules", {}).get("energy")
    return prior, pair, energy


def _decide(model, version: int) -> _Decision:
    """The class checks of :func:`plan` for the model's current modules."""
    prior, pair, energy = _children(model)
    modules = tuple(model.modules_list)
    eligible = (unmodified(type(model), RPM) and isinstance(pair, ImplicitPrior)
                and unmodified(type(pair), ImplicitPrior)
                and (pair is prior or unmodified(type(prior), MarkovImplicitPrior))
                and _builtin_energy(type(energy)))
    delta_classes = True
    for module in modules:
        if unmodified(type(module), GaussianRecognition):
            delta_classes = False
        elif not unmodified(type(module), DeltaRecognition):
            eligible = False
    plain = (energy, *modules)
    eligible = eligible and all(isinstance(module, PyroModule)
                                and shares_pyro_context(module, model) for module in plain)
    return _Decision(version, prior, pair, energy, modules, eligible, pair is not prior,
                     delta_classes, plain)


def _decision(model) -> _Decision:
    """The model's :class:`_Decision`, cached on the model while the structure version is the
    same."""
    version = structure_version()
    decision = model.__dict__.get(_CACHE)
    if decision is None or decision.version != version:
        decision = _decide(model, version)
        model.__dict__[_CACHE] = decision
    return decision


def plan(model, elbo, args: tuple, kwargs: dict, tracing: bool | None = None) -> Plan | None:
    """The plan of the fast evaluation of ``elbo`` on ``model`` for the data ``args``, or None
    when the step takes the generic path (module docstring). Never raises: a batch the generic
    path would refuse gets None, and the generic path names what is wrong. The class checks are
    made once per set of modules (cached on the model); the hooks, the Pyro contexts, the
    batch's signature and the sizes at every step.

    :param model: the model behind ``(model.model, model.guide)``.
    :param elbo: the :class:`~rpm.RPMELBO`.
    :param tuple args: the model's data arguments.
    :param dict kwargs: the keyword arguments of the call.
    :param tracing: whether torch is tracing or compiling (None: asked here).
    """
    if (kwargs or elbo.num_particles != 1 or elbo.block_size is not None or elbo.global_batch
            or model.queue is not None):
        return None
    if tracing is None:
        tracing = torch.jit.is_tracing() or torch.compiler.is_compiling()
    decision = _decision(model)
    if tracing or not decision.eligible or decision.joint == (len(args) == 2):
        return None  # a pair prior takes (x, x2), a prior over J views a list or a stack
    for module in decision.plain:  # hooks are registered without an assignment: every step
        if not calls_forward_only(module):
            return None
    modules = decision.modules
    try:
        if decision.joint:
            names, views, stacked = model._views(args)
        else:  # RPM._views of two views, without building the lists
            names, views, stacked = _PAIR_NAMES, args, None
        groups = model._groups(len(views), modules)
        num, frames = views[0].shape[0], len(views) - 1
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    if not passed(model, signature(views, decision.version)):
        return None  # the first batch of a signature runs every check, on the generic path
    if frames > 1 and (num * frames) ** 2 > _STACKED_LIMIT:
        return None  # MarkovImplicitPrior's steps one by one
    if frames == 1 and use_streaming(num, num, views[0].device):
        return None
    deltas = decision.delta_classes and all(module.noise_scale == 0.0 for module in modules)
    return Plan(decision.prior, decision.energy, modules, groups, names, views, stacked, deltas,
                decision.joint)


def needs_context(step: Plan) -> bool:
    """Whether :func:`evaluate` must run in the model's Pyro context (``pyro_method``) to do
    what the generic path does there, or may run without it (a torch loop over a parameter-free
    energy, e.g. ``CosineEnergy`` with a fixed kappa).

    The context matters for three things only: Pyro handlers (SVI's parameter capture, a
    trace), which receive the parameters' messages; the energy's parameters (a ``PyroParam`` or
    a parameter of a ``PyroModule`` is read through the param store inside the context); and the
    registration of a recognition network that the store does not hold (after
    ``pyro.clear_param_store()``: inside the context it is registered again). So the context
    is skipped only with no handler active, Pyro's module-local parameters off, an energy
    without parameters or submodules, deterministic Delta encoders whose plain ``torch.nn``
    networks the store holds (the check of ``rpm.models.recognition._network``, which then
    returns the network and registers nothing, inside the context or not)."""
    if am_i_wrapped() or not step.deltas or pyro.settings.get("module_local_params"):
        return True
    energy = step.energy.__dict__  # a PyroParam is held as the parameter "<name>_unconstrained"
    if energy["_parameters"] or energy["_modules"] or has_pyro_samples(step.energy):
        return True
    store = pyro.get_param_store()
    for module in step.modules:
        cached = module.__dict__.get("_registration")
        if (cached is None or cached[0] != pyro_name(module)
                or isinstance(module._modules["net"], PyroModule)
                or (cached[1] is not None and cached[1] not in store)):
            return True
    return False


def _delta_latents(step: Plan, encoder_calls: str, batch_size: int) -> list[torch.Tensor]:
    """The latents of the J views under deterministic Delta encoders: what
    :func:`~rpm.models.views.encode_views` and ``DeltaRecognition.forward`` give, each (N, D),
    with the latent checks a recognition model keeps when asked to (``validate=True``)."""
    modules, views, names, groups = step.modules, step.views, step.names, step.groups
    if encoder_calls == "per_view" and len(modules) == 1:  # one network for every view
        module = modules[0]
        net = _network(module)
        latents = [call_encoder(net, view, name) for view, name in zip(views, names, strict=True)]
        if _checks_latents(module):  # finiteness: in the range check's reduction
            for loc, view in zip(latents, views, strict=True):
                _check_batch("latents", loc, view.shape[0])
                if module.validate:
                    _check_finite("latents", loc)
        return latents
    if encoder_calls == "per_view" or len(views) == 1:
        return [_delta(modules[g], view, name) for name, view, g in zip(names, views, groups,
                                                                          strict=True)]
    latents = [None] * len(views)
    for g in sorted(set(groups)):
        members = [j for j in range(len(views)) if groups[j] == g]
        if len(members) == 1:
            latents[members[0]] = _delta(modules[g], views[members[0]], names[members[0]])
            continue
        joint = _delta(modules[g], torch.cat([views[j] for j in members]),
                       "the views " + ", ".join(names[j] for j in members))
        for j, part in zip(members, joint.chunk(len(members)), strict=True):
            latents[j] = part
    return latents


def _delta(module: DeltaRecognition, value: torch.Tensor, name: str) -> torch.Tensor:
    """``module(value).v``: the latents of a deterministic :class:`~rpm.DeltaRecognition` as its
    ``forward`` computes them on a batch whose signature passed the checks."""
    loc = call_encoder(_network(module), value, name)
    if _checks_latents(module):  # finiteness: in the range check's reduction
        _check_batch("latents", loc, value.shape[0])
        if module.validate:
            _check_finite("latents", loc)
    return loc


def _views_latents(model, step: Plan, batch_size: int) -> torch.Tensor:
    """The J views' latents in step-major order, ``(J N, D)``: rows ``t N ... (t + 1) N - 1``
    hold view t (the order of ``MarkovImplicitPrior``'s stacked matrix)."""
    encoder_calls = model.encoder_calls
    if step.deltas:
        if step.stacked is not None and encoder_calls == "concat" and len(step.modules) == 1:
            flat = step.stacked.reshape(batch_size * len(step.views), *step.stacked.shape[2:])
            loc = call_encoder(_network(step.modules[0]), flat, "x")               # (N J, D)
            if _checks_latents(step.modules[0]):
                _check_batch("latents", loc, flat.shape[0])
                if step.modules[0].validate:
                    _check_finite("latents", loc)
            return loc.reshape(batch_size, len(step.views), -1).transpose(0, 1).reshape(
                batch_size * len(step.views), -1)
        return torch.cat(_delta_latents(step, encoder_calls, batch_size))
    # stochastic recognition: the generic path's distributions and one draw of "z" (N, J, D)
    validating = is_validation_enabled()
    with nullcontext() if validating else skipped_checks():  # validation: every batch
        _, q = model._encode_views(step.names, step.views, step.stacked, step.modules,
                                   step.groups, batch_size, True, check=validating)
    z = q.to_event(1).rsample()
    return z.transpose(0, 1).reshape(z.shape[0] * z.shape[1], z.shape[2])


def evaluate(model, step: Plan) -> torch.Tensor:
    """Minus the ELBO of the step (minus the number :func:`rpm.inference.objective.elbo` gives on
    ``model.objective_inputs(*args)``: the loss), to be called in the model's Pyro context
    unless :func:`needs_context` says it need not be.

    :param model: the :class:`~rpm.RPM`.
    :param Plan step: :func:`plan`'s result for this step.
    :return: a scalar tensor.
    """
    energy, batch_size = step.energy, step.views[0].shape[0]
    if not step.joint:
        if step.deltas:
            z, z2 = _delta_latents(step, model.encoder_calls, batch_size)
        else:
            validating = is_validation_enabled()
            with nullcontext() if validating else skipped_checks():  # validation: every batch
                q, q2 = encode_views(step.names, step.views, step.modules, step.groups,
                                     model.encoder_calls, batch_size, check=validating)
            z, z2 = _rsample(q), _rsample(q2)
        # ImplicitPrior.log_ratio, dense, the batch's own candidates
        negative = _negative_terms(energy.forward(z, z2))                              # (N,)
        check_implicit_log_ratio(type(step.prior).__name__, energy, [z, z2], negative,
                                 _inputs(step))
        return negative.sum()
    frames = _views_latents(model, step, batch_size)                       # (J N, D)
    steps = len(step.views) - 1
    anchors, partners = frames[:-batch_size], frames[batch_size:]
    if steps == 1:  # MarkovImplicitPrior.log_ratio through the pair prior's dense path
        negative = _negative_terms(energy.forward(anchors, partners))
        check_implicit_log_ratio(type(step.prior.pair).__name__, energy, [anchors, partners],
                                 negative, _inputs(step))
        return negative.sum()
    # MarkovImplicitPrior._stacked_log_ratio: step t's (N, N) block of one energy matrix
    full = energy.forward(anchors, partners).reshape(steps, batch_size, steps, batch_size)
    blocks = full.diagonal(dim1=0, dim2=2).permute(2, 0, 1)                    # (T - 1, N, N)
    negative = _negative_terms(blocks).sum(0)                                  # (N,)
    check_implicit_log_ratio(type(step.prior).__name__, energy, [frames], negative,
                             _inputs(step))
    return negative.sum()


def _inputs(step: Plan) -> list[torch.Tensor]:
    """The views whose finiteness the implicit prior's range check reads in its reduction."""
    return [step.stacked] if step.stacked is not None else list(step.views)


def _checks_latents(module) -> bool:
    """Whether the latents of a recognition model are checked on this step: asked to
    (``validate=True``), or following Pyro's validation (``None``, every batch)."""
    return module.validate or (module.validate is None and is_validation_enabled())


def _negative_terms(logits: torch.Tensor) -> torch.Tensor:
    r"""Minus :func:`~rpm.ops.diagonal_log_softmax` of the (..., N, N) logits with the offset
    :math:`\log N`: :math:`-\log N - \log\operatorname{softmax}(F)_{ii}`, one autograd node
    (``rsub``) where the terms and their negation are two. Bit for bit the negated terms: IEEE
    rounding is symmetric, :math:`\mathrm{fl}(-a - b) = -\mathrm{fl}(a + b)`."""
    diagonal = torch.log_softmax(logits, dim=-1).diagonal(dim1=-2, dim2=-1)        # (..., N)
    return torch.rsub(diagonal, -math.log(logits.shape[-1]))
