"""Which batches a model checks (rpm.models._checked_batches): under pyro.enable_validation
every batch; without it, the structural checks on the first batch of each shape, dtype and
device after the last assignment of a module or attribute. Bad input is named on any batch,
and no sequence of assignments skips the checks of the modules assigned last."""

import math
import sys

import pyro
import pytest
import torch

import rpm
from rpm.models import _checked_batches as checked_batches
from rpm.priors import CosineEnergy, GaussianRandomWalkPrior, ImplicitPrior, RBFEnergy
from tests.helpers import GaussianHead

IN, DIM = 4, 3


def delta_rpm(prior=None):
    return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(IN, DIM)), prior or ImplicitPrior(RBFEnergy()))


def loss(model, *views):
    return rpm.RPMELBO().loss(model.model, model.guide, *views)


def counting_checks(monkeypatch):
    """Counts the calls of the input check of each batch (rpm.models._views.check_inputs)."""
    calls = []
    original = rpm.models._rpm.check_inputs

    def counted(names, views):
        calls.append(tuple(tuple(view.shape) for view in views))
        return original(names, views)

    monkeypatch.setattr(rpm.models._rpm, "check_inputs", counted)
    return calls


def counting_value_checks(monkeypatch):
    """The batches whose values the model checked in one reduction (rpm.models._checked_batches
    .check_values: a batch whose structure passed before, under validation)."""
    calls = []
    original = rpm.models._rpm.check_values

    def counted(recognitions):
        calls.append(tuple(tuple(dist.batch_shape) for dist in recognitions))
        return original(recognitions)

    monkeypatch.setattr(rpm.models._rpm, "check_values", counted)
    return calls


def test_validation_checks_every_batch_and_without_it_the_first_of_each_shape(monkeypatch):
    calls = counting_checks(monkeypatch)
    values = counting_value_checks(monkeypatch)
    model = delta_rpm()
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    for _ in range(3):
        loss(model, x, x2)                         # validation: every batch's values checked
    assert len(calls) == 1 and len(values) == 2    # the first batch by every check
    with pyro.validation_enabled(False):
        for _ in range(3):
            loss(model, x, x2)                                   # a remembered signature
        assert len(calls) == 1
        loss(model, torch.randn(7, IN), torch.randn(7, IN))      # a new batch size: checked
        assert calls[-1] == ((7, IN), (7, IN))
        loss(model, torch.randn(6, IN), torch.randn(6, IN))      # remembered
        assert len(calls) == 2 and len(values) == 2              # no value checks


def test_a_new_dtype_or_an_assignment_is_checked_again(monkeypatch):
    calls = counting_checks(monkeypatch)
    model = delta_rpm()
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    with pyro.validation_enabled(False):
        loss(model, x, x2)
        loss(model, x, x2)                                       # remembered
        assert len(calls) == 1
        with pytest.raises(TypeError, match="dtype torch.float64"):
            loss(model, x.double(), x2.double())                 # a new dtype: checked, refused
        model.prior = ImplicitPrior(CosineEnergy())              # an assignment: checked
        loss(model, x, x2)
        model.recognition.validate = None                        # any assignment
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


def test_swapping_priors_never_skips_the_checks_of_the_prior_assigned_last():
    """The checks are decided by assignment, not by object identities: after 20 swaps of
    implicit priors (each checked and trained on), an explicit density prior assigned to a
    model with a deterministic encoder gets the error a fresh model raises."""
    model = delta_rpm()
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    for _ in range(20):
        model.prior = ImplicitPrior(CosineEnergy())
        loss(model, x, x2)
    with pytest.raises(ValueError, match=r"ill-defined \(Appendix B"):
        delta_rpm(GaussianRandomWalkPrior(DIM))
    model.prior = GaussianRandomWalkPrior(DIM)
    for validation in (True, False):
        with pyro.validation_enabled(validation), pytest.raises(
                ValueError, match=r"ill-defined \(Appendix B"):
            loss(model, x, x2)


@pytest.mark.parametrize("validation", [True, False])
def test_an_assigned_attribute_runs_the_checks_again(validation):
    """Setting ``noise_scale`` to 0 makes the encoder deterministic; with an explicit prior the
    next batch of a signature that passed before is refused, validation on or off."""
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(IN, DIM), noise_scale=0.1),
                    GaussianRandomWalkPrior(DIM))
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    with pyro.validation_enabled(validation):
        assert math.isfinite(loss(model, x, x2))
        model.recognition.noise_scale = 0.0
        with pytest.raises(ValueError, match=r"ill-defined \(Appendix B"):
            loss(model, x, x2)


def test_an_assigned_recognition_model_in_a_list_runs_the_checks_again():
    model = rpm.RPM([rpm.DeltaRecognition(torch.nn.Linear(IN, DIM), noise_scale=0.1)] * 2,
                    GaussianRandomWalkPrior(DIM))
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    with pyro.validation_enabled(False):
        loss(model, x, x2)
        model.recognition[1] = rpm.DeltaRecognition(torch.nn.Linear(IN, DIM))
        with pytest.raises(ValueError, match=r"recognition2 is deterministic.*Appendix B"):
            loss(model, x, x2)


@pytest.mark.parametrize("elbo", ["RPMELBO", "Trace_ELBO"])
@pytest.mark.parametrize("prior", ["implicit", "random-walk"])
def test_validation_checks_every_batch(elbo, prior):
    """Under ``pyro.enable_validation`` a bad second batch of a signature that passed is
    refused with the error that names it, by RPMELBO and by Pyro's own Trace_ELBO on the model
    and guide."""
    if prior == "implicit":
        model = delta_rpm()
    else:
        model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(IN, DIM)), GaussianRandomWalkPrior(DIM))
    objective = {"RPMELBO": rpm.RPMELBO(), "Trace_ELBO": pyro.infer.Trace_ELBO()}[elbo]
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    for _ in range(2):
        objective.loss(model.model, model.guide, x, x2)
    bad = x2.clone()
    bad[2, 1] = math.nan
    with pytest.raises(ValueError, match=r"x2 has NaN or infinite entries in 1 of its 6 rows \(rows 2\)"):
        objective.loss(model.model, model.guide, x, bad)


@pytest.mark.parametrize("bad", ["nan", "inf", "zero scale"])
@pytest.mark.parametrize("summed", [False, True])
def test_deferred_value_checks_are_made_in_the_range_check(bad, summed):
    """Inside deferred_value_checks a batch's value checks are recorded (check_values returns
    True) and the implicit prior's range check makes them, for the per-pair terms and for
    their sum (log_ratio_sum): a NaN or infinite location, or a scale that is not positive,
    raises DeferredValuesError; a clean batch passes and empties them."""
    from rpm.priors._energy_range import DeferredValuesError, deferred_value_checks

    prior = ImplicitPrior(RBFEnergy())
    evaluate = prior.log_ratio_sum if summed else prior.log_ratio
    z, z2 = torch.randn(6, DIM), torch.randn(6, DIM)
    loc, scale = torch.randn(6, DIM), torch.rand(6, DIM) + 0.1
    normal = pyro.distributions.Normal(loc, scale).to_event(1)
    with deferred_value_checks() as deferred:
        assert checked_batches.check_values([normal])
        assert len(deferred.pending) == 1
        evaluate(z, z2)
        assert deferred.pending == []
    bad_loc = loc.clone()
    if bad == "zero scale":
        scale = scale.clone()
        scale[2, 1] = 0.0
    else:
        bad_loc[1, 2] = math.nan if bad == "nan" else math.inf
    normal = pyro.distributions.Normal(bad_loc, scale, validate_args=False).to_event(1)
    assert not checked_batches.check_values([normal])      # outside: checked at once
    with deferred_value_checks():
        assert checked_batches.check_values([normal])      # inside: recorded
        with pytest.raises(DeferredValuesError):
            evaluate(z, z2)


def test_a_prior_without_a_range_check_has_the_values_checked_after_the_objective(monkeypatch):
    """For a prior that makes no range check the RPMELBO evaluation checks the deferred values
    itself, once per batch (values_valid); under the implicit prior the range check does."""
    module = sys.modules["rpm.inference._elbo"]   # rpm.inference._elbo is also a function's name
    calls = []
    original = module.values_valid

    def counted(tensors, scales):
        calls.append(len(tensors))
        return original(tensors, scales)

    monkeypatch.setattr(module, "values_valid", counted)
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    walk = rpm.RPM(rpm.GaussianRecognition(GaussianHead(IN, DIM)), GaussianRandomWalkPrior(DIM))
    for _ in range(3):
        loss(walk, x, x2)
    assert calls == [4, 4]           # loc and scale of each view's recognition
    implicit = delta_rpm()
    for _ in range(3):
        loss(implicit, x, x2)
    assert calls == [4, 4]


def test_an_energy_overflow_on_a_remembered_batch_is_diagnosed_without_a_second_evaluation(
        monkeypatch):
    """Finite views and latents whose energy overflows float32: the range check names the
    energy at once (the deferred value checks passed), the batch is not evaluated again."""
    module = sys.modules["rpm.inference._elbo"]
    evaluations = []
    original = module._objective

    def counted(*args):
        evaluations.append(1)
        return original(*args)

    monkeypatch.setattr(module, "_objective", counted)
    net = torch.nn.Linear(IN, DIM)
    model = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy()))
    x, x2 = torch.randn(6, IN), torch.randn(6, IN)
    loss(model, x, x2)
    with torch.no_grad():
        net.weight.mul_(1e20)
    evaluations.clear()
    with pytest.raises(ValueError, match="RBFEnergy overflows float32"):
        loss(model, x, x2)
    assert evaluations == [1]
