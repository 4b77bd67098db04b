"""RPMELBO has one path: the objective (rpm._objective) on the model's inputs, each
module called as the user wrote it. A subclass that overrides a recognition model's or an
energy's forward gets its own forward (against a float64 loop of the InfoNCE terms); one that
overrides RPM.model or guide gets Pyro's Trace_ELBO of its own program; the dispatch decided for
a model is decided again after an assignment; the fused value check of a remembered batch
agrees with an entry-by-entry test."""

import math

import pyro
import pytest
import torch
from pyro.distributions import Delta, Normal
from pyro.infer import Trace_ELBO

import rpm
from rpm.models._checked_batches import check_values
from rpm.priors import GaussianRandomWalkPrior, ImplicitPrior, RBFEnergy
from tests.helpers import GaussianHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IN, D, N = 4, 3, 6


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def loop_elbo(z, z2, energy):
    """sum_i f(z_i, z2_i) - log (1/N) sum_j e^{f(z_i, z2_j)} (Eq. 23-25), in float64 loops."""
    total = 0.0
    for i in range(len(z)):
        logits = [energy(z[i], z2[j]) for j in range(len(z2))]
        total += energy(z[i], z2[i]) - math.log(sum(math.exp(v) for v in logits) / len(logits))
    return total


def rbf(a, b, lengthscale=1.0):
    return -float(((a - b) ** 2).sum()) / (2 * lengthscale**2)


class DoubledDelta(rpm.DeltaRecognition):
    """A user's recognition model: the latents are twice the network's output."""

    def forward(self, x):
        return Delta(2.0 * self.net(x), event_dim=1)


class ShiftedRBF(RBFEnergy):
    """A user's energy: the RBF energy of (z + 1, z')."""

    def forward(self, z, z2):
        return super().forward(z + 1.0, z2)


def test_a_recognition_subclass_overriding_forward_gets_its_forward():
    net = torch.nn.Linear(IN, D)
    model = rpm.RPM(DoubledDelta(net), ImplicitPrior(RBFEnergy(1.0)))
    x, x2 = torch.randn(N, IN), torch.randn(N, IN)
    for _ in range(2):  # the first batch of its signature, then a remembered one
        loss = rpm.RPMELBO().loss(model.model, model.guide, x, x2)
        with torch.no_grad():
            expected = -loop_elbo(2.0 * net(x), 2.0 * net(x2), rbf)
        assert abs(loss - expected) < 1e-10


def test_an_energy_subclass_overriding_forward_gets_its_forward():
    net = torch.nn.Linear(IN, D)
    model = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(ShiftedRBF(1.0)))
    x, x2 = torch.randn(N, IN), torch.randn(N, IN)
    loss = rpm.RPMELBO().loss(model.model, model.guide, x, x2)
    with torch.no_grad():
        expected = -loop_elbo(net(x), net(x2), lambda a, b: rbf(a + 1.0, b))
    assert abs(loss - expected) < 1e-10


class BonusRPM(rpm.RPM):
    """A user's RPM whose model adds a factor of 2.5: its ELBO is the RPM's plus 2.5."""

    @pyro.nn.pyro_method
    def model(self, *args, **kwargs):
        pyro.factor("bonus", torch.tensor(2.5))
        return super().model(*args, **kwargs)


def test_an_rpm_subclass_overriding_model_runs_its_own_model():
    net = torch.nn.Linear(IN, D)
    model = BonusRPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy(1.0)))
    x, x2 = torch.randn(N, IN), torch.randn(N, IN)
    loss = rpm.RPMELBO().loss(model.model, model.guide, x, x2)
    with torch.no_grad():
        expected = -loop_elbo(net(x), net(x2), rbf) - 2.5
    assert abs(loss - expected) < 1e-10
    assert abs(loss - Trace_ELBO().loss(model.model, model.guide, x, x2)) < 1e-10


def test_a_sequence_rpm_keeps_the_objective_and_its_value():
    net = torch.nn.Linear(IN, D)
    model = rpm.RPM(rpm.DeltaRecognition(net), rpm.priors.MarkovImplicitPrior(RBFEnergy(1.0)),
                    encoder_calls="concat")
    x = torch.randn(N, 3, IN)
    loss = rpm.RPMELBO().loss(model.model, model.guide, x)
    with torch.no_grad():
        z = net(x)
        expected = -loop_elbo(z[:, 0], z[:, 1], rbf) - loop_elbo(z[:, 1], z[:, 2], rbf)
    assert abs(loss - expected) < 1e-10


def test_an_assigned_prior_or_recognition_is_used_at_the_next_step():
    net, net2 = torch.nn.Linear(IN, D), torch.nn.Linear(IN, D)
    model = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy(1.0)))
    x, x2 = torch.randn(N, IN), torch.randn(N, IN)
    elbo = rpm.RPMELBO()
    elbo.loss(model.model, model.guide, x, x2)
    model.prior = ImplicitPrior(ShiftedRBF(1.0))
    with torch.no_grad():
        shifted = -loop_elbo(net(x), net(x2), lambda a, b: rbf(a + 1.0, b))
    assert abs(elbo.loss(model.model, model.guide, x, x2) - shifted) < 1e-10
    model.recognition = rpm.DeltaRecognition(net2)
    with torch.no_grad():
        expected = -loop_elbo(net2(x), net2(x2), lambda a, b: rbf(a + 1.0, b))
    assert abs(elbo.loss(model.model, model.guide, x, x2) - expected) < 1e-10
    model.prior = GaussianRandomWalkPrior(D)  # a density with a deterministic encoder: refused
    with pytest.raises(ValueError, match="ill-defined"):
        elbo.loss(model.model, model.guide, x, x2)


def test_gaussian_recognition_under_the_remembered_path_matches_trace_elbo():
    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(IN, D)), GaussianRandomWalkPrior(D))
    x, x2 = torch.randn(N, IN), torch.randn(N, IN)
    for seed in (1, 2):  # the first batch of its signature, then a remembered one
        pyro.set_rng_seed(seed)
        ours = rpm.RPMELBO().loss(model.model, model.guide, x, x2)
        pyro.set_rng_seed(seed)
        pyros = Trace_ELBO().loss(model.model, model.guide, x, x2)
        assert abs(ours - pyros) < 1e-9


@pytest.mark.parametrize("case", ["finite", "nan-latent", "inf-latent", "nan-scale",
                                  "zero-scale", "overflow"])
def test_check_values_agrees_with_entry_by_entry_tests(case):
    loc, scale = torch.randn(N, D), torch.rand(N, D) + 0.1
    if case == "nan-latent":
        loc[3, 1] = math.nan
    elif case == "inf-latent":
        loc[0, 2] = -math.inf
    elif case == "nan-scale":
        scale[1, 1] = math.nan
    elif case == "zero-scale":
        scale[4, 0] = 0.0
    elif case == "overflow":  # finite entries whose sum overflows float32
        loc = torch.full((N, D), 3e38, dtype=torch.float32)
    recognitions = [Delta(loc, event_dim=1),
                    Normal(loc.abs(), scale, validate_args=False).to_event(1)]
    expected = bool(torch.isfinite(loc).all()) and bool((scale > 0).all())
    assert check_values(recognitions) == expected
    assert expected == (case in ("finite", "overflow"))
