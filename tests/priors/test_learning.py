"""Learned prior parameters move in the direction the data asks for under SVI."""

import pyro
import torch
from pyro.infer import SVI

import rpm
from rpm.priors import AnisotropicEnergy, ImplicitPrior, RBFEnergy


def train(prior, make_pair, steps=60, lr=0.05):
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), prior)
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": lr}), rpm.RPMELBO())
    for _ in range(steps):
        svi.step(*make_pair())
    return model


def test_rbf_lengthscale_shrinks_towards_the_positive_pair_distance():
    """Positive pairs 0.1 apart in 2-D, latents spread over a unit-variance cloud: the RBF
    lengthscale starting at 1.0 must decrease (the conditional is much tighter than 1)."""

    def pair():
        z = torch.randn(128, 2)
        return z, z + 0.1 * torch.randn(128, 2)

    model = train(ImplicitPrior(RBFEnergy(lengthscale=1.0)), pair)
    assert model.prior.energy.lengthscale.item() < 0.6


def test_anisotropic_diagonal_grows_for_the_tight_dimension():
    """Dimension 0 of the positive pairs has noise 0.05, dimension 1 noise 0.5: the learned
    concentration of dimension 0 must end above that of dimension 1, and above its start."""

    def pair():
        z = torch.randn(128, 2)
        noise = torch.randn(128, 2) * torch.tensor([0.05, 0.5])
        return z, z + noise

    model = train(ImplicitPrior(AnisotropicEnergy(2, normalize=False)), pair, steps=100, lr=0.2)
    concentration = model.prior.energy.concentration.detach()
    assert concentration[0] > 1.5
    assert concentration[0] > 2 * concentration[1]
