"""``rpm.nn``: each module's parameters live in Pyro's global param store under its own,
process-unique name; two modules with the same attribute names keep their own tensors (the
values they compute are checked against the same formula evaluated by hand with each module's
own weights), and a stale entry under another name is never read."""

import math
import threading

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroParam
from torch.distributions import constraints

from rpm.nn import NamedModule, _check_name, _unique_name


class Regression(NamedModule):
    """y ~ Normal(x w + b, sigma): one plain ``nn.Linear`` under the attribute name ``net`` and a
    learned noise scale ``sigma`` (a PyroParam)."""

    def __init__(self, seed, sigma=1.0, name=None):
        super().__init__(name)
        torch.manual_seed(seed)
        self.net = torch.nn.Linear(3, 1).double()
        self.sigma = PyroParam(torch.tensor(sigma, dtype=torch.float64), constraints.positive)

    def forward(self, x, y):
        loc = self.net(x).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(loc, self.sigma), obs=y)


def _log_likelihood_by_hand(module, x, y):
    """sum_n log N(y_n; x_n . w + b, sigma), written out with the module's own weights."""
    w = module.net.weight.detach()[0]
    b = module.net.bias.detach()[0]
    sigma = module.sigma.item()
    total = 0.0
    for n in range(x.shape[0]):
        residual = (y[n] - (x[n] @ w + b)).item()
        total += -0.5 * (residual / sigma) ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)
    return total


def _data():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    y = torch.randn(6, generator=generator, dtype=torch.float64)
    return x, y


def test_default_names_are_unique_and_never_handed_out_twice():
    first, second = _unique_name("thing"), _unique_name("thing")
    assert first != second and second.startswith("thing")
    given = Regression(seed=0, name="thing_given")
    assert given._pyro_name == "thing_given"
    names = [Regression(seed=0)._pyro_name for _ in range(3)]
    assert len(set(names)) == 3 and all(name.startswith("Regression") for name in names)
    # from several threads at once
    found = []
    threads = [threading.Thread(target=lambda: found.extend(_unique_name("threaded")
                                                            for _ in range(50)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == len(set(found)) == 200


def test_bad_names_are_refused():
    with pytest.raises(TypeError, match="name must be a string"):
        _check_name(3)
    with pytest.raises(ValueError, match="non-empty"):
        Regression(seed=0, name="")
    with pytest.raises(ValueError, match=r"\$\$\$"):
        Regression(seed=0, name="a$$$b")


def test_two_modules_with_the_same_attribute_names_keep_their_own_tensors():
    first, second = Regression(seed=0, sigma=0.7), Regression(seed=1, sigma=1.9)
    assert not torch.equal(first.net.weight, second.net.weight)
    x, y = _data()
    for module in (first, second, first):
        trace = pyro.poutine.trace(module).get_trace(x, y)
        # the log-likelihood of each call is that of its own weights, computed by hand
        assert trace.log_prob_sum().item() == pytest.approx(_log_likelihood_by_hand(module, x, y),
                                                             rel=1e-12)
        params = [site["value"].unconstrained() for site in trace.nodes.values()
                  if site["type"] == "param"]
        assert {id(value) for value in params} == {id(p) for p in module.parameters()}
    # the store holds both, each under its module's name
    store = pyro.get_param_store()
    for module in (first, second):
        assert store[f"{module._pyro_name}.net$$$weight"] is module.net.weight
        assert store[f"{module._pyro_name}.sigma"].unconstrained() is module.sigma_unconstrained
    # SVI on the second module moves only the second module's tensors
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


def test_one_sgd_step_matches_the_gradient_by_hand_and_ignores_stale_entries():
    """d/dw of -sum_n log N(y_n; x_n w + b, 1) is -sum_n (y_n - x_n w - b) x_n. A stale entry
    left under the attribute path (another module's, with no name) is never read."""
    stale = pyro.param("net$$$weight", torch.zeros(1, 3, dtype=torch.float64))
    module = Regression(seed=2)
    x, y = _data()
    w, b = module.net.weight.detach().clone()[0], module.net.bias.detach().clone()[0]
    residual = y - (x @ w + b)
    lr = 0.05
    svi = pyro.infer.SVI(module, lambda x, y: None,
                         pyro.optim.SGD({"lr": lr}), pyro.infer.Trace_ELBO())
    svi.step(x, y)
    torch.testing.assert_close(module.net.weight.detach()[0], w + lr * (residual[:, None] * x).sum(0))
    torch.testing.assert_close(module.net.bias.detach()[0], b + lr * residual.sum())
    assert (stale == 0).all()
