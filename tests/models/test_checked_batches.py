"""The checks of a batch run on the first batch of each signature (rpm.models.checked_batches):
bad input is caught on the first call with a new shape, a changed shape, dtype or module is
checked again, and a value that goes bad on a later batch of a checked shape still gets the
error that names it (RPMELBO evaluates a non-finite step again with every check)."""

import math

import pyro
import pytest
import torch

import rpm
from rpm.models import checked_batches
from rpm.priors import CosineEnergy, GaussianRandomWalkPrior, ImplicitPrior, RBFEnergy
from tests.helpers import GaussianHead

IN, DIM = 4, 3


def delta_rpm(prior=None):
    return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(IN, DIM)), prior or ImplicitPrior(RBFEnergy()))


def loss(model, *views):
    return rpm.RPMELBO().loss(model.model, model.guide, *views)


def counting_checks(monkeypatch):
    """Counts the calls of the input check of each batch (rpm.models.views.check_inputs)."""
    calls = []
    original = rpm.models.rpm.check_inputs

    def counted(names, views):
        calls.append(tuple(tuple(view.shape) for view in views))
        return original(names, views)

    monkeypatch.setattr(rpm.models.rpm, "check_inputs", counted)
    return calls


def test_first_batch_of_each_shape_is_checked_once(monkeypatch):
    calls = counting_checks(monkeypatch)
    model = delta_rpm()
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    for _ in range(3):
        loss(model, x, x2)
    assert calls == [((6, IN), (6, IN))]
    loss(model, torch.randn(7, IN), torch.randn(7, IN))          # a new batch size: checked
    assert calls == [((6, IN), (6, IN)), ((7, IN), (7, IN))]
    loss(model, torch.randn(6, IN), torch.randn(6, IN))          # remembered
    assert len(calls) == 2


def test_a_new_dtype_validation_state_or_module_is_checked_again(monkeypatch):
    calls = counting_checks(monkeypatch)
    model = delta_rpm()
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    loss(model, x, x2)
    with pyro.validation_enabled(False):
        loss(model, x, x2)                                       # remembered without values
    with pytest.raises(TypeError, match="dtype torch.float64"):
        loss(model, x.double(), x2.double())                     # a new dtype: checked, refused
    model.prior = ImplicitPrior(CosineEnergy())                  # a new module: checked
    loss(model, x, x2)
    assert len(calls) == 4


def test_bad_input_of_a_new_shape_is_caught_on_its_first_call():
    model = delta_rpm()
    loss(model, torch.randn(6, IN), torch.randn(6, IN))
    x, x2 = torch.randn(5, IN), torch.randn(5, IN)
    x2[3, 0] = math.nan
    with pytest.raises(ValueError, match=r"x2 has NaN or infinite entries in 1 of its 5 rows \(rows 3\)"):
        loss(model, x, x2)


@pytest.mark.parametrize("prior", ["implicit", "random-walk"])
def test_a_nan_in_a_later_batch_of_a_checked_shape_is_named(prior):
    if prior == "implicit":
        model = delta_rpm()
    else:
        model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(IN, DIM)), GaussianRandomWalkPrior(DIM))
    loss(model, torch.randn(6, IN), torch.randn(6, IN))
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    x[4, 2] = math.inf
    with pytest.raises(ValueError, match=r"x has NaN or infinite entries in 1 of its 6 rows \(rows 4\)"):
        loss(model, x, x2)


def test_an_encoder_that_overflows_later_is_named():
    net = torch.nn.Linear(IN, DIM)
    model = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(CosineEnergy()))
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    loss(model, x, x2)
    with torch.no_grad():
        net.weight.fill_(math.inf)
    with pytest.raises(ValueError, match="returned NaN or infinite latents"):
        loss(model, x, x2)


def test_without_validation_a_nan_gives_a_nan_loss_and_no_error():
    model = delta_rpm()
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    loss(model, x, x2)
    x[0, 0] = math.nan
    with pyro.validation_enabled(False):
        assert math.isnan(loss(model, x, x2))


def test_full_checks_run_every_check():
    model = delta_rpm()
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    key = checked_batches.signature([x, x2], True, "extra")
    checked_batches.remember(model, key)
    assert checked_batches.passed(model, key)
    with checked_batches.full_checks():
        assert not checked_batches.passed(model, key)
    assert checked_batches.signature([x, "not a tensor"]) is None
    assert not checked_batches.passed(model, None)
