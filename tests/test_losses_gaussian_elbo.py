"""The ``elbo`` of the Gaussian lightly-style losses (VICReg, Barlow Twins, LeJEPA): the
Gaussian pair or star RPM's ELBO per instance for their outputs, against the closed form
written in numpy (float64)."""

import pytest
import torch

from rpm.losses import BarlowTwinsLoss, LeJEPALoss, VICRegLoss
from tests.helpers import gaussian_pair_closed_form, gaussian_star_closed_form


@pytest.mark.parametrize("loss_class", [VICRegLoss, BarlowTwinsLoss])
def test_pair_losses_elbo_is_the_gaussian_pair_closed_form(loss_class):
    """N = 64, D = 3: the default correlation 0.9 and a stated one, 1e-8."""
    generator = torch.Generator().manual_seed(11)
    z_a = torch.randn(64, 3, generator=generator, dtype=torch.float64) * 2.0 + 1.0
    z_b = 0.8 * z_a + 0.5 * torch.randn(64, 3, generator=generator, dtype=torch.float64)
    loss = loss_class()
    for rho, value in ((0.9, loss.elbo(z_a, z_b)), (-0.3, loss.elbo(z_a, z_b, correlation=-0.3))):
        expected = gaussian_pair_closed_form(z_a.numpy(), z_b.numpy(), rho)
        assert abs(value.item() - expected) < 1e-8


def test_lejepa_elbo_is_the_gaussian_star_closed_form():
    """2 global and 1 local views (J = 3, global first), D = 2, scale 1/3 by default and a
    stated one, 1e-8."""
    generator = torch.Generator().manual_seed(12)
    content = torch.randn(1, 64, 2, generator=generator, dtype=torch.float64)
    views = content + 0.4 * torch.randn(3, 64, 2, generator=generator, dtype=torch.float64)
    loss = LeJEPALoss()
    latents = views.transpose(0, 1).numpy()  # (N, J, D), the global views first
    for scale, value in ((1 / 3, loss.elbo(local_proj=views[2:], global_proj=views[:2])),
                         (0.6, loss.elbo(local_proj=views[2:], global_proj=views[:2],
                                         scale=0.6))):
        assert abs(value.item() - gaussian_star_closed_form(latents, scale)) < 1e-8


def test_elbo_needs_more_rows_than_dimensions():
    z = torch.randn(4, 4)
    with pytest.raises(ValueError, match="N >= 5"):
        VICRegLoss().elbo(z, z + 1)
    with pytest.raises(ValueError, match="N >= 5"):
        LeJEPALoss().elbo(local_proj=z[None], global_proj=z[None] + 1)
    with pytest.raises(ValueError, match="correlation must lie in the open interval"):
        BarlowTwinsLoss().elbo(torch.randn(8, 2), torch.randn(8, 2), correlation=1.0)
