r"""The private Pyro state rpm reads, in one place (private).

Pyro offers no public way to read a :class:`~pyro.nn.PyroModule`'s name in the param store or
to give a copied module a name of its own, nor the separator of the store names of a plain
``torch.nn.Module``'s parameters; rpm needs them for its parameter names (:mod:`rpm.nn`, the
registration of recognition networks). Each such read lives here, nowhere else in the
package, and ``tests/test_pyro_compat.py`` checks every one against the behaviour it stands
for, so a Pyro release that changes them fails there rather than changing what rpm computes.
``setup.cfg`` bounds ``pyro-ppl`` to the minor version the suite ran on.
"""

from __future__ import annotations

from pyro.nn import PyroModule
from pyro.params import param_store as _param_store

__all__ = ["MODULE_NAMESPACE_DIVIDER", "pyro_name", "set_pyro_name"]

#: The separator between a module's name and a parameter's name in the store names that
#: ``pyro.module`` gives a plain ``torch.nn.Module``'s parameters (``"a.net$$$0.weight"``).
MODULE_NAMESPACE_DIVIDER: str = _param_store._MODULE_NAMESPACE_DIVIDER


def pyro_name(module: PyroModule) -> str:
    """The prefix of ``module``'s parameters in Pyro's param store (its root's name and the
    attribute path from the root, e.g. ``"a.prior.energy"``)."""
    return module._pyro_name


def set_pyro_name(module: PyroModule, name: str) -> None:
    """Gives ``module`` the store prefix ``name`` (for a copy that must not share the
    original's store entries)."""
    module._pyro_name = name
