r"""Modules whose parameters have their own names in Pyro's param store (as :mod:`pyro.nn`).

**Parameters the Pyro way.** Inside a :class:`~pyro.nn.PyroModule` tree, Pyro names every
parameter after the root's ``name`` and the attribute path, and registers it under that name in
the global param store when the tree runs:

* a :class:`~pyro.nn.PyroParam` ``lengthscale`` of the energy of the prior of an RPM named
  ``"a"`` is the store entry ``"a.prior.energy.lengthscale"``;
* a plain ``torch.nn.Module`` attribute (the user's network, never converted) is registered with
  :func:`pyro.module`, so its weights are ``"a.recognition.net$$$0.weight"``, ...

(``pyro/nn/module.py``: a sub-``PyroModule`` takes its parent's name as prefix when it is
assigned as an attribute, and its parent's context.) Two models with distinct root names
therefore never share a store entry, and every route Pyro offers works on the global store as
it is: ``SVI`` with ``Trace_ELBO``, ``TraceGraph_ELBO``, ``JitTrace_ELBO`` (whose compiled graph
reads ``pyro.param(name)``) or :class:`~rpm.RPMELBO`; a ``torch.optim`` loop over
``model.parameters()``; ``pyro.get_param_store().save()`` and ``pyro.param(name)``.

:class:`NamedModule` gives each module of this package a name that is unique in the process
unless one is given (``_unique_name``: ``"rpm"``, ``"rpm_1"``, ...), so that a model, and
also a prior or energy called on its own, never picks up an entry another module left in the
store under the same name (Pyro's :class:`~pyro.nn.PyroModule` adopts a
:class:`~pyro.nn.PyroParam` it finds in the store under its own name). A module assigned into
a model takes the model's prefix instead, as in Pyro. ``copy.deepcopy`` of a model gives the
copy a name of its own (``"a_1"`` for ``"a"``), since it holds tensors of its own.

**Assignments.** Every assignment of an attribute of a :class:`NamedModule` (a prior, an
energy, a recognition model, ``noise_scale``) or an item of a :class:`NamedModuleList` gives a
new ``_structure_version``: a model decides its checks and its dispatch under one version
and decides them again under the next, so what was decided for the modules it held before is
never reused for the modules it holds now.

The private Pyro state these modules read (a module's store prefix) is read through
``rpm._pyro_compat``.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import itertools
import threading

import pyro.nn
import torch
from pyro.nn import PyroModule, PyroModuleList

from rpm._pyro_compat import MODULE_NAMESPACE_DIVIDER as _MODULE_NAMESPACE_DIVIDER
from rpm._pyro_compat import pyro_name, set_pyro_name

__all__ = ["NamedModule", "NamedModuleList", "pyro_method"]

_TAKEN: set[str] = set()  # every name handed out or given in this process
_LOCK = threading.Lock()
_VERSIONS = itertools.count(1)
_version = 0
# The recognition modules whose networks were registered with Pyro in the current outermost
# call of a model's method (None outside one): see pyro_method.
_REGISTERED: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "rpm_registered_networks", default=None)


def _structure_version() -> int:
    """A number that changes whenever an attribute of a :class:`NamedModule` or a
    :class:`NamedModuleList` is assigned or deleted (a prior, an energy, a recognition model,
    a network, ``noise_scale``, ...; attributes whose names begin with ``_`` only when the
    value is a module). A model's checks and dispatch decided under one version hold while it
    is current; any assignment, in any model, makes them be decided again."""
    return _version


def _structure_changed() -> None:
    global _version
    _version = next(_VERSIONS)


def _changes_structure(name: str, value) -> bool:
    return not name.startswith("_") or isinstance(value, torch.nn.Module)


def pyro_method(fn):
    """:func:`pyro.nn.pyro_method` (the method runs in the module's Pyro context), and the
    outermost such call of the package's modules opens a registration scope: a recognition
    network is registered with Pyro (``pyro.module``) once per outermost call, however many
    views it encodes (``_registration_scope``)."""
    inner = pyro.nn.pyro_method(fn)

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        if _REGISTERED.get() is not None:
            return inner(self, *args, **kwargs)
        token = _REGISTERED.set([])
        try:
            return inner(self, *args, **kwargs)
        finally:
            _REGISTERED.reset(token)

    return method


def _registration_scope() -> list | None:
    """The list of the modules whose networks the current outermost :func:`pyro_method` call
    registered with Pyro (to be appended to), or None outside such a call."""
    return _REGISTERED.get()


def _check_name(name: str) -> str:
    """Returns ``name`` if it can prefix Pyro parameter names.

    :raises TypeError: if it is not a string.
    :raises ValueError: if it is empty or holds Pyro's module separator ``"$$$"``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string (the prefix of the parameters' names in Pyro's "
                        f"param store), got {type(name).__name__}")
    if not name or _MODULE_NAMESPACE_DIVIDER in name:
        raise ValueError(f"name must be a non-empty string without {_MODULE_NAMESPACE_DIVIDER!r}, "
                         f"got {name!r}")
    return name


def _unique_name(prefix: str) -> str:
    """The first of ``prefix``, ``prefix_1``, ``prefix_2``, ... not handed out or given before in
    this process (thread-safe). A name is never handed out twice, also after its module is
    gone: Pyro's store may still hold that module's tensors under it."""
    _check_name(prefix)
    with _LOCK:
        name, count = prefix, 0
        while name in _TAKEN:
            count += 1
            name = f"{prefix}_{count}"
        _TAKEN.add(name)
    return name


class NamedModule(PyroModule):
    """A :class:`~pyro.nn.PyroModule` with a process-unique default name: the base of the
    package's recognition models, priors, energies and models.

    :param name: the prefix of its parameters' names in Pyro's param store when it is the root
        of its tree (a module assigned into a model takes the model's prefix, as in Pyro). By
        default ``_unique_name`` of :attr:`default_name` (the class name when None). A name
        given explicitly is used as it is: two live modules given the same name share Pyro's
        store entries, as two PyroModules do.
    """

    #: The prefix of the default names; None for the class name.
    default_name: str | None = None

    def __init__(self, name: str | None = None):
        if name is None:
            base = self.default_name or type(self).__name__
            name = _unique_name(base)
        else:
            base = _check_name(name)
            with _LOCK:
                _TAKEN.add(name)
        super().__init__(name)
        self.__dict__["_name_base"] = base

    @property
    def name(self) -> str:
        """The prefix of this module's parameters in Pyro's param store (read-only, set at
        construction): for the root of a tree the name given or the default
        (``_unique_name``: ``"rpm"``, ``"rpm_1"``, ...); for a module inside a model, the
        model's name and the attribute path (``"a.prior"``, ``"a.prior.energy"``). Every store
        entry of the module begins with ``name + "."``: ``"a.prior.energy.lengthscale"`` for a
        :class:`~pyro.nn.PyroParam`, ``"a.recognition.net$$$0.weight"`` for the weights of a
        plain ``torch.nn.Module`` it holds."""
        return pyro_name(self)

    def __setattr__(self, name: str, value) -> None:
        """:meth:`PyroModule.__setattr__ <pyro.nn.PyroModule.__setattr__>`, and a new
        ``_structure_version`` (the checks and dispatch of every model are decided again)."""
        super().__setattr__(name, value)
        if _changes_structure(name, value):
            _structure_changed()

    def __delattr__(self, name: str) -> None:
        """:meth:`PyroModule.__delattr__`, and a new ``_structure_version``."""
        super().__delattr__(name)
        _structure_changed()

    def __deepcopy__(self, memo: dict) -> NamedModule:
        """A copy with its own tensors and, when this module is the root of its tree, its own
        name (``_unique_name`` of the name it was built from: ``"a"`` gives ``"a_1"``),
        the names of the modules under it re-prefixed alike: a copy must not share store
        entries with the original, whose tensors it no longer shares. A module inside a model
        (its name holds a ``"."``) keeps its name; the copy of the model renames it."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))  # as pickling does
        old = pyro_name(self)
        if "." not in old:
            name = _unique_name(self.__dict__.get("_name_base", old))
            for module in new.modules():
                if isinstance(module, PyroModule) and (pyro_name(module) == old or
                                                       pyro_name(module).startswith(old + ".")):
                    set_pyro_name(module, name + pyro_name(module)[len(old):])
        return new


class NamedModuleList(PyroModuleList):
    """A :class:`~pyro.nn.PyroModuleList` whose item assignments (``models[0] = module``) give
    a new ``_structure_version``, as a :class:`NamedModule`'s attribute assignments do."""

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if _changes_structure(name, value) or name.isdigit():
            _structure_changed()

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        _structure_changed()
