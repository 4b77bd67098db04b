"""A model and a guide of two different ``rpm.RPM`` instances are refused by every ELBO, naming
both models and the fix; a model with its own guide is unchanged."""

import pyro
import pytest
import torch
from pyro.infer import JitTrace_ELBO, Trace_ELBO, TraceMeanField_ELBO

import rpm
from rpm.priors import ImplicitPrior, MarkovImplicitPrior, RBFEnergy
from tests.helpers import GaussianHead

N, X_DIM, D = 8, 4, 2


def _pair_model(name):
    return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)), ImplicitPrior(RBFEnergy()),
                   name=name)


def _loss(elbo, model, guide, *args):
    if isinstance(elbo, JitTrace_ELBO):  # no differentiable_loss: its compiled loss
        return torch.as_tensor(elbo.loss_and_grads(model, guide, *args))
    return elbo.differentiable_loss(model, guide, *args)


ELBOS = {"RPMELBO": rpm.RPMELBO, "Trace_ELBO": Trace_ELBO,
         "TraceMeanField_ELBO": TraceMeanField_ELBO, "JitTrace_ELBO": JitTrace_ELBO}


@pytest.fixture
def pair():
    x = torch.randn(N, X_DIM, generator=torch.Generator().manual_seed(0))
    return x, x + 0.1 * torch.randn(N, X_DIM, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("elbo", sorted(ELBOS))
def test_a_guide_of_another_model_is_refused_naming_both(elbo, pair):
    a, b = _pair_model("model_a"), _pair_model("model_b")
    with pytest.raises(ValueError) as error:
        _loss(ELBOS[elbo](), a.model, b.guide, *pair)
    first = str(error.value).splitlines()[0]  # Pyro's trace appends the sites' shapes below
    assert "the model of RPM 'model_a' is paired with the guide of RPM 'model_b'" in first
    assert "SVI(m.model, m.guide, ...)" in first


def test_svi_step_refuses_another_models_guide(pair):
    a, b = _pair_model("svi_a"), _pair_model("svi_b")
    svi = pyro.infer.SVI(a.model, b.guide, pyro.optim.Adam({"lr": 1e-3}), rpm.RPMELBO())
    with pytest.raises(ValueError, match="guide of RPM 'svi_b'"):
        svi.step(*pair)


def test_a_guide_of_a_model_of_the_same_name_is_refused(pair):
    """Two live models given one name share the param store, but not their encoders."""
    a, b = _pair_model("twin"), _pair_model("twin")
    with pytest.raises(ValueError, match="another model of the same name"):
        Trace_ELBO().differentiable_loss(a.model, b.guide, *pair)


def test_a_sequence_models_guide_of_another_model_is_refused():
    """J views stacked in one tensor: the single site "z" of event (J, D)."""
    def model(name):
        return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
                       MarkovImplicitPrior(RBFEnergy()), name=name)

    a, b = model("seq_a"), model("seq_b")
    x = torch.randn(N, 3, X_DIM, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="model of RPM 'seq_a' is paired with the guide of RPM"):
        Trace_ELBO().differentiable_loss(a.model, b.guide, x)


def test_a_model_with_its_own_guide_agrees_with_rpmelbo(pair):
    """The owner's record on the guide's sites changes nothing: Trace_ELBO on the same random
    numbers is RPMELBO's loss, finite."""
    torch.set_default_dtype(torch.float64)
    try:
        a = _pair_model("own")
        x, x2 = (v.double() for v in pair)
        pyro.set_rng_seed(5)
        trace = Trace_ELBO().differentiable_loss(a.model, a.guide, x, x2)
        pyro.set_rng_seed(5)
        ours = rpm.RPMELBO().differentiable_loss(a.model, a.guide, x, x2)
    finally:
        torch.set_default_dtype(torch.float32)
    assert torch.isfinite(trace)
    assert trace.item() == pytest.approx(ours.item(), rel=1e-10, abs=1e-10)


def test_a_guide_that_is_no_models_is_accepted(pair):
    """A hand-written guide records no owner: the model takes its draws (the implicit prior
    is joint over the batch: one site of event shape (N, D) per view)."""
    a = rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), ImplicitPrior(RBFEnergy()),
                name="handmade")  # a Delta recognition gives any other draw density 0

    def guide(x, x2):
        pyro.sample("z", pyro.distributions.Normal(torch.zeros(N, D), 1.0).to_event(2))
        pyro.sample("z2", pyro.distributions.Normal(torch.zeros(N, D), 1.0).to_event(2))

    assert torch.isfinite(Trace_ELBO().differentiable_loss(a.model, guide, *pair))
