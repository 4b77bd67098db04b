"""``rpm.ops._logsumexp.diagonal_log_softmax``, the per-pair InfoNCE terms of the dense implicit prior
(Eq. 23-25 of Aitchison & Ganev), against a float64 loop written from the equation, autograd's
gradient of that loop, ``gradcheck`` and the float64 value of float32 logits spread over up to
1e4 nats."""

import math

import pytest
import torch

from rpm.ops import safe_logsumexp
from rpm.ops._logsumexp import diagonal_log_softmax

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def terms_loop(logits, offset):
    """r_i = F_ii - log sum_j exp(F_ij) + c, one row at a time, shifted by the row maximum."""
    rows = []
    for i in range(logits.shape[0]):
        row = logits[i]
        top = row.detach().max()
        rows.append(row[i] - (top + torch.log(torch.exp(row - top).sum())) + offset)
    return torch.stack(rows)


@pytest.mark.parametrize("shape", [(2, 2), (5, 5), (7, 12), (16, 16)])
def test_matches_loop_in_float64(shape):
    logits = (3 * torch.randn(*shape, dtype=torch.float64)).requires_grad_()
    weights = torch.randn(shape[0], dtype=torch.float64)
    offset = math.log(shape[1])
    actual = diagonal_log_softmax(logits, offset)
    (grad,) = torch.autograd.grad((actual * weights).sum(), logits)
    expected = terms_loop(logits, offset)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), logits)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)
    # the terms the generic path computed before (diagonal minus the safe log-sum-exp)
    generic = torch.diagonal(logits[:, :shape[0]]) - safe_logsumexp(logits, -1) + offset
    torch.testing.assert_close(actual, generic, rtol=0, atol=1e-12)


def test_gradcheck_and_gradgradcheck():
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: diagonal_log_softmax(t, 0.5), (logits,))
    assert torch.autograd.gradgradcheck(lambda t: diagonal_log_softmax(t, 0.5), (logits,))


@pytest.mark.parametrize("spread", [1.0, 1e2, 1e3, 1e4])
def test_float32_equals_float64_for_sharp_logits(spread):
    """Logits uniform in [-spread, spread] (a sharp energy puts most of a row hundreds of nats
    below its maximum): float32 within float32 rounding of float64, gradients within 1e-6."""
    x64 = (spread * (2 * torch.rand(6, 40, dtype=torch.float64) - 1)).float().double()
    x64.requires_grad_()
    x32 = x64.detach().float().requires_grad_()
    weights = torch.randn(6, dtype=torch.float64)
    expected = terms_loop(x64, 0.0)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), x64)
    actual = diagonal_log_softmax(x32)
    (grad,) = torch.autograd.grad((actual * weights.float()).sum(), x32)
    scale = expected.detach().abs().clamp_min(1.0)
    assert ((actual.double() - expected.detach()).abs() / scale).max() < 8 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(grad.double(), expected_grad, rtol=0, atol=1e-6)


def test_masked_entries_and_non_finite_rows():
    logits = torch.randn(4, 4, dtype=torch.float64)
    logits[0, 2] = -math.inf                           # a masked candidate: no weight, no gradient
    logits[1] = math.nan                               # a NaN row
    logits[2, 3] = math.inf                            # a row with +inf
    logits.requires_grad_()
    actual = diagonal_log_softmax(logits)
    assert math.isfinite(actual[0].item()) and math.isfinite(actual[3].item())
    assert not math.isfinite(actual[1].item()) and not math.isfinite(actual[2].item())
    (grad,) = torch.autograd.grad(actual[0], logits)
    assert grad[0, 2] == 0
    finite = logits.detach()[0, [0, 1, 3]]
    torch.testing.assert_close(actual[0], logits[0, 0] - torch.logsumexp(finite, 0), rtol=0,
                               atol=1e-12)
    row = logits.detach()[3]
    torch.testing.assert_close(actual[3], row[3] - torch.logsumexp(row, 0), rtol=0, atol=1e-12)


def test_bad_arguments():
    with pytest.raises(TypeError, match="floating-point"):
        diagonal_log_softmax(torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"M >= N, got \(4, 3\)"):
        diagonal_log_softmax(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"\(\.\.\., N, M\)"):
        diagonal_log_softmax(torch.randn(4))


def test_leading_dimensions_are_a_batch_of_matrices():
    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    expected = torch.stack([terms_loop(matrix, 0.25) for matrix in logits])
    torch.testing.assert_close(diagonal_log_softmax(logits, 0.25), expected, rtol=0, atol=1e-12)
