"""Recognition models: the distributions they return against the densities written out, the
user's network left as it is, frozen layers, and the checks on what the network returns."""

import math
import warnings

import pyro
import pytest
import torch
from pyro.infer import SVI

import rpm
from rpm.priors import ImplicitPrior, RBFEnergy
from tests.helpers import GaussianHead

N, X_DIM, D = 5, 4, 3


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def test_gaussian_recognition_is_the_diagonal_normal_of_the_network():
    head = GaussianHead(X_DIM, D)
    x = torch.randn(N, X_DIM)
    q = rpm.GaussianRecognition(head)(x)
    assert q.batch_shape == (N,) and q.event_shape == (D,)
    with torch.no_grad():
        loc, scale = head(x)
    z = torch.randn(N, D)
    expected = [
        sum(-0.5 * ((z[i, d] - loc[i, d]) / scale[i, d]) ** 2
            - math.log(scale[i, d] * math.sqrt(2 * math.pi)) for d in range(D)).item()
        for i in range(N)
    ]
    torch.testing.assert_close(q.log_prob(z).detach(), torch.tensor(expected), rtol=1e-12, atol=0)
    assert q.has_rsample


def test_delta_recognition_is_a_point_mass_and_with_noise_a_gaussian():
    net = torch.nn.Linear(X_DIM, D)
    x = torch.randn(N, X_DIM)
    delta = rpm.DeltaRecognition(net)(x)
    assert rpm.DeltaRecognition(net).is_deterministic
    torch.testing.assert_close(delta.rsample(), net(x))
    assert (delta.log_prob(net(x)) == 0).all()
    assert (delta.log_prob(net(x) + 0.1) == -math.inf).all()
    noisy = rpm.DeltaRecognition(net, noise_scale=0.2)(x)
    z = torch.randn(N, D)
    expected = torch.distributions.MultivariateNormal(net(x), 0.04 * torch.eye(D)).log_prob(z)
    torch.testing.assert_close(noisy.log_prob(z), expected, rtol=1e-12, atol=0)


def test_the_network_is_held_as_it_is():
    net = torch.nn.Sequential(torch.nn.Linear(X_DIM, 8), torch.nn.ReLU(), torch.nn.Linear(8, D))
    before = [type(m) for m in net.modules()]
    for recognition in (rpm.DeltaRecognition(net), rpm.DeltaRecognition(net, noise_scale=0.1)):
        recognition(torch.randn(N, X_DIM))
        assert recognition.net is net
    assert [type(m) for m in net.modules()] == before
    assert not any(isinstance(m, pyro.nn.PyroModule) for m in net.modules())


def test_frozen_layers_stay_frozen_and_quiet_under_svi():
    """A pretrained, frozen first layer: SVI trains only the head; no warning per step."""
    frozen = torch.nn.Linear(X_DIM, 6)
    frozen.requires_grad_(False)
    head = torch.nn.Linear(6, D)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Sequential(frozen, head)),
                    ImplicitPrior(RBFEnergy()))
    frozen_before, head_before = frozen.weight.clone(), head.weight.detach().clone()
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.1}), rpm.RPMELBO())
    x = torch.randn(16, X_DIM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            svi.step(x, x + 0.1 * torch.randn(16, X_DIM))
    assert torch.equal(frozen.weight, frozen_before)
    assert not torch.equal(head.weight.detach(), head_before)


def test_network_outputs_are_checked():
    class Scalar(torch.nn.Module):
        def forward(self, x):
            return x.sum(-1)

    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        rpm.DeltaRecognition(Scalar())(torch.randn(N, X_DIM))
    with pytest.raises(ValueError, match="pair"):
        rpm.GaussianRecognition(torch.nn.Linear(X_DIM, D))(torch.randn(N, X_DIM))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        rpm.DeltaRecognition(lambda x: x)
