"""The structured guide runs its covariance recursion once for a noise level shared by every
frame (a fixed DeltaRecognition noise), with the same values as per-frame recursions."""

import pytest
import torch

from rpm.distributions._state_space import StateSpacePosterior
from rpm.priors import StateSpacePrior

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_fixed_noise_level_shares_one_covariance_recursion():
    torch.set_default_dtype(torch.float64)
    N, T, D = 7, 12, 2
    prior = StateSpacePrior(D).distribution(T)
    loc = torch.randn(N, T, D)
    fixed = torch.full_like(loc, 0.3)  # materialised, as DeltaRecognition(noise_scale=0.3) makes it
    learned = torch.full_like(loc, 0.3).requires_grad_()  # may differ per frame: not shared
    shared = StateSpacePosterior(prior, loc, fixed)
    per_frame = StateSpacePosterior(prior, loc, learned)
    assert shared.filtered.filtered_scale_tril.shape == (1, T, 2 * D, 2 * D)
    assert per_frame.filtered.filtered_scale_tril.shape == (N, T, 2 * D, 2 * D)
    for a, b in zip(shared.filtered, per_frame.filtered, strict=True):
        assert torch.allclose(a, b.detach(), rtol=0, atol=1e-12)
    noise = torch.randn(N, T, 3 * D)
    assert torch.allclose(shared._rsample_from_noise(noise),
                          per_frame._rsample_from_noise(noise).detach(), rtol=0, atol=1e-12)
    # a noise level that differs between frames is not shared
    varying = fixed.clone()
    varying[3, 5] = 0.4
    assert StateSpacePosterior(prior, loc, varying).filtered.filtered_scale_tril.shape[0] == N


@pytest.mark.parametrize("scale", ["fixed", "learned"])
def test_shared_recursion_gradients_equal_per_sequence_ones(scale):
    """Values and gradients (prior parameters and pseudo-observations) of the structured guide's
    log-normaliser and draw, the recursion shared or run per sequence, to 1e-10."""
    torch.set_default_dtype(torch.float64)
    N, T, D = 5, 10, 2
    module = StateSpacePrior(D)
    loc = torch.randn(N, T, D, requires_grad=True)
    noise = torch.randn(N, T, 3 * D)
    weights = torch.randn(N, T, D)
    results = []
    for shared in (True, False):
        sigma = torch.full((N, T, D), 0.3)
        if not shared or scale == "learned":
            sigma = sigma.clone().requires_grad_()  # not compacted: one recursion per sequence
        post = StateSpacePosterior(module.distribution(T), loc, sigma)
        assert post.filtered.filtered_scale_tril.shape[0] == (1 if shared and scale == "fixed" else N)
        total = post.filtered.log_prob.sum() + (weights * post._rsample_from_noise(noise)).sum()
        params = [loc, *module.parameters()]
        results.append((total, torch.autograd.grad(total, params)))
    (value, grads), (expected, expected_grads) = results
    assert torch.allclose(value, expected, rtol=1e-12, atol=1e-10)
    for g, e in zip(grads, expected_grads, strict=True):
        assert torch.allclose(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("guide", ["structured", "recognition"])
@pytest.mark.parametrize("elbo", ["RPMELBO", "Trace_ELBO"])
def test_the_dense_kalman_forms_leave_the_sequence_toys_step_unchanged(monkeypatch, guide, elbo):
    """The sequence toy of benchmarks/multiview.py in float64: its loss and every gradient with
    the dense Kalman forms (the default for its 10-frame windows) equal those of the recursions
    (``DENSE_THRESHOLD = 0``: the scans and square-root recursions), to 1e-10."""
    import pyro

    import rpm
    from rpm.ops import _kalman as kalman

    torch.set_default_dtype(torch.float64)
    x = torch.randn(16, 10, 4)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, 2), noise_scale=0.1),
                    StateSpacePrior(2), guide=guide, encoder_calls="concat")
    loss_fn = rpm.RPMELBO() if elbo == "RPMELBO" else pyro.infer.Trace_ELBO()
    results = []
    for threshold in (kalman.DENSE_THRESHOLD, 0):
        monkeypatch.setattr(kalman, "DENSE_THRESHOLD", threshold)
        pyro.set_rng_seed(3)
        loss = loss_fn.differentiable_loss(model.model, model.guide, x)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (loss, grads), (expected, expected_grads) = results
    assert torch.allclose(loss, expected, rtol=1e-12, atol=1e-10)
    for g, e in zip(grads, expected_grads, strict=True):
        assert torch.allclose(g, e, rtol=1e-10, atol=1e-10)
