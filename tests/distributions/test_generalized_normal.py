"""GeneralizedNormal against scipy.stats.gennorm: log-density, CDF, moments, entropy, samples
(Kolmogorov-Smirnov), the reparameterised gradient, and the errors of bad parameters."""

import numpy as np
import pyro
import pytest
import torch
from scipy import stats

from rpm.distributions import GeneralizedNormal


@pytest.mark.parametrize("shape", [0.4, 0.7, 1.0, 2.0, 3.5])
def test_log_prob_cdf_moments_entropy_match_scipy(shape):
    torch.set_default_dtype(torch.float64)
    loc, scale = 0.3, 1.7
    x = torch.linspace(-6, 6, 41)
    dist = GeneralizedNormal(loc, scale, shape)
    reference = stats.gennorm(shape, loc=loc, scale=scale)
    np.testing.assert_allclose(dist.log_prob(x).numpy(), reference.logpdf(x.numpy()), rtol=1e-12)
    np.testing.assert_allclose(dist.cdf(x).numpy(), reference.cdf(x.numpy()), rtol=1e-10,
                               atol=1e-14)
    assert dist.variance.item() == pytest.approx(reference.var(), rel=1e-12)
    assert dist.entropy().item() == pytest.approx(reference.entropy(), rel=1e-10)


def test_special_cases_are_laplace_and_normal():
    torch.set_default_dtype(torch.float64)
    x = torch.randn(20) * 3
    laplace = torch.distributions.Laplace(0.5, 2.0).log_prob(x)
    normal = torch.distributions.Normal(0.5, 2.0).log_prob(x)
    torch.testing.assert_close(GeneralizedNormal(0.5, 2.0, 1.0).log_prob(x), laplace)
    torch.testing.assert_close(GeneralizedNormal(0.5, 2.0 * 2**0.5, 2.0).log_prob(x), normal)


@pytest.mark.parametrize("shape", [0.5, 1.0, 3.0])
def test_samples_follow_the_density(shape):
    torch.set_default_dtype(torch.float64)
    samples = GeneralizedNormal(-1.0, 0.2, shape).sample((20000,))
    result = stats.kstest(samples.numpy(), stats.gennorm(shape, loc=-1.0, scale=0.2).cdf)
    assert result.pvalue > 1e-3


def test_batch_shape_expand_and_gradients():
    torch.set_default_dtype(torch.float64)
    loc = torch.zeros(3, requires_grad=True)
    scale = torch.full((2, 1), 0.5, requires_grad=True)
    shape = torch.tensor(0.6, requires_grad=True)
    dist = GeneralizedNormal(loc, scale, shape)
    assert dist.batch_shape == (2, 3) and dist.event_shape == ()
    assert dist.expand((4, 2, 3)).batch_shape == (4, 2, 3)
    x = dist.rsample((5,))
    assert x.shape == (5, 2, 3)
    x.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in (loc, scale, shape))
    # d/dbeta log p at the location: 1/beta + digamma(1/beta) / beta^2 (|0|^beta adds 0).
    shape.grad = None
    GeneralizedNormal(0.0, 1.0, shape).log_prob(torch.tensor(0.0)).backward()
    digamma = torch.special.digamma(torch.tensor(1 / 0.6))
    assert shape.grad.item() == pytest.approx((1 / 0.6 + digamma / 0.6**2).item(), rel=1e-10)


@pytest.mark.parametrize("bad", [{"scale": 0.0}, {"beta": -1.0}])
def test_bad_parameters_raise(bad):
    arguments = {"loc": 0.0, "scale": 1.0, "beta": 1.0, **bad}
    with pyro.validation_enabled(True), pytest.raises(ValueError, match=next(iter(bad))):
        GeneralizedNormal(**arguments, validate_args=True)


def test_gradient_at_the_location_is_zero_not_nan():
    """For beta < 1 the slope of |x|^beta at 0 is infinite: log_prob's gradient there is 0 (the
    Lp energy's choice), and finite elsewhere."""
    torch.set_default_dtype(torch.float64)
    x = torch.tensor([0.0, 0.3, -0.2], requires_grad=True)
    GeneralizedNormal(0.0, 0.5, 0.5).log_prob(x).sum().backward()
    expected = -0.5 * (x.detach().abs() / 0.5) ** -0.5 / 0.5 * x.detach().sign()
    torch.testing.assert_close(x.grad, torch.nan_to_num(expected, nan=0.0))
