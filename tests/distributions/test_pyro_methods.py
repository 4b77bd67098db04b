"""Pyro's methods of a TorchDistribution, ``d.shape()`` (the shape of a draw) and ``d.mask(m)``
(a log-density zeroed where m is False), work on rpm's distributions and marginals: no attribute
of theirs hides them (the generalized normal's shape parameter is ``beta``, a frame mask is
``frame_mask``)."""

import pytest
import torch
from pyro.distributions import Normal, constraints

from rpm.distributions import (
    GaussianStateSpace,
    GeneralizedNormal,
    StateSpacePosterior,
    VonMisesFisher,
)
from rpm.marginals import MixtureMarginal
from rpm.marginals._moment_matched import MomentMatchedMarginal
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, T, D = 4, 3, 2
FRAMES = torch.tensor([[True, False, True], [True, True, True], [False, True, True],
                       [True, True, False]])  # (N, T), True = observed


def state_space(mask=FRAMES):
    eye = torch.eye(D, dtype=torch.float64)
    return GaussianStateSpace(torch.zeros(D, dtype=torch.float64), eye, 0.9 * eye, 0.5 * eye, eye,
                              0.3 * eye, duration=T, mask=mask)


def recognition(frames=FRAMES):
    generator = torch.Generator().manual_seed(0)
    loc = torch.randn(N, T, D, generator=generator, dtype=torch.float64)
    scale = 0.5 + torch.rand(N, T, D, generator=generator, dtype=torch.float64)
    return Normal(loc, scale).to_event(1).mask(frames)


DISTRIBUTIONS = {
    "generalized_normal": lambda: GeneralizedNormal(torch.zeros(N, dtype=torch.float64), 1.5, 0.7),
    "state_space": state_space,
    "state_space_posterior": lambda: StateSpacePosterior(
        state_space(), torch.randn(N, T, D, dtype=torch.float64),
        torch.full((N, T, D), 0.4, dtype=torch.float64)),
    "sequence_mixture_marginal": lambda: SequenceMixtureMarginal(recognition()),
    "moment_matched_marginal": lambda: MomentMatchedMarginal(recognition()),
    "mixture_marginal": lambda: MixtureMarginal(
        Normal(torch.randn(N, D, dtype=torch.float64), 1.0).to_event(1)),
    "von_mises_fisher": lambda: VonMisesFisher(
        torch.nn.functional.normalize(torch.randn(N, 3, dtype=torch.float64), dim=-1),
        torch.full((N,), 2.0, dtype=torch.float64)),
}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_shape_and_mask_are_pyros_methods(name):
    torch.manual_seed(1)
    dist = DISTRIBUTIONS[name]()
    assert dist.batch_shape == (N,)
    assert dist.shape() == dist.batch_shape + dist.event_shape
    assert dist.shape((5,)) == (5, *dist.batch_shape, *dist.event_shape)
    value = torch.randn(dist.shape(), dtype=torch.float64)
    if dist.support is constraints.sphere:
        value = torch.nn.functional.normalize(value, dim=-1)
    keep = torch.tensor([True, False, True, False])
    expected = torch.where(keep, dist.log_prob(value), torch.zeros((), dtype=torch.float64))
    torch.testing.assert_close(dist.mask(keep).log_prob(value), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["state_space", "state_space_posterior",
                                  "sequence_mixture_marginal", "moment_matched_marginal"])
def test_the_frame_mask_is_held_as_frame_mask(name):
    assert torch.equal(DISTRIBUTIONS[name]().frame_mask, FRAMES)
