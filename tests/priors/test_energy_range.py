"""Every energy's InfoNCE loss and gradients in float32 over latents of norm 1e-20 ... 1e20,
under ImplicitPrior and PooledImplicitPrior: finite, or a ValueError that names the valid range
and the fix (rpm.priors._energy_range; LpEnergy's own check of its matrix, p in [0.5, 100])."""

import math

import pyro
import pytest
import torch

import rpm
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    ImplicitPrior,
    LpEnergy,
    NeuralEnergy,
    PooledImplicitPrior,
    RBFEnergy,
)
from rpm.priors._base import Energy
from rpm.priors._energy_range import valid_norms

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, D = 6, 3
NORMS = [10.0**k for k in range(-20, 21)]
ENERGIES = {
    "bilinear": lambda: BilinearEnergy(D),
    "cosine": lambda: CosineEnergy(kappa=1 / 0.07),
    "rbf": lambda: RBFEnergy(1.0),
    "anisotropic": lambda: AnisotropicEnergy(D),
    "anisotropic-raw": lambda: AnisotropicEnergy(D, normalize=False),
    "neural": lambda: NeuralEnergy(D, hidden=8),
    "lp-0.5": lambda: LpEnergy(p=0.5),
    "lp-1": lambda: LpEnergy(p=1.0),
    "lp-3": lambda: LpEnergy(p=3.0),
    "lp-100": lambda: LpEnergy(p=100.0),
}
# LpEnergy checks its own matrix (its message names the largest representable difference)
OWN_CHECK = {"lp-0.5", "lp-1", "lp-3", "lp-100"}
# f scales with the square of the latents: past ~1e18 the float32 loss is not representable
QUADRATIC = {"bilinear", "rbf", "anisotropic-raw"}
# f depends on the directions only: the loss is the same at every norm
SCALE_FREE = {"cosine", "anisotropic"}
PRIORS = {"implicit": ImplicitPrior, "pooled": PooledImplicitPrior}


def latents(norm: float):
    """Two float32 views of N latents, each row of Euclidean norm ``norm`` (drawn in float64)."""
    generator = torch.Generator().manual_seed(1)
    z = torch.randn(N, D, generator=generator, dtype=torch.float64)
    z2 = z + 0.5 * torch.randn(N, D, generator=generator, dtype=torch.float64)
    z = z / z.norm(dim=-1, keepdim=True) * norm
    z2 = z2 / z2.norm(dim=-1, keepdim=True) * norm
    return z.float().requires_grad_(), z2.float().requires_grad_()


def loss_and_grads(prior_cls, energy, norm, summed=False):
    """Minus the ELBO's terms summed (``log_ratio``), or their sum as the ELBO reads it
    (``log_ratio_sum``: the implicit prior's summed log-softmax diagonal), and its gradients."""
    z, z2 = latents(norm)
    prior = prior_cls(energy)
    loss = -(prior.log_ratio_sum(z, z2) if summed else prior.log_ratio(z, z2).sum())
    params = [p for p in energy.parameters() if p.requires_grad]
    return loss, torch.autograd.grad(loss, [z, z2, *params])


@pytest.mark.parametrize("summed", [False, True], ids=["terms", "sum"])
@pytest.mark.parametrize("prior", list(PRIORS))
@pytest.mark.parametrize("name", list(ENERGIES))
def test_loss_and_gradients_are_finite_or_the_range_is_named(name, prior, summed):
    reference = None
    raised = []
    for norm in NORMS:
        try:
            loss, grads = loss_and_grads(PRIORS[prior], ENERGIES[name](), norm, summed)
        except ValueError as error:
            message = str(error)
            if name in OWN_CHECK:
                assert "overflows torch.float32" in message and "<=" in message
            else:
                assert "float32 latents of norm" in message and "latent norms up to" in message
            assert "float64" in message
            raised.append(norm)
            continue
        assert torch.isfinite(loss), (name, prior, norm)
        for grad in grads:
            assert torch.isfinite(grad).all(), (name, prior, norm)
        if name not in OWN_CHECK:  # (|z - z'|^p / tau of p = 100 underflows, exactly so)
            assert (grads[0] != 0).any() and (grads[1] != 0).any(), (name, prior, norm)
        if name in SCALE_FREE:
            # normalising a rescaled vector: the same directions at every norm
            reference = loss if reference is None else reference
            assert loss.item() == pytest.approx(reference.item(), rel=1e-5), norm
    if name in QUADRATIC:
        # in range up to 1e18 (6 pairs, unit parameters); refused, not NaN, beyond
        assert raised == [norm for norm in NORMS if norm > 1e18]
    elif name in OWN_CHECK:
        # refused exactly from some norm on (p = 100 holds coordinate differences up to ~2.4)
        assert raised == [norm for norm in NORMS if norm >= raised[0]] if raised else True
        assert not raised or raised[0] > 1.0
    else:
        assert raised == []


def test_the_reported_cases():
    """Cosine and anisotropic at 1e20 gave loss -0.0 and zero gradients (F.normalize
    overflowed); RBF and bilinear at 1e19 a NaN loss without an error."""
    for energy in (CosineEnergy(), AnisotropicEnergy(D)):
        loss, grads = loss_and_grads(ImplicitPrior, energy, 1e20)
        expected, _ = loss_and_grads(ImplicitPrior, type(energy)(*([D] if energy.dim else [])), 1.0)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        assert all((grad != 0).any() for grad in grads[:2])
    for energy in (RBFEnergy(), BilinearEnergy(D)):
        with pytest.raises(ValueError, match=r"overflows float32 .* up to 1e\+18 .*float64"):
            loss_and_grads(ImplicitPrior, energy, 1e19)


def test_rpmelbo_names_the_range():
    """The error reaches the user from RPMELBO, with the energy and the fix."""
    z, z2 = latents(1e19)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), ImplicitPrior(RBFEnergy()))
    with pytest.raises(ValueError, match="ImplicitPrior: RBFEnergy overflows float32"):
        rpm.RPMELBO().loss(model.model, model.guide, z.detach(), z2.detach())


def test_valid_range_follows_the_bound():
    """valid_norms inverts 16 N B(R) <= max: for the RBF at l = 1, 16 N 2 R^2 <= 3.4e38."""
    low, high = valid_norms(RBFEnergy(1.0), N, torch.float32)
    assert low <= 1e-44  # the smallest norm scanned: no lower limit
    expected = math.sqrt(torch.finfo(torch.float32).max / (16 * N * 2))
    assert expected / 10**0.1 <= high <= expected
    # cosine: B = kappa max(1, 1/R), so only the smallest norms are out of range
    low, high = valid_norms(CosineEnergy(1.0), N, torch.float32)
    assert 16 * N / torch.finfo(torch.float32).max <= low <= 1e-35 and high == pytest.approx(1e45)


def test_an_energy_without_a_bound_gets_its_non_finite_loss_diagnosed():
    class Cubic(Energy):
        def forward(self, z, z2):
            return -torch.cdist(z, z2).pow(3)

    for prior_cls in PRIORS.values():
        with pytest.raises(ValueError, match="the InfoNCE loss is not finite .* Cubic"):
            loss_and_grads(prior_cls, Cubic(), 1e15)


def test_non_finite_latents_are_named():
    z, z2 = latents(1.0)
    z = z.detach().clone()
    z[0, 0] = float("nan")
    with pytest.raises(ValueError, match="the latents are not finite"):
        ImplicitPrior(RBFEnergy()).log_ratio(z, z2)


def test_without_validation_nothing_is_checked():
    """Pyro's validation switched off skips the check (and its synchronisation)."""
    pyro.enable_validation(False)
    try:
        loss, _ = loss_and_grads(ImplicitPrior, RBFEnergy(), 1e20)
    finally:
        pyro.enable_validation(True)
    assert not torch.isfinite(loss)
