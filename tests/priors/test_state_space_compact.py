"""The structured guide runs its covariance recursion once for a noise level shared by every
frame (a fixed DeltaRecognition noise), with the same values as per-frame recursions."""

import pytest
import torch

from rpm.priors import StateSpacePrior
from rpm.priors.state_space import StateSpacePosterior

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
