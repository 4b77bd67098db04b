"""The fused Triton kernel of the mixture marginal (rpm.ops._triton_mixture).

* Under Triton's interpreter (``TRITON_INTERPRET=1`` and Triton installed; skipped otherwise,
  and failed instead of skipped with ``RPM_REQUIRE_TRITON_INTERPRETER=1``, as
  ``.ci/triton_interpreter`` runs them): values and the gradients for z, loc and scale against
  a float64 loop written from the equation, with exclude_self, M != N, sizes that are not
  multiples of the block, D = 1, 3, 16, 130, and tight clusters far from the origin where the
  expanded quadratic form cancels; second derivatives (Hessian-vector products, a gradient
  penalty) against the float64 loop and the dense path; the per-call ``fused`` argument.
* On CUDA (``pytest -m cuda``, Triton installed, not interpreted): the same at N up to 8192,
  the gradients against the streamed kernel, and the dispatch of gaussian_mixture_log_prob.
* Everywhere: importing rpm never imports the kernels; the fused function's errors.
"""

import functools
import math
import os
import subprocess
import sys

import pytest
import torch

import rpm.ops._gaussian_mixture as gaussian_mixture
from rpm.ops import fused_mixture_kernel, gaussian_mixture_log_prob
from rpm.ops._dispatch import (
    FUSED_MAX_DIM,
    ieee_float32_matmul,
    triton_available,
    use_fused_mixture,
)
from rpm.ops._gaussian_mixture import (
    dense_gaussian_mixture_log_prob,
    fused_gaussian_mixture_log_prob,
)
from rpm.ops._streaming import streaming_gaussian_mixture_log_prob

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
#: Set by .ci/triton_interpreter: the interpreter tests fail where they would skip.
REQUIRE_INTERPRETER = os.environ.get("RPM_REQUIRE_TRITON_INTERPRETER") == "1"


@functools.cache
def interpreter_problem() -> str | None:
    """Why the kernels cannot run under Triton's interpreter here, or None when they run (one
    pair through the fused function: a loop over a runtime bound, the case that Triton 3.6's
    interpreter fails with NumPy >= 2.3)."""
    if not INTERPRETED:
        return "needs TRITON_INTERPRET=1"
    if not triton_available():
        return "needs Triton installed"
    try:
        fused_gaussian_mixture_log_prob(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))
    except Exception as error:  # any failure: the interpreter cannot run the kernels
        return f"Triton's interpreter fails here: {type(error).__name__}: {error}"
    return None


@pytest.fixture
def triton_interpreter():
    """Skips the test where the kernels cannot be interpreted, or fails it with
    ``RPM_REQUIRE_TRITON_INTERPRETER=1`` (so that CI cannot skip them silently)."""
    problem = interpreter_problem()
    if problem is not None:
        if REQUIRE_INTERPRETER:
            pytest.fail(f"RPM_REQUIRE_TRITON_INTERPRETER=1, but {problem}")
        pytest.skip(problem)


interpreter = pytest.mark.usefixtures("triton_interpreter")
compiled = pytest.mark.skipif(
    not triton_available() or INTERPRETED, reason="needs Triton compiling for CUDA")


def mixture_rows(z, loc, scale, exclude_self, first_row):
    """log Q(z_m) for the points z (rows first_row, first_row + 1, ... of the whole set):
    logsumexp_n L_mn - log N (N - 1 without the pair (m, m)), with
    L_mn = -sum_d log sigma_nd - D/2 log 2 pi - 1/2 sum_d (z_md - mu_nd)^2 / sigma_nd^2."""
    dim = z.shape[1]
    log_norm = -scale.log().sum(-1) - 0.5 * dim * math.log(2 * math.pi)  # (N,)
    values = log_norm - 0.5 * ((z[:, None] - loc[None]) / scale[None]).square().sum(-1)
    count = loc.shape[0]
    if exclude_self:
        rows = torch.arange(z.shape[0], device=z.device)
        values = values.index_put((rows, rows + first_row), values.new_tensor(-math.inf))
        count -= 1
    return torch.logsumexp(values, 1) - math.log(count)


def loop_values_and_grads(inputs, weights, exclude_self, rows_per_step):
    """The float64 loop over blocks of points: log Q and the gradients of sum_m weights_m
    log Q(z_m), accumulated block by block (so its memory is one block's)."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    values, grads = [], [torch.zeros_like(leaf) for leaf in leaves]
    for start in range(0, leaves[0].shape[0], rows_per_step):
        stop = start + rows_per_step
        part = mixture_rows(leaves[0][start:stop], leaves[1], leaves[2], exclude_self, start)
        for total, grad in zip(grads, torch.autograd.grad(part, leaves, weights[start:stop]),
                               strict=True):
            total += grad
        values.append(part.detach())
    return torch.cat(values), grads


def values_and_grads(fn, tensors, weights):
    """fn(*tensors) and the gradients of sum_m weights_m fn_m for every tensor."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    values = fn(*leaves)
    grads = torch.autograd.grad(values, leaves, weights.to(values))
    return values.detach(), grads


def overlapping(num_points, num_comps, dim, generator, device="cpu"):
    """Points and locations N(0, I), scales U(0.5, 1.5), float64."""
    options = {"generator": generator, "dtype": torch.float64}
    z = torch.randn(num_points, dim, **options)
    loc = torch.randn(num_comps, dim, **options)
    scale = 0.5 + torch.rand(num_comps, dim, **options)
    return [t.to(device) for t in (z, loc, scale)]


def tight(num, dim, generator, device="cpu"):
    """Four clusters 1e3 from the origin, locations 1e-3 apart, scales ~1e-3, point m drawn
    from component m (float64): the expansion z^2 w - 2 z mu w + mu^2 w cancels ~1e12 to 1."""
    options = {"generator": generator, "dtype": torch.float64}
    centres = torch.randn(4, dim, **options)
    centres = 1e3 * centres / centres.norm(dim=1, keepdim=True)
    loc = centres[torch.arange(num) % 4] + 1e-3 * torch.randn(num, dim, **options)
    scale = 1e-3 * (0.5 + torch.rand(num, dim, **options))
    z = loc + scale * torch.randn(num, dim, **options)
    return [t.to(device) for t in (z, loc, scale)]


def assert_matches_loop(inputs, exclude_self, value_tol, grad_tol, dtype=torch.float32):
    """The fused kernel in ``dtype`` against the float64 loop on the same (rounded) inputs:
    largest absolute value error and largest gradient error relative to the gradient's
    largest entry."""
    inputs = [t.to(dtype).double() for t in inputs]
    weights = torch.randn(inputs[0].shape[0], generator=torch.Generator().manual_seed(7),
                          dtype=torch.float64).to(inputs[0].device)
    rows_per_step = 1 if inputs[0].device.type == "cpu" else 128
    want, want_grads = loop_values_and_grads(inputs, weights, exclude_self, rows_per_step)
    got, got_grads = values_and_grads(
        lambda *t: fused_gaussian_mixture_log_prob(*t, exclude_self),
        [t.to(dtype) for t in inputs], weights)
    assert got.dtype == dtype and got.shape == want.shape
    assert (got.double() - want).abs().max().item() < value_tol
    for name, g, w in zip(("z", "loc", "scale"), got_grads, want_grads, strict=True):
        error = ((g.double() - w).abs().max() / w.abs().max()).item()
        assert error < grad_tol, (name, error)


# ----------------------------------------------------------------------------- interpreter
@interpreter
@pytest.mark.parametrize(("num_points", "num_comps", "dim", "exclude_self"), [
    (70, 70, 1, True),  # two row and column blocks, the second one 6 wide
    (33, 150, 3, False),  # M != N, three column blocks over two splits
    (100, 45, 16, False),  # M > N, one column block
    (70, 70, 130, True),  # D not a multiple of the chunk of 16
    (2, 2, 3, True),  # one pair per row
    (1, 1, 1, False),
])
def test_interpreted_kernel_matches_float64_loop(num_points, num_comps, dim, exclude_self):
    inputs = overlapping(num_points, num_comps, dim, torch.Generator().manual_seed(dim))
    assert_matches_loop(inputs, exclude_self, value_tol=1e-4, grad_tol=1e-4)


@interpreter
@pytest.mark.parametrize("exclude_self", [False, True])
def test_interpreted_kernel_does_not_cancel_for_tight_far_clusters(exclude_self):
    """Where the float32 expansion of the quadratic form is off by many nats, the difference
    form stays within 1e-4 of float64."""
    z, loc, scale = (t.float().double() for t in tight(80, 16, torch.Generator().manual_seed(3)))
    weight = scale.float().reciprocal().square()
    z32, loc32 = z.float(), loc.float()
    expanded = (z32.square() @ weight.T - 2 * z32 @ (loc32 * weight).T
                + (loc32.square() * weight).sum(-1))  # (M, N), float32
    exact = (((z[:, None] - loc[None]) / scale[None]) ** 2).sum(-1)
    assert (expanded.double() - exact).abs().max().item() > 1.0  # the case is a hard one
    assert_matches_loop([z, loc, scale], exclude_self, value_tol=1e-4, grad_tol=1e-4)


@interpreter
def test_interpreted_kernel_in_float64_equals_the_loop():
    inputs = overlapping(70, 70, 5, torch.Generator().manual_seed(5))
    assert_matches_loop(inputs, True, value_tol=1e-10, grad_tol=1e-10, dtype=torch.float64)


@interpreter
def test_interpreted_kernel_without_points_or_unwanted_gradients():
    z, loc, scale = overlapping(0, 5, 3, torch.Generator().manual_seed(0))
    z, loc, scale = (t.float().requires_grad_() for t in (z, loc, scale))
    values = fused_gaussian_mixture_log_prob(z, loc, scale)
    assert values.shape == (0,)
    values.sum().backward()
    assert loc.grad.abs().max() == 0 and z.grad.shape == (0, 3)
    # Only z requires a gradient: loc and scale are not differentiated.
    z, loc, scale = overlapping(20, 30, 4, torch.Generator().manual_seed(1))
    z = z.float().requires_grad_()
    weights = torch.ones(20, dtype=torch.float64)
    (grad,) = torch.autograd.grad(
        fused_gaussian_mixture_log_prob(z, loc.float(), scale.float()), z, weights.float())
    want = loop_values_and_grads([z, loc, scale], weights, False, 1)[1][0]
    assert (grad.double() - want).abs().max().item() < 1e-5


def first_and_second_derivatives(fn, tensors, weights, vectors):
    """The gradients g of sum_m weights_m fn_m for every tensor and the Hessian-vector
    products d/dt sum_i <g_i, v_i> (the second derivative, through create_graph=True)."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    grads = torch.autograd.grad(fn(*leaves), leaves, weights.to(leaves[0]), create_graph=True)
    dot = sum((g * v.to(g)).sum() for g, v in zip(grads, vectors, strict=True))
    products = torch.autograd.grad(dot, leaves)
    return [g.detach() for g in grads], list(products)


def relative_error(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


@interpreter
@pytest.mark.parametrize("exclude_self", [False, True])
def test_interpreted_kernel_is_twice_differentiable(exclude_self):
    """Hessian-vector products through the fused function: in float64 equal to the float64
    loop's (an independent autograd graph of the equation), in float32 to the dense path's."""
    generator = torch.Generator().manual_seed(11)
    inputs = overlapping(40, 40, 3, generator)
    weights = torch.randn(40, generator=generator, dtype=torch.float64)
    vectors = [torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in inputs]

    def loop(z, loc, scale):
        return mixture_rows(z, loc, scale, exclude_self, 0)

    want_grads, want = first_and_second_derivatives(loop, inputs, weights, vectors)
    got_grads, got = first_and_second_derivatives(
        lambda *t: fused_gaussian_mixture_log_prob(*t, exclude_self), inputs, weights, vectors)
    names = ("grad z", "grad loc", "grad scale", "hvp z", "hvp loc", "hvp scale")
    for name, g, w in zip(names, got_grads + got, want_grads + want, strict=True):
        assert relative_error(g, w) < 1e-10, name
    floats = [t.float() for t in inputs]
    dense_grads, dense = first_and_second_derivatives(
        lambda *t: dense_gaussian_mixture_log_prob(*t, exclude_self), floats, weights, vectors)
    got_grads, got = first_and_second_derivatives(
        lambda *t: fused_gaussian_mixture_log_prob(*t, exclude_self), floats, weights, vectors)
    for g, w in zip(got_grads + got, dense_grads + dense, strict=True):
        assert g.dtype == torch.float32 and relative_error(g, w) < 1e-6
    for g, w in zip(got, want, strict=True):  # and float32 is near float64
        assert relative_error(g, w) < 1e-3


@interpreter
def test_interpreted_kernel_takes_a_gradient_penalty():
    """loss = -sum_m log Q(z_m) + sum_m |d log Q(z_m) / d z_m|^2 (a gradient penalty):
    backward through the fused function gives the float64 loop's gradients."""
    inputs = overlapping(30, 25, 4, torch.Generator().manual_seed(12))

    def penalised_gradients(fn):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        values = fn(*leaves)
        (score,) = torch.autograd.grad(values.sum(), leaves[0], create_graph=True)
        loss = -values.sum() + score.square().sum()
        loss.backward()
        return [leaf.grad for leaf in leaves]

    want = penalised_gradients(lambda *t: mixture_rows(*t, False, 0))
    got = penalised_gradients(fused_gaussian_mixture_log_prob)
    for name, g, w in zip(("z", "loc", "scale"), got, want, strict=True):
        assert relative_error(g, w) < 1e-10, name


@interpreter
def test_interpreted_first_order_gradients_stay_in_the_kernels(monkeypatch):
    """Without create_graph the backward pass runs the kernels (the dense path, made to raise,
    is not called) and its gradients agree with the dense path's; with create_graph it
    differentiates the dense path."""
    inputs = [t.float() for t in overlapping(50, 60, 5, torch.Generator().manual_seed(13))]
    weights = torch.randn(50, generator=torch.Generator().manual_seed(14))
    dense, dense_grads = values_and_grads(dense_gaussian_mixture_log_prob, inputs, weights)

    def refuse(*args, **kwargs):
        raise AssertionError("the dense path was called")

    monkeypatch.setattr(gaussian_mixture, "dense_gaussian_mixture_log_prob", refuse)
    fused, fused_grads = values_and_grads(fused_gaussian_mixture_log_prob, inputs, weights)
    assert (fused - dense).abs().max().item() < 1e-5
    for g, w in zip(fused_grads, dense_grads, strict=True):
        assert relative_error(g, w) < 1e-5
    leaves = [t.clone().requires_grad_() for t in inputs]
    with pytest.raises(AssertionError, match="dense path was called"):
        torch.autograd.grad(fused_gaussian_mixture_log_prob(*leaves), leaves, weights,
                            create_graph=True)


@interpreter
def test_interpreted_dispatch_follows_the_call_then_the_scoped_switch():
    """fused=True runs the fused kernel (even on the CPU, interpreted, and inside a block that
    forbids the automatic choice); fused=None on the CPU and fused=False never do."""
    z, loc, scale = (t.float().requires_grad_()
                     for t in overlapping(20, 30, 4, torch.Generator().manual_seed(15)))
    fused = gaussian_mixture_log_prob(z, loc, scale, fused=True)
    assert type(fused.grad_fn).__name__ == "FusedGaussianMixtureBackward"
    assert torch.equal(fused, fused_gaussian_mixture_log_prob(z, loc, scale))
    with fused_mixture_kernel(False):
        inside = gaussian_mixture_log_prob(z, loc, scale, fused=True)
    assert type(inside.grad_fn).__name__ == "FusedGaussianMixtureBackward"
    for choice in (None, False):
        other = gaussian_mixture_log_prob(z, loc, scale, fused=choice)
        assert "Fused" not in type(other.grad_fn).__name__
        assert (other - fused).abs().max().item() < 1e-5


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@compiled
@pytest.mark.parametrize(("num_points", "num_comps", "dim", "exclude_self"), [
    (8192, 8192, 16, True),
    (4096, 3000, 128, False),
    (1000, 1000, 130, True),
    (77, 5000, 1, False),
])
def test_cuda_kernel_matches_float64_loop(num_points, num_comps, dim, exclude_self):
    inputs = overlapping(num_points, num_comps, dim, torch.Generator().manual_seed(dim), "cuda")
    assert_matches_loop(inputs, exclude_self, value_tol=1e-4, grad_tol=1e-4)


@pytest.mark.cuda
@compiled
@pytest.mark.parametrize("exclude_self", [False, True])
def test_cuda_kernel_does_not_cancel_for_tight_far_clusters(exclude_self):
    inputs = tight(4096, 16, torch.Generator().manual_seed(3), "cuda")
    assert_matches_loop(inputs, exclude_self, value_tol=1e-4, grad_tol=1e-4)


@pytest.mark.cuda
@compiled
@pytest.mark.parametrize("exclude_self", [False, True])
def test_cuda_kernel_gradients_match_the_streamed_kernel(exclude_self):
    """Same float32 data through the fused and the streamed kernel: values within 1e-4, every
    gradient within 1e-4 of its largest entry (both are within that of float64)."""
    inputs = [t.float() for t in overlapping(4096, 4096, 32, torch.Generator().manual_seed(9),
                                             "cuda")]
    weights = torch.randn(4096, generator=torch.Generator().manual_seed(4)).cuda()
    fused, fused_grads = values_and_grads(
        lambda *t: fused_gaussian_mixture_log_prob(*t, exclude_self), inputs, weights)
    with ieee_float32_matmul():
        streamed, streamed_grads = values_and_grads(
            lambda *t: streaming_gaussian_mixture_log_prob(*t, exclude_self, block_size=1024),
            inputs, weights)
    assert (fused - streamed).abs().max().item() < 1e-4
    for g, w in zip(fused_grads, streamed_grads, strict=True):
        assert ((g - w).abs().max() / w.abs().max()).item() < 1e-4


@pytest.mark.cuda
@compiled
def test_cuda_dispatch_uses_the_fused_kernel_for_float32_unless_switched_off():
    z, loc, scale = overlapping(300, 200, 8, torch.Generator().manual_seed(2), "cuda")
    z32, loc32, scale32 = (t.float().requires_grad_() for t in (z, loc, scale))
    assert use_fused_mixture(z32) and not use_fused_mixture(z)
    fused = gaussian_mixture_log_prob(z32, loc32, scale32)
    assert type(fused.grad_fn).__name__ == "FusedGaussianMixtureBackward"
    assert torch.equal(fused, fused_gaussian_mixture_log_prob(z32, loc32, scale32))
    with fused_mixture_kernel(False):
        assert not use_fused_mixture(z32)
        other = gaussian_mixture_log_prob(z32, loc32, scale32)
    assert use_fused_mixture(z32)  # restored
    assert "Fused" not in type(other.grad_fn).__name__
    assert (fused - other).abs().max().item() < 1e-4
    # a block size asks for the streamed kernel; float64 goes to the matrix-product paths
    streamed = gaussian_mixture_log_prob(z32, loc32, scale32, block_size=64)
    assert "Streaming" in type(streamed.grad_fn).__name__
    assert "Fused" not in type(gaussian_mixture_log_prob(z, loc, scale).grad_fn).__name__
    # wider latents than FUSED_MAX_DIM go to the matrix-product paths
    wide = torch.zeros(5, FUSED_MAX_DIM + 1, device="cuda")
    assert use_fused_mixture(wide[:, :FUSED_MAX_DIM]) and not use_fused_mixture(wide)


# ----------------------------------------------------------------------------- everywhere
def test_importing_rpm_does_not_import_the_triton_kernels():
    """The kernels' module (which imports Triton) loads only when the fused path runs."""
    code = ("import sys, rpm, rpm.ops, rpm.marginals; "
            "assert 'rpm.ops._triton_mixture' not in sys.modules, 'kernels imported'")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=os.getcwd(), timeout=120)
    assert result.returncode == 0, result.stderr


def test_fused_function_refuses_what_it_cannot_run():
    z, loc, scale = (t.float() for t in overlapping(4, 3, 2, torch.Generator().manual_seed(0)))
    if not triton_available():
        with pytest.raises(RuntimeError, match="needs Triton"):
            fused_gaussian_mixture_log_prob(z, loc, scale)
    elif not INTERPRETED:
        with pytest.raises(ValueError, match="runs on CUDA tensors"):
            fused_gaussian_mixture_log_prob(z, loc, scale)
    with pytest.raises(ValueError, match="dimension"):  # the shared argument checks come first
        fused_gaussian_mixture_log_prob(z[:, :1], loc, scale)
    assert not use_fused_mixture(z)  # CPU tensors never dispatch to it
    with pytest.raises(ValueError, match="one device"):  # a kernel would read a wrong address
        gaussian_mixture_log_prob(z, loc.to("meta"), scale)
