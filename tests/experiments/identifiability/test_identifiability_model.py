"""``rpm.experiments.identifiability.model``: each energy at temperature tau against its formula
written out pair by pair."""

import pytest
import torch

from rpm.experiments.identifiability.model import ENERGIES, build_energy, energy_parameters

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("name", ENERGIES)
def test_energies_have_scale_one_over_tau(name):
    """Each energy at temperature tau against its formula written out (module table)."""
    torch.set_default_dtype(torch.float64)
    z, z2 = torch.randn(5, 3), torch.randn(6, 3)
    tau = 0.25
    energy = build_energy(name, 3, tau=tau, p=1.0)
    zn = z / z.norm(dim=-1, keepdim=True)
    z2n = z2 / z2.norm(dim=-1, keepdim=True)
    expected = torch.empty(5, 6)
    for i in range(5):
        for j in range(6):
            if name == "cosine":
                expected[i, j] = (zn[i] @ z2n[j]) / tau
            elif name == "anisotropic":
                expected[i, j] = -0.5 * ((zn[i] - z2n[j]) ** 2).sum() / tau
            elif name == "lp":
                expected[i, j] = -(z[i] - z2[j]).abs().sum() / tau
            elif name == "rbf":
                expected[i, j] = -((z[i] - z2[j]) ** 2).sum() / tau
            else:
                expected[i, j] = (z[i] @ z2[j]) / tau
    torch.testing.assert_close(energy(z, z2), expected)
    assert isinstance(energy_parameters(energy), dict) and energy_parameters(energy)
