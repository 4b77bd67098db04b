"""``rpm.data.synthetic.spaces``: the box truncation by rejection gives the truncated law
whatever the size of its first round.

Monte Carlo tolerances: moments to 5 standard errors, distributions by a Kolmogorov-Smirnov
test at level 1e-3; every draw is seeded, so the tests are deterministic."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from rpm.data.synthetic import (
    FactorisedNoise,
)
from rpm.data.synthetic.spaces import BoxTruncation
from tests.data.synthetic.helpers import ALPHA, gen, truncated_cdf


@pytest.mark.parametrize("first_round", [1, 2, 40])
def test_box_rejection_rounds_do_not_change_the_law(first_round):
    noise = FactorisedNoise("gennorm", 0.5, 1.5)
    box = BoxTruncation(noise, first_round=first_round)
    centre = torch.tensor([0.9, -0.99, 0.2]).expand(3000, 3).contiguous()
    out = box.sample(centre, gen()).numpy()
    for k, c in enumerate(centre[0].tolist()):
        cdf = truncated_cdf(stats.gennorm(1.5, scale=0.5), c)
        assert stats.kstest(out[:, k], cdf).pvalue > ALPHA
