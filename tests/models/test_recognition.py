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


class _ConstantScale(torch.nn.Module):
    """x -> (a linear map of x, a constant scale): the scale's distance to the floor is set."""

    def __init__(self, scale: float):
        super().__init__()
        self.linear = torch.nn.Linear(X_DIM, D)
        self.scale = scale

    def forward(self, x):
        loc = self.linear(x)
        return loc, torch.full_like(loc, self.scale)


def _calls(recognition, count, x):
    for _ in range(count):
        recognition(x)


def test_scale_floor_warning_fires_once_when_the_scale_sits_at_its_floor():
    recognition = rpm.GaussianRecognition(_ConstantScale(1.05e-3), min_scale=1e-3)
    x = torch.randn(N, X_DIM)
    with pytest.warns(rpm.ScaleFloorWarning, match="at their floor min_scale=0.001") as record:
        _calls(recognition, 3 * recognition.floor_check_every, x)
    assert len(record) == 1  # once per model
    assert recognition.floor_warned
    assert issubclass(rpm.ScaleFloorWarning, UserWarning)


def test_scale_floor_warning_is_silent_away_from_the_floor_and_outside_training():
    x = torch.randn(N, X_DIM)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rpm.ScaleFloorWarning)
        # 1.2 x the floor is away from it (the check's margin is 10%)
        away = rpm.GaussianRecognition(_ConstantScale(1.2e-3), min_scale=1e-3)
        _calls(away, 3 * away.floor_check_every, x)
        assert not away.floor_warned
        at_floor = rpm.GaussianRecognition(_ConstantScale(1e-3), min_scale=1e-3)
        with torch.no_grad():  # evaluation: not training
            _calls(at_floor, 2, x)
        at_floor.eval()  # the network in eval mode
        _calls(at_floor, 2, x)
        _calls(rpm.GaussianRecognition(_ConstantScale(1e-3)), 2, x)  # no floor given: no check


def test_scale_floor_check_counts_half_of_the_entries():
    from rpm.models._recognition import _scale_at_floor

    scale = torch.full((4, 2), 1.0)
    scale[:2] = 1.1e-3  # half of the entries at the floor (within 10%)
    assert _scale_at_floor(scale, 1e-3)
    scale[1, 1] = 1.2e-3  # 3 of 8
    assert not _scale_at_floor(scale, 1e-3)


@pytest.mark.parametrize("min_scale", [0.0, -1e-3, float("inf"), float("nan"), True, "1e-3"])
def test_min_scale_must_be_a_positive_finite_number(min_scale):
    with pytest.raises(ValueError, match="min_scale must be a finite number > 0"):
        rpm.GaussianRecognition(GaussianHead(X_DIM, D), min_scale=min_scale)


class _FixedGaussian(torch.nn.Module):
    """A fixed encoder: an index x -> (means[x], sigma)."""

    def __init__(self, means, sigma):
        super().__init__()
        self.means, self.sigma = means, sigma

    def forward(self, x):
        loc = self.means[x]
        return loc, torch.full_like(loc, self.sigma)


def _mean_elbo(prior, mu, mu2, sigma, particles=30):
    """Monte Carlo ELBO per pair of fixed Gaussian encoders with means mu (first views) and mu2
    (second views) and scale sigma (the same random numbers for every sigma)."""
    model = rpm.RPM(rpm.GaussianRecognition(_FixedGaussian(torch.cat([mu, mu2]), sigma)), prior)
    elbo = rpm.RPMELBO()
    n = mu.shape[0]
    x, x2 = torch.arange(n), torch.arange(n, 2 * n)
    total = 0.0
    for k in range(particles):
        pyro.set_rng_seed(k)
        total -= float(elbo.loss(model.model, model.guide, x, x2)) / n
    return total / particles


def test_implicit_prior_elbo_falls_as_the_encoder_noise_grows_an_explicit_prior_rewards_some():
    """docs/theory.md#stochastic-encoders: with the implicit prior the recognition entropy
    cancels and the ELBO (an InfoNCE bound on the information the latents share) falls as
    independent noise is added to both encoders; an explicit prior keeps the marginal entropy
    -E log Q(z), which rewards noise. Monte Carlo over 30 draws with common random numbers
    (at 100 draws the values move by less than 0.02; the gaps tested are 0.05 to 9)."""
    from rpm.priors import GaussianRandomWalkPrior

    g = torch.Generator().manual_seed(0)
    sigmas = (0.01, 0.1, 0.3)
    mu = torch.randn(16, 2, generator=g)
    mu2 = mu + 0.3 * torch.randn(16, 2, generator=g)
    implicit = [_mean_elbo(ImplicitPrior(RBFEnergy(lengthscale=0.5)), mu, mu2, s) for s in sigmas]
    assert implicit[0] > implicit[1] > implicit[2]
    explicit = [_mean_elbo(GaussianRandomWalkPrior(2, scale=1.0, step=0.3), mu, mu2, s) for s in sigmas]
    assert explicit[0] < explicit[1]
