"""rpm.training.schedule: the warm-up + cosine factor against its equation, step by step."""

import math

import pytest

from rpm.training.schedule import cosine_schedule


@pytest.mark.parametrize("num_steps, warmup", [(10, 0.0), (10, 0.2), (7, 0.5), (3, 1.0)])
def test_cosine_schedule_follows_its_equation(num_steps, warmup):
    factor = cosine_schedule(num_steps, warmup)
    warm = math.ceil(warmup * num_steps)
    for step in range(num_steps):
        if step < warm:
            expected = (step + 1) / warm
        else:
            expected = 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, num_steps - warm)))
        assert factor(step) == pytest.approx(expected, abs=1e-15)
    if warm:
        assert factor(warm - 1) == 1.0  # the warm-up ends at the peak
    if warm < num_steps:
        assert factor(warm) == 1.0  # the decay starts from it
