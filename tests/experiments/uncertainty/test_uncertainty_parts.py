"""``rpm uncertainty``'s pieces against independent computations: the controlled process's true
posterior (a Monte Carlo fit of the latents it draws), its normaliser ratio (scipy's Bessel
function), its positive pairs (the candidates' acceptance probabilities), the corruptions
(loops and scipy's Gaussian filter), the crop score and the probe's predictive."""

import math

import numpy as np
import pytest
import torch
from scipy import ndimage, optimize, special

from rpm.experiments.uncertainty.corruptions import blur, crop
from rpm.experiments.uncertainty.evaluate import (
    mean_cosines,
    nested_crop_order,
    posterior_predictive,
    spearman,
)
from rpm.experiments.uncertainty.process import (
    ControlledProcess,
    effective_concentration,
    log_normaliser_ratio,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def process():
    return ControlledProcess(smoothing_steps=200, seed=3)


def mean_resultant_length(kappa, dim):
    """A_D(kappa) = I_{D/2}(kappa) / I_{D/2-1}(kappa), from scipy's scaled Bessel functions."""
    return special.ive(dim / 2, kappa) / special.ive(dim / 2 - 1, kappa)


def test_normaliser_ratio_is_scipys_closed_form():
    """log C_D(0) - log C_D(kappa), C_D(kappa) = kappa^(D/2-1) / ((2 pi)^(D/2) I_{D/2-1}(kappa)),
    C_D(0) = Gamma(D/2) / (2 pi^(D/2)): 11.148 for D = 10, kappa = 20."""
    for dim, kappa in ((10, 20.0), (3, 5.0), (16, 40.0)):
        log_c = ((dim / 2 - 1) * math.log(kappa) - dim / 2 * math.log(2 * math.pi)
                 - (math.log(special.ive(dim / 2 - 1, kappa)) + kappa))
        log_c0 = math.lgamma(dim / 2) - math.log(2) - dim / 2 * math.log(math.pi)
        assert log_normaliser_ratio(kappa, dim) == pytest.approx(log_c0 - log_c, abs=1e-9)
    assert log_normaliser_ratio(20.0, 10) == pytest.approx(11.1483, abs=1e-4)


@pytest.mark.parametrize("dim, kappa_pos, threshold", [(10, 20.0, None), (3, 8.0, 2.0),
                                                        (16, 40.0, None)])
def test_effective_concentration_matches_the_positive_rule_by_monte_carlo(dim, kappa_pos,
                                                                           threshold):
    """(U4) against a Monte Carlo estimate written from the rule: 400,000 points uniform on the
    sphere, weighted by sigma(kappa_+ c - l) with c their first coordinate; the weighted mean
    cosine (standard error below 0.002) solved for kappa with scipy's Bessel ratio is the
    function's value within 2%; and the function's value solves A_D(kappa) = E[c] of scipy's
    quadrature to 1e-6. For D = 10, kappa_+ = 20 (the reference run) it is 8.94."""
    from scipy import integrate

    threshold = log_normaliser_ratio(kappa_pos, dim) if threshold is None else threshold
    value = effective_concentration(kappa_pos, threshold, dim)
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(400_000, dim, generator=generator, dtype=torch.float64)
    cosine = (points[:, 0] / points.norm(dim=-1)).numpy()
    weight = special.expit(kappa_pos * cosine - threshold)
    monte_carlo = float((weight * cosine).sum() / weight.sum())
    fitted = optimize.brentq(lambda k: mean_resultant_length(k, dim) - monte_carlo, 1e-3, 1e4)
    assert value == pytest.approx(fitted, rel=0.02)

    def density(theta, power):
        return (np.cos(theta) ** power * np.sin(theta) ** (dim - 2)
                * special.expit(kappa_pos * np.cos(theta) - threshold))

    exact = (integrate.quad(density, 0, np.pi, args=(1,), epsabs=1e-13, limit=200)[0]
             / integrate.quad(density, 0, np.pi, args=(0,), epsabs=1e-13, limit=200)[0])
    assert mean_resultant_length(value, dim) == pytest.approx(exact, abs=1e-6)
    if (dim, kappa_pos) == (10, 20.0):
        assert value == pytest.approx(8.94, abs=0.01)


def test_true_posterior_concentration_matches_a_monte_carlo_fit(process):
    """For 4 inputs, 40,000 latents drawn by the process given each: their mean direction is
    mu(x) (cosine > 0.999) and the maximum-likelihood vMF concentration (A_D(kappa) = |mean z|,
    solved with scipy) is kappa(x) within 2% (its standard error here is about 0.5%)."""
    generator = torch.Generator().manual_seed(0)
    x = process.sample_inputs(4, generator)
    mu, kappa = process.posterior(x)
    draws = process.sample_latents(x.repeat(40000, 1), generator).double()  # (40000 * 4, D)
    mean = draws.reshape(40000, 4, -1).mean(0)  # (4, D)
    for i in range(4):
        length = float(mean[i].norm())
        assert float(mean[i] @ mu[i].double()) / length > 0.999
        fitted = optimize.brentq(lambda k, r=length: mean_resultant_length(k, process.dim) - r,
                                 0.1, 1e4)
        assert fitted == pytest.approx(float(kappa[i]), rel=0.02)
    assert 15.0 < float(kappa.min()) and float(kappa.max()) < 34.0


def test_concentrations_span_the_range_and_means_spread(process):
    """On 10,000 fresh inputs the concentrations fill about [16, 32] (the range is set on 1000
    reference inputs) and the means spread over the sphere (smallest pairwise cosine < 0.5)."""
    x = process.sample_inputs(10000, torch.Generator().manual_seed(1))
    mu, kappa = process.posterior(x)
    assert 15.0 < float(kappa.min()) < 16.5 and 31.0 < float(kappa.max()) < 34.0
    assert float((mu[:1000] @ mu[:1000].T).min()) < 0.5
    torch.testing.assert_close(mu.norm(dim=-1), torch.ones(10000))


def test_positive_pairs_follow_the_acceptance_probability(process):
    """Given its reference latent z, a partner's latent has density proportional to P(z')
    sigma(kappa_+ z.z' - l): the mean cosine z.z' of 4000 drawn pairs equals, within 4
    standard errors (+ 0.01 for the pool's sharing of candidates), the mean over 2000
    independent references of the sigma-weighted mean cosine of 4000 independent candidates
    (self-normalised importance sampling per reference); every partner is a distinct input."""
    generator = torch.Generator().manual_seed(2)
    x, x2, z, z2 = process.sample_pairs(4000, generator, return_latents=True)
    assert len(torch.unique(x2, dim=0)) == 4000
    assert z.shape == z2.shape == (4000, process.dim)
    drawn = (z * z2).sum(-1).double()
    references = process.sample_latents(process.sample_inputs(2000, generator), generator)
    candidates = process.sample_latents(process.sample_inputs(4000, generator), generator)
    weights = process.positive_probability(references, candidates).double()
    cosines = (references @ candidates.T).double()
    target = float(((weights * cosines).sum(1) / weights.sum(1)).mean())
    error = float(drawn.std() / math.sqrt(len(drawn)))
    assert abs(float(drawn.mean()) - target) < 4 * error + 0.01, (float(drawn.mean()), target)
    assert float(drawn.mean()) > float(cosines.mean()) + 0.3


def test_positive_rule_energy_is_the_log_acceptance_probability(process):
    """PositiveRuleEnergy(kappa_+, l)(z, z') = log sigma(kappa_+ z.z' / (|z| |z'|) - l), the
    log of the process's acceptance probability, for unnormalised rows too; its paired form is
    the matrix's diagonal; float64 to 1e-12."""
    from rpm.experiments.uncertainty.model import PositiveRuleEnergy

    energy = PositiveRuleEnergy(process.kappa_pos, process.threshold)
    generator = torch.Generator().manual_seed(4)
    z = 3.0 * torch.randn(6, process.dim, generator=generator, dtype=torch.float64)
    z2 = torch.randn(5, process.dim, generator=generator, dtype=torch.float64)
    unit, unit2 = z / z.norm(dim=-1, keepdim=True), z2 / z2.norm(dim=-1, keepdim=True)
    expected = [[float(special.log_expit(process.kappa_pos * float(unit[i] @ unit2[j])
                                        - process.threshold)) for j in range(5)]
                for i in range(6)]
    torch.testing.assert_close(energy(z, z2), torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-12, atol=1e-12)
    accepted = process.positive_probability(unit.float(), unit2.float()).double().log()
    torch.testing.assert_close(energy(z, z2), accepted, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(energy.paired(z[:5], z2), energy(z[:5], z2).diagonal(),
                               rtol=1e-12, atol=1e-12)


def test_crop_keeps_the_window_a_loop_finds():
    """Pixel (r, c) survives iff its centre (c + 0.5, r + 0.5) lies in the square of side 8s at
    corner u (8 - 8s); windows of a smaller side with the same u lie inside the larger."""
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(5, 1, 8, 8, generator=generator) + 0.1
    side = torch.tensor([1.0, 0.8, 0.55, 0.5, 0.3])
    corner = torch.rand(5, 2, generator=generator)
    out = crop(images, side, corner)
    for n in range(5):
        span = 8 * float(side[n])
        x0, y0 = (float(corner[n, k]) * (8 - span) for k in range(2))
        for r in range(8):
            for c in range(8):
                inside = x0 <= c + 0.5 <= x0 + span and y0 <= r + 0.5 <= y0 + span
                assert float(out[n, 0, r, c]) == (float(images[n, 0, r, c]) if inside else 0.0)
    assert torch.equal(out[0], images[0])
    shared = corner[:1].expand(4, 2)
    masks = [crop(torch.ones(4, 1, 8, 8), torch.full((4,), s), shared) > 0
             for s in (0.9, 0.7, 0.5, 0.3)]
    for larger, smaller in zip(masks[:-1], masks[1:], strict=True):
        assert bool((smaller <= larger).all()) and smaller.sum() < larger.sum()


def test_blur_is_scipys_gaussian_filter():
    """sigma = 0 leaves the image; otherwise scipy.ndimage.gaussian_filter with a zero border
    and radius 3 (7 taps), to float32 precision."""
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(3, 1, 8, 8, generator=generator)
    sigma = torch.tensor([0.0, 0.7, 1.5])
    out = blur(images, sigma)
    assert torch.equal(out[0], images[0])
    for n in (1, 2):
        want = ndimage.gaussian_filter(images[n, 0].double().numpy(), float(sigma[n]),
                                       mode="constant", radius=3)
        np.testing.assert_allclose(out[n, 0].numpy(), want, atol=1e-6)


def test_nested_crop_order_is_a_loop_over_pairs_of_levels():
    generator = torch.Generator().manual_seed(2)
    kappa = torch.rand(30, 4, generator=generator)
    pairs = [[kappa[n, m] < kappa[n, l] for l in range(4) for m in range(l + 1, 4)]
             for n in range(30)]
    want = sum(sum(bool(p) for p in row) for row in pairs) / (30 * 6)
    assert nested_crop_order(kappa) == pytest.approx(want, abs=1e-12)
    assert nested_crop_order(torch.arange(4.0, 0.0, -1).expand(3, 4)) == 1.0


def test_mean_cosines_and_spearman():
    mu = torch.nn.functional.normalize(torch.randn(6, 3, generator=torch.Generator()
                                                   .manual_seed(3)), dim=-1)
    want = [float(mu[i] @ mu[j]) for i in range(6) for j in range(i)]
    torch.testing.assert_close(mean_cosines(mu), torch.tensor(want))
    assert spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_posterior_predictive_averages_the_probe_over_posterior_draws():
    """Without kappa: the probe at the directions; with a huge kappa: the same to 1e-4; with
    a small kappa: the probe's probabilities averaged over vMF draws, a loop over the same
    draws (same seed) equal to 1e-12, and less confident than at the directions."""
    from sklearn.linear_model import LogisticRegression

    generator = torch.Generator().manual_seed(4)
    features = torch.nn.functional.normalize(torch.randn(200, 4, generator=generator), dim=-1)
    labels = (features[:, 0] > 0).long() + (features[:, 1] > 0).long()
    probe = LogisticRegression(C=10.0).fit(features.double().numpy(), labels.numpy())
    mu = features[:20]
    plain = posterior_predictive(probe, mu, None, 8, 0)
    np.testing.assert_allclose(plain, probe.predict_proba(mu.double().numpy()), atol=1e-12)
    sharp = posterior_predictive(probe, mu, torch.full((20,), 1e8), 8, 0)
    np.testing.assert_allclose(sharp, plain, atol=1e-4)
    wide = posterior_predictive(probe, mu, torch.full((20,), 2.0), 500, 7)
    from rpm.distributions import VonMisesFisher

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        draws = VonMisesFisher(torch.nn.functional.normalize(mu.double(), dim=-1),
                               torch.full((20,), 2.0, dtype=torch.float64)).sample((500,))
    loop = np.mean([probe.predict_proba(draws[k].numpy()) for k in range(500)], axis=0)
    np.testing.assert_allclose(wide, loop, atol=1e-12)
    assert wide.max(1).mean() < plain.max(1).mean()


def _convolved_critic_loop(z, z2, dim, pair):
    """f(z_i, z'_j) = log vMF(d'_j; d_i, tau) - log C_D(0) + b'_j, 1/tau = 1/a + e^w_i + e^w'_j,
    entry by entry from scipy's Bessel function (float64)."""
    order = dim / 2 - 1
    log_c0 = math.lgamma(dim / 2) - math.log(2) - dim / 2 * math.log(math.pi)
    rows = []
    for i in range(len(z)):
        row = []
        for j in range(len(z2)):
            d, d2 = z[i, :dim].numpy(), z2[j, :dim].numpy()
            cosine = float(d @ d2) / float(np.linalg.norm(d) * np.linalg.norm(d2))
            tau = 1 / (1 / pair + math.exp(float(z[i, dim])) + math.exp(float(z2[j, dim])))
            log_c = (order * math.log(tau) - dim / 2 * math.log(2 * math.pi)
                     - math.log(special.iv(order, tau)))
            row.append(tau * cosine + log_c - log_c0 + float(z2[j, dim + 1]))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("dim", [3, 10])
def test_convolved_cosine_energy_is_a_vmf_log_density_ratio(dim):
    """ConvolvedCosineEnergy(D, a)(z, z') against a loop from its equation (scipy's I_nu), for
    unnormalised directions and widths from 1e-3 to 10; its paired form is the matrix's
    diagonal; with both widths huge it tends to b' alone (the uniform conditional); float64."""
    from rpm.experiments.uncertainty.model import ConvolvedCosineEnergy

    energy = ConvolvedCosineEnergy(dim, 8.94).double()
    generator = torch.Generator().manual_seed(dim)
    z = torch.randn(6, dim + 2, generator=generator, dtype=torch.float64)
    z2 = torch.randn(5, dim + 2, generator=generator, dtype=torch.float64)
    z[:, :dim] *= 3.0
    z[:, dim] = torch.linspace(math.log(1e-3), math.log(10.0), 6, dtype=torch.float64)
    expected = _convolved_critic_loop(z, z2, dim, 8.94)
    torch.testing.assert_close(energy(z, z2), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(energy.paired(z[:5], z2), energy(z[:5], z2).diagonal(),
                               rtol=1e-12, atol=1e-12)
    wide, wide2 = z.clone(), z2.clone()
    wide[:, dim], wide2[:, dim] = 20.0, 20.0                   # 1/tau ~ e^20: tau ~ 1e-9
    torch.testing.assert_close(energy(wide, wide2), wide2[:, dim + 1].expand(6, 5),
                               rtol=0, atol=1e-7)


def test_convolved_cosine_energy_learns_its_coupling_and_names_the_latent_layout():
    from rpm.experiments.uncertainty.model import ConvolvedCosineEnergy

    energy = ConvolvedCosineEnergy(4, 5.0)
    z = torch.randn(3, 6)
    energy(z, z).sum().backward()
    (parameter,) = list(energy.parameters())
    assert parameter.grad is not None and float(parameter.grad.abs()) > 0
    assert not list(ConvolvedCosineEnergy(4, 5.0, learn_pair_concentration=False).parameters())
    with pytest.raises(ValueError, match=r"\(direction, log width, log partner weight\) of "
                       "dimension 6, got 4"):
        energy(torch.randn(3, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="D >= 2"):
        ConvolvedCosineEnergy(1, 5.0)
    with pytest.raises(ValueError, match="pair_concentration must be a finite positive"):
        ConvolvedCosineEnergy(4, 0.0)


def test_first_phase_elbo_is_infonce_with_the_convolved_critic():
    """RPMELBO() of build_means_rpm is, for N pairs, sum_i -(F_ii - log sum_j e^F_ij) - N log N
    with F the loop's critic at the encoder's (m(x), -log kappa(x), b(x)) (float64); the width
    column is minus the log of the ControlledEncoder's concentration, so the second phase
    starts from it."""
    from rpm import RPMELBO
    from rpm.experiments.uncertainty.model import ControlledEncoder, build_means_rpm

    torch.manual_seed(0)
    encoder = ControlledEncoder(10, 4, 16, 1, 8, 22.0).double()
    means = build_means_rpm(encoder, 8, 8.94).double()
    with torch.no_grad():
        for parameter in means.parameters():               # move the zero-started layers
            parameter.add_(0.3 * torch.randn_like(parameter))
    x, x2 = torch.rand(7, 10, dtype=torch.float64), torch.rand(7, 10, dtype=torch.float64)
    z, z2 = means.recognition.net(x).detach(), means.recognition.net(x2).detach()
    torch.testing.assert_close(z[:, 4], -encoder(x)[1].detach().log(), rtol=1e-12, atol=1e-12)
    pair = float(means.prior.energy.pair_concentration.detach())
    critic = _convolved_critic_loop(z, z2, 4, pair)
    expected = float(-(critic.diagonal() - torch.logsumexp(critic, 1)).sum() - 7 * math.log(7))
    loss = RPMELBO().differentiable_loss(means.model, means.guide, x, x2)
    assert float(loss) == pytest.approx(expected, abs=1e-9)
