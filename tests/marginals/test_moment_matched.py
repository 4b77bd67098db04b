"""MomentMatchedMarginal: against its moments and density written as float64 loops, against the
minibatch mixture it summarises (Monte Carlo), and inside a model (RPMELBO == Trace_ELBO)."""

import math

import numpy as np
import pyro
import pytest
import torch
from pyro.distributions import Delta, Normal
from pyro.infer import Trace_ELBO

import rpm
from rpm.experiments.lds.model import GaussianMLPEncoder, build_sequence_model
from rpm.marginals import MomentMatchedMarginal
from rpm.ops import gaussian_mixture_log_prob


def _loop_log_prob(loc, scale, value, observed):
    """sum_t log N(z_{n,t}; m, S) over observed frames, the moments of the observed frames'
    components written as loops, the Gaussian density from its formula (numpy, float64)."""
    loc, scale, value = (np.asarray(t, dtype=np.float64) for t in (loc, scale, value))
    num, length, dim = loc.shape
    frames = [(n, t) for n in range(num) for t in range(length) if observed[n][t]]
    mean = sum(loc[n, t] for n, t in frames) / len(frames)
    cov = np.zeros((dim, dim))
    for n, t in frames:
        d = loc[n, t] - mean
        cov += np.outer(d, d) + np.diag(scale[n, t] ** 2)
    cov /= len(frames)
    inverse, logdet = np.linalg.inv(cov), np.linalg.slogdet(cov)[1]
    out = np.zeros(num)
    for n, t in frames:
        d = value[n, t] - mean
        out[n] += -0.5 * (dim * math.log(2 * math.pi) + logdet + d @ inverse @ d)
    return out


def _recognition(num=4, length=3, dim=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    loc = torch.randn(num, length, dim, generator=generator, dtype=torch.float64)
    scale = 0.1 + torch.rand(num, length, dim, generator=generator, dtype=torch.float64)
    value = torch.randn(num, length, dim, generator=generator, dtype=torch.float64)
    return loc, scale, value


def test_log_prob_is_the_gaussian_of_the_mixture_moments():
    loc, scale, value = _recognition()
    marginal = MomentMatchedMarginal(Normal(loc, scale).to_event(1), pooled=True)
    assert marginal.batch_shape == (4,) and marginal.event_shape == (3, 2)
    expected = _loop_log_prob(loc, scale, value, np.ones((4, 3), dtype=bool))
    np.testing.assert_allclose(marginal.log_prob(value).numpy(), expected, rtol=1e-10)
    assert marginal.view_log_prob(value).shape == (4, 3)


def test_missing_frames_are_no_components_and_have_no_term():
    loc, scale, value = _recognition(num=5, length=4, dim=3, seed=1)
    mask = torch.rand(5, 4, generator=torch.Generator().manual_seed(2)) > 0.4
    mask[0, 0] = True
    q = Normal(loc, scale).to_event(1).mask(mask)
    marginal = MomentMatchedMarginal(q, pooled=True)
    expected = _loop_log_prob(loc, scale, value, mask.numpy())
    np.testing.assert_allclose(marginal.log_prob(value).numpy(), expected, rtol=1e-10)
    assert torch.all(marginal.view_log_prob(value)[~mask] == 0)
    with pytest.raises(ValueError, match="every frame of the batch is missing"):
        none_observed = torch.zeros(5, 4, dtype=torch.bool)
        MomentMatchedMarginal(Normal(loc, scale).to_event(1).mask(none_observed), pooled=True)


def test_it_is_the_population_mixture_of_gaussian_means():
    """Means mu_k ~ N(a, B) with constant noise sigma: the mixture of N(mu_k, sigma^2 I) over
    many components is N(a, B + sigma^2 I), and so is the moment-matched Gaussian: at 100 points
    drawn from the means' law the log-densities differ by 0.04 nats or less on average (the
    mixture's Monte Carlo error with 20000 components is about 0.016; leaving sigma^2 out of S
    would differ by more than 0.2)."""
    generator = torch.Generator().manual_seed(3)
    dim, count = 3, 20000
    root = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.8, 0.0], [-0.3, 0.2, 0.6]], dtype=torch.float64)
    means = (torch.randn(count, dim, generator=generator, dtype=torch.float64) @ root.T
             + torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64))
    scale = torch.full_like(means, 0.5)
    q = Normal(means.reshape(100, 200, dim), scale.reshape(100, 200, dim)).to_event(1)
    marginal = MomentMatchedMarginal(q, pooled=True)
    points = (torch.randn(100, 1, dim, generator=generator, dtype=torch.float64) @ root.T
              + torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64))
    mixture = gaussian_mixture_log_prob(points[:, 0], means, scale)
    moment = marginal.gaussian.log_prob(points[:, 0])
    assert (mixture - moment).abs().mean() < 0.04
    truth = torch.distributions.MultivariateNormal(
        torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64),
        root @ root.T + 0.25 * torch.eye(dim, dtype=torch.float64))
    assert (truth.log_prob(points[:, 0]) - moment).abs().mean() < 0.04


def test_per_view_delta_and_one_view_forms_against_loops():
    """Per view (each view its own moments over the N instances), Delta recognition (no
    noise term), and one view of a pair (batch (N,), event (D,)): each against the loop."""
    loc, scale, value = _recognition(num=6, length=3, dim=2, seed=4)
    observed = np.ones((6, 1), dtype=bool)
    for recognition, noise in ((Normal(loc, scale).to_event(1), scale), (Delta(loc, event_dim=1),
                                                                       torch.zeros_like(scale))):
        per_view = MomentMatchedMarginal(recognition).view_log_prob(value)
        assert per_view.shape == (6, 3)
        for j in range(3):
            expected = _loop_log_prob(loc[:, j:j + 1], noise[:, j:j + 1], value[:, j:j + 1],
                                      observed)
            np.testing.assert_allclose(per_view[:, j].numpy(), expected, rtol=1e-10)
    one_view = MomentMatchedMarginal(Delta(loc[:, 1], event_dim=1))
    assert one_view.batch_shape == (6,) and one_view.event_shape == (2,)
    expected = _loop_log_prob(loc[:, 1:2], torch.zeros_like(scale[:, 1:2]), value[:, 1:2], observed)
    np.testing.assert_allclose(one_view.log_prob(value[:, 1]).numpy(), expected, rtol=1e-10)


def test_a_singular_covariance_is_refused_naming_the_batch_size():
    """Delta recognition: N points in D dimensions have a singular covariance unless N >= D + 1
    (and they span the space); Gaussian recognition's noise keeps S positive definite."""
    with pytest.raises(ValueError, match=r"N >= 4"):
        MomentMatchedMarginal(Delta(torch.randn(3, 2, 3), event_dim=1))
    MomentMatchedMarginal(Delta(torch.randn(4, 2, 3), event_dim=1))  # N = D + 1 suffices
    flat = torch.randn(8, 1).expand(8, 3) * torch.tensor([1.0, 2.0, 3.0])  # rank one
    with pytest.raises(ValueError, match="span fewer than D = 3"):
        MomentMatchedMarginal(Delta(flat, event_dim=1))
    MomentMatchedMarginal(Normal(torch.zeros(2, 3), 0.1).to_event(1))  # N = 2 < D + 1: fine
    with pytest.raises(ValueError, match="pooled=False"):
        MomentMatchedMarginal(Delta(torch.randn(5, 3), event_dim=1), pooled=True)


def test_rpm_elbo_equals_trace_elbo_and_uses_the_gaussian():
    """In the sequence model with the structured guide: RPMELBO equals Pyro's Trace_ELBO (same
    samples), and the ELBO is log Z_q - sum_t log N(z_t; m, S) at the guide's draw, the Kalman
    likelihood of the means minus the moment-matched cross-entropy."""
    torch.set_default_dtype(torch.float64)
    encoder = GaussianMLPEncoder(4, 2, hidden=0, noise=0.2)
    model = build_sequence_model(encoder, 2, marginal="gaussian")
    assert model.marginal_kind == "gaussian" and model.pooled_marginal
    x = torch.randn(6, 5, 4)
    pyro.set_rng_seed(7)
    trace = Trace_ELBO().differentiable_loss(model.model, model.guide, x)
    pyro.set_rng_seed(7)
    ours = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x)
    torch.testing.assert_close(ours, trace)
    pyro.set_rng_seed(7)
    q = model.recognise(x)
    guide = model.prior.posterior(q)
    z = guide.rsample()
    loc, scale = encoder(x)
    expected = -(guide.filtered.log_prob.sum()
                 - torch.tensor(_loop_log_prob(loc.detach(), scale.detach(), z.detach(),
                                               np.ones((6, 5), dtype=bool))).sum())
    torch.testing.assert_close(ours, expected)


def test_candidates_of_one_process_change_nothing_and_a_queue_is_refused():
    """Without torch.distributed a global batch is the batch: the same log-densities (bitwise);
    a queue of earlier latents, or explicit negatives, cannot enter the moments (one line)."""
    from rpm.inference import Candidates, LatentQueue

    torch.set_default_dtype(torch.float64)
    q = Normal(torch.randn(6, 2, 3), torch.rand(6, 2, 3) + 0.1).to_event(1)
    value = torch.randn(6, 2, 3)
    for pooled in (False, True):
        gathered = MomentMatchedMarginal(q, pooled=pooled, candidates=Candidates(global_batch=True))
        assert torch.equal(gathered.log_prob(value),
                           MomentMatchedMarginal(q, pooled=pooled).log_prob(value))
    queue = LatentQueue(4, 3)
    queue.push(torch.randn(2, 3))
    for candidates in (Candidates(queue=queue), Candidates(negatives=torch.randn(4, 3))):
        with pytest.raises(ValueError, match="without a queue and without explicit negatives"):
            MomentMatchedMarginal(q, candidates=candidates)
