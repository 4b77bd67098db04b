"""The RPM's input checks: every bad input raises an error naming the problem and the fix."""

import pyro
import pytest
import torch

import rpm
from rpm.priors import BilinearEnergy, GaussianRandomWalkPrior, ImplicitPrior, RBFEnergy
from tests.helpers import GaussianHead


def delta_rpm(prior=None, out_dim=3):
    return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, out_dim)), prior or ImplicitPrior(RBFEnergy()))


def test_delta_with_explicit_prior_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="noise_scale") as info:
        delta_rpm(GaussianRandomWalkPrior(3))
    assert "GaussianRecognition" in str(info.value)
    # the two fixes the message names both work
    rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, 3), noise_scale=1e-2), GaussianRandomWalkPrior(3))
    rpm.RPM(rpm.GaussianRecognition(GaussianHead(4, 3)), GaussianRandomWalkPrior(3))


def test_batch_size_mismatch():
    model = delta_rpm()
    with pytest.raises(ValueError, match="same batch size, got 5 and 4"):
        model.model(torch.randn(5, 4), torch.randn(4, 4))


def test_batch_of_one_has_nothing_to_contrast():
    model = delta_rpm()
    with pytest.raises(ValueError, match="nothing to contrast"):
        rpm.RPMELBO().loss(model.model, model.guide, torch.randn(1, 4), torch.randn(1, 4))


def test_encoder_and_prior_dimensions_disagree():
    model = delta_rpm(ImplicitPrior(BilinearEnergy(5)), out_dim=3)
    with pytest.raises(ValueError, match="dimension 5 but the encoder outputs dimension 3"):
        model.guide(torch.randn(6, 4), torch.randn(6, 4))


def test_nan_inputs_are_reported():
    model = delta_rpm()
    x = torch.randn(6, 4)
    x[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        rpm.RPMELBO().loss(model.model, model.guide, x, torch.randn(6, 4))


def test_nonpositive_scale_from_the_network():
    class BadHead(torch.nn.Module):
        def forward(self, x):
            return x, -torch.ones_like(x)

    model = rpm.RPM(rpm.GaussianRecognition(BadHead()), ImplicitPrior(RBFEnergy()))
    with pytest.raises(ValueError, match="non-positive scale"):
        model.guide(torch.randn(3, 2), torch.randn(3, 2))


def test_negative_noise_scale():
    with pytest.raises(ValueError, match="noise_scale must be"):
        rpm.DeltaRecognition(torch.nn.Linear(2, 2), noise_scale=-0.1)


def test_prior_that_forgets_a_site():
    class Forgetful(pyro.nn.PyroModule):
        def forward(self, q, q2):
            z = pyro.sample("z", pyro.distributions.Normal(0.0, 1.0).expand([3]).to_event(1))
            return z, z

    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(4, 3)), Forgetful())
    x = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"did not declare the sample site\(s\) \['z2'\]"):
        model.model(x, x)
    with pytest.raises(ValueError, match="z2"):
        rpm.RPMELBO().loss(model.model, model.guide, x, x)


def test_prior_that_declares_a_latent_as_a_factor():
    """A latent must be drawn from a distribution; a factor named "z2" is refused with the fix
    (by the model and by the ELBO's traced fallback)."""
    class FactorSite(pyro.nn.PyroModule):
        def forward(self, q, q2):
            z = pyro.sample("z", pyro.distributions.Normal(0.0, 1.0).expand([3]).to_event(1))
            pyro.factor("z2", -z.pow(2).sum(-1))
            return z, z

    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(4, 3)), FactorSite())
    x = torch.randn(5, 4)
    expected = r"declared 'z2' with pyro.factor; declare the latent from a distribution"
    with pytest.raises(ValueError, match=expected):
        model.model(x, x)
    with pytest.raises(ValueError, match=expected):
        rpm.RPMELBO().loss(model.model, model.guide, x, x)


def test_recognition_must_return_a_batch_of_vectors():
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Flatten(0)), ImplicitPrior(RBFEnergy()))
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        model.guide(torch.randn(3, 2), torch.randn(3, 2))


def test_separate_second_view_encoder_is_used():
    first, second = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    model = rpm.RPM(rpm.DeltaRecognition(first), ImplicitPrior(RBFEnergy()), rpm.DeltaRecognition(second))
    x, x2 = torch.randn(5, 4), torch.randn(5, 4)
    z, z2 = model.guide(x, x2)
    torch.testing.assert_close(z2, second(x2))
    torch.testing.assert_close(model.encode(x), first(x))
