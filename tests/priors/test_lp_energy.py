"""LpEnergy: values and gradients (latents and a learned temperature) against a float64 loop
written from f(z, z') = -sum_d |z_d - z'_d|^p / tau, the valid p range [0.5, 100], and the
float32 grid of latent norms 1e-20 ... 1e20: the InfoNCE loss and its gradients are finite, or
a ValueError names the largest representable difference exactly when an energy overflows."""

import math

import pytest
import torch

from rpm.priors import ImplicitPrior, LpEnergy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def energy_loop(z, z2, p, tau):
    """-sum_d |z_id - z'_jd|^p / tau for every pair, as Python floats, float64."""
    out = torch.zeros(z.shape[0], z2.shape[0], dtype=torch.float64)
    for i in range(z.shape[0]):
        for j in range(z2.shape[0]):
            out[i, j] = -sum(abs(float(a - b)) ** p for a, b in zip(z[i], z2[j], strict=True)) / tau
    return out


def log_largest_energy(z, z2, p):
    """log max_ij sum_d |z_id - z'_jd|^p in float64, in the scaled form
    p log a + log sum_d (|d| / a)^p with a = max_d |d| (the energies themselves may exceed
    float64)."""
    diff = (z.double()[:, None, :] - z2.double()[None, :, :]).abs()  # (N, M, D)
    top = diff.amax(-1, keepdim=True)
    scaled = (diff / top).pow(p).sum(-1).log() + p * top.squeeze(-1).log()
    return scaled.max().item()


@pytest.mark.parametrize("p", [0.5, 1.0, 1.5, 2.0, 3.0, 10.0])
def test_matches_float64_loop(p):
    """Values; gradients of the latents and of tau against autograd of the loop's closed form
    (d/dz = -p sign(d) |d|^(p-1) / tau, d/dtau = S / tau^2 through tau = exp(u))."""
    tau = 0.7
    energy = LpEnergy(p=p, tau=tau, learn_tau=True).double()
    z = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    z2 = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(6, 5, dtype=torch.float64)
    matrix = energy(z, z2)
    expected = energy_loop(z.detach(), z2.detach(), p, tau)
    torch.testing.assert_close(matrix, expected, rtol=1e-13, atol=1e-13)
    grads = torch.autograd.grad((matrix * weights).sum(), (z, z2, energy.tau_unconstrained))
    diff = z.detach()[:, None, :] - z2.detach()[None, :, :]  # (N, M, D)
    slope = -p * diff.sign() * diff.abs().pow(p - 1) / tau * weights[:, :, None]
    torch.testing.assert_close(grads[0], slope.sum(1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[1], -slope.sum(0), rtol=1e-12, atol=1e-12)
    # tau = exp(u): d/du = tau d/dtau, and d/dtau f = -f / tau
    torch.testing.assert_close(grads[2], (-expected * weights).sum(), rtol=1e-12, atol=1e-12)
    paired = energy.paired(z[:5], z2)
    torch.testing.assert_close(paired, torch.diagonal(expected[:5]), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("p", [0.0, 0.49, 100.5, 1e3])
def test_p_outside_the_valid_range_is_refused(p):
    with pytest.raises(ValueError, match=r"p in \[0.5, 100\]|p must"):
        LpEnergy(p=p)


@pytest.mark.parametrize("p", [0.5, 1.0, 1.5, 2.0, 3.0, 10.0, 100.0])
@pytest.mark.parametrize("norm", [1e-20, 1e-10, 1.0, 1e10, 1e20])
def test_float32_grid_finite_or_clear_error(p, norm):
    """The InfoNCE loss of ImplicitPrior(LpEnergy) in float32 for latents of the given norm
    (positive pairs at a tenth of it): finite loss and gradients, or the range error, and the
    error exactly when some float64 energy lies beyond float32's largest number."""
    z64 = norm * torch.nn.functional.normalize(torch.randn(8, 3, dtype=torch.float64), dim=-1)
    z2_64 = z64 + 0.1 * norm * torch.randn(8, 3, dtype=torch.float64) / math.sqrt(3)
    z, z2 = z64.float().requires_grad_(), z2_64.float().requires_grad_()
    prior = ImplicitPrior(LpEnergy(p=p, tau=1.0))
    log_largest = log_largest_energy(z.detach(), z2.detach(), p)
    log_max = math.log(torch.finfo(torch.float32).max)
    try:
        loss = -prior.log_ratio(z, z2).mean()
        grads = torch.autograd.grad(loss, (z, z2))
    except ValueError as error:
        assert "overflows" in str(error) and "tau" in str(error)
        assert log_largest > log_max - 1  # refused only where the energy leaves the range
        return
    assert log_largest < log_max + 1
    assert torch.isfinite(loss)
    assert all(torch.isfinite(g).all() for g in grads)


def test_p100_on_randn_latents():
    """The case of the issue: p = 100 on ordinary randn latents gave non-finite gradients
    through torch.cdist. Latents whose scaled differences stay below 2.4 now give finite
    gradients (in float32, with tau = 1); a temperature that makes the same latents
    representable (tau = 1e70: differences up to 12) does too."""
    z = 0.3 * torch.randn(64, 10)
    z2 = z + 0.05 * torch.randn(64, 10)
    for data, tau in ((z, z2), 1.0), ((3 * z, 3 * z2), 1e70):
        a, b = (t.clone().requires_grad_() for t in data)
        loss = -ImplicitPrior(LpEnergy(p=100.0, tau=tau)).log_ratio(a, b).mean()
        grads = torch.autograd.grad(loss, (a, b))
        assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)


def test_range_check_on_an_accelerator_runs_only_under_validation():
    """Off the CPU the overflow check synchronises with the device, so it runs only under
    Pyro's validation: without it an infinite energy is returned unchecked (here on the meta
    device, which has no values to check: under validation reading one is an error)."""
    import pyro

    energy = LpEnergy(p=1.0)
    z = torch.empty(4, 3, device="meta")
    distances = torch.empty(4, 4, device="meta")
    with pyro.validation_enabled(False):
        assert energy._check_range(distances, z, z) is None
    with pyro.validation_enabled(True), pytest.raises((RuntimeError, NotImplementedError)):
        energy._check_range(distances, z, z)
