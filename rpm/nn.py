r"""Modules whose parameters belong to them (as :mod:`pyro.nn`, for this package).

**Parameters belong to their module.** Inside a :class:`~pyro.nn.PyroModule`, Pyro names every
parameter after its attribute path (``"recognition.net.weight"``) and, by default, registers it
in the *global* param store under that name. Two models with the same attribute names then
share one entry: the second model's ``pyro.infer.SVI`` optimises the first model's tensors and
its own never move. Pyro's ``module_local_params`` setting avoids the store, but in Pyro 1.9 its
param statements for plain ``nn.Parameter`` s carry no ``unconstrained`` link, so ``SVI`` fails
on any model with an ordinary ``torch.nn`` network.

:class:`ScopedModule` therefore runs every call of the package's modules (recognition models,
priors, energies, and the ``model``, ``guide`` and ELBO of an RPM) inside
:func:`parameter_scope`: the global store is set aside and replaced by an empty
one for the duration of the call (:meth:`pyro.params.param_store.ParamStoreDict.scope`'s idea),
so Pyro's machinery registers, under the usual names, exactly this module's own tensors. On exit
the previous store is restored and the module's parameters are (re-)registered in it under
those names, as Pyro's default mode leaves them, so that code reading the store after a call
(``JitTrace_ELBO``, ``pyro.param(name)``, ``pyro.get_param_store()``) finds this module's
tensors. No call ever *reads* an entry left by another module, because every call starts from
an empty store: ``SVI`` sees the module's own tensors through the param sites of the call, a
``torch.optim`` loop through ``module.parameters()``; no setting is changed, the user's networks
are not converted, and two models, or one recognition model shared by two models, train side
by side with no ``pyro.clear_param_store()`` (the store then shows the parameters of the model
called last, one entry per name). A
``pyro.param`` statement that creates a parameter outside the module's tree inside a call is
refused (it would be created afresh at every call): declare it as a
:class:`~pyro.nn.PyroParam` attribute of the prior or energy instead.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import pyro
import torch
from pyro.nn import PyroModule

__all__ = ["ScopedModule", "parameter_scope"]

# Models whose parameter scope is open (a nested call of the same model reuses its scope).
_OPEN_SCOPES: list[int] = []


def _relink(state: dict) -> None:
    """Restores the ``unconstrained`` back-links that ``ParamStoreDict.get_state`` strips from
    the stored tensors (for pickling): a real-valued parameter is its own constrained value, and
    ``SVI`` reads ``value.unconstrained()`` from the param sites recorded before the swap."""
    for tensor in state["params"].values():
        tensor.unconstrained = weakref.ref(tensor)



@contextlib.contextmanager
def parameter_scope(module: torch.nn.Module) -> Iterator[None]:
    """Runs the body with an empty global param store, so that Pyro registers ``module``'s own
    tensors (under their attribute names) and nothing else; on exit the previous store is
    restored, with the module's parameters registered in it under those names (replacing
    entries of the same names). Re-entrant: a nested scope of the same module is the open one.

    :param torch.nn.Module module: the module whose parameters the body uses.
    :raises ValueError: if the body created a Pyro parameter that is not a parameter of
        ``module`` (a ``pyro.param`` statement with an initial value).
    """
    if id(module) in _OPEN_SCOPES:
        yield
        return
    store = pyro.get_param_store()
    outer = store.get_state()
    _relink(outer)  # values handed out before the call (replayed, traced) keep their links
    store.clear()
    _OPEN_SCOPES.append(id(module))
    try:
        yield
        own = {id(tensor) for tensor in module.parameters()}
        created = {name for name, tensor in store.named_parameters() if id(tensor) not in own}
        inner = store.get_state()
        _relink(inner)
    finally:
        _OPEN_SCOPES.remove(id(module))
        store.clear()
        store.set_state(outer)
    if not created:
        for name in inner["params"]:
            with contextlib.suppress(KeyError):  # a tensor held under two names maps to one
                del store[name]  # the entry this module replaces, with its reverse mapping
        store.set_state(inner)
    else:
        raise ValueError(
            f"{type(module).__name__} created the Pyro parameter(s) {sorted(created)} with "
            "pyro.param inside a call; the parameters of a model belong to its modules (and "
            "would be created afresh at every call here): declare them as PyroParam or "
            "torch.nn.Parameter attributes of the prior or energy instead"
        )


class ScopedModule(PyroModule):
    """A :class:`~pyro.nn.PyroModule` whose calls run inside :func:`parameter_scope`: its
    parameters are its own tensors whoever calls it, also when a distribution evaluates it
    lazily (``Trace_ELBO`` computes the log-densities after the model has returned). The base
    of the package's recognition models, priors, energies and models."""

    def __call__(self, *args, **kwargs):
        with parameter_scope(self):
            return super().__call__(*args, **kwargs)
