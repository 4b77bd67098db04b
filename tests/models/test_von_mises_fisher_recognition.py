"""rpm.VonMisesFisherRecognition: the map from the network's outputs to vMF(mu, kappa), written
out here from its definition (mu = d / |d|, kappa = softplus(c) + kappa_min or the network's
kappa), the one-line errors for bad outputs, and its use inside an RPM (the guide samples the
recognition distribution; the mixture marginal of a vMF batch against a float64 loop with
scipy's Bessel function)."""

import math

import pyro
import pytest
import torch
from pyro import poutine
from scipy import special

import rpm
from rpm.distributions import VonMisesFisher
from rpm.marginals import MixtureMarginal
from rpm.priors import CosineEnergy, ImplicitPrior

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, X_DIM, D = 7, 4, 3


class Head(torch.nn.Module):
    """x -> (direction (N, D), concentration output (N, 1)) by one linear map."""

    def __init__(self, dim: int = D, squeeze: bool = False):
        super().__init__()
        self.linear = torch.nn.Linear(X_DIM, dim + 1)
        self.squeeze = squeeze

    def forward(self, x):
        out = self.linear(x)
        concentration = out[:, -1] if self.squeeze else out[:, -1:]
        return out[:, :-1], concentration


class Returns(torch.nn.Module):
    """Returns the given outputs whatever the input."""

    def __init__(self, *outputs):
        super().__init__()
        self.outputs = outputs
        self.unused = torch.nn.Linear(1, 1)

    def forward(self, x):
        return self.outputs if len(self.outputs) != 1 else self.outputs[0]


def log_vmf_density(z, mu, kappa):
    """log vMF(z; mu, kappa) in float64 from scipy: (D/2 - 1) log k - D/2 log 2pi - log I_{D/2-1}(k)
    + k mu.z, with log I_v(k) = log ive(v, k) + k."""
    dim = len(z)
    order = dim / 2 - 1
    log_normaliser = (order * math.log(kappa) - dim / 2 * math.log(2 * math.pi)
                      - (math.log(special.ive(order, kappa)) + kappa))
    return log_normaliser + kappa * sum(a * b for a, b in zip(z, mu, strict=True))


@pytest.mark.parametrize("squeeze", [False, True])
def test_softplus_map_normalises_the_direction_and_floors_kappa(squeeze):
    head = Head(squeeze=squeeze).double()
    recognition = rpm.VonMisesFisherRecognition(head, min_concentration=0.25)
    x = torch.randn(N, X_DIM, dtype=torch.float64)
    with torch.no_grad():
        q = recognition(x)
    assert isinstance(q, VonMisesFisher)
    assert q.batch_shape == (N,) and q.event_shape == (D,)
    with torch.no_grad():
        direction, raw = head(x)
    raw = raw.reshape(N)
    for n in range(N):
        norm = math.sqrt(sum(float(v) ** 2 for v in direction[n]))
        for d in range(D):
            assert float(q.loc[n, d]) == pytest.approx(float(direction[n, d]) / norm, rel=1e-14)
        expected = math.log1p(math.exp(float(raw[n]))) + 0.25
        assert float(q.concentration[n]) == pytest.approx(expected, rel=1e-14)


def test_raw_map_takes_the_networks_kappa_and_the_floor_bounds_it():
    kappa = torch.tensor([0.5, 3.0, 40.0], dtype=torch.float64)
    direction = torch.tensor([[3.0, 0, 0], [0, -2.0, 0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    q = rpm.VonMisesFisherRecognition(Returns(direction, kappa), concentration="raw")(
        torch.zeros(3, 1))
    assert torch.equal(q.concentration, kappa)
    assert torch.allclose(q.loc[2], torch.full((3,), 3 ** -0.5, dtype=torch.float64), rtol=1e-15)
    # the softplus map never goes below its floor, whatever the output
    very_negative = torch.full((3,), -1e4, dtype=torch.float64)
    q = rpm.VonMisesFisherRecognition(Returns(direction, very_negative))(torch.zeros(3, 1))
    assert torch.equal(q.concentration,
                       torch.full((3,), rpm.VonMisesFisherRecognition.DEFAULT_MIN_CONCENTRATION,
                                  dtype=torch.float64))


def test_gradients_reach_the_network_through_rsample():
    head = Head().double()
    q = rpm.VonMisesFisherRecognition(head)(torch.randn(N, X_DIM, dtype=torch.float64))
    q.rsample().sum().backward()
    assert head.linear.weight.grad is not None
    assert bool(torch.isfinite(head.linear.weight.grad).all())
    assert head.linear.weight.grad[-1].abs().sum() > 0  # the concentration row too


@pytest.mark.parametrize("outputs, message", [
    ((torch.randn(N, 1), torch.ones(N)), "D >= 2"),
    ((torch.randn(N, D), -torch.ones(N)), "kappa > 0"),
    ((torch.randn(N, D), torch.full((N,), math.nan)), "NaN or infinite concentration"),
    ((torch.randn(N, D), torch.full((N,), math.inf)), "NaN or infinite concentration"),
    ((torch.full((N, D), math.inf), torch.ones(N)), "NaN or infinite direction"),
    ((torch.zeros(N, D), torch.ones(N)), "zero direction"),
    ((torch.randn(N, D), torch.ones(N, 2)), "concentration of shape"),
    ((torch.randn(N + 1, D), torch.ones(N)), "rows of direction"),
    ((torch.randn(N, D),), r"pair \(direction, concentration\)"),
])
def test_bad_network_outputs_raise_one_line(outputs, message):
    raw = message == "kappa > 0"
    recognition = rpm.VonMisesFisherRecognition(Returns(*outputs),
                                                concentration="raw" if raw else "softplus")
    with pytest.raises(ValueError, match=message) as info:
        recognition(torch.zeros(N, 1))
    assert "\n" not in str(info.value)


def test_negative_softplus_outputs_are_valid_and_nonfinite_ones_are_not():
    """Under the softplus map a negative output is a small kappa, not an error."""
    q = rpm.VonMisesFisherRecognition(Returns(torch.randn(N, D), -torch.ones(N)))(
        torch.zeros(N, 1))
    assert bool((q.concentration > 0).all())


@pytest.mark.parametrize("kwargs, message", [
    ({"concentration": "exp"}, "concentration must be one of"),
    ({"min_concentration": 0.0}, "min_concentration must be a finite number > 0"),
    ({"min_concentration": math.inf}, "min_concentration must be a finite number > 0"),
    ({"concentration": "raw", "min_concentration": 0.1}, "leave min_concentration=None"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rpm.VonMisesFisherRecognition(Head(), **kwargs)


def test_the_rpm_guide_samples_the_recognition_distribution():
    """The guide's sites "z", "z2" are draws of Q(z|x), Q(z'|x') (reparameterised: the same
    random numbers give q.rsample()), and their log-densities are the vMF's."""
    recognition = rpm.VonMisesFisherRecognition(Head().double())
    model = rpm.RPM(recognition, ImplicitPrior(CosineEnergy(5.0)))
    x, x2 = torch.randn(N, X_DIM, dtype=torch.float64), torch.randn(N, X_DIM, dtype=torch.float64)
    pyro.set_rng_seed(3)
    trace = poutine.trace(model.guide).get_trace(x, x2)
    pyro.set_rng_seed(3)
    q, q2 = recognition(x), recognition(x2)
    expected = q.rsample(), q2.rsample()
    for site, value, dist in (("z", expected[0], q), ("z2", expected[1], q2)):
        node = trace.nodes[site]
        assert not node["is_observed"] and torch.equal(node["value"], value)
        # the implicit prior's sites are whole-batch events: the guide's is the sum over pairs
        expected_log_prob = sum(log_vmf_density(value[n].tolist(), dist.loc[n].tolist(),
                                                float(dist.concentration[n])) for n in range(N))
        assert float(node["fn"].log_prob(value)) == pytest.approx(expected_log_prob, rel=1e-12)


@pytest.mark.parametrize("dim", [3, 5])
def test_mixture_marginal_of_a_vmf_batch(dim):
    """MixtureMarginal of vMF components (the generic path, the family's own log_prob in row
    blocks): log (1/N) sum_n vMF(z_m; mu_n, kappa_n) against a float64 loop."""
    mu = torch.nn.functional.normalize(torch.randn(N, dim, dtype=torch.float64), dim=-1)
    kappa = torch.linspace(0.3, 60.0, N, dtype=torch.float64)
    marginal = MixtureMarginal(VonMisesFisher(mu, kappa))
    assert marginal.family == "generic"
    z = VonMisesFisher(mu[:4], kappa[:4]).sample()                      # (4, dim)
    for block_size in (None, 1):
        values = (marginal.log_prob(z) if block_size is None
                  else marginal.log_prob_rows(z, block_size=block_size))
        for m in range(4):
            terms = [log_vmf_density(z[m].tolist(), mu[n].tolist(), float(kappa[n]))
                     for n in range(N)]
            top = max(terms)
            expected = top + math.log(sum(math.exp(t - top) for t in terms) / N)
            assert float(values[m]) == pytest.approx(expected, rel=1e-12, abs=1e-12)
