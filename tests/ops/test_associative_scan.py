"""The associative scan against sequential loops written from its definition."""

import pytest
import torch

from rpm.ops._associative_scan import associative_scan

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 8, 9, 16, 17, 31])
def test_prefix_sums_and_matrix_products(length):
    x = torch.randn(length, 3, dtype=torch.float64)
    (sums,) = associative_scan(lambda a, b: (a[0] + b[0],), (x,))
    assert torch.allclose(sums, x.cumsum(0), atol=1e-12)
    m = torch.randn(length, 2, 2, dtype=torch.float64)
    # y_t = m_t ... m_1 (later elements multiply from the left): a non-commutative operation
    (prefix,) = associative_scan(lambda a, b: (b[0] @ a[0],), (m,))
    expected = [m[0]]
    for t in range(1, length):
        expected.append(m[t] @ expected[-1])
    assert torch.allclose(prefix, torch.stack(expected), atol=1e-10)


@pytest.mark.parametrize("length", [1, 2, 6, 7])
def test_reverse_scan_keeps_the_order_of_the_operands(length):
    m = torch.randn(length, 2, 2, dtype=torch.float64)
    v = torch.randn(length, 4, 2, dtype=torch.float64)

    def affine(earlier, later):  # (E, c): x -> E x + c composed as earlier(later(x))
        return earlier[0] @ later[0], (earlier[0] @ later[1].unsqueeze(-1)).squeeze(-1) + earlier[1]

    e, c = associative_scan(affine, (m.unsqueeze(1).expand(length, 4, 2, 2), v), reverse=True)
    state_m, state_c = m[-1].expand(4, 2, 2), v[-1]
    assert torch.allclose(c[-1], state_c)
    for t in range(length - 2, -1, -1):
        state_m, state_c = m[t] @ state_m, (m[t] @ state_c.unsqueeze(-1)).squeeze(-1) + v[t]
        assert torch.allclose(e[t], state_m, atol=1e-10)
        assert torch.allclose(c[t], state_c, atol=1e-10)


def test_elements_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="same length along axis 0"):
        associative_scan(lambda a, b: a, (torch.zeros(3), torch.zeros(4)))
