"""Parameters the Pyro way: each model's parameters are named after the model in Pyro's global
param store, so models that coexist in one process train as each would alone under every route
(SVI with Trace_ELBO, TraceGraph_ELBO, JitTrace_ELBO and RPMELBO, and a torch.optim loop), the
store holds all of them, and ``state_dict`` restores a model exactly."""

import copy

import pyro
import pytest
import torch
from pyro.infer import SVI, JitTrace_ELBO, Trace_ELBO, TraceGraph_ELBO
from torch.distributions import constraints

import rpm
from rpm.priors import (
    GaussianRandomWalkPrior,
    ImplicitPrior,
    MarkovImplicitPrior,
    RBFEnergy,
)

N, X_DIM, D, STEPS = 16, 5, 3, 4


def make_rpm(seed, hidden=None, lengthscale=0.9, name=None):
    """An RPM with a Linear encoder (or a one-hidden-layer MLP) and an RBF energy whose
    lengthscale is learned (a PyroParam)."""
    torch.manual_seed(seed)
    if hidden is None:
        net = torch.nn.Linear(X_DIM, D)
    else:
        net = torch.nn.Sequential(torch.nn.Linear(X_DIM, hidden), torch.nn.Tanh(),
                                  torch.nn.Linear(hidden, D))
    return rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy(lengthscale=lengthscale)),
                   name=name)


@pytest.fixture
def batches():
    torch.manual_seed(123)
    return [(torch.randn(N, X_DIM), torch.randn(N, X_DIM)) for _ in range(STEPS)]


def weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_same_weights(got, expected, exact=True):
    assert got.keys() == expected.keys()
    for name, value in got.items():
        if exact:
            torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)
        else:
            torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-7, msg=name)


def svi_route(loss):
    def train(models, batches):
        """One SVI per model; each batch is stepped by every model in turn (interleaved)."""
        svis = [SVI(m.model, m.guide, pyro.optim.Adam({"lr": 0.05}), loss()) for m in models]
        for x, x2 in batches:
            for svi in svis:
                svi.step(x, x2)
    return train


def train_torch(models, batches):
    """torch.optim.Adam over model.parameters() and RPMELBO's differentiable_loss."""
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.05) for m in models]
    elbo = rpm.RPMELBO()
    for x, x2 in batches:
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad()
            elbo.differentiable_loss(model.model, model.guide, x, x2).backward()
            optimizer.step()


ROUTES = {
    "svi-Trace_ELBO": svi_route(Trace_ELBO),
    "svi-TraceGraph_ELBO": svi_route(TraceGraph_ELBO),
    "svi-JitTrace_ELBO": svi_route(JitTrace_ELBO),
    "svi-RPMELBO": svi_route(rpm.RPMELBO),
    "torch_optim": train_torch,
}


def store_entries(model):
    """The store entries Pyro's naming gives this RPM's parameters, written out: the energy's
    lengthscale (a PyroParam, stored unconstrained) and the encoder's weights (registered with
    pyro.module)."""
    name = model._pyro_name
    entries = {f"{name}.prior.energy.lengthscale": model.prior.energy.lengthscale_unconstrained}
    for param_name, param in model.recognition.net.named_parameters():
        entries[f"{name}.recognition.net$$${param_name}"] = param
    return entries


@pytest.mark.parametrize("route", ROUTES)
def test_two_rpms_interleaved_train_as_each_alone(route, batches):
    train = ROUTES[route]
    first, second = make_rpm(1), make_rpm(2, hidden=4, lengthscale=1.3)
    start = weights(second)
    train([first, second], batches)
    alone = []
    for seed, hidden, lengthscale in ((1, None, 0.9), (2, 4, 1.3)):
        pyro.clear_param_store()  # each alone: the only model in the store
        model = make_rpm(seed, hidden, lengthscale)
        train([model], batches)
        alone.append(model)
    for together, expected in zip((first, second), alone, strict=True):
        assert_same_weights(weights(together), weights(expected))
    moved = {name: (weights(second)[name] - start[name]).abs().max().item() for name in start}
    assert min(moved.values()) > 1e-3, moved  # the second model's own tensors were trained


@pytest.mark.parametrize("route", ROUTES)
def test_one_network_shared_by_two_priors_trains_as_each_alone(route, batches):
    """One encoder network under two priors (to compare priors): the first model trains, then
    the second from where the first left the encoder; each as it would with only itself in the
    store, and the second never touches the first's prior."""
    def build():
        torch.manual_seed(4)
        net = torch.nn.Linear(X_DIM, D)
        return (rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy(lengthscale=0.5))),
                rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy(lengthscale=2.0))))

    train = ROUTES[route]
    narrow, wide = build()
    train([narrow], batches)
    narrow_trained = weights(narrow)
    train([wide], batches)
    assert narrow.recognition.net is wide.recognition.net
    assert_same_weights({k: v for k, v in weights(narrow).items() if "prior" in k},
                        {k: v for k, v in narrow_trained.items() if "prior" in k})
    reference_narrow, reference_wide = build()
    pyro.clear_param_store()
    train([reference_narrow], batches)
    assert_same_weights(narrow_trained, weights(reference_narrow))
    pyro.clear_param_store()
    train([reference_wide], batches)
    assert_same_weights(weights(wide), weights(reference_wide))
    assert narrow.prior.energy.lengthscale.item() != wide.prior.energy.lengthscale.item()


def test_one_recognition_model_under_two_priors_interleaved(batches):
    """One recognition model shared by two RPMs and trained interleaved: each SVI trains the
    shared encoder and its own prior; compared with two torch.optim.Adam over the same tensors.
    The shared recognition model takes the name of the model that adopted it last (Pyro
    re-parents it), so its network has one store entry per tensor."""
    def build():
        torch.manual_seed(4)
        recognition = rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D))
        return (rpm.RPM(recognition, ImplicitPrior(RBFEnergy(lengthscale=0.5))),
                rpm.RPM(recognition, ImplicitPrior(RBFEnergy(lengthscale=2.0))))

    narrow, wide = build()
    reference = build()
    ROUTES["svi-RPMELBO"]([narrow, wide], batches)
    train_torch(list(reference), batches)
    assert narrow.recognition is wide.recognition
    for model, expected in zip((narrow, wide), reference, strict=True):
        assert_same_weights(weights(model), weights(expected), exact=False)
    store = pyro.get_param_store()
    assert store[f"{wide._pyro_name}.recognition.net$$$weight"] is wide.recognition.net.weight
    assert f"{narrow._pyro_name}.recognition.net$$$weight" not in store


@pytest.mark.parametrize("route", ["svi-Trace_ELBO", "svi-RPMELBO", "torch_optim"])
def test_the_store_holds_every_model_and_save_load_captures_them(route, tmp_path, batches):
    first, second = make_rpm(1, name="first"), make_rpm(2, hidden=4, name="second")
    ROUTES[route]([first, second], batches)
    store = pyro.get_param_store()
    stored = dict(store.named_parameters())
    expected = {**store_entries(first), **store_entries(second)}
    assert stored.keys() == expected.keys()
    for name, tensor in expected.items():
        assert stored[name] is tensor, name  # the models' own tensors, under their own names
    assert pyro.param("first.prior.energy.lengthscale").item() == pytest.approx(
        first.prior.energy.lengthscale.item(), rel=1e-12)
    store.save(tmp_path / "store.pt")
    pyro.clear_param_store()
    store.load(tmp_path / "store.pt")
    loaded = dict(store.named_parameters())
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(loaded[name], tensor.detach(), rtol=0, atol=0)


def test_state_dict_restores_a_model_exactly_and_a_loaded_store_does_not(tmp_path, batches):
    """``load_state_dict`` restores every parameter, the learned lengthscale (a PyroParam)
    included, and the restored model trains on as the original does. A param store loaded with
    ``pyro.get_param_store().load`` is not copied back into the network's ``nn.Parameter`` s
    (Pyro's behaviour), which is why the docs name ``state_dict`` as the route."""
    trained = make_rpm(1, name="saved")
    ROUTES["torch_optim"]([trained], batches[:2])
    assert trained.prior.energy.lengthscale.item() != pytest.approx(0.9)
    torch.save(trained.state_dict(), tmp_path / "model.pt")
    pyro.get_param_store().save(tmp_path / "store.pt")

    restored = make_rpm(7, lengthscale=2.5)  # other initial weights and lengthscale
    x, x2 = batches[0]
    rpm.RPMELBO().loss(restored.model, restored.guide, x, x2)  # registered in the store
    restored.load_state_dict(torch.load(tmp_path / "model.pt"))
    assert_same_weights(weights(restored), weights(trained))
    assert restored.prior.energy.lengthscale.item() == trained.prior.energy.lengthscale.item()
    loss = rpm.RPMELBO().loss
    assert loss(restored.model, restored.guide, x, x2) == loss(trained.model, trained.guide, x, x2)
    trained.zero_grad(set_to_none=True)  # SVI adds to .grad; the torch loop left its last one
    ROUTES["svi-RPMELBO"]([trained], batches[2:])
    ROUTES["svi-RPMELBO"]([restored], batches[2:])
    assert_same_weights(weights(restored), weights(trained))

    pyro.clear_param_store()
    fresh = make_rpm(7, lengthscale=2.5, name="saved_again")
    store = pyro.get_param_store()
    store.load(tmp_path / "store.pt")
    saved_weight = store["saved.recognition.net$$$weight"]
    assert not torch.equal(fresh.recognition.net.weight, saved_weight)  # nothing copied back


def test_a_plain_callable_prior_with_pyro_param_trains_under_svi(batches):
    """A plain function prior with its own ``pyro.param``: the parameter lives in the store and
    SVI trains it; one SGD step moves it by exactly lr times the gradient of the loss."""
    def walk_prior(q, q2):
        scale = pyro.param("walk_scale", torch.tensor(1.5), constraint=constraints.positive)
        z = pyro.sample("z", pyro.distributions.Normal(0.0, scale).expand([D]).to_event(1))
        z2 = pyro.sample("z2", pyro.distributions.Normal(z, 0.1).to_event(1))
        return z, z2

    torch.manual_seed(0)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D), noise_scale=0.1), walk_prior)
    x, x2 = batches[0]
    for loss in (Trace_ELBO(), rpm.RPMELBO()):
        scale = pyro.param("walk_scale", torch.tensor(1.5))
        unconstrained = scale.unconstrained()
        before = unconstrained.detach().clone()
        pyro.set_rng_seed(3)
        with pyro.poutine.trace(param_only=True):
            value = loss.differentiable_loss(model.model, model.guide, x, x2)
        (gradient,) = torch.autograd.grad(value, unconstrained)
        pyro.set_rng_seed(3)
        svi = SVI(model.model, model.guide, pyro.optim.SGD({"lr": 0.01}), loss)
        svi.step(x, x2)
        assert pyro.param("walk_scale").unconstrained() is unconstrained
        torch.testing.assert_close(unconstrained.detach(), before - 0.01 * gradient)
        assert gradient.abs().item() > 1e-4


def test_the_users_network_is_not_converted():
    net = torch.nn.Sequential(torch.nn.Linear(X_DIM, 4), torch.nn.Tanh(), torch.nn.Linear(4, D))
    classes = [type(module) for module in net.modules()]
    model = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy()))
    rpm.RPMELBO().loss(model.model, model.guide, torch.randn(N, X_DIM), torch.randn(N, X_DIM))
    assert [type(module) for module in net.modules()] == classes
    assert model.recognition.net is net


def test_a_subclass_of_a_built_in_prior_names_its_own_parameters(batches):
    """A user's subclass of ImplicitPrior with a PyroParam of its own: named after the model,
    trained by SVI like the built-in ones."""
    class TemperedPrior(ImplicitPrior):
        def __init__(self, energy):
            super().__init__(energy)
            self.temperature = pyro.nn.PyroParam(torch.tensor(1.0), constraints.positive)

        def log_ratio(self, z, z2, q, q2, candidates=None, block_size=None):
            return None  # the traced fallback: forward's sites minus the marginals

        def forward(self, q, q2):
            z, z2 = super().forward(q, q2)
            pyro.factor("tempering", -self.temperature * (z - z2).pow(2).sum())
            return z, z2

    torch.manual_seed(0)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
                    TemperedPrior(RBFEnergy(lengthscale=0.9)), name="tempered")
    ROUTES["svi-Trace_ELBO"]([model], batches)
    store = pyro.get_param_store()
    assert store["tempered.prior.temperature"].unconstrained() is model.prior.temperature_unconstrained
    assert model.prior.temperature.item() != pytest.approx(1.0)


def test_explicit_prior_parameters_are_the_modules_own(batches):
    prior = GaussianRandomWalkPrior(D, scale=1.0, step=0.5)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D), noise_scale=0.2), prior,
                    name="walk")
    before = prior.step.item()
    ROUTES["svi-RPMELBO"]([model], batches)
    assert prior.step.item() != before
    assert pyro.param("walk.prior.step").item() == prior.step.item()


def test_default_model_names_are_unique():
    names = [make_rpm(0)._pyro_name for _ in range(3)]
    assert len(set(names)) == 3 and all(name.startswith("rpm") for name in names)
    with pytest.raises(ValueError, match="non-empty"):
        make_rpm(0, name="")


def test_a_pyro_module_that_ran_in_one_model_is_refused_by_a_second_with_the_fix():
    x = torch.randn(8, 3)
    recognition = rpm.DeltaRecognition(pyro.nn.PyroModule[torch.nn.Linear](3, 2))
    first = rpm.RPM(recognition, ImplicitPrior(RBFEnergy()))
    rpm.RPMELBO().loss(first.model, first.guide, x, x)
    for build in (lambda: rpm.RPM(recognition, ImplicitPrior(RBFEnergy())),
                  lambda: rpm.RPM(recognition, MarkovImplicitPrior(RBFEnergy()),
                                  encoder_calls="concat")):
        with pytest.raises(ValueError, match="plain torch.nn.Module network"):
            build()


def test_a_trace_of_the_model_records_each_parameter_once_per_call():
    """The recognition model runs once per view; its network's param sites are recorded by the
    first evaluation of each call (model, guide), with the model's names."""
    model = make_rpm(3, hidden=4, name="traced")
    x, x2 = torch.randn(N, X_DIM), torch.randn(N, X_DIM)
    for program in (model.model, model.guide):
        trace = pyro.poutine.trace(program).get_trace(x, x2)
        params = {name: site["value"] for name, site in trace.nodes.items()
                  if site["type"] == "param"}
        expected = {name for name in store_entries(model) if "recognition" in name}
        assert expected <= params.keys()
        for name in expected:
            assert params[name] is store_entries(model)[name]


@pytest.mark.parametrize("route", ["svi-JitTrace_ELBO", "svi-RPMELBO"])
def test_a_deep_copy_has_its_own_names_and_trains_as_the_original_alone(route, batches):
    original = make_rpm(5, hidden=4, name="original")
    x, x2 = batches[0]
    rpm.RPMELBO().loss(original.model, original.guide, x, x2)  # in the store already
    duplicate = copy.deepcopy(original)
    name = duplicate._pyro_name
    assert name != "original" and name.startswith("original_")  # "original_1", "original_2", ...
    assert duplicate.prior.energy._pyro_name == f"{name}.prior.energy"
    assert original.prior.energy._pyro_name == "original.prior.energy"
    ROUTES[route]([original, duplicate], batches)
    assert_same_weights(weights(duplicate), weights(original))
    pyro.clear_param_store()
    alone = make_rpm(5, hidden=4)
    ROUTES[route]([alone], batches)
    assert_same_weights(weights(original), weights(alone))


def test_model_name_is_the_prefix_of_its_entries_in_the_store(batches):
    """``model.name`` (the README's "Parameters"): every store entry of a trained model begins
    with ``model.name + "."``, each of its parameters is such an entry, and a second model's
    entries carry the second name."""
    named, default = make_rpm(0, hidden=4, name="a"), make_rpm(1)
    assert named.name == "a" and default.name.startswith("rpm") and default.name != "a"
    assert named.prior.name == "a.prior" and named.prior.energy.name == "a.prior.energy"
    assert named.recognition.name == "a.recognition"
    for model in (named, default):
        SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.05}), rpm.RPMELBO()).step(
            *batches[0])
    store = pyro.get_param_store()
    for model, other in ((named, default), (default, named)):
        entries = {key for key in store.keys() if key.startswith(model.name + ".")}
        assert entries == {
            f"{model.name}.prior.energy.lengthscale",
            *(f"{model.name}.recognition.net$$${key}" for key, _ in
              model.recognition.net.named_parameters()),
        }
        assert not any(key.startswith(other.name + ".") for key in entries)
        own = {id(p) for p in model.parameters()}
        for key in entries:  # each entry is one of the model's own tensors
            value = store[key]
            assert id(value.unconstrained() if hasattr(value, "unconstrained") else value) in own
    with pytest.raises(AttributeError):
        named.name = "b"  # given at construction: a new name needs a new model
    assert copy.deepcopy(named).name == "a_1"
