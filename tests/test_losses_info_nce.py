"""``rpm.losses.info_nce`` against a loop written from its equation,
InfoNCE = (1/N) sum_i -log( exp F_ii / sum_j exp F_ij ), in float64."""

import math

import pytest
import torch

from rpm.losses import info_nce


def _info_nce_loop(logits):
    n = len(logits)
    total = 0.0
    for i in range(n):
        denominator = sum(math.exp(logits[i][j]) for j in range(n))
        total += -math.log(math.exp(logits[i][i]) / denominator)
    return total / n


@pytest.mark.parametrize("n", [1, 2, 7])
def test_info_nce_matches_the_loop_over_rows(n):
    generator = torch.Generator().manual_seed(n)
    logits = 3.0 * torch.randn(n, n, generator=generator, dtype=torch.float64)
    assert info_nce(logits).item() == pytest.approx(_info_nce_loop(logits.tolist()), rel=1e-12)


def test_info_nce_is_log_n_for_uninformative_logits_and_not_symmetric_in_its_axes():
    """Equal logits give log N whatever their value; the loss normalises over the columns
    (candidates) of each row, so the transpose gives another value."""
    assert info_nce(torch.full((5, 5), 4.2, dtype=torch.float64)).item() == pytest.approx(
        math.log(5), rel=1e-12)
    logits = torch.tensor([[3.0, 0.0, 0.0], [2.0, 1.0, 0.0], [2.0, 0.0, 0.5]], dtype=torch.float64)
    assert info_nce(logits.T).item() == pytest.approx(_info_nce_loop(logits.T.tolist()), rel=1e-12)
    assert abs(info_nce(logits).item() - info_nce(logits.T).item()) > 0.4


def test_info_nce_gradient_is_softmax_minus_identity_over_n():
    """d InfoNCE / d F_ij = (softmax_j F_ij - [i = j]) / N."""
    logits = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    info_nce(logits).backward()
    expected = (torch.softmax(logits.detach(), dim=1) - torch.eye(4, dtype=torch.float64)) / 4
    torch.testing.assert_close(logits.grad, expected)


@pytest.mark.parametrize("shape", [(3, 4), (3,), (2, 2, 2)])
def test_info_nce_refuses_logits_that_are_not_square(shape):
    with pytest.raises(ValueError, match=r"shape \(N, N\)"):
        info_nce(torch.zeros(shape))


def test_info_nce_refuses_logits_that_are_not_a_tensor():
    with pytest.raises(ValueError, match=r"shape \(N, N\); got list"):
        info_nce([[1.0, 0.0], [0.0, 1.0]])
