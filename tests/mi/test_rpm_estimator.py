r"""The RPM ELBO as an MI estimator: ELBO = I_Q(z; z') - KL(Q(z, z') || P(z, z')) (Eq. 17-18 of
Aitchison & Ganev) on affine encoders of the correlated Gaussian pair, where Q(z, z') is the
Gaussian with covariance [[A A^T + s^2 I, rho A B^T], [rho B A^T, B B^T + s'^2 I]] and both
terms are closed forms. Monte Carlo over independent batches in float64, within 4 standard
errors."""

import math

import pytest
import torch

from rpm.mi import CorrelatedGaussian
from rpm.mi._rpm_estimator import RPMEstimator, gaussian_entropy

DIM = 3


def joint_of_q(est, rho):
    """The mean and covariance of Q(z, z') for affine encoders of the Gaussian pair."""
    a, b = (e.affine.weight for e in est.encoders)
    s, s2 = est.log_noise.exp()
    eye = torch.eye(DIM, dtype=a.dtype)
    cov = torch.cat([torch.cat([a @ a.T + s**2 * eye, rho * a @ b.T], 1),
                     torch.cat([rho * b @ a.T, b @ b.T + s2**2 * eye], 1)])
    loc = torch.cat([e.affine.bias for e in est.encoders])
    return loc, cov


def closed_forms(est, rho):
    with torch.no_grad():
        loc, cov = joint_of_q(est, rho)
        mi_q = 0.5 * (torch.logdet(cov[:DIM, :DIM]) + torch.logdet(cov[DIM:, DIM:])
                      - torch.logdet(cov))
        q = torch.distributions.MultivariateNormal(loc, cov)
        p = torch.distributions.MultivariateNormal(est.prior.loc, scale_tril=est.prior.scale_tril)
        return mi_q.item(), torch.distributions.kl_divergence(q, p).item()


def monte_carlo(est, pair, n=256, count=64):
    gen = torch.Generator().manual_seed(3)
    values = []
    with torch.no_grad():
        for _ in range(count):
            x, y = pair.sample(n, gen, dtype=torch.float64)
            values.append(est(x, y).item())
    values = torch.tensor(values)
    return values.mean().item(), values.std().item() / math.sqrt(count)


@pytest.fixture
def setup():
    torch.set_default_dtype(torch.float64)
    pair = CorrelatedGaussian.with_mi(1.5, DIM)
    est = RPMEstimator(DIM, DIM, DIM, noise=0.3)
    with torch.no_grad():
        for encoder in est.encoders:
            encoder.affine.weight.copy_(torch.randn(DIM, DIM) * 0.7 + torch.eye(DIM))
            encoder.affine.bias.normal_()
        est.prior.loc = torch.randn(2 * DIM) * 0.3
        est.prior.scale_tril = torch.eye(2 * DIM) * 1.5 + torch.randn(2 * DIM, 2 * DIM).tril(-1) * 0.2
    return pair, est


def test_elbo_is_the_mutual_information_minus_the_kl(setup):
    pair, est = setup
    mi_q, kl = closed_forms(est, pair.rho)
    assert kl > 0.3 and mi_q < pair.mutual_information  # data processing, and a real gap
    mean, se = monte_carlo(est, pair)
    assert abs(mean - (mi_q - kl)) < 4 * se


def test_optimal_prior_closes_the_gap(setup):
    pair, est = setup
    with torch.no_grad():
        loc, cov = joint_of_q(est, pair.rho)
        est.prior.loc = loc.clone()
        est.prior.scale_tril = torch.linalg.cholesky(cov)
    mi_q, kl = closed_forms(est, pair.rho)
    assert kl < 1e-10
    mean, se = monte_carlo(est, pair)
    assert abs(mean - mi_q) < 4 * se


def test_gaussian_entropy_is_unbiased_and_the_correction_matters():
    torch.set_default_dtype(torch.float64)
    n, d = 24, 6
    scale_tril = torch.eye(d) + 0.3 * torch.randn(d, d).tril(-1)
    gaussian = torch.distributions.MultivariateNormal(torch.zeros(d), scale_tril=scale_tril)
    samples = gaussian.sample((4000, n))                                   # (B, N, D)
    estimates = torch.stack([gaussian_entropy(z) for z in samples])
    se = estimates.std().item() / math.sqrt(len(estimates))
    assert abs(estimates.mean().item() - gaussian.entropy().item()) < 4 * se
    centred = samples - samples.mean(1, keepdim=True)
    naive = 0.5 * d * math.log(2 * math.pi * math.e) + 0.5 * torch.logdet(
        centred.transpose(1, 2) @ centred / n)
    assert gaussian.entropy().item() - naive.mean().item() > 20 * se  # the in-sample bias


def test_mixture_marginal_saturates_at_log_n(setup):
    r"""-log Q(z_i) <= -log Q(z_i|x_i) + log N: the mixture's entropy estimate exceeds the
    conditional entropy by at most log N."""
    pair, est = setup
    est = RPMEstimator(DIM, DIM, DIM, noise=1e-3, marginal="mixture")
    x, y = pair.sample(16, torch.Generator().manual_seed(0), dtype=torch.float64)
    (mu, s), _ = est.recognise(x, y)
    z = mu + s * torch.randn_like(mu)
    conditional = -torch.distributions.Normal(mu, s).log_prob(z).sum(-1).mean()
    entropy = est._entropy(z, mu, s)
    assert entropy <= conditional + math.log(16) + 1e-9
    assert entropy > conditional + math.log(16) - 0.01  # sharp encoders: saturated


def test_bad_input():
    with pytest.raises(ValueError, match="more than 20 samples"):
        gaussian_entropy(torch.randn(20, 20))
    with pytest.raises(ValueError, match="marginal"):
        RPMEstimator(2, 2, 2, marginal="running")
    with pytest.raises(ValueError, match="batches of N >= 2 pairs"):
        RPMEstimator(2, 2, 2)(torch.zeros(4, 2), torch.zeros(3, 2))
