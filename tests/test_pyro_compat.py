"""The private Pyro state rpm reads (rpm._pyro_compat) still means what rpm takes it
to mean: each read is checked against the public behaviour it stands for, so a Pyro
release that changes one fails here."""

import pyro
import torch
from pyro.nn import PyroModule

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
