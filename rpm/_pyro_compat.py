r"""The private Pyro and torch state rpm reads, in one place (private).

Pyro offers no public way to read a :class:`~pyro.nn.PyroModule`'s name in the param store or
to give a copied module a name of its own, and torch none to ask whether calling a module runs
anything besides its ``forward`` (hooks, a compiled call). rpm needs the first for its
parameter names (:mod:`rpm.nn`, the registration of recognition networks) and the second for
the step evaluation that skips module calls (:mod:`rpm.inference.fast_step`). Each such read
lives here, nowhere else in the package, and ``tests/test_pyro_compat.py`` checks every one
against the behaviour it stands for, so a Pyro or torch release that changes them fails there
rather than changing what rpm computes. ``setup.cfg`` bounds ``pyro-ppl`` to the minor
version the suite ran on.
"""

from __future__ import annotations

import torch
import torch.nn.modules.module as _torch_module
from pyro.nn import PyroModule
from pyro.params import param_store as _param_store

__all__ = ["MODULE_NAMESPACE_DIVIDER", "calls_forward_only", "has_pyro_samples", "pyro_name",
           "set_pyro_name", "shares_pyro_context"]

#: The separator between a module's name and a parameter's name in the store names that
#: ``pyro.module`` gives a plain ``torch.nn.Module``'s parameters (``"a.net$$$0.weight"``).
MODULE_NAMESPACE_DIVIDER: str = _param_store._MODULE_NAMESPACE_DIVIDER

# torch's global module hooks (dictionaries that the public register functions change in
# place): any of them makes every module call run code besides the module's forward.
_GLOBAL_HOOKS = (_torch_module._global_forward_hooks, _torch_module._global_forward_pre_hooks,
                 _torch_module._global_backward_hooks, _torch_module._global_backward_pre_hooks)


def pyro_name(module: PyroModule) -> str:
    """The prefix of ``module``'s parameters in Pyro's param store (its root's name and the
    attribute path from the root, e.g. ``"a.prior.energy"``)."""
    return module._pyro_name


def set_pyro_name(module: PyroModule, name: str) -> None:
    """Gives ``module`` the store prefix ``name`` (for a copy that must not share the
    original's store entries)."""
    module._pyro_name = name


def shares_pyro_context(module: PyroModule, other: PyroModule) -> bool:
    """True when ``module`` runs in ``other``'s Pyro context (it was assigned into ``other``'s
    tree): a call of ``other``'s methods covers it."""
    return module._pyro_context is other._pyro_context


def has_pyro_samples(module: PyroModule) -> bool:
    """True when ``module`` declares :class:`~pyro.nn.PyroSample` attributes of its own."""
    return bool(module.__dict__.get("_pyro_samples"))


def calls_forward_only(module: torch.nn.Module) -> bool:
    """True when calling ``module`` runs its ``forward`` and nothing else: no forward or
    backward hooks of its own or global ones, and no ``torch.compile`` of the module."""
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or any(_GLOBAL_HOOKS)
                or module.__dict__.get("_compiled_call_impl") is not None)
