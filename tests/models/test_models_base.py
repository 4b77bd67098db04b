"""Parameters that belong to their module: RPMs that coexist in one process, compared with the
same training run alone, and with a plain torch loop written out by hand."""

import copy
import math

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO

import rpm
from rpm.priors import GaussianRandomWalkPrior, ImplicitPrior, MarkovImplicitPrior, Prior, RBFEnergy

N, X_DIM, D, STEPS = 16, 5, 3, 4


def make_rpm(seed, prior=None):
    torch.manual_seed(seed)
    return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
                   prior or ImplicitPrior(RBFEnergy(lengthscale=0.9)))


@pytest.fixture
def batches():
    torch.manual_seed(123)
    return [(torch.randn(N, X_DIM), torch.randn(N, X_DIM)) for _ in range(STEPS)]


def weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_svi(models, batches):
    """One SVI per model; each batch is stepped by every model in turn (interleaved)."""
    svis = [SVI(m.model, m.guide, pyro.optim.Adam({"lr": 0.05}), rpm.RPMELBO()) for m in models]
    for x, x2 in batches:
        for svi in svis:
            svi.step(x, x2)


def train_torch(models, batches):
    """The same with torch.optim.Adam over model.parameters() and differentiable_loss."""
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.05) for m in models]
    elbo = rpm.RPMELBO()
    for x, x2 in batches:
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad()
            elbo.differentiable_loss(model.model, model.guide, x, x2).backward()
            optimizer.step()


@pytest.mark.parametrize("train", [train_svi, train_torch], ids=["svi", "torch_optim"])
def test_two_rpms_interleaved_train_as_each_alone(train, batches):
    first, second = make_rpm(1), make_rpm(2)
    first_alone, second_alone = copy.deepcopy(first), copy.deepcopy(second)
    start = weights(second)
    train([first, second], batches)
    train([first_alone], batches)
    train([second_alone], batches)
    for together, alone in ((first, first_alone), (second, second_alone)):
        for name, value in weights(together).items():
            torch.testing.assert_close(value, weights(alone)[name], rtol=0, atol=0)
    moved = {name: (weights(second)[name] - start[name]).abs().max().item() for name in start}
    assert min(moved.values()) > 1e-3, moved  # the second model's own tensors were trained
    # the store shows the parameters of the model called last, under Pyro's names
    store = pyro.get_param_store()
    assert store["recognition.net$$$weight"].unconstrained() is second_alone.recognition.net.weight
    assert store["prior.energy.lengthscale"].unconstrained() is (
        second_alone.prior.energy.lengthscale_unconstrained)


def test_svi_and_torch_optim_agree(batches):
    """pyro.optim.Adam under SVI and torch.optim.Adam on model.parameters() take the same steps."""
    by_svi = make_rpm(3)
    by_torch = copy.deepcopy(by_svi)
    train_svi([by_svi], batches)
    train_torch([by_torch], batches)
    for name, value in weights(by_svi).items():
        torch.testing.assert_close(value, weights(by_torch)[name], rtol=1e-6, atol=1e-7)


def test_one_recognition_model_under_two_priors(batches):
    """One encoder shared by two RPMs (to compare priors): each SVI trains the shared encoder
    and its own prior; compared with two torch.optim.Adam written over the same tensors."""
    torch.manual_seed(4)
    recognition = rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D))
    narrow = rpm.RPM(recognition, ImplicitPrior(RBFEnergy(lengthscale=0.5)))
    wide = rpm.RPM(recognition, ImplicitPrior(RBFEnergy(lengthscale=2.0)))
    reference = copy.deepcopy((narrow, wide))  # deepcopy keeps the sharing within the copy
    assert reference[0].recognition is reference[1].recognition
    train_svi([narrow, wide], batches)
    train_torch(list(reference), batches)
    assert narrow.recognition is wide.recognition
    for model, expected in zip((narrow, wide), reference, strict=True):
        for name, value in weights(model).items():
            torch.testing.assert_close(value, weights(expected)[name], rtol=1e-6, atol=1e-7)
    assert narrow.prior.energy.lengthscale.item() != wide.prior.energy.lengthscale.item()


def test_trace_elbo_under_svi_trains_each_model_alone(batches):
    first, second = make_rpm(5), make_rpm(6)
    alone = copy.deepcopy(second)
    for models in ([first, second], [alone]):
        svis = [SVI(m.model, m.guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
                for m in models]
        for x, x2 in batches:
            for svi in svis:
                svi.step(x, x2)
    for name, value in weights(second).items():
        torch.testing.assert_close(value, weights(alone)[name], rtol=0, atol=0)


def test_entries_left_in_the_global_param_store_are_never_read(batches):
    """Stale tensors under the RPM's names in the global store (another model's, or a user's)
    are not trained and not used: a call starts from an empty store."""
    stale = pyro.param("recognition.net$$$weight", torch.zeros(D, X_DIM))
    decoy = pyro.param("prior.energy.lengthscale", torch.tensor(3.0),
                       constraint=pyro.distributions.constraints.positive).unconstrained()
    unrelated = pyro.param("my_own", torch.ones(2))
    model = make_rpm(7)
    reference = copy.deepcopy(model)
    train_svi([model], batches)
    assert (stale == 0).all() and decoy.item() == pytest.approx(math.log(3.0))
    assert pyro.param("my_own") is unrelated
    pyro.clear_param_store()
    train_svi([reference], batches)
    for name, value in weights(model).items():
        torch.testing.assert_close(value, weights(reference)[name], rtol=0, atol=0)


def test_the_users_network_is_not_converted():
    net = torch.nn.Sequential(torch.nn.Linear(X_DIM, 4), torch.nn.Tanh(), torch.nn.Linear(4, D))
    classes = [type(module) for module in net.modules()]
    model = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy()))
    rpm.RPMELBO().loss(model.model, model.guide, torch.randn(N, X_DIM), torch.randn(N, X_DIM))
    assert [type(module) for module in net.modules()] == classes
    assert model.recognition.net is net


def test_pyro_param_inside_a_prior_is_refused_with_the_fix():
    class ScaledWalk(Prior):
        def forward(self, q, q2):
            scale = pyro.param("walk_scale", torch.tensor(1.0))
            z = pyro.sample("z", pyro.distributions.Normal(0.0, scale).expand([D]).to_event(1))
            z2 = pyro.sample("z2", pyro.distributions.Normal(z, 0.1).to_event(1))
            return z, z2

    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D), noise_scale=0.1), ScaledWalk())
    with pytest.raises(ValueError, match=r"\['walk_scale'\].*PyroParam"):
        rpm.RPMELBO().loss(model.model, model.guide, torch.randn(N, X_DIM), torch.randn(N, X_DIM))
    assert "walk_scale" not in pyro.get_param_store()


def test_explicit_prior_parameters_are_the_modules_own(batches):
    prior = GaussianRandomWalkPrior(D, scale=1.0, step=0.5)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D), noise_scale=0.2), prior)
    before = prior.step.item()
    train_svi([model], batches)
    assert prior.step.item() != before
    assert pyro.param("prior.step").item() == prior.step.item()  # as in Pyro's default mode


def test_a_pyro_module_that_ran_in_one_model_is_refused_by_a_second_with_the_fix():
    x = torch.randn(8, 3)
    recognition = rpm.DeltaRecognition(pyro.nn.PyroModule[torch.nn.Linear](3, 2))
    first = rpm.RPM(recognition, ImplicitPrior(RBFEnergy()))
    rpm.RPMELBO().loss(first.model, first.guide, x, x)
    for build in (lambda: rpm.RPM(recognition, ImplicitPrior(RBFEnergy())),
                  lambda: rpm.SequenceRPM(recognition, MarkovImplicitPrior(RBFEnergy()))):
        with pytest.raises(ValueError, match="plain torch.nn.Module network"):
            build()
