"""The log of the exponentially scaled Bessel function of the first kind, and the ratio
I_{v+1}/I_v, against scipy.special.ive (float64) where it is representable and mpmath (50 digits)
where scipy underflows; derivatives by gradcheck and gradgradcheck (finite differences)."""

import mpmath
import numpy as np
import pytest
import torch
from scipy import special

from rpm.ops._bessel import DEBYE_MIN_ORDER, SERIES_MAX_ARGUMENT, bessel_iv_ratio, log_bessel_ive

#: Orders on both sides of the switch to Debye's expansion, up to D = 1024 (v = 511).
ORDERS = [0.0, 0.5, 1.0, 1.5, 4.0, 14.0, 14.5, 15.0, 15.5, 31.0, 99.5, 255.0, 511.0]
#: kappa from 1e-3 to 1e5, and both sides of the switch from the series to Hankel's expansion.
ARGUMENTS = np.sort(np.concatenate([np.logspace(-3, 5, 81), [29.99, 30.0, 30.01]]))


def test_the_switches_are_where_the_grid_tests_them():
    assert SERIES_MAX_ARGUMENT == 30.0 and DEBYE_MIN_ORDER == 15.0


@pytest.mark.parametrize("order", ORDERS)
def test_log_ive_matches_scipy(order):
    ours = log_bessel_ive(order, torch.tensor(ARGUMENTS)).numpy()
    scaled = special.ive(order, ARGUMENTS)
    representable = scaled > 1e-290                      # below, scipy's ive rounds to 0
    assert representable.sum() >= 20
    reference = np.log(scaled[representable])
    log_iv = reference + ARGUMENTS[representable]         # log I_v, the size of the rounding
    np.testing.assert_array_less(np.abs(ours[representable] - reference),
                                 1e-12 * np.maximum(np.abs(log_iv), 1.0))


@pytest.mark.parametrize("order, x", [(511.0, 1e-3), (511.0, 0.5), (255.5, 2.0), (99.5, 1e-3),
                                      (63.0, 1e-3)])
def test_log_ive_where_scipy_underflows_matches_mpmath(order, x):
    assert special.ive(order, x) < 1e-290
    with mpmath.workdps(50):
        reference = float(mpmath.log(mpmath.besseli(order, x)) - x)
    ours = log_bessel_ive(order, torch.tensor([x], dtype=torch.float64)).item()
    assert ours == pytest.approx(reference, rel=1e-13)


@pytest.mark.parametrize("order", ORDERS)
def test_ratio_matches_scipy(order):
    x = ARGUMENTS
    with np.errstate(invalid="ignore", divide="ignore"):
        reference = special.ive(order + 1, x) / special.ive(order, x)
    representable = special.ive(order + 1, x) > 1e-290
    ours = bessel_iv_ratio(order, torch.tensor(x)).numpy()
    np.testing.assert_allclose(ours[representable], reference[representable], rtol=1e-11)
    assert ((ours > 0) & (ours < 1)).all()


@pytest.mark.parametrize("order", [0.0, 14.5, 15.0, 511.0])
def test_derivatives_match_finite_differences(order):
    x = torch.tensor([1e-3, 0.7, 29.9, 30.1, 250.0, 1e5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: log_bessel_ive(order, t), (x,))
    assert torch.autograd.gradcheck(lambda t: bessel_iv_ratio(order, t), (x,))
    if order in (14.5, 15.0):  # the backward pass is differentiable too (both expansions)
        assert torch.autograd.gradgradcheck(lambda t: log_bessel_ive(order, t), (x,))


def test_float32_is_computed_in_float64_and_cast_back():
    x = torch.tensor([1e-3, 3.0, 4e4])
    for function in (log_bessel_ive, bessel_iv_ratio):
        value = function(40.0, x)
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, function(40.0, x.double()).float(), rtol=0, atol=0)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="order must be >= 0"):
        log_bessel_ive(-0.5, torch.ones(2))
    with pytest.raises(TypeError, match="floating tensor"):
        bessel_iv_ratio(1.0, torch.ones(2, dtype=torch.long))
