"""The matrix-product mixture marginal against a float64 loop written from the equation."""

import math

import pytest
import torch

from rpm.ops import gaussian_mixture_log_prob


def mixture_loop(z, loc, scale, exclude_self=False):
    """log (1/N) sum_n prod_d N(z_d; mu_nd, sigma_nd), one point and one component at a time."""
    z, loc, scale = z.double(), loc.double(), scale.double()
    out = []
    for m in range(z.shape[0]):
        terms = []
        for n in range(loc.shape[0]):
            if exclude_self and m == n:
                continue
            quad = (((z[m] - loc[n]) / scale[n]) ** 2).sum()
            log_norm = -scale[n].log().sum() - 0.5 * z.shape[1] * math.log(2 * math.pi)
            terms.append(log_norm - 0.5 * quad)
        out.append(torch.logsumexp(torch.stack(terms), 0) - math.log(len(terms)))
    return torch.stack(out)


@pytest.mark.parametrize("exclude_self", [False, True])
def test_matches_float64_loop(exclude_self):
    n, d = 13, 4
    loc = torch.randn(n, d, dtype=torch.float64)
    scale = torch.rand(n, d, dtype=torch.float64) + 0.2
    z = loc + scale * torch.randn(n, d, dtype=torch.float64)
    actual = gaussian_mixture_log_prob(z, loc, scale, exclude_self=exclude_self)
    assert actual.shape == (n,)
    torch.testing.assert_close(actual, mixture_loop(z, loc, scale, exclude_self), rtol=0, atol=1e-10)


def test_points_other_than_components():
    loc = torch.randn(7, 3, dtype=torch.float64)
    scale = torch.rand(7, 3, dtype=torch.float64) + 0.5
    z = 2 * torch.randn(5, 3, dtype=torch.float64)
    actual = gaussian_mixture_log_prob(z, loc, scale)
    assert actual.shape == (5,)
    torch.testing.assert_close(actual, mixture_loop(z, loc, scale), rtol=0, atol=1e-10)


@pytest.mark.parametrize("scale_value", [1e-2, 1e-1, 1.0, 1e1, 1e2])
def test_float32_within_1e4_of_float64(scale_value):
    """Float32 error below 1e-4 absolute for scales in [1e-2, 1e2], points drawn from the
    mixture (so the log-density is moderate and representable to 1e-4)."""
    n, d = 300, 16
    loc = torch.randn(n, d, dtype=torch.float64)
    scale = scale_value * (0.5 + torch.rand(n, d, dtype=torch.float64))
    z = loc + scale * torch.randn(n, d, dtype=torch.float64)
    z32, loc32, scale32 = z.float(), loc.float(), scale.float()
    reference = gaussian_mixture_log_prob(z32.double(), loc32.double(), scale32.double())
    actual = gaussian_mixture_log_prob(z32, loc32, scale32)
    assert actual.dtype == torch.float32
    assert (actual.double() - reference).abs().max().item() < 1e-4


def test_float32_accuracy_with_offset_data():
    """Locations far from the origin relative to the scale: centring keeps float32 accurate."""
    n, d = 200, 8
    loc = 50.0 + torch.randn(n, d, dtype=torch.float64)
    scale = torch.full((n, d), 1e-2, dtype=torch.float64)
    z = loc + scale * torch.randn(n, d, dtype=torch.float64)
    rounded = [t.float().double() for t in (z, loc, scale)]
    reference = gaussian_mixture_log_prob(*rounded)
    actual = gaussian_mixture_log_prob(z.float(), loc.float(), scale.float())
    assert (actual.double() - reference).abs().max().item() < 1e-4


@pytest.mark.parametrize("exclude_self", [False, True])
def test_gradcheck(exclude_self):
    n, d = 5, 3
    loc = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    log_scale = (0.3 * torch.randn(n, d, dtype=torch.float64)).requires_grad_()
    z = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda z, loc, log_scale: gaussian_mixture_log_prob(z, loc, log_scale.exp(), exclude_self),
        (z, loc, log_scale),
    )


def test_float32_gradients_match_float64():
    n, d = 50, 6
    loc = torch.randn(n, d, dtype=torch.float64)
    scale = 0.05 * (1 + torch.rand(n, d, dtype=torch.float64))
    z = loc + scale * torch.randn(n, d, dtype=torch.float64)
    grads = []
    for dtype in (torch.float32, torch.float64):
        zz = z.to(dtype).requires_grad_()
        ll = loc.to(dtype).requires_grad_()
        gaussian_mixture_log_prob(zz, ll, scale.to(dtype)).sum().backward()
        grads.append((zz.grad.double(), ll.grad.double()))
    for g32, g64 in zip(*grads, strict=True):
        torch.testing.assert_close(g32, g64, rtol=1e-3, atol=1e-2)


def test_errors():
    loc = torch.randn(4, 3)
    with pytest.raises(ValueError, match="dimension"):
        gaussian_mixture_log_prob(torch.randn(2, 5), loc, torch.ones(4, 3))
    with pytest.raises(ValueError, match="shape of loc"):
        gaussian_mixture_log_prob(torch.randn(2, 3), loc, torch.ones(3))
    with pytest.raises(ValueError, match="exclude_self"):
        gaussian_mixture_log_prob(torch.randn(2, 3), loc, torch.ones(4, 3), exclude_self=True)
    with pytest.raises(ValueError, match="dtype"):
        gaussian_mixture_log_prob(torch.randn(4, 3).double(), loc, torch.ones(4, 3))
