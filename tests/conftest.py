"""Root test configuration: every test is seeded, starts with an empty param store and runs
with Pyro's validation enabled (as Pyro's own test suite does)."""

import random

import numpy as np
import pyro
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_clear_param_store():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    pyro.enable_validation(True)
    default_dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(default_dtype)
    pyro.clear_param_store()
