"""The state-space likelihood against Pyro's GaussianHMM under rpm's initial-state convention.

rpm (rpm.ops._kalman, GaussianStateSpace, StateSpacePrior) puts the initial distribution on the
state of the first observation, s_1 ~ N(m_1, S_1). Pyro's GaussianHMM puts it one transition
earlier: s_0 ~ initial_dist, s_1 = s_0 A_1 + w_1 (right-multiplied matrices). The two coincide,
for any m_1 and S_1, when GaussianHMM's transitions are time-varying with a first transition
that forgets s_0: A_1 = 0 and w_1 ~ N(m_1, S_1); the later ones are A^T and N(0, Q). That is the
conversion docs/theory.md#linear-gaussian-state-space-prior states, checked here."""

import pytest
import torch
from pyro.distributions import GaussianHMM, MultivariateNormal

from rpm.ops import kalman_filter
from rpm.priors._state_space import StateSpacePrior
from tests.ops.test_kalman import random_model
from tests.priors.test_state_space import as_dict, set_params

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gaussian_hmm_with_rpm_convention(p: dict, duration: int) -> GaussianHMM:
    """GaussianHMM of rpm's model ``p`` (the names of rpm.ops._kalman.kalman_filter), batch
    shape that of ``p``: a first transition A_1 = 0, w_1 ~ N(m_1, S_1), then A^T, N(0, Q)."""
    init_loc, init_tril = p["init_loc"], p["init_scale_tril"]
    batch, hidden = init_loc.shape[:-1], init_loc.shape[-1]
    transition = p["transition_matrix"].transpose(-1, -2).unsqueeze(-3)  # (..., 1, H, H)
    transition = transition.expand(batch + (duration, hidden, hidden)).clone()
    transition[..., 0, :, :] = 0.0  # the first transition forgets s_0
    noise_loc = torch.zeros(batch + (duration, hidden), dtype=init_loc.dtype)
    noise_loc[..., 0, :] = init_loc
    noise_tril = p["transition_scale_tril"].unsqueeze(-3).expand(
        batch + (duration, hidden, hidden)).clone()
    noise_tril[..., 0, :, :] = init_tril
    obs_dim = p["observation_matrix"].shape[-2]
    obs_tril = p["observation_scale_tril"]  # (..., D, D), or (..., T or 1, D, D) time-varying
    if obs_tril.dim() == len(batch) + 2:
        obs_tril = obs_tril.unsqueeze(-3)
    return GaussianHMM(
        MultivariateNormal(torch.zeros(batch + (hidden,), dtype=init_loc.dtype),
                           torch.eye(hidden, dtype=init_loc.dtype)),  # s_0: any, forgotten
        transition,
        MultivariateNormal(noise_loc, scale_tril=noise_tril),
        p["observation_matrix"].transpose(-1, -2).unsqueeze(-3),
        MultivariateNormal(torch.zeros(batch + (1, obs_dim), dtype=init_loc.dtype),
                           scale_tril=obs_tril),
        duration=duration)


@pytest.mark.parametrize("time_varying_r", [False, True])
def test_kalman_filter_matches_gaussian_hmm_with_a_nonzero_initial_mean(time_varying_r):
    """Random parameters per sequence (N = 5, T = 7, H = 4, D = 3), m_1 != 0 and any S_1, a
    constant or a time-varying observation noise R_t."""
    T, H, D, N = 7, 4, 3, 5
    p = random_model(batch=(N,), H=H, D=D, T=T, time_varying_r=time_varying_r)
    p["init_loc"] = 2.0 * torch.randn(N, H, dtype=torch.float64)
    hmm = gaussian_hmm_with_rpm_convention(p, T)
    z = hmm.sample()  # (N, T, D)
    assert torch.allclose(kalman_filter(z, **p).log_prob, hmm.log_prob(z), rtol=0, atol=1e-9)


def test_state_space_prior_matches_gaussian_hmm_with_its_learned_parameters():
    """The prior's own parameters (its initial state included), constant velocity and a
    non-zero initial position: log P(z_{1:T}) of StateSpacePrior equals GaussianHMM's."""
    torch.set_default_dtype(torch.float64)
    prior = StateSpacePrior(2, init_loc=[3.0, -1.0, 0.5, 0.2], init_scale=[1.0, 2.0, 0.3, 0.3],
                            process_noise=0.2, observation_noise=0.3)
    set_params(prior, init_scale_tril=torch.tensor([
        [1.0, 0.0, 0.0, 0.0], [0.4, 2.0, 0.0, 0.0], [0.1, -0.2, 0.3, 0.0], [0.0, 0.3, 0.1, 0.3]]))
    T = 6
    hmm = gaussian_hmm_with_rpm_convention(as_dict(prior), T)
    z = hmm.sample((4,))  # (4, T, 2)
    assert torch.allclose(prior.distribution(T).log_prob(z), hmm.log_prob(z), rtol=0, atol=1e-9)


def test_without_the_conversion_the_conventions_differ():
    """GaussianHMM given m_1, S_1 as its initial_dist and the constant transitions places them
    one transition too early: a different likelihood (the reason for the conversion)."""
    T, H, D = 5, 4, 2
    p = random_model(H=H, D=D, T=T)
    p["init_loc"] = torch.randn(H, dtype=torch.float64)
    naive = GaussianHMM(
        MultivariateNormal(p["init_loc"], scale_tril=p["init_scale_tril"]),
        p["transition_matrix"].T,
        MultivariateNormal(torch.zeros(H, dtype=torch.float64),
                           scale_tril=p["transition_scale_tril"]),
        p["observation_matrix"].T,
        MultivariateNormal(torch.zeros(D, dtype=torch.float64),
                           scale_tril=p["observation_scale_tril"]),
        duration=T)
    z = naive.sample((3,))
    assert (kalman_filter(z, **p).log_prob - naive.log_prob(z)).abs().min() > 1e-3
