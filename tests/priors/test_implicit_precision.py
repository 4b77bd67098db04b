"""The streamed InfoNCE normaliser keeps float32 accuracy where the expanded squared distance
would cancel (tight clusters far from the centre at a tiny lengthscale)."""

import torch

from rpm.priors import ImplicitPrior, RBFEnergy


def test_streamed_rbf_log_ratio_matches_float64_for_far_tight_clusters():
    centres = torch.cat([torch.full((8, 3), 1e3), torch.full((8, 3), -1e3)])
    z = centres + 1e-3 * torch.randn(16, 3)
    z2 = z + 1e-3 * torch.randn(16, 3)
    prior = ImplicitPrior(RBFEnergy(1e-3))
    reference = prior.log_ratio(z.double(), z2.double())
    streamed = prior.log_ratio(z, z2, block_size=4)
    assert (streamed.double() - reference).abs().max() < 1e-2
