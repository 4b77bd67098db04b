"""Float32 accuracy of the implicit prior's InfoNCE term on its streamed path, against a float64
loop written from Eq. 23-25 of Aitchison & Ganev, with the path that ran checked each time."""

import math

import pytest
import torch

import rpm.ops._logsumexp as logsumexp
from rpm.ops._distances import expansion_rounding_bound, squared_distance_factors
from rpm.priors import ImplicitPrior, RBFEnergy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rbf_log_ratio_loop(z, z2, lengthscale):
    """f(z_i, z'_i) - log sum_j exp f(z_i, z'_j) + log N, f = -|z - z'|^2 / (2 l^2), float64."""
    z, z2 = z.double(), z2.double()
    out = []
    for i in range(z.shape[0]):
        logits = torch.stack([-((z[i] - z2[j]) ** 2).sum() / (2 * lengthscale**2)
                              for j in range(z2.shape[0])])
        out.append(logits[i] - torch.logsumexp(logits, 0) + math.log(z2.shape[0]))
    return torch.stack(out)


@pytest.fixture
def streamed_calls(monkeypatch):
    """Counts the calls of the streamed normaliser kernel (whoever calls it)."""
    calls = []
    original = logsumexp._StreamingMatmulLogsumexp.apply

    def counting(left, right, block_size):
        calls.append((left.shape[0], right.shape[0], block_size))
        return original(left, right, block_size)

    monkeypatch.setattr(logsumexp._StreamingMatmulLogsumexp, "apply", counting)
    return calls


def clusters(offset, spread, num=16, dim=3):
    """Two clusters of num / 2 first-view latents at +-offset (per coordinate), the second view
    a small perturbation of the first."""
    centres = torch.cat([torch.full((num // 2, dim), offset), torch.full((num // 2, dim), -offset)])
    z = centres + spread * torch.randn(num, dim)
    return z, z + 0.3 * spread * torch.randn(num, dim)


def test_streamed_rbf_log_ratio_matches_float64_for_clusters_far_from_the_origin(streamed_calls):
    """Both views 1e3 from the origin in one cluster: the uncentred expansion would carry an
    error of ~1e6 eps ~ 0.1 nats, the factors are centred, so the streamed path stays exact."""
    z, z2 = clusters(0.0, 1.0)
    z, z2 = z + 1e3, z2 + 1e3
    weight = torch.ones(3)
    assert squared_distance_factors(z, z2, weight) is not None
    got = ImplicitPrior(RBFEnergy(1.0)).log_ratio(z, z2, block_size=4)
    assert streamed_calls == [(16, 16, 4)]
    assert (got.double() - rbf_log_ratio_loop(z, z2, 1.0)).abs().max() < 1e-4


def test_streamed_rbf_log_ratio_gradients_match_float64(streamed_calls):
    z, z2 = clusters(2.0, 1.0)
    z, z2 = z + 50.0, z2 + 50.0
    leaves = [t.clone().requires_grad_() for t in (z, z2)]
    ImplicitPrior(RBFEnergy(0.7)).log_ratio(*leaves, block_size=5).sum().backward()
    assert streamed_calls == [(16, 16, 5)]
    exact = [t.double().requires_grad_() for t in (z, z2)]
    rbf_log_ratio_loop(*exact, 0.7).sum().backward()
    for got, want in zip(leaves, exact, strict=True):
        assert ((got.grad.double() - want.grad).abs().max() / want.grad.abs().max()) < 1e-4


def test_tight_far_clusters_fall_back_to_the_float64_expansion(streamed_calls):
    """Two tight clusters 2e3 apart at lengthscale 1e-3: no centre serves both, the factors
    would be off by far more than 1e-3 nats, so they are refused and the normaliser is the
    dense matrix, expanded in float64; the result matches the float64 loop to the rounding
    bound of that float64 expansion (a few 1e-3 nats here, against ~1e4 nats in float32)."""
    z, z2 = clusters(1e3, 1e-3)
    weight = torch.full((3,), 1e6)
    assert squared_distance_factors(z, z2, weight) is None
    got = ImplicitPrior(RBFEnergy(1e-3)).log_ratio(z, z2, block_size=4)
    assert streamed_calls == []
    centred = torch.cat([z, z2]).double()
    magnitude = 2 * (centred - centred.mean(0)).square().sum(-1).max()
    float64_bound = expansion_rounding_bound(magnitude, 3, torch.float64) / (2 * 1e-3**2)
    assert float64_bound < 1e-2
    assert expansion_rounding_bound(magnitude, 3, torch.float32) / (2 * 1e-3**2) > 1e3
    assert (got.double() - rbf_log_ratio_loop(z, z2, 1e-3)).abs().max() < 2 * float64_bound
