"""The two content priors of rpm content-style: their RPM ELBOs against the equations of the
model module written as float64 loops (InfoNCE with the squared-distance critic; AlignMaxEnt
with the minibatch-mixture entropy)."""

import math

import pyro
import pytest
import torch

import rpm
from rpm.experiments.content_style.model import PRIORS, build_model

N, X_DIM, M = 9, 6, 3


@pytest.fixture
def batch():
    torch.set_default_dtype(torch.float64)
    x = torch.randn(N, X_DIM)
    return x, x + 0.3 * torch.randn(N, X_DIM)


def _log_normal(u, mean, scale):
    """log N(u; mean, scale^2 I), one coordinate at a time."""
    return sum(-0.5 * ((a - b) / scale) ** 2 - math.log(scale) - 0.5 * math.log(2 * math.pi)
               for a, b in zip(u, mean, strict=True))


def _log_mixture(u, means, scale):
    """log (1/N) sum_j N(u; means_j, scale^2 I)."""
    return math.log(sum(math.exp(_log_normal(u, m, scale)) for m in means) / len(means))


def test_rbf_prior_elbo_is_infonce_with_the_squared_distance(batch):
    encoder = torch.nn.Linear(X_DIM, M)
    lengthscale = 0.8
    model = build_model(encoder, M, "rbf", lengthscale=lengthscale)
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, *batch)
    c, c2 = (encoder(x).tolist() for x in batch)

    def f(u, v):
        return -sum((a - b) ** 2 for a, b in zip(u, v, strict=True)) / (2 * lengthscale ** 2)
    elbo = sum(f(c[i], c2[i]) - math.log(sum(math.exp(f(c[i], c2[j])) for j in range(N)) / N)
               for i in range(N))
    assert -loss.item() == pytest.approx(elbo, rel=1e-10, abs=1e-10)


def test_gaussian_prior_elbo_is_alignment_plus_entropies(batch):
    encoder = torch.nn.Linear(X_DIM, M)
    model = build_model(encoder, M, "gaussian", lengthscale=0.6, noise_scale=0.3)
    with torch.no_grad():
        model.prior.scale = torch.tensor(1.7)
    pyro.set_rng_seed(5)
    guide = pyro.poutine.trace(model.guide).get_trace(*batch)
    pyro.set_rng_seed(5)
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, *batch)
    z, z2 = (guide.nodes[name]["value"].tolist() for name in ("z", "z2"))
    mu, mu2 = (encoder(x).tolist() for x in batch)
    s, l, eps = 1.7, 0.6, 0.3
    elbo = 0.0
    for i in range(N):
        alignment = -sum((a - b) ** 2 for a, b in zip(z[i], z2[i], strict=True)) / (2 * l ** 2)
        entropies = -_log_mixture(z[i], mu, eps) - _log_mixture(z2[i], mu2, eps)
        elbo += (alignment + entropies + _log_normal(z[i], [0.0] * M, s)
                 - M * math.log(l) - 0.5 * M * math.log(2 * math.pi))
    assert -loss.item() == pytest.approx(elbo, rel=1e-10)


def test_build_model_rejects_bad_arguments():
    with pytest.raises(ValueError, match="prior"):
        build_model(torch.nn.Linear(2, 2), 2, "vmf")
    with pytest.raises(ValueError, match="noise_scale"):
        build_model(torch.nn.Linear(2, 2), 2, "gaussian", noise_scale=0.0)
    assert PRIORS == ("rbf", "gaussian")
