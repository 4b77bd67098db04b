"""Root test configuration: every test is seeded, starts with an empty param store and runs
with Pyro's validation enabled (as Pyro's own test suite does), and Ctrl-C reaches it."""

import random
import signal

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


@pytest.fixture(autouse=True)
def _sigint_not_ignored():
    """A suite started in the background (``nohup``, ``cmd &`` in a script) inherits an ignored
    SIGINT, which the trainer deliberately leaves ignored; the tests of Ctrl-C handling need the
    interactive default, so every test runs with Python's default SIGINT handler (restored
    afterwards). Tests that start child processes reset it there as well."""
    before = signal.getsignal(signal.SIGINT)
    if before is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)



@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: small kernels gain nothing from threads, and on a busy
    shared CPU OpenMP's waits for descheduled threads make them many times slower. Modules opt
    in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` (``pytest -m cuda`` selects them) skip where no CUDA device is."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
