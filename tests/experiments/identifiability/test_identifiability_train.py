"""``rpm.experiments.identifiability.train``: the learning-rate schedule, the concentration report
and the oracle fit of the anisotropic energy on the true latents."""

import math

import pytest
import torch

from rpm.data.synthetic import LatentProcess
from rpm.experiments.identifiability.model import build_rpm
from rpm.experiments.identifiability.train import (
    _concentration_report,
    cosine_schedule,
    oracle_concentrations,
)
from rpm.priors import AnisotropicEnergy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_cosine_schedule_matches_warmup_and_cosine():
    factor = cosine_schedule(100, 0.1)
    assert [factor(s) for s in range(10)] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factor(10) == pytest.approx(1.0)
    assert factor(55) == pytest.approx(0.5)
    assert factor(99) == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))
    values = [factor(s) for s in range(10, 100)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert cosine_schedule(10, 0.0)(0) == pytest.approx(1.0)


def test_concentration_report_matches_true_to_learned_dimensions():
    """Learned Lambda read through the MCC matching (true d -> recovered index[d]) and the
    ratio of group means, second half over first half, against the truth's."""
    report = _concentration_report({"concentration": [1.0, 2.0, 3.0, 4.0]},
                                   torch.tensor([3, 2, 1, 0]), torch.tensor([5.0, 5, 25, 25]))
    assert report["concentration_matched"] == [4.0, 3.0, 2.0, 1.0]
    assert report["group_ratio_true"] == pytest.approx(5.0)
    assert report["group_ratio_learned"] == pytest.approx(1.5 / 3.5)
    assert report["group_ratio_error"] == pytest.approx(abs(1.5 / 3.5 / 5.0 - 1.0))
    assert _concentration_report({"kappa": 1.0}, torch.tensor([0]), None) == {}


@pytest.mark.slow
def test_oracle_concentrations_recover_the_box_precisions():
    """In the box with a uniform marginal, the optimal critic of the truncated anisotropic
    Gaussian conditional is exactly -(z'-z)^T Lambda (z'-z) / 2 plus a function of z, so the
    anisotropic energy fitted on the true latents recovers Lambda (here within 15%), from a
    start 2x off in both directions."""
    process = LatentProcess(dim=2, space="box", conditional="anisotropic",
                            concentrations=torch.tensor([20.0, 80.0]))
    # A trained RPM whose parameters have the same names must neither leak in nor change.
    trained = build_rpm(torch.nn.Identity(), AnisotropicEnergy(2, normalize=False, init=3.0))
    trained.model(torch.randn(8, 2), torch.randn(8, 2))
    fitted = oracle_concentrations(process, num_steps=250, batch_size=512, seed=0, lr=0.5,
                                   normalize=False, init=torch.tensor([40.0, 40.0]))
    assert fitted == pytest.approx([20.0, 80.0], rel=0.15)
    concentration = trained.prior.energy.concentration.detach()  # held in float64
    torch.testing.assert_close(concentration, torch.full((2,), 3.0, dtype=concentration.dtype))
