"""``rpm.nn``: the parameter scope sets the global param store aside for the duration of a call
and restores it, and two modules with the same attribute names keep their own tensors; the
values they compute are checked against the same formula evaluated by hand with each module's
own weights."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from rpm.nn import ScopedModule, parameter_scope


class Regression(ScopedModule):
    """y ~ Normal(x w + b, 1): one ``nn.Linear`` under the attribute name ``net``."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Linear(3, 1).double()
        self.store_names_inside = None

    def forward(self, x, y):
        self.store_names_inside = sorted(pyro.get_param_store().keys())
        loc = self.net(x).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(loc, 1.0), obs=y)


def _log_likelihood_by_hand(module, x, y):
    """sum_n log N(y_n; x_n . w + b, 1), written out with the module's own weights."""
    w = module.net.weight.detach()[0]
    b = module.net.bias.detach()[0]
    total = 0.0
    for n in range(x.shape[0]):
        residual = (y[n] - (x[n] @ w + b)).item()
        total += -0.5 * residual**2 - 0.5 * math.log(2 * math.pi)
    return total


def _data():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    y = torch.randn(6, generator=generator, dtype=torch.float64)
    return x, y


def test_scope_empties_the_store_during_the_call_and_restores_it_after():
    pyro.clear_param_store()
    outside = pyro.param("outside", torch.tensor([1.0, 2.0]))
    module = Regression(seed=0)
    x, y = _data()
    module(x, y)
    assert module.store_names_inside == []  # nothing from outside is visible in the call
    store = pyro.get_param_store()
    assert store["outside"] is outside  # the entry set aside is back, the same tensor
    # and beside it exactly the module's own two tensors, registered by the call
    others = [value for name, value in store.items() if name != "outside"]
    assert len(others) == 2
    assert {id(value) for value in others} == {id(p) for p in module.parameters()}
    pyro.clear_param_store()


def test_two_modules_with_the_same_attribute_names_keep_their_own_tensors():
    pyro.clear_param_store()
    first, second = Regression(seed=0), Regression(seed=1)
    assert not torch.equal(first.net.weight, second.net.weight)
    x, y = _data()
    for module in (first, second, first):
        trace = pyro.poutine.trace(module).get_trace(x, y)
        # the log-likelihood of each call is that of its own weights, computed by hand
        assert trace.log_prob_sum().item() == pytest.approx(_log_likelihood_by_hand(module, x, y),
                                                             rel=1e-12)
        params = [site["value"] for site in trace.nodes.values() if site["type"] == "param"]
        assert {id(value) for value in params} == {id(p) for p in module.parameters()}
    # SVI on the second model moves only the second model's tensors
    first_before = [p.detach().clone() for p in first.parameters()]
    second_before = [p.detach().clone() for p in second.parameters()]
    svi = pyro.infer.SVI(second, lambda x, y: None, pyro.optim.SGD({"lr": 0.1}),
                         pyro.infer.Trace_ELBO())
    for _ in range(3):
        svi.step(x, y)
    for before, after in zip(first_before, first.parameters(), strict=True):
        assert torch.equal(before, after)
    for before, after in zip(second_before, second.parameters(), strict=True):
        assert not torch.equal(before, after)
    pyro.clear_param_store()


def test_one_sgd_step_of_the_scoped_module_matches_the_gradient_by_hand():
    """d/dw of -sum_n log N(y_n; x_n w + b, 1) is -sum_n (y_n - x_n w - b) x_n."""
    pyro.clear_param_store()
    pyro.param("net.weight", torch.zeros(1, 3, dtype=torch.float64))  # a stale entry, same name
    module = Regression(seed=2)
    x, y = _data()
    w, b = module.net.weight.detach().clone()[0], module.net.bias.detach().clone()[0]
    residual = y - (x @ w + b)
    lr = 0.05
    svi = pyro.infer.SVI(module, lambda x, y: None, pyro.optim.SGD({"lr": lr}),
                         pyro.infer.Trace_ELBO())
    svi.step(x, y)
    torch.testing.assert_close(module.net.weight.detach()[0], w + lr * (residual[:, None] * x).sum(0))
    torch.testing.assert_close(module.net.bias.detach()[0], b + lr * residual.sum())
    pyro.clear_param_store()


def test_a_pyro_param_created_inside_a_call_is_refused_and_the_store_restored():
    class Creates(ScopedModule):
        def forward(self):
            return pyro.param("fresh", torch.ones(2))

    pyro.clear_param_store()
    outside = pyro.param("outside", torch.zeros(1))
    with pytest.raises(ValueError, match=r"created the Pyro parameter\(s\) \['fresh'\]"):
        Creates()()
    assert list(pyro.get_param_store().keys()) == ["outside"]
    assert pyro.get_param_store()["outside"] is outside
    pyro.clear_param_store()


def test_a_nested_scope_of_the_same_module_is_the_open_one():
    """The module's call inside its own open scope sees that scope's store (not a fresh empty
    one); the outer scope then refuses the foreign parameter and restores the store."""
    pyro.clear_param_store()
    module = Regression(seed=0)
    x, y = _data()
    with pytest.raises(ValueError, match=r"\['outer-only'\]"):
        with parameter_scope(module):
            pyro.param("outer-only", torch.ones(1))
            module(x, y)
    assert module.store_names_inside == ["outer-only"]
    assert list(pyro.get_param_store().keys()) == []
    pyro.clear_param_store()
