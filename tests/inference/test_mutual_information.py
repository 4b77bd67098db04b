r"""The decomposition ELBO = I_Q(z; z') - KL(Q(z, z') || P(z, z')) (Eq. 17-18) on a model where
every term is analytic.

Data: x ~ N(0, 1), x' = rho x + sqrt(1 - rho^2) eps. Encoders: Q(z|x) = N(a x, s^2),
Q(z'|x') = N(a x', s^2). Then Q(z, z') is the bivariate normal with variance v = a^2 + s^2 and
covariance c = a^2 rho, so I_Q = -1/2 log(1 - (c/v)^2) and the KL to a Gaussian prior is the
closed-form KL between two bivariate normals.

The Monte Carlo ELBO of the package (minibatch-mixture marginals, float64, N = 1536 pairs,
6 batches) must match I - KL within 4 standard errors plus 0.01 nats for the mixture's bias.
"""

import math

import pytest
import torch

import rpm
from rpm.priors import GaussianRandomWalkPrior, LinearDynamicsPrior

A, S, RHO = 1.0, 0.5, 0.8
VAR = A**2 + S**2
COV = A**2 * RHO


class LinearGaussian(torch.nn.Module):
    def forward(self, x):
        return A * x, torch.full_like(x, S)


def joint_covariance(prior):
    """Covariance of (z, z') under a 1-D linear-Gaussian prior P(z) P(z'|z)."""
    if isinstance(prior, GaussianRandomWalkPrior):
        p_var, a, noise = prior.scale.item() ** 2, 1.0, prior.step.item() ** 2
    else:
        p_var = prior.initial_scale_tril.item() ** 2
        a, noise = prior.transition.item(), prior.noise_scale_tril.item() ** 2
    return torch.tensor([[p_var, a * p_var], [a * p_var, a * a * p_var + noise]], dtype=torch.float64)


def gaussian_kl(cov_q, cov_p):
    k = cov_q.shape[0]
    return 0.5 * (
        torch.trace(torch.linalg.solve(cov_p, cov_q)) - k
        + torch.logdet(cov_p) - torch.logdet(cov_q)
    ).item()


def monte_carlo_elbo(prior, batches=6, n=1536):
    model = rpm.RPM(rpm.GaussianRecognition(LinearGaussian()), prior)
    values = []
    for _ in range(batches):
        x = torch.randn(n, 1, dtype=torch.float64)
        x2 = RHO * x + math.sqrt(1 - RHO**2) * torch.randn(n, 1, dtype=torch.float64)
        q, q2 = model.recognise(x, x2)
        z, z2 = q.sample(), q2.sample()
        with torch.no_grad():
            values.append(rpm.inference.rpm_elbo(model.prior, [z, z2], [q, q2]).item() / n)
    values = torch.tensor(values)
    return values.mean().item(), (values.std() / math.sqrt(batches)).item()


@pytest.mark.slow
def test_elbo_equals_mutual_information_minus_kl():
    torch.set_default_dtype(torch.float64)
    prior = GaussianRandomWalkPrior(1, scale=2.0, step=0.7)
    cov_q = torch.tensor([[VAR, COV], [COV, VAR]], dtype=torch.float64)
    mutual_information = -0.5 * math.log(1 - (COV / VAR) ** 2)
    kl = gaussian_kl(cov_q, joint_covariance(prior))
    elbo, se = monte_carlo_elbo(prior)
    assert kl > 0.1  # the test is not trivially at the optimum
    assert abs(elbo - (mutual_information - kl)) < 4 * se + 0.01


@pytest.mark.slow
def test_optimal_prior_gives_the_mutual_information():
    """With P(z, z') = Q(z, z') (Eq. 19-20) the KL vanishes and the ELBO approaches I_Q."""
    torch.set_default_dtype(torch.float64)
    prior = LinearDynamicsPrior(1)
    with torch.no_grad():
        prior.transition.fill_(COV / VAR)
        prior.initial_scale_tril = torch.full((1, 1), math.sqrt(VAR))
        prior.noise_scale_tril = torch.full((1, 1), math.sqrt(VAR - COV**2 / VAR))
    cov_q = torch.tensor([[VAR, COV], [COV, VAR]], dtype=torch.float64)
    assert gaussian_kl(cov_q, joint_covariance(prior)) < 1e-12
    mutual_information = -0.5 * math.log(1 - (COV / VAR) ** 2)
    elbo, se = monte_carlo_elbo(prior)
    assert abs(elbo - mutual_information) < 4 * se + 0.01
