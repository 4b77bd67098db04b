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
unless one is given (:func:`unique_name`: ``"rpm"``, ``"rpm_1"``, ...), so that a model, and
also a prior or energy called on its own, never picks up an entry another module left in the
store under the same name (Pyro's :class:`~pyro.nn.PyroModule` adopts a
:class:`~pyro.nn.PyroParam` it finds in the store under its own name). A module assigned into
a model takes the model's prefix instead, as in Pyro. ``copy.deepcopy`` of a model gives the
copy a name of its own (``"a_1"`` for ``"a"``), since it holds tensors of its own.
"""

from __future__ import annotations

import copy
import threading

import torch
from pyro.nn import PyroModule
from pyro.params.param_store import _MODULE_NAMESPACE_DIVIDER

__all__ = ["NamedModule", "check_name", "unique_name"]

_TAKEN: set[str] = set()  # every name handed out or given in this process
_LOCK = threading.Lock()


def check_name(name: str) -> str:
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


def unique_name(prefix: str) -> str:
    """The first of ``prefix``, ``prefix_1``, ``prefix_2``, ... not handed out or given before in
    this process (thread-safe). A name is never handed out twice, also after its module is
    gone: Pyro's store may still hold that module's tensors under it."""
    check_name(prefix)
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
        default :func:`unique_name` of :attr:`default_name` (the class name when None). A name
        given explicitly is used as it is: two live modules given the same name share Pyro's
        store entries, as two PyroModules do.
    """

    #: The prefix of the default names; None for the class name.
    default_name: str | None = None

    def __init__(self, name: str | None = None):
        if name is None:
            base = self.default_name or type(self).__name__
            name = unique_name(base)
        else:
            base = check_name(name)
            with _LOCK:
                _TAKEN.add(name)
        super().__init__(name)
        self.__dict__["_name_base"] = base

    def __call__(self, *args, **kwargs):
        """:meth:`PyroModule.__call__ <pyro.nn.PyroModule.__call__>`; inside a call of its tree
        (its Pyro context active) it only re-enters the context, so the module is called
        directly then, without Pyro's settings lookups of the outermost call."""
        context = self.__dict__["_pyro_context"]
        if context.active:
            with context:
                return torch.nn.Module.__call__(self, *args, **kwargs)
        return super().__call__(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> NamedModule:
        """A copy with its own tensors and, when this module is the root of its tree, its own
        name (:func:`unique_name` of the name it was built from: ``"a"`` gives ``"a_1"``),
        the names of the modules under it re-prefixed alike: a copy must not share store
        entries with the original, whose tensors it no longer shares. A module inside a model
        (its name holds a ``"."``) keeps its name; the copy of the model renames it."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))  # as pickling does
        old = self._pyro_name
        if "." not in old:
            name = unique_name(self.__dict__.get("_name_base", old))
            for module in new.modules():
                if isinstance(module, PyroModule) and (module._pyro_name == old or
                                                       module._pyro_name.startswith(old + ".")):
                    module._pyro_name = name + module._pyro_name[len(old):]
        return new
