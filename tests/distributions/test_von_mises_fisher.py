"""VonMisesFisher against scipy.stats.vonmises_fisher (log-density, entropy, samples by a
two-sample Kolmogorov-Smirnov test), Pyro's VonMises (D = 2) and VonMises3D (D = 3), the closed
forms of the moments (mean resultant length A_D = I_{D/2}/I_{D/2-1} from scipy.special.ive) by
Monte Carlo with a stated tolerance, the reparameterised gradients against finite differences
of the closed form E[mu^T x] = A_D(kappa), and the errors of bad parameters."""

import math

import numpy as np
import pyro
import pyro.distributions as pyro_dist
import pytest
import torch
from scipy import integrate, special, stats

from rpm.distributions import VonMisesFisher
from rpm.distributions._von_mises_fisher import _cosine_kappa_derivative, _wood_cosine

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(not hasattr(stats, "vonmises_fisher"),
                                 reason="scipy.stats.vonmises_fisher needs scipy >= 1.11")]

#: Monte Carlo tolerance: standard errors a sample mean may be from its expectation.
SIGMAS = 5.0


def unit(dim: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(dim, generator=generator,
                                                     dtype=torch.float64), dim=0)


def mean_resultant_length(dim: int, kappa: float) -> float:
    """A_D(kappa) from scipy's exponentially scaled Bessel functions."""
    return special.ive(dim / 2, kappa) / special.ive(dim / 2 - 1, kappa)


def assert_within_monte_carlo_error(samples: torch.Tensor, expected, sigmas: float = SIGMAS):
    """Each mean over the first axis within ``sigmas`` standard errors of ``expected``."""
    standard_error = samples.std(0) / math.sqrt(samples.shape[0])
    deviation = (samples.mean(0) - torch.as_tensor(expected, dtype=samples.dtype)).abs()
    assert (deviation <= sigmas * standard_error).all(), (deviation / standard_error).max()


@pytest.mark.parametrize("dim", [3, 10, 64])
@pytest.mark.parametrize("kappa", [0.1, 1.0, 10.0, 100.0, 1000.0])
def test_log_prob_and_entropy_match_scipy(dim, kappa):
    torch.set_default_dtype(torch.float64)
    loc = unit(dim)
    reference = stats.vonmises_fisher(loc.numpy(), kappa)
    x = torch.cat([torch.from_numpy(reference.rvs(8, random_state=1)), loc[None], -loc[None]])
    dist = VonMisesFisher(loc, kappa)
    np.testing.assert_allclose(dist.log_prob(x).numpy(), reference.logpdf(x.numpy()), rtol=1e-8)
    assert dist.entropy().item() == pytest.approx(reference.entropy(), rel=1e-8)


def test_extreme_dimensions_and_concentrations():
    """D = 1024: at kappa = 1e-3 the density is uniform up to log C_D(kappa) = -log|S^{D-1}|
    - kappa^2 / (2D) + O(kappa^4) (where scipy's ive underflows); at 1e3 and 1e5 against scipy."""
    torch.set_default_dtype(torch.float64)
    dim, loc = 1024, unit(1024)
    log_area = math.log(2) + dim / 2 * math.log(math.pi) - math.lgamma(dim / 2)
    at_loc = VonMisesFisher(loc, 1e-3).log_prob(loc).item()
    assert at_loc == pytest.approx(1e-3 - log_area - 1e-6 / (2 * dim), rel=1e-13)
    for kappa in (1e3, 1e5):
        reference = stats.vonmises_fisher(loc.numpy(), kappa)
        x = torch.from_numpy(reference.rvs(4, random_state=2))
        np.testing.assert_allclose(VonMisesFisher(loc, kappa).log_prob(x).numpy(),
                                   reference.logpdf(x.numpy()), rtol=1e-8)


def test_low_dimensions_match_pyro():
    """D = 2 is pyro's VonMises of the angle; D = 3 is pyro's VonMises3D."""
    torch.set_default_dtype(torch.float64)
    kappa = torch.tensor([0.05, 2.0, 300.0])
    angle = torch.tensor([0.3, -2.0, 1.0])
    theta = torch.linspace(-3, 3, 7)[:, None]
    circle = torch.stack([theta.cos(), theta.sin()], -1).expand(7, 3, 2)
    loc = torch.stack([angle.cos(), angle.sin()], -1)
    torch.testing.assert_close(VonMisesFisher(loc, kappa).log_prob(circle),
                               pyro_dist.VonMises(angle, kappa).log_prob(theta))
    loc3 = torch.stack([unit(3, seed) for seed in range(3)])
    x = VonMisesFisher(loc3, kappa).sample((5,))
    torch.testing.assert_close(VonMisesFisher(loc3, kappa).log_prob(x),
                               pyro_dist.VonMises3D(kappa[:, None] * loc3).log_prob(x))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_float32_parameters_give_float32_results_computed_in_float64(device):
    """float32 parameters (on the CPU or a CUDA device) give float32 values equal to float64's
    on the CPU to float32 rounding, unit-norm samples on the device and finite gradients."""
    loc64, kappa64 = unit(16), torch.tensor([0.01, 5.0, 4000.0], dtype=torch.float64)
    x64 = VonMisesFisher(loc64, kappa64).sample((3,))
    kappa32 = kappa64.float().to(device).requires_grad_()
    dist32 = VonMisesFisher(loc64.float().to(device), kappa32)
    value = dist32.log_prob(x64.float().to(device))
    assert value.dtype == torch.float32 and dist32.entropy().dtype == torch.float32
    torch.testing.assert_close(value.double().cpu(), VonMisesFisher(loc64, kappa64).log_prob(x64),
                               rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(dist32.entropy().double().cpu(),
                               VonMisesFisher(loc64, kappa64).entropy(), rtol=1e-5, atol=1e-5)
    sample = dist32.rsample((100,))
    assert sample.dtype == torch.float32 and sample.device.type == device
    assert pyro_dist.constraints.sphere.check(sample).all()
    (sample @ dist32.loc[0]).sum().backward()
    assert torch.isfinite(kappa32.grad).all() and (kappa32.grad > 0).all()


@pytest.mark.parametrize("dim", [2, 3, 5, 64])
@pytest.mark.parametrize("kappa", [0.5, 20.0])
def test_samples_have_the_mean_and_variance_of_the_closed_forms(dim, kappa):
    """E[x] = A_D mu (so also E[mu^T x] = A_D) and the diagonal of the covariance, within
    SIGMAS standard errors of 20000 draws; every draw is a unit vector."""
    torch.set_default_dtype(torch.float64)
    loc = unit(dim, seed=dim)
    dist = VonMisesFisher(loc, kappa)
    x = dist.sample((20000,))
    assert x.shape == (20000, dim)
    torch.testing.assert_close(x.norm(dim=-1), torch.ones(20000), rtol=0, atol=1e-14)
    length = mean_resultant_length(dim, kappa)
    assert dist.mean_resultant_length.item() == pytest.approx(length, rel=1e-12)
    torch.testing.assert_close(dist.mean, length * loc, rtol=1e-12, atol=0)
    assert_within_monte_carlo_error(x @ loc, length)
    assert_within_monte_carlo_error(x, length * loc)
    covariance = (length / kappa * torch.eye(dim)
                  + (1 - dim * length / kappa - length**2) * torch.outer(loc, loc))
    torch.testing.assert_close(dist.variance, covariance.diagonal(), rtol=1e-12, atol=1e-15)
    assert_within_monte_carlo_error((x - length * loc) ** 2, covariance.diagonal())


@pytest.mark.parametrize("dim, kappa", [(2, 1.0), (3, 5.0), (5, 0.3), (5, 40.0), (64, 10.0),
                                        (64, 2000.0)])
def test_cosines_follow_scipy_two_sample_kolmogorov_smirnov(dim, kappa):
    torch.set_default_dtype(torch.float64)
    loc = unit(dim, seed=1)
    ours = VonMisesFisher(loc, kappa).sample((4000,)) @ loc
    theirs = stats.vonmises_fisher(loc.numpy(), kappa).rvs(4000, random_state=3) @ loc.numpy()
    assert stats.ks_2samp(ours.numpy(), theirs).pvalue > 1e-3


@pytest.mark.parametrize("dim, kappa", [(2, 1.0), (5, 10.0), (64, 50.0), (10, 1000.0), (3, 2.0)])
def test_implicit_derivative_matches_finite_differences_of_the_cdf(dim, kappa):
    """d omega / d kappa = -(dF/dkappa) / p(omega) for Omega = 1 - mu^T x, with the CDF F by
    scipy's adaptive quadrature of the density and dF/dkappa by central differences."""
    half = (dim - 3) / 2
    kappas = torch.full((4,), kappa, dtype=torch.float64)
    omega, two_minus_omega = _wood_cosine(kappas, dim)
    ours = _cosine_kappa_derivative(kappas, omega, two_minus_omega, dim)

    def cdf_and_density(w, k):
        """F(w) and p(w) of the density prop. to e^{-k s} (s (2 - s))^half on [0, 2], the
        factor (s (2 - s))^half as QUADPACK's algebraic end-point weight."""
        def shifted(s):
            return math.exp(-k * (s - w))

        below = integrate.quad(lambda s: shifted(s) * (2 - s) ** half, 0, w, weight="alg",
                               wvar=(half, 0), limit=400, epsabs=0, epsrel=1e-13)[0]
        above = integrate.quad(lambda s: shifted(s) * s**half, w, 2, weight="alg",
                               wvar=(0, half), limit=400, epsabs=0, epsrel=1e-13)[0]
        return below / (below + above), (w * (2 - w)) ** half / (below + above)

    for w, derivative in zip(omega.tolist(), ours.tolist(), strict=True):
        step = 1e-4 * kappa
        slope = (cdf_and_density(w, kappa + step)[0]
                 - cdf_and_density(w, kappa - step)[0]) / (2 * step)
        assert derivative == pytest.approx(-slope / cdf_and_density(w, kappa)[1], rel=1e-6)


@pytest.mark.parametrize("dim, kappa", [(2, 0.5), (3, 0.5), (3, 20.0), (5, 2.0), (64, 20.0)])
def test_reparameterised_kappa_gradient_matches_the_closed_form(dim, kappa):
    """d E[mu^T x] / d kappa from per-sample pathwise gradients of 4000 draws against central
    differences of A_D(kappa), within SIGMAS standard errors."""
    torch.set_default_dtype(torch.float64)
    loc = unit(dim, seed=2)
    kappas = torch.full((4000,), kappa, requires_grad=True)    # one kappa per draw: per-draw grads
    x = VonMisesFisher(loc, kappas).rsample()
    (per_draw,) = torch.autograd.grad((x @ loc).sum(), kappas)
    step = 1e-5 * kappa
    expected = (mean_resultant_length(dim, kappa + step)
                - mean_resultant_length(dim, kappa - step)) / (2 * step)
    assert_within_monte_carlo_error(per_draw[:, None], [expected])


def test_inverse_cdf_gradient_of_d3_equals_the_implicit_one():
    """For D = 3 autograd through the inverse CDF and the implicit quadrature agree draw by draw."""
    torch.set_default_dtype(torch.float64)
    kappas = torch.tensor([1e-3, 0.5, 7.0, 300.0, 1e5]).repeat(20).requires_grad_()
    x = VonMisesFisher(unit(3), kappas).rsample()
    omega = 1 - x @ unit(3)
    (autograd,) = torch.autograd.grad(omega.sum(), kappas)
    implicit = _cosine_kappa_derivative(kappas.detach(), omega.detach(), 2 - omega.detach(), 3)
    torch.testing.assert_close(autograd, implicit, rtol=1e-7, atol=0)


def test_reparameterised_loc_gradient_matches_the_closed_form():
    """E[c^T x] = A_D c^T mu: the pathwise gradient in mu, projected on the tangent space of
    the sphere, is A_D (c - (c^T mu) mu), within SIGMAS standard errors of 4000 draws."""
    torch.set_default_dtype(torch.float64)
    dim, kappa = 5, 2.0
    mu, direction = unit(dim, seed=4), unit(dim, seed=5)
    loc = mu.expand(4000, dim).clone().requires_grad_()
    x = VonMisesFisher(loc, kappa).rsample()
    (gradient,) = torch.autograd.grad((x @ direction).sum(), loc)
    tangential = gradient - (gradient @ mu)[:, None] * mu
    expected = mean_resultant_length(dim, kappa) * (direction - (direction @ mu) * mu)
    assert_within_monte_carlo_error(tangential, expected)


def test_log_prob_and_entropy_gradients_match_finite_differences():
    torch.set_default_dtype(torch.float64)
    loc = unit(7)
    x = VonMisesFisher(loc, 3.0).sample((4,))
    kappa = torch.tensor([0.01, 1.5, 40.0, 5e3], requires_grad=True)
    assert torch.autograd.gradcheck(lambda k: VonMisesFisher(loc, k).log_prob(x), (kappa,))
    assert torch.autograd.gradcheck(lambda k: VonMisesFisher(loc, k).entropy(), (kappa,))
    assert torch.autograd.gradcheck(lambda k: VonMisesFisher(loc, k).mean, (kappa,))


def test_batch_shapes_broadcast_and_expand():
    torch.set_default_dtype(torch.float64)
    loc = torch.stack([unit(4, seed) for seed in range(3)])[:, None]          # (3, 1, 4)
    kappa = torch.tensor([0.5, 1.0, 2.0, 8.0])                                  # (4,)
    dist = VonMisesFisher(loc, kappa)
    assert dist.batch_shape == (3, 4) and dist.event_shape == (4,)
    x = dist.rsample((2,))
    assert x.shape == (2, 3, 4, 4) and dist.log_prob(x).shape == (2, 3, 4)
    assert dist.mean.shape == (3, 4, 4) and dist.mode.shape == (3, 4, 4)
    assert dist.entropy().shape == (3, 4)
    torch.testing.assert_close(dist.log_prob(x)[:, 1, 2],
                               VonMisesFisher(loc[1, 0], kappa[2]).log_prob(x[:, 1, 2]))
    expanded = dist.expand((5, 3, 4))
    assert expanded.batch_shape == (5, 3, 4) and expanded.sample().shape == (5, 3, 4, 4)
    torch.testing.assert_close(expanded.log_prob(x[0]), dist.log_prob(x[0]).expand(5, 3, 4))


def test_pyro_traces_score_the_site():
    torch.set_default_dtype(torch.float64)
    dist = VonMisesFisher(unit(6), torch.tensor(3.0))
    value = dist.sample((10,))

    def model():
        with pyro.plate("data", 10):
            pyro.sample("x", dist, obs=value)

    trace = pyro.poutine.trace(model).get_trace()
    assert trace.log_prob_sum().item() == pytest.approx(dist.log_prob(value).sum().item())


@pytest.mark.parametrize("concentration", [0.0, -1.0, math.nan, math.inf])
def test_bad_concentration_raises_one_line(concentration):
    with pytest.raises(ValueError, match=r"concentration must be finite and > 0") as error:
        VonMisesFisher(unit(3), torch.tensor([1.0, concentration]))
    assert "\n" not in str(error.value)


def test_loc_off_the_sphere_says_by_how_much():
    loc = torch.stack([unit(4, 0), 1.5 * unit(4, 1)])
    with pytest.raises(ValueError, match=r"max \|‖loc‖ - 1\| = 0\.5 .*normalize"):
        VonMisesFisher(loc, 1.0)
    VonMisesFisher(loc, 1.0, validate_args=False)              # the caller's choice: unchecked


def test_one_dimension_points_to_von_mises():
    with pytest.raises(ValueError, match=r"D >= 2.*VonMises"):
        VonMisesFisher(torch.ones(2, 1), 1.0)
    with pytest.raises(ValueError, match="floating tensor"):
        VonMisesFisher(torch.tensor([1, 0]), 1.0)


def test_values_off_the_sphere_are_refused_by_log_prob():
    dist = VonMisesFisher(unit(3).float(), 1.0)
    with pytest.raises(ValueError, match="support"):
        dist.log_prob(torch.tensor([1.0, 1.0, 0.0]))


@pytest.mark.parametrize("dim", [2, 3, 10, 64])
def test_tabulated_log_normaliser_matches_scipy_and_its_derivative(dim):
    """TabulatedLogNormaliser(D)(kappa) = log C_D(kappa) + kappa, with C_D from scipy's ive, to
    1e-10 in float64 over the table's range (log-uniform kappa, node and interval points
    alike); its derivative in kappa is 1 - A_D(kappa) to 1e-7; float32 input stays float32,
    within float32 rounding of the value; kappa outside the range takes the exact function."""
    from rpm.distributions._von_mises_fisher import TabulatedLogNormaliser

    table = TabulatedLogNormaliser(dim)
    generator = torch.Generator().manual_seed(dim)
    kappa = torch.exp(torch.empty(4000, dtype=torch.float64).uniform_(
        math.log(1e-2), math.log(1e4), generator=generator))
    kappa = torch.cat([kappa, torch.tensor([1e-2, 1e4, 1.0], dtype=torch.float64)])
    k = kappa.numpy()
    order = dim / 2 - 1
    expected = order * np.log(k) - dim / 2 * math.log(2 * math.pi) - np.log(special.ive(order, k))
    kappa.requires_grad_(True)
    value = table(kappa)
    np.testing.assert_allclose(value.detach().numpy(), expected, rtol=0, atol=1e-10)
    (slope,) = torch.autograd.grad(value.sum(), kappa)
    mean_length = special.ive(dim / 2, k) / special.ive(order, k)
    np.testing.assert_allclose(slope.numpy(), 1 - mean_length, rtol=0, atol=1e-7)
    single = table(kappa.detach().float())
    assert single.dtype == torch.float32
    np.testing.assert_allclose(single.double().numpy(), expected,
                               rtol=0, atol=4e-7 * (1 + np.abs(expected)).max())
    outside = torch.tensor([1e-3, 3e4], dtype=torch.float64)
    k = outside.numpy()
    expected = order * np.log(k) - dim / 2 * math.log(2 * math.pi) - np.log(special.ive(order, k))
    np.testing.assert_allclose(table(outside).numpy(), expected, rtol=0, atol=1e-11)


def test_tabulated_log_normaliser_refuses_bad_settings():
    from rpm.distributions._von_mises_fisher import TabulatedLogNormaliser

    with pytest.raises(ValueError, match="dim >= 2"):
        TabulatedLogNormaliser(1)
    with pytest.raises(ValueError, match="0 < low < high"):
        TabulatedLogNormaliser(3, low=10.0, high=1.0)
    with pytest.raises(ValueError, match="points >= 2"):
        TabulatedLogNormaliser(3, points=1)
    with pytest.raises(TypeError, match="floating tensor"):
        TabulatedLogNormaliser(3)(torch.tensor([1, 2]))


def test_uniform_log_density_is_minus_the_log_area_of_the_sphere():
    """log C_D(0): 1/(2 pi) on the circle, 1/(4 pi) on S^2, Gamma(D/2) / (2 pi^(D/2)) in
    general, and the limit of log C_D(kappa) as kappa -> 0."""
    from rpm.distributions._von_mises_fisher import (
        log_normaliser_plus_concentration,
        uniform_log_density,
    )

    assert uniform_log_density(2) == pytest.approx(-math.log(2 * math.pi), abs=1e-14)
    assert uniform_log_density(3) == pytest.approx(-math.log(4 * math.pi), abs=1e-14)
    tiny = torch.tensor(1e-9, dtype=torch.float64)
    for dim in (2, 5, 10, 64):
        assert float(log_normaliser_plus_concentration(dim, tiny)) == pytest.approx(
            uniform_log_density(dim), abs=1e-8)
