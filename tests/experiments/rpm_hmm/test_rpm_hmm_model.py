"""The RPM-HMM of ``rpm rpm-hmm`` against independent computations: the log-likelihood against a
float64 forward loop written from the equations, the posterior marginals and the most probable
path against brute-force enumeration of every state path, Pyro's enumerated program against the
``DiscreteHMM`` one, and the normaliser's identity."""

import itertools
import math

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceEnum_ELBO, infer_discrete

import rpm
from rpm.experiments.rpm_hmm.model import RPMHMM

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(num_states, features=5, seed=0):
    """A float64 RPM-HMM on vectors of ``features`` with random parameters."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(features, 7), torch.nn.Tanh(),
                              torch.nn.Linear(7, num_states))
    model = RPMHMM(rpm.CategoricalRecognition(net, num_classes=num_states)).double()
    with torch.no_grad():
        model.initial_logits.copy_(torch.randn(num_states, dtype=torch.float64))
        model.transition_logits.copy_(2 * torch.randn(num_states, num_states,
                                                      dtype=torch.float64))
    return model


def _emissions_loop(model, frames):
    """E[b][t][k] = log f(k | x) - log F(k), F the mean of f over every frame, by loops."""
    windows, length = frames.shape[:2]
    probs = [[torch.softmax(model.recognition.net(frames[b, t]), -1).tolist()
              for t in range(length)] for b in range(windows)]
    count = windows * length
    normaliser = [sum(probs[b][t][k] for b in range(windows) for t in range(length)) / count
                  for k in range(model.num_states)]
    return [[[math.log(probs[b][t][k]) - math.log(normaliser[k])
              for k in range(model.num_states)] for t in range(length)] for b in range(windows)]


def _forward_loop(initial, transition, emissions):
    """log sum over z_0..z_T of pi(z_0) prod_t A[z_{t-1}, z_t] exp(E_t(z_t)), the forward
    algorithm in Python floats: alpha_t(j) = sum_i alpha_{t-1}(i) A_ij exp(E_t(j))."""
    num = len(initial)
    alpha = list(initial)
    log_scale = 0.0
    for row in emissions:
        alpha = [sum(alpha[i] * transition[i][j] for i in range(num)) * math.exp(row[j])
                 for j in range(num)]
        total = sum(alpha)
        log_scale += math.log(total)
        alpha = [a / total for a in alpha]
    return log_scale


def test_log_likelihood_is_the_forward_algorithm_in_float64():
    """DiscreteHMM's log_prob of the emission factors equals a forward loop written from the
    equations to 1e-10, window by window (the normaliser over all windows' frames), and is
    minus Trace_ELBO's loss on the Pyro program and TraceEnum_ELBO's on the enumerated one."""
    model = _model(4)
    frames = torch.randn(3, 9, 5, dtype=torch.float64)
    initial = model.initial_probs.tolist()
    transition = model.transition_matrix.tolist()
    emissions = _emissions_loop(model, frames)
    expected = sum(_forward_loop(initial, transition, window) for window in emissions)
    assert model.log_likelihood(frames).item() == pytest.approx(expected, abs=1e-10)
    torch.testing.assert_close(model.emission_log_factors(frames),
                               torch.tensor(emissions, dtype=torch.float64), rtol=0, atol=1e-12)
    loss = Trace_ELBO().differentiable_loss(model.model, model.guide, frames)
    assert -loss.item() == pytest.approx(expected, abs=1e-10)
    one = frames[:1]
    single = _forward_loop(initial, transition, _emissions_loop(model, one)[0])
    enumerated = TraceEnum_ELBO(max_plate_nesting=0).differentiable_loss(
        model.enumerated_model, lambda frames: None, one[0])
    assert -enumerated.item() == pytest.approx(single, abs=1e-10)


def _paths(model, frames):
    """Every path z_0..z_T of one chain with its unnormalised log-probability (H2)."""
    log_pi = torch.log_softmax(model.initial_logits.detach(), -1).tolist()
    log_a = torch.log_softmax(model.transition_logits.detach(), -1).tolist()
    emissions = _emissions_loop(model, frames[None])[0]
    for path in itertools.product(range(model.num_states), repeat=len(emissions) + 1):
        value = log_pi[path[0]] + sum(log_a[path[t - 1]][path[t]] + emissions[t - 1][path[t]]
                                      for t in range(1, len(path)))
        yield path, value


def test_posterior_marginals_and_path_match_brute_force_enumeration():
    """T = 4, K = 3: the marginals q(z_t | x_{1:T}) of the gradient identity (H4) and of
    TraceEnum_ELBO.compute_marginals equal sums over all 3^5 paths; infer_discrete's MAP path
    (temperature 0) is the brute-force most probable path."""
    model = _model(3, seed=1)
    frames = torch.randn(4, 5, dtype=torch.float64)
    paths = list(_paths(model, frames))
    log_total = math.log(sum(math.exp(v) for _, v in paths))
    expected = torch.zeros(4, 3, dtype=torch.float64)
    for path, value in paths:
        for t in range(1, 5):
            expected[t - 1, path[t]] += math.exp(value - log_total)
    marginals = model.posterior_marginals(frames[None])[0]
    torch.testing.assert_close(marginals, expected, rtol=0, atol=1e-12)
    assert torch.equal(model.posterior_modes(frames[None])[0], expected.argmax(-1))
    elbo = TraceEnum_ELBO(max_plate_nesting=0)
    computed = elbo.compute_marginals(model.enumerated_model, lambda frames: None, frames)
    for t in range(1, 5):
        torch.testing.assert_close(computed[f"z_{t}"].probs, expected[t - 1], rtol=0, atol=1e-12)
    best_path, _ = max(paths, key=lambda item: item[1])
    decoded = infer_discrete(model.enumerated_model, first_available_dim=-1, temperature=0)
    trace = pyro.poutine.trace(decoded).get_trace(frames)
    assert tuple(int(trace.nodes[f"z_{t}"]["value"]) for t in range(5)) == best_path


def test_emission_factors_normalise_over_the_frames_given():
    """(1/M) sum over the M frames of f(z|x)/F(z) = 1 for every state: P(x|z) = f p_0 / F is a
    distribution over the frames (D1)."""
    model = _model(5, seed=2)
    frames = torch.randn(4, 6, 5, dtype=torch.float64)
    ratios = model.emission_log_factors(frames).exp()  # (B, W, K)
    torch.testing.assert_close(ratios.mean((0, 1)), torch.ones(5, dtype=torch.float64))


def test_a_network_is_told_to_wrap_itself_and_frames_need_windows():
    with pytest.raises(TypeError, match="CategoricalRecognition"):
        RPMHMM(torch.nn.Linear(3, 2))
    model = _model(3)
    with pytest.raises(ValueError, match=r"\(B, W, \.\.\.\)"):
        model.log_likelihood(torch.randn(4, dtype=torch.float64))
