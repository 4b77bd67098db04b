"""The package's log-sum-exps never exponentiate below the underflow threshold of their dtype
(rpm.ops._logsumexp), and with logits spread up to 1e4 nats they still equal float64 in value
and gradient: the dense one, the streamed matrix-product one, the implicit priors' normalisers
and the mixture marginal."""

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from rpm.ops import gaussian_mixture_log_prob, safe_logsumexp, streaming_matmul_logsumexp
from rpm.ops._logsumexp import exp_floor
from rpm.ops._streaming import streaming_gaussian_mixture_log_prob
from rpm.priors import CosineEnergy, ImplicitPrior, NeuralEnergy, PooledImplicitPrior, RBFEnergy
from rpm.priors._implicit import energy_log_normalizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPREADS = [1.0, 1e2, 1e3, 1e4]


class ExpWatch(TorchFunctionMode):
    """Records the smallest input of every exp and refuses torch's own logsumexp (whose
    backward exponentiates every entry, however far below the maximum)."""

    def __init__(self):
        super().__init__()
        self.lowest = math.inf
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("exp", "exp_"):
            values = args[0].detach()
            if values.numel():
                self.lowest = min(self.lowest, values.min().item())
            self.calls += 1
        if name == "logsumexp" and args[0].dim() > 1 and args[0].shape[-1] > 2:
            raise AssertionError("torch.logsumexp of a matrix: its backward exponentiates below "
                                 "the floor")
        return func(*args, **kwargs)


def underflow(dtype):
    """Inputs below this give subnormal exp() results."""
    return math.log(torch.finfo(dtype).tiny)


def spread_logits(spread, rows=6, cols=40, dtype=torch.float64):
    """Rows of logits uniform in [-spread, spread], one entry per row at the maximum."""
    x = spread * (2 * torch.rand(rows, cols, dtype=dtype) - 1)
    return x


def test_floor_is_above_the_subnormal_range():
    for dtype in (torch.float32, torch.float64):
        floor = exp_floor(dtype)
        tiny = torch.finfo(dtype).tiny
        assert torch.tensor(floor, dtype=dtype).exp().item() >= tiny
        assert floor < math.log(torch.finfo(dtype).eps) - 40  # far below what a sum can see


@pytest.mark.parametrize("spread", SPREADS)
def test_safe_logsumexp_float32_equals_float64(spread):
    """Value within float32 rounding of the float64 log-sum-exp of the same (float32) logits;
    gradients (the softmax) within 1e-6 absolute, exact zeros far below the maximum."""
    x64 = spread_logits(spread).float().double().requires_grad_()
    x64.data[:, 3] = -math.inf  # masked entries
    x32 = x64.detach().float().requires_grad_()
    weights = torch.randn(x64.shape[0], dtype=torch.float64)
    expected = torch.logsumexp(x64, -1)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), x64)
    watch = ExpWatch()
    with watch:
        actual = safe_logsumexp(x32, -1)
        (grad,) = torch.autograd.grad((actual * weights.float()).sum(), x32)
    assert watch.calls >= 1 and watch.lowest > underflow(torch.float32)
    assert actual.dtype == torch.float32
    scale = expected.abs().clamp_min(1.0)
    assert ((actual.double() - expected).abs() / scale).max() < 4 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(grad.double(), expected_grad, rtol=0, atol=1e-6)
    assert (grad[:, 3] == 0).all()


def test_safe_logsumexp_float64_and_special_rows():
    x = spread_logits(1e4, rows=5, cols=30)
    x[1] = -math.inf
    x[2, 4] = math.inf
    x[3, 7] = math.nan
    x.requires_grad_()
    actual = safe_logsumexp(x, -1)
    expected = torch.logsumexp(x.detach(), -1)
    torch.testing.assert_close(actual, expected, rtol=1e-15, atol=0, equal_nan=True)
    row = x[4].detach().clone().requires_grad_()
    (grad,) = torch.autograd.grad(safe_logsumexp(row, 0), row)
    torch.testing.assert_close(grad, torch.softmax(row.detach(), 0), rtol=0, atol=1e-15)
    with pytest.raises(TypeError, match="floating-point"):
        safe_logsumexp(torch.ones(3, dtype=torch.long))


def test_safe_logsumexp_twice_differentiable():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: safe_logsumexp(t, -1), (x,))


@pytest.mark.parametrize("spread", SPREADS)
def test_streamed_matmul_logsumexp_sharp(spread):
    """The streamed normaliser of a product whose logits span +-spread nats, float32 against
    float64 (same rounded inputs): values to float32 rounding, gradients to float32 rounding of the logits."""
    left = torch.randn(20, 3, dtype=torch.float64)
    right = torch.randn(30, 3, dtype=torch.float64)
    left = (spread * left / (left @ right.T).abs().max()).float().double().requires_grad_()
    right = right.float().double().requires_grad_()
    weights = torch.rand(20, dtype=torch.float64)
    expected = torch.logsumexp(left @ right.T, -1)
    expected_grads = torch.autograd.grad((expected * weights).sum(), (left, right))
    left32, right32 = (t.detach().float().requires_grad_() for t in (left, right))
    watch = ExpWatch()
    with watch:
        actual = streaming_matmul_logsumexp(left32, right32, block_size=7)
        grads = torch.autograd.grad((actual * weights.float()).sum(), (left32, right32))
    assert watch.lowest > underflow(torch.float32)
    tol = 8 * torch.finfo(torch.float32).eps * max(spread, 1.0)
    torch.testing.assert_close(actual.double(), expected, rtol=0, atol=tol)
    for got, want in zip(grads, expected_grads, strict=True):
        scale = want.abs().max().item()
        # the logits themselves round to eps * spread nats in float32
        torch.testing.assert_close(got.double(), want, rtol=0, atol=(1e-6 + tol) * scale)


def rounded(*tensors):
    return [t.float().double() for t in tensors]


@pytest.mark.parametrize("spread", SPREADS)
@pytest.mark.parametrize("streamed", [False, True])
def test_dense_prior_normalisers_sharp(spread, streamed):
    """ImplicitPrior and PooledImplicitPrior log-ratios of an RBF energy whose logits span
    about +-spread nats (lengthscale chosen from the spread), dense and streamed: float32
    against float64 in value and gradient."""
    z64, z2_64 = rounded(torch.randn(24, 3), torch.randn(24, 3))
    lengthscale = float(torch.cdist(z64, z2_64).max() / math.sqrt(2 * spread))
    block = 5 if streamed else None
    results = {}
    for dtype in (torch.float64, torch.float32):
        z = z64.to(dtype).requires_grad_()
        z2 = z2_64.to(dtype).requires_grad_()
        implicit = ImplicitPrior(RBFEnergy(lengthscale, learn_lengthscale=False))
        pooled = PooledImplicitPrior(RBFEnergy(lengthscale, learn_lengthscale=False))
        watch = ExpWatch()
        with watch:
            value = (implicit.log_ratio(z, z2, block_size=block).sum()
                     + pooled.log_ratio(z, z2, block_size=block).sum())
            grads = torch.autograd.grad(value, (z, z2))
        if dtype == torch.float32:
            assert watch.lowest > underflow(dtype)
        results[dtype] = (value.double(), [g.double() for g in grads])
    (v64, g64), (v32, g32) = results[torch.float64], results[torch.float32]
    assert torch.isfinite(v32)
    tol = 16 * torch.finfo(torch.float32).eps * spread  # the logits round to eps * spread nats
    torch.testing.assert_close(v32, v64, rtol=0, atol=48 * tol)
    for got, want in zip(g32, g64, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=(1e-5 + tol) * want.abs().max().item())


@pytest.mark.parametrize("energy", [CosineEnergy(kappa=1e4), NeuralEnergy(3, hidden=4)])
def test_non_product_and_cosine_normaliser_sharp(energy):
    """The dense normaliser of any energy goes through the safe log-sum-exp."""
    with torch.no_grad():
        for param in energy.parameters():
            param.mul_(300.0)
    z, z2 = torch.randn(10, 3), torch.randn(12, 3)
    watch = ExpWatch()
    with watch:
        actual = energy_log_normalizer(energy, z, z2)
    expected = torch.logsumexp(energy.double()(z.double(), z2.double()), -1)
    assert watch.lowest > underflow(torch.float32)
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("scale_value", [1.0, 1e-2, 1e-3])
@pytest.mark.parametrize("kernel", ["dense", "streamed"])
def test_mixture_marginal_sharp(scale_value, kernel):
    """Narrow components (log-components spread up to ~1e6 nats) in float32 against float64:
    values and gradients, and no exp below the floor."""
    n, d = 40, 3
    loc, z = rounded(torch.randn(n, d), torch.randn(n, d))
    scale = torch.full((n, d), scale_value, dtype=torch.float64)
    results = {}
    for dtype in (torch.float64, torch.float32):
        args = [t.to(dtype).requires_grad_() for t in (z, loc, scale)]
        watch = ExpWatch()
        with watch:
            if kernel == "dense":
                value = gaussian_mixture_log_prob(*args, exclude_self=True)
            else:
                value = streaming_gaussian_mixture_log_prob(*args, exclude_self=True, block_size=7)
            grads = torch.autograd.grad(value.sum(), args)
        if dtype == torch.float32:
            assert watch.lowest > underflow(dtype)
        results[dtype] = (value.double(), [g.double() for g in grads])
    (v64, g64), (v32, g32) = results[torch.float64], results[torch.float32]
    scale_v = v64.abs().clamp_min(1.0)
    assert ((v32 - v64).abs() / scale_v).max() < 1e-5
    for got, want in zip(g32, g64, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * want.abs().max().item())


def test_distribution_mixture_marginal_sharp():
    """The generic (any recognition family) mixture marginal: narrow Student-t components in
    float32 against float64, and no exp below the floor."""
    from rpm.ops import distribution_mixture_log_prob

    n, d = 30, 3
    loc, z = rounded(torch.randn(n, d), torch.randn(n, d))
    results = {}
    for dtype in (torch.float64, torch.float32):
        loc_t = loc.to(dtype).requires_grad_()
        z_t = z.to(dtype).requires_grad_()
        q = torch.distributions.Independent(
            torch.distributions.StudentT(torch.tensor(4.0, dtype=dtype), loc_t,
                                         torch.full_like(loc_t, 1e-3)), 1)
        watch = ExpWatch()
        with watch:
            value = distribution_mixture_log_prob(q, z_t, exclude_self=True)
            grads = torch.autograd.grad(value.sum(), (z_t, loc_t))
        if dtype == torch.float32:
            assert watch.lowest > underflow(dtype)
        results[dtype] = (value.double(), [g.double() for g in grads])
    (v64, g64), (v32, g32) = results[torch.float64], results[torch.float32]
    assert ((v32 - v64).abs() / v64.abs().clamp_min(1.0)).max() < 1e-5
    for got, want in zip(g32, g64, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * want.abs().max().item())
