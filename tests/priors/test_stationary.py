"""StationaryStateSpacePrior: its likelihood against Pyro's GaussianHMM and a dense joint Gaussian
built from the equations (float64), its stationarity in closed form, the contraction
parametrisation, the whitening of from_dynamics, and both guides inside an RPM of sequences against
Trace_ELBO."""

import pyro
import pytest
import torch
from pyro.distributions import GaussianHMM, MultivariateNormal
from pyro.infer import Trace_ELBO

from rpm import RPMELBO, GaussianRecognition
from rpm.distributions import GaussianStateSpace
from rpm.models._rpm import RPM
from rpm.ops._lyapunov import stationary_covariance
from rpm.priors import StationaryStateSpacePrior
from rpm.priors._stationary import contraction_weight
from tests.helpers import GaussianHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def random_prior(dim=2, state_dim=4, weight_scale=2.0):
    """A prior with random W (singular values of A spread over (0, 1)), C, b and R."""
    prior = StationaryStateSpacePrior(dim, state_dim)
    with torch.no_grad():
        prior.transition_weight.copy_(weight_scale * torch.randn(state_dim, state_dim))
        prior.observation_matrix.copy_(torch.randn(dim, state_dim))
        prior.observation_offset.copy_(3.0 * torch.randn(dim))
    tril = torch.randn(dim, dim).tril()
    tril.diagonal().copy_(0.2 + torch.rand(dim))
    prior.observation_scale_tril = tril
    return prior


def dense_joint(prior, duration):
    """The joint Gaussian of z_{1:T} written from the equations with a loop: Cov(s_t, s_u) =
    A^{t-u} for t >= u (unit stationary covariance), z_t = C s_t + b + v_t."""
    a = prior.transition_matrix.detach()
    c = prior.observation_matrix.detach()
    r = prior.observation_scale_tril.detach()
    dim = c.shape[0]
    cov = torch.zeros(duration * dim, duration * dim)
    for t in range(duration):
        for u in range(duration):
            lag = torch.linalg.matrix_power(a, abs(t - u))
            block = c @ (lag if t >= u else lag.T) @ c.T
            if t == u:
                block = block + r @ r.T
            cov[t * dim:(t + 1) * dim, u * dim:(u + 1) * dim] = block
    loc = prior.observation_offset.detach().repeat(duration)
    return MultivariateNormal(loc, covariance_matrix=cov)


def test_parametrisation_keeps_singular_values_below_one_and_q_is_i_minus_a_a_t():
    for scale in (0.1, 1.0, 10.0, 100.0):
        prior = random_prior(dim=3, state_dim=5, weight_scale=scale)
        a = prior.transition_matrix.detach()
        tril = prior.transition_scale_tril.detach()
        weight = prior.transition_weight.detach()
        singular = torch.linalg.svdvals(a)
        expected = torch.linalg.svdvals(weight)
        expected = expected / (1 + expected ** 2).sqrt()  # sigma(W) / sqrt(1 + sigma(W)^2)
        assert torch.allclose(singular, expected, rtol=1e-8, atol=1e-12)
        assert (singular < 1).all()
        assert torch.equal(tril, tril.tril()) and (tril.diagonal() > 0).all()
        assert torch.allclose(tril @ tril.T, torch.eye(5) - a @ a.T, atol=1e-10)


def test_contraction_weight_inverts_the_parametrisation():
    a = torch.randn(4, 4)
    a = 0.95 * a / torch.linalg.matrix_norm(a, ord=2)  # a strict contraction
    prior = StationaryStateSpacePrior(2, 4)
    with torch.no_grad():
        prior.transition_weight.copy_(contraction_weight(a))
    assert torch.allclose(prior.transition_matrix.detach(), a, atol=1e-12)
    with pytest.raises(ValueError, match="singular values below 1"):
        contraction_weight(1.01 * a / 0.95)


def test_log_prob_matches_gaussian_hmm_started_from_the_stationary_state():
    """GaussianHMM puts its initial state one transition before the first frame: from N(0, I)
    that transition leaves N(0, I), so no conversion of conventions is needed."""
    prior = random_prior(dim=3, state_dim=4)
    T = 9
    dist = prior.distribution(T)
    a, q_tril = prior.transition_matrix.detach(), prior.transition_scale_tril.detach()
    c, r_tril = prior.observation_matrix.detach(), prior.observation_scale_tril.detach()
    hmm = GaussianHMM(MultivariateNormal(torch.zeros(4), torch.eye(4)), a.T,
                      MultivariateNormal(torch.zeros(4), scale_tril=q_tril), c.T,
                      MultivariateNormal(torch.zeros(3), scale_tril=r_tril), duration=T)
    z = dist.sample((6,))  # (6, T, 3)
    offset = prior.observation_offset.detach()
    assert torch.allclose(dist.log_prob(z), hmm.log_prob(z - offset), rtol=0, atol=1e-9)


def test_log_prob_matches_the_dense_joint_and_every_frame_has_the_stationary_marginal():
    prior = random_prior(dim=2, state_dim=5)
    T = 7
    joint = dense_joint(prior, T)
    z = joint.sample((5,)).reshape(5, T, 2)
    assert torch.allclose(prior.distribution(T).log_prob(z), joint.log_prob(z.flatten(1)),
                          rtol=0, atol=1e-9)
    marginal = prior.marginal()
    for t in range(T):
        block = joint.covariance_matrix[2 * t:2 * t + 2, 2 * t:2 * t + 2]
        assert torch.allclose(block, marginal.covariance_matrix, atol=1e-12)
    assert torch.allclose(marginal.loc, prior.observation_offset)


def test_the_state_marginal_is_standard_normal_at_every_step():
    """P_{t+1} = A P_t A^T + Q from P_1 = I stays I (closed form, 200 steps), and a Monte Carlo
    check of the sampled latents' covariance at the first and last frame."""
    prior = random_prior(dim=2, state_dim=4, weight_scale=5.0)  # singular values near 1
    a, q_tril = prior.transition_matrix.detach(), prior.transition_scale_tril.detach()
    cov = torch.eye(4)
    for _ in range(200):
        cov = a @ cov @ a.T + q_tril @ q_tril.T
        assert torch.allclose(cov, torch.eye(4), atol=1e-10)
    draws = prior.distribution(12).sample((40000,))  # (S, 12, 2)
    expected = prior.marginal().covariance_matrix
    for t in (0, 11):
        empirical = torch.cov(draws[:, t].T)
        # standard error of a covariance entry <= sqrt(2 / S) * max variance: 5 of them
        assert torch.allclose(empirical, expected, atol=5 * (2 / 40000) ** 0.5 * expected.max().item())


def test_stationary_covariance_is_the_series():
    a = torch.randn(3, 3)
    a = 0.9 * a / torch.linalg.eigvals(a).abs().max()
    q_tril = torch.randn(3, 3).tril() + 2 * torch.eye(3)
    q = q_tril @ q_tril.T
    series, power = torch.zeros(3, 3), torch.eye(3)
    for _ in range(2000):
        series = series + power @ q @ power.T
        power = a @ power
    assert torch.allclose(stationary_covariance(a, q), series, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="no stationary distribution"):
        stationary_covariance(torch.eye(3), q)


def test_from_dynamics_is_the_same_chain_in_the_whitened_basis():
    """A damped constant-velocity chain (positions and velocities in pixels) started from its
    stationary distribution gives the same log-likelihood as the whitened stationary prior."""
    dim = 2
    eye = torch.eye(dim)
    a0 = torch.cat([torch.cat([0.97 * eye, 0.9 * eye], 1), torch.cat([0 * eye, 0.9 * eye], 1)])
    q_tril = torch.diag(torch.tensor([0.5, 0.5, 1.5, 1.5]))
    c0 = torch.cat([eye, 0 * eye], 1)
    prior = StationaryStateSpacePrior.from_dynamics(a0, q_tril, c0, observation_offset=16.0,
                                                    observation_noise=0.3)
    p0 = stationary_covariance(a0, q_tril @ q_tril.T)
    reference = GaussianStateSpace(torch.zeros(4), torch.linalg.cholesky(p0), a0, q_tril, c0,
                                   0.3 * eye, 10, observation_offset=torch.full((dim,), 16.0))
    z = reference.sample((7,))
    assert torch.allclose(prior.distribution(10).log_prob(z), reference.log_prob(z),
                          rtol=0, atol=1e-8)
    # the eigenvalues of A are A_0's (a change of basis)
    eig = torch.linalg.eigvals(prior.transition_matrix.detach())
    eig0 = torch.linalg.eigvals(a0)
    assert torch.allclose(eig.abs().sort().values, eig0.abs().sort().values, atol=1e-10)


def make(guide, N=5, T=4, x_dim=5, D=2):
    model = RPM(GaussianRecognition(GaussianHead(x_dim, D)),
                StationaryStateSpacePrior(D, 3, observation_noise=0.5), guide=guide,
                encoder_calls="concat")
    return model, torch.randn(N, T, x_dim)


@pytest.mark.parametrize("guide", ["structured", "recognition"])
def test_both_guides_agree_with_trace_elbo(guide):
    model, x = make(guide)
    model.guide(x)
    params = list(model.parameters())

    def run(elbo):
        pyro.set_rng_seed(3)
        loss = elbo.differentiable_loss(model.model, model.guide, x)
        return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)

    ours, our_grads = run(RPMELBO())
    theirs, their_grads = run(Trace_ELBO())
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0)
    prior_params = {id(p) for p in model.prior.parameters()}
    for p, a, b in zip(params, our_grads, their_grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)
        if id(p) in prior_params:  # W, C, b and R all receive gradients
            assert a is not None and a.abs().sum() > 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="decay"):
        StationaryStateSpacePrior(2, decay=1.0)
    with pytest.raises(ValueError, match="observation_scale"):
        StationaryStateSpacePrior(2, observation_scale=[1.0, -1.0])
    with pytest.raises(ValueError, match="observation_offset"):
        StationaryStateSpacePrior(2, observation_offset=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="no stationary distribution"):
        StationaryStateSpacePrior.from_dynamics(torch.eye(2), torch.eye(2), torch.eye(2))
    with pytest.raises(ValueError, match="observation_matrix"):
        StationaryStateSpacePrior.from_dynamics(0.5 * torch.eye(2), torch.eye(2), torch.eye(3))


def test_a_fixed_observation_matrix_is_a_buffer_that_keeps_its_start():
    a0 = torch.tensor([[0.9, 0.5], [0.0, 0.8]])
    prior = StationaryStateSpacePrior.from_dynamics(a0, 0.3 * torch.eye(2), torch.tensor([[1.0, 0.0]]),
                                                    learn_observation_matrix=False)
    names = {name for name, _ in prior.named_parameters()}
    assert not any("observation_matrix" in name for name in names)
    assert "observation_matrix" in dict(prior.named_buffers())
    start = prior.observation_matrix.clone()
    optimizer = torch.optim.SGD(prior.parameters(), lr=0.1)
    loss = -prior.distribution(5).log_prob(torch.randn(3, 5, 1)).sum()
    loss.backward()
    optimizer.step()
    assert torch.equal(prior.observation_matrix, start)
    assert prior.transition_weight.grad.abs().sum() > 0


def test_a_fixed_emission_noise_and_offset_are_buffers_kept_through_training_and_state_dict():
    a0 = torch.tensor([[0.9, 0.5], [0.0, 0.8]])
    prior = StationaryStateSpacePrior.from_dynamics(
        a0, 0.3 * torch.eye(2), torch.tensor([[1.0, 0.0]]), observation_offset=2.0,
        observation_noise=0.4, learn_observation_matrix=False, learn_observation_noise=False,
        learn_observation_offset=False)
    assert [name for name, _ in prior.named_parameters()] == ["transition_weight"]
    buffers = dict(prior.named_buffers())
    assert {"observation_matrix", "observation_scale_tril", "observation_offset"} <= set(buffers)
    assert torch.equal(prior.observation_scale_tril, torch.tensor([[0.4]]))
    assert torch.equal(prior.observation_offset, torch.tensor([2.0]))
    starts = {name: getattr(prior, name).clone() for name in buffers}
    optimizer = torch.optim.Adam(prior.parameters(), lr=0.1)
    z = 2.0 + torch.randn(3, 6, 1)
    for _ in range(3):
        optimizer.zero_grad()
        (-prior.distribution(6).log_prob(z).sum()).backward()
        optimizer.step()
    for name, start in starts.items():
        assert getattr(prior, name).grad is None
        assert torch.equal(getattr(prior, name), start)
    assert prior.transition_weight.grad.abs().sum() > 0
    # the log-likelihood uses the fixed R and b: the dense joint of the equations
    assert torch.allclose(prior.distribution(6).log_prob(z), dense_joint(prior, 6).log_prob(z.flatten(1)))
    # checkpoint / resume: a fresh prior with other starting values takes the saved ones
    state = prior.state_dict()
    assert {"observation_scale_tril", "observation_offset", "observation_matrix"} <= set(state)
    restored = StationaryStateSpacePrior(1, 2, observation_noise=1.0, learn_observation_matrix=False,
                                         learn_observation_noise=False, learn_observation_offset=False)
    restored.load_state_dict(state)
    for name in ("observation_scale_tril", "observation_offset", "observation_matrix",
                 "transition_weight"):
        assert torch.equal(getattr(restored, name), getattr(prior, name))
    assert torch.equal(restored.distribution(6).log_prob(z), prior.distribution(6).log_prob(z))


def test_learned_emission_noise_and_offset_are_parameters():
    prior = StationaryStateSpacePrior(2, 4)
    names = {name.split(".")[0] for name, _ in prior.named_parameters()}
    assert {"transition_weight", "observation_matrix", "observation_offset"} <= names
    assert any(name.startswith("observation_scale_tril") for name, _ in prior.named_parameters())
