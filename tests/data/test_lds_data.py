"""Tests of the linear-dynamical-system generator (RP-GSSM's linear tasks, rpm.data.lds)."""

import math

import pytest
import scipy.stats
import torch

from rpm.data.lds import LDS_SIZES, generate_lds, random_rotation


@pytest.fixture(scope="module")
def system():
    return generate_lds(num_sequences=400, num_steps=100, state_dim=3, obs_dim=5, seed=3)


def test_sizes_are_those_of_rp_gssm():
    assert LDS_SIZES == {"small": (3, 5), "medium": (5, 10), "large": (10, 20)}


def test_shapes_dtype_and_seed(system):
    assert system.observations.shape == (400, 100, 5)
    assert system.states.shape == (400, 100, 3)
    assert system.observations.dtype == torch.float64
    again = generate_lds(400, 100, 3, 5, seed=3)
    assert torch.equal(again.observations, system.observations)
    other = generate_lds(400, 100, 3, 5, seed=4)
    assert not torch.equal(other.transition_matrix, system.transition_matrix)


def test_more_sequences_extend_the_set_with_the_same_system(system):
    """Held-out sequences are the last ones of a longer call: the first ones do not change."""
    fewer = generate_lds(50, 100, 3, 5, seed=3)
    assert torch.equal(fewer.transition_matrix, system.transition_matrix)
    assert torch.equal(fewer.observations, system.observations[:50])


@pytest.mark.parametrize("dim", [1, 2, 3, 10])
def test_random_rotation_is_a_rotation(dim):
    rotation = random_rotation(dim, torch.Generator().manual_seed(dim))
    torch.testing.assert_close(rotation @ rotation.T, torch.eye(dim, dtype=torch.float64))
    assert torch.linalg.det(rotation).item() == pytest.approx(1.0)


def test_random_rotation_is_haar_distributed():
    """Under the Haar measure on SO(2) the angle is uniform on (-pi, pi] (Kolmogorov-Smirnov)."""
    generator = torch.Generator().manual_seed(0)
    angles = [math.atan2(r[1, 0], r[0, 0]) for r in
              (random_rotation(2, generator) for _ in range(2000))]
    assert scipy.stats.kstest(angles, scipy.stats.uniform(-math.pi, 2 * math.pi).cdf).pvalue > 1e-3


@pytest.mark.parametrize("size", sorted(LDS_SIZES))
def test_transition_is_a_damped_rotation_and_the_emission_well_conditioned(size):
    state_dim, obs_dim = LDS_SIZES[size]
    system = generate_lds(2, 10, state_dim, obs_dim, seed=0)
    a = system.transition_matrix
    torch.testing.assert_close(a @ a.T, 0.95 ** 2 * torch.eye(state_dim, dtype=torch.float64))
    torch.testing.assert_close(system.eigenvalues.abs(),
                               torch.full((state_dim,), 0.95, dtype=torch.float64))
    torch.testing.assert_close(system.process_covariance,
                               (1 - 0.95 ** 2) * torch.eye(state_dim, dtype=torch.float64))
    singular = torch.linalg.svdvals(system.observation_matrix)
    torch.testing.assert_close(singular, torch.full((state_dim,), math.sqrt(obs_dim / state_dim),
                                                    dtype=torch.float64))


def test_states_follow_the_dynamics(system):
    """Least squares of s_{t+1} on s_t recovers A, the residuals have covariance I - A A^T,
    every s_t is N(0, I) (stationary), and x_t - C s_t has standard deviation 0.1: Monte Carlo
    over 400 x 99 transitions, tolerances of about 4 standard errors."""
    s = system.states
    before, after = s[:, :-1].reshape(-1, 3), s[:, 1:].reshape(-1, 3)
    fitted = torch.linalg.lstsq(before, after).solution.T  # s_{t+1} ~ A s_t
    torch.testing.assert_close(fitted, system.transition_matrix, rtol=0, atol=0.01)
    residual = after - before @ system.transition_matrix.T
    torch.testing.assert_close(residual.T @ residual / len(residual), system.process_covariance,
                               rtol=0, atol=0.01)
    for t in (0, 50, 99):  # N(0, I) at every step, the first included
        frame = s[:, t]
        torch.testing.assert_close(frame.T @ frame / len(frame),
                                   torch.eye(3, dtype=torch.float64), rtol=0, atol=0.3)
    everything = s.reshape(-1, 3)
    torch.testing.assert_close(everything.T @ everything / len(everything),
                               torch.eye(3, dtype=torch.float64), rtol=0, atol=0.1)
    noise = system.observations - s @ system.observation_matrix.T
    assert noise.std().item() == pytest.approx(0.1, rel=0.01)
    assert noise.mean().abs().item() < 0.002


@pytest.mark.parametrize("kwargs, message", [
    ({"decay": 1.0}, "decay must lie in (0, 1)"),
    ({"observation_noise": -0.1}, "observation_noise"),
    ({"num_steps": 0}, "num_steps"),
])
def test_bad_arguments(kwargs, message):
    arguments = {"num_sequences": 2, "num_steps": 5, "state_dim": 2, "obs_dim": 3, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        generate_lds(**arguments)
