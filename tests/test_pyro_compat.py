"""The private Pyro and torch state rpm reads (rpm._pyro_compat) still means what rpm takes it
to mean: each read is checked against the public behaviour it stands for, so a Pyro or torch
release that changes one fails here."""

import pyro
import pytest
import torch
from pyro.nn import PyroModule, PyroSample

from rpm import _pyro_compat as compat


class Leaf(PyroModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.net(x)


class Root(PyroModule):
    def __init__(self, name=""):
        super().__init__(name)
        self.leaf = Leaf()

    def forward(self, x):
        return self.leaf(x)


def test_pyro_name_is_the_prefix_of_the_store_names():
    pyro.clear_param_store()
    root = Root("compat_root")
    root(torch.ones(1, 2))
    assert compat.pyro_name(root) == "compat_root"
    assert compat.pyro_name(root.leaf) == "compat_root.leaf"
    weight = f"compat_root.leaf.net{compat.MODULE_NAMESPACE_DIVIDER}weight"
    assert weight in pyro.get_param_store()
    assert pyro.param(weight) is root.leaf.net.weight


def test_set_pyro_name_changes_the_store_names():
    pyro.clear_param_store()
    root = Root("compat_old")
    compat.set_pyro_name(root, "compat_new")
    compat.set_pyro_name(root.leaf, "compat_new.leaf")
    root(torch.ones(1, 2))
    names = set(pyro.get_param_store().keys())
    assert names == {f"compat_new.leaf.net{compat.MODULE_NAMESPACE_DIVIDER}{p}"
                     for p in ("weight", "bias")}


def test_a_child_shares_its_roots_pyro_context():
    root, other = Root(), Root()
    assert compat.shares_pyro_context(root.leaf, root)
    assert not compat.shares_pyro_context(other.leaf, root)
    # the context is what pyro_method enters: a PyroSample of the child is drawn once per call
    root.leaf.noise = PyroSample(pyro.distributions.Normal(0.0, 1.0))

    @pyro.nn.pyro_method
    def twice(module):
        return module.leaf.noise, module.leaf.noise

    first, second = twice(root)
    assert first is second


def test_has_pyro_samples():
    leaf = Leaf()
    assert not compat.has_pyro_samples(leaf)
    leaf.noise = PyroSample(pyro.distributions.Normal(0.0, 1.0))
    assert compat.has_pyro_samples(leaf)


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "full_backward", "full_backward_pre"])
def test_calls_forward_only_sees_every_hook(kind):
    module = Leaf()
    assert compat.calls_forward_only(module)
    handle = getattr(module, f"register_{kind}_hook")(lambda *args: None)
    assert not compat.calls_forward_only(module)
    handle.remove()
    assert compat.calls_forward_only(module)
    handle = getattr(torch.nn.modules.module, f"register_module_{kind}_hook")(lambda *args: None)
    try:
        assert not compat.calls_forward_only(module)
    finally:
        handle.remove()
    assert compat.calls_forward_only(module)


def test_calls_forward_only_sees_a_compiled_module():
    module = Leaf()
    module.compile()
    assert not compat.calls_forward_only(module)
