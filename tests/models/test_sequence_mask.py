"""Missing frames through the model: the masked ELBO of the sequence RPM against a float64 loop over
the dense joint Gaussian of the observed frames, Trace_ELBO against RPMELBO, the structured
guide against the dense conditional, imputation, and refusals."""

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions import MultivariateNormal, Normal
from pyro.infer import Trace_ELBO

from rpm import RPM, RPMELBO, GaussianRecognition
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal
from rpm.priors import MarkovImplicitPrior, RBFEnergy, StateSpacePrior
from tests.helpers import GaussianHead
from tests.ops.test_kalman import dense_joint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, T, X_DIM, D = 5, 6, 3, 2
MASK = torch.tensor([
    [1, 1, 1, 1, 1, 1],
    [1, 0, 1, 1, 0, 1],
    [0, 1, 1, 0, 1, 1],
    [1, 1, 0, 0, 0, 1],
    [1, 0, 1, 0, 1, 0],
], dtype=torch.bool)


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def make(guide):
    prior = StateSpacePrior(D, process_noise=0.3, observation_noise=0.2)
    with torch.no_grad():  # a generic chain, not the constant-velocity start
        prior.transition_matrix.add_(0.1 * torch.randn(2 * D, 2 * D))
        prior.observation_matrix.add_(0.3 * torch.randn(D, 2 * D))
    return RPM(GaussianRecognition(GaussianHead(X_DIM, D)), prior, guide=guide, encoder_calls="concat")


def prior_params(prior):
    return {name: getattr(prior, name).detach() for name in (
        "init_loc", "init_scale_tril", "transition_matrix", "transition_scale_tril",
        "observation_matrix", "observation_scale_tril")}


def data():
    x = torch.randn(N, T, X_DIM)
    return x, torch.where(MASK.unsqueeze(-1), x, torch.nan)  # missing frames hold NaN


def observed(row):
    return [t * D + d for t in range(T) if row[t] for d in range(D)]


def loop_elbo(model, x, z, structured):
    """sum_n [log P(z_obs) + sum_{t obs} (log Q(z_t|x_t) - log Q_t(z_t)) - log guide(z_obs)],
    each term from its equation in float64: the dense joint Gaussian of the chain, mixtures
    over the observed frames of each view, the guide as the dense conditional."""
    mean_z, cov_z = dense_joint(prior_params(model.prior), T)[2:4]
    loc, scale = (v.detach() for v in model.recognition.net(x))  # (N, T, D); used where observed
    total = 0.0
    for n in range(N):
        idx = observed(MASK[n])
        zn = z[n].reshape(-1)[idx]
        total += MultivariateNormal(mean_z[idx], cov_z[idx][:, idx]).log_prob(zn)
        for t in range(T):
            if not MASK[n, t]:
                continue
            log_q = Normal(loc[n, t], scale[n, t]).log_prob(z[n, t]).sum()
            components = [Normal(loc[m, t], scale[m, t]).log_prob(z[n, t]).sum()
                          for m in range(N) if MASK[m, t]]
            log_marginal = torch.logsumexp(torch.stack(components), 0) - math.log(len(components))
            total += log_q - log_marginal
            if not structured:
                total -= log_q  # the recognition guide's own density
        if structured:  # q(z_obs) = p(z_obs | mu_obs), mu_t = z_t + e_t, e_t ~ N(0, sigma_t^2)
            mu = loc[n].reshape(-1)[idx]
            sigma2 = torch.diag(scale[n].reshape(-1)[idx] ** 2)
            cz = cov_z[idx][:, idx]
            gain = cz @ torch.linalg.inv(cz + sigma2)
            q = MultivariateNormal(mean_z[idx] + gain @ (mu - mean_z[idx]), cz - gain @ cz)
            total -= q.log_prob(zn)
    return total


@pytest.mark.parametrize("guide", ["recognition", "structured"])
def test_masked_elbo_equals_the_loop_and_trace_elbo(guide):
    model = make(guide)
    clean, x = data()
    model.guide(clean)  # materialise parameters
    params = list(model.parameters())
    losses, grads = {}, {}
    for name, loss_fn in (("rpm", RPMELBO()), ("trace", Trace_ELBO())):
        pyro.set_rng_seed(3)
        loss = loss_fn.differentiable_loss(model.model, model.guide, x, mask=MASK)
        losses[name] = loss.detach()
        grads[name] = torch.autograd.grad(loss, params)
    pyro.set_rng_seed(3)
    z = poutine.trace(model.guide).get_trace(x, mask=MASK).nodes["z"]["value"].detach()
    expected = loop_elbo(model, torch.where(MASK.unsqueeze(-1), clean, 0.0), z, guide == "structured")
    assert torch.allclose(-losses["rpm"], expected, rtol=1e-10, atol=1e-8)
    assert torch.allclose(losses["rpm"], losses["trace"], rtol=1e-10, atol=1e-10)
    for ours, theirs in zip(grads["rpm"], grads["trace"], strict=True):
        assert torch.isfinite(ours).all()
        assert torch.allclose(ours, theirs, rtol=1e-7, atol=1e-9)


def test_a_full_mask_is_no_mask():
    model = make("structured")
    x, _ = data()
    model.guide(x)
    pyro.set_rng_seed(4)
    plain = RPMELBO().differentiable_loss(model.model, model.guide, x)
    pyro.set_rng_seed(4)
    full = RPMELBO().differentiable_loss(model.model, model.guide, x,
                                         mask=torch.ones(N, T, dtype=torch.bool))
    assert torch.allclose(plain, full, rtol=1e-12)


def test_structured_guide_draws_the_dense_conditional_and_encode_imputes():
    """The guide's draw is affine in its noise: its offset and M M^T are the mean and covariance
    of z_{1:T} given the observed frames' recognition means (missing frames included)."""
    model = make("structured")
    clean, x = data()
    n = 1
    q = model.recognise(x, mask=MASK)
    posterior = model.prior.posterior(q)
    mean_z, cov_z = dense_joint(prior_params(model.prior), T)[2:4]
    loc, scale = (v.detach() for v in model.recognition.net(torch.where(MASK.unsqueeze(-1), clean, 0.0)))
    idx = observed(MASK[n])
    mu = loc[n].reshape(-1)[idx]
    gain = cov_z[:, idx] @ torch.linalg.inv(cov_z[idx][:, idx] + torch.diag(scale[n].reshape(-1)[idx] ** 2))
    cond_mean = mean_z + gain @ (mu - mean_z[idx])
    cond_cov = cov_z - gain @ cov_z[idx]
    width = 2 * D + D  # H + D noise numbers per frame
    basis = torch.cat([torch.zeros(1, T * width), torch.eye(T * width)]).reshape(-1, 1, T, width)
    noise = torch.zeros(basis.shape[0], N, T, width)
    noise[:, n] = basis[:, 0]
    draws = posterior._rsample_from_noise(noise)[:, n].detach().reshape(-1, T * D)
    offset, matrix = draws[0], (draws[1:] - draws[0]).T
    assert torch.allclose(offset, cond_mean, atol=1e-8)
    assert torch.allclose(matrix @ matrix.T, cond_cov, atol=1e-8)
    # encode: the recognition means where observed, the posterior mean where missing
    encoded = model.encode_views(x, mask=MASK).detach()
    assert torch.allclose(encoded[MASK], loc[MASK])
    missing = ~MASK[n]
    assert torch.allclose(encoded[n][missing], cond_mean.reshape(T, D)[missing], atol=1e-8)
    assert torch.allclose(posterior.mean[n].detach(), cond_mean.reshape(T, D), atol=1e-8)


@pytest.mark.parametrize("pooled", [False, True])
def test_masked_marginals_leave_the_missing_frames_out(pooled):
    loc, scale = torch.randn(N, T, D), torch.rand(N, T, D) + 0.3
    q = Normal(loc, scale).to_event(1).mask(MASK)
    value = torch.randn(N, T, D)
    ours = SequenceMixtureMarginal(q, pooled=pooled).view_log_prob(value)
    for n in range(N):
        for t in range(T):
            if not MASK[n, t]:
                assert ours[n, t] == 0
                continue
            frames = [(m, u) for m in range(N) for u in range(T)
                      if MASK[m, u] and (pooled or u == t)]
            terms = torch.stack([Normal(loc[m, u], scale[m, u]).log_prob(value[n, t]).sum()
                                 for m, u in frames])
            expected = torch.logsumexp(terms, 0) - math.log(len(frames))
            assert torch.allclose(ours[n, t], expected, atol=1e-10)


def test_masks_are_refused_where_they_cannot_be_honoured():
    x, _ = data()
    model = make("recognition")
    with pytest.raises(ValueError, match=r"mask must be a bool tensor of shape \(N, J\) = \(5, 6\)"):
        model.model(x, mask=MASK.float())
    with pytest.raises(ValueError, match=r"mask must be a bool tensor of shape \(N, J\)"):
        model.model(x, mask=MASK[:, :-1])
    implicit = RPM(GaussianRecognition(GaussianHead(X_DIM, D)), MarkovImplicitPrior(RBFEnergy()),
                   encoder_calls="concat")
    with pytest.raises(ValueError, match="marginalises missing views"):
        implicit.model(x, mask=MASK)


def test_the_stationary_prior_takes_a_mask():
    """StationaryStateSpacePrior's site with a mask is the dense marginal density of the observed
    frames (its offset included), and an RPM with it trains on masked batches."""
    from rpm.priors import StationaryStateSpacePrior

    prior = StationaryStateSpacePrior(D, 3, observation_offset=0.7)
    dist = prior.distribution(T)
    params = {name: getattr(dist, name).detach() for name in (
        "init_loc", "init_scale_tril", "transition_matrix", "transition_scale_tril",
        "observation_matrix", "observation_scale_tril")}
    mean_z, cov_z = dense_joint(params, T)[2:4]
    mean_z = mean_z + dist.observation_offset.detach().repeat(T)
    z = torch.randn(N, T, D)
    log_prob = dist.masked(MASK).log_prob(z).detach()
    for n in range(N):
        idx = observed(MASK[n])
        expected = MultivariateNormal(mean_z[idx], cov_z[idx][:, idx]).log_prob(z[n].reshape(-1)[idx])
        assert torch.allclose(log_prob[n], expected, atol=1e-8)
    model = RPM(GaussianRecognition(GaussianHead(X_DIM, D)), prior, guide="structured",
                encoder_calls="concat")
    _, x = data()
    loss = RPMELBO().differentiable_loss(model.model, model.guide, x, mask=MASK)
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
