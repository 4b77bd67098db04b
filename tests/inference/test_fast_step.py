"""The specialised evaluation of an RPM step (rpm.inference.fast_step) computes what the generic
path computes, and is taken only where it provably does: values and gradients against
RPMELBO(fast_path=False) in float64 for every built-in energy, Delta and Gaussian recognition,
pairs and J = 2, 4 views; a subclass overriding forward, a hook, a queue, a block size ... take
the generic path, whose value equals a loop over the user's forward; the checks still fire."""

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions import Delta
from pyro.nn import pyro_method

import rpm
from rpm.inference import fast_step
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    ImplicitPrior,
    LpEnergy,
    MarkovImplicitPrior,
    NeuralEnergy,
    RBFEnergy,
)
from tests.helpers import GaussianHead

IN, DIM, N = 5, 3, 6

ENERGIES = {
    "bilinear": lambda: BilinearEnergy(DIM, init_scale=0.7),
    "cosine": lambda: CosineEnergy(3.0, learn_kappa=True),
    "cosine-fixed": lambda: CosineEnergy(3.0),
    "rbf": lambda: RBFEnergy(0.8),
    "anisotropic": lambda: AnisotropicEnergy(DIM),
    "anisotropic-raw": lambda: AnisotropicEnergy(DIM, normalize=False, init=0.6),
    "lp1": lambda: LpEnergy(1.0, tau=2.0),
    "lp3": lambda: LpEnergy(3.0, learn_tau=True),
    "neural": lambda: NeuralEnergy(DIM, hidden=4),
}
# (prior over J views?, J, how the views are given, encoder_calls)
FORMS = {
    "pair": (False, 2, "pair", "per_view"),
    "pair-concat": (False, 2, "pair", "concat"),
    "J=2": (True, 2, "list", "per_view"),
    "J=4": (True, 4, "list", "per_view"),
    "J=4-concat": (True, 4, "list", "concat"),
    "J=4-stacked-concat": (True, 4, "stacked", "concat"),
}


def recognition(kind: str):
    if kind == "delta":
        return rpm.DeltaRecognition(torch.nn.Sequential(torch.nn.Linear(IN, 7), torch.nn.Tanh(),
                                                        torch.nn.Linear(7, DIM)))
    if kind == "noisy-delta":
        return rpm.DeltaRecognition(torch.nn.Linear(IN, DIM), noise_scale=0.3)
    return rpm.GaussianRecognition(GaussianHead(IN, DIM))


def build(energy, kind: str = "delta", form: str = "pair", model_class=rpm.RPM):
    joint, _, _, calls = FORMS[form]
    prior = MarkovImplicitPrior(energy) if joint else ImplicitPrior(energy)
    return model_class(recognition(kind), prior, encoder_calls=calls).double()


def data(form: str, num: int = N) -> tuple:
    _, views, given, _ = FORMS[form]
    x = torch.randn(num, views, IN, dtype=torch.float64)
    if given == "pair":
        return x[:, 0], x[:, 1]
    if given == "stacked":
        return (x,)
    return (list(x.unbind(1)),)


def loss_and_grads(model, elbo, args, seed: int = 3):
    pyro.set_rng_seed(seed)  # the same draws for stochastic encoders on both paths
    loss = elbo.differentiable_loss(model.model, model.guide, *args)
    params = [p for p in model.parameters() if p.requires_grad]
    return loss, torch.autograd.grad(loss, params, allow_unused=True)


def spy(monkeypatch) -> list:
    """Counts the steps evaluated by the fast path."""
    calls = []
    original = fast_step.evaluate

    def counted(model, step):
        calls.append(step)
        return original(model, step)

    monkeypatch.setattr(fast_step, "evaluate", counted)
    return calls


def assert_close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ["delta", "gaussian", "noisy-delta"])
@pytest.mark.parametrize("name", ENERGIES)
def test_fast_path_equals_generic_path(monkeypatch, name, kind, form):
    torch.manual_seed(0)
    model = build(ENERGIES[name](), kind, form)
    args = data(form)
    fast, generic = rpm.RPMELBO(), rpm.RPMELBO(fast_path=False)
    assert fast_step.plan(model, fast, args, {}) is None        # a new signature: every check
    loss_and_grads(model, fast, args)
    assert fast_step.plan(model, fast, args, {}) is not None
    calls = spy(monkeypatch)
    loss, grads = loss_and_grads(model, fast, args)
    assert len(calls) == 1 and calls[0].deltas == (kind == "delta")
    want, want_grads = loss_and_grads(model, generic, args)
    assert len(calls) == 1
    assert_close(loss, want)
    for got, expected in zip(grads, want_grads, strict=True):
        assert (got is None) == (expected is None)
        if got is not None:
            assert_close(got, expected)


@pytest.mark.parametrize("form", ["pair", "J=4"])
def test_fast_path_equals_a_loop_from_the_equation(monkeypatch, form):
    """Eq. 23-25: sum over consecutive views t and instances i of f(z_it, z_i,t+1) - log(1/N
    sum_j exp f(z_it, z_j,t+1)), f the RBF energy, z the encoder's output, in float64."""
    torch.manual_seed(1)
    model = build(RBFEnergy(0.7), "delta", form)
    args = data(form)
    elbo = rpm.RPMELBO()
    elbo.loss(model.model, model.guide, *args)
    calls = spy(monkeypatch)
    got = elbo.loss(model.model, model.guide, *args)
    assert len(calls) == 1
    views = list(args) if form == "pair" else args[0]
    net = model.recognition.net
    with torch.no_grad():
        z = [net(view) for view in views]
    total = 0.0
    for t in range(len(z) - 1):
        for i in range(N):
            logits = [-float(((z[t][i] - z[t + 1][j]) ** 2).sum()) / (2 * 0.7**2) for j in range(N)]
            top = max(logits)
            total += logits[i] - (top + math.log(sum(math.exp(v - top) for v in logits) / N))
    assert got == pytest.approx(-total, rel=1e-12, abs=1e-12)


def test_training_under_svi_and_torch_matches_the_generic_path():
    """Five SVI steps (pyro.optim.Adam, the parameter capture of SVI) and five torch.optim
    steps give the same parameters, the energy's learned lengthscale included."""
    def train(fast_path: bool, route: str):
        torch.manual_seed(0)
        model = build(RBFEnergy(0.8), "delta", "pair")
        args = data("pair")
        elbo = rpm.RPMELBO(fast_path=fast_path)
        if route == "svi":
            svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.05}), elbo)
            for _ in range(5):
                svi.step(*args)
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
            for _ in range(5):
                optimizer.zero_grad()
                elbo.differentiable_loss(model.model, model.guide, *args).backward()
                optimizer.step()
        return [value.clone() for value in model.state_dict().values()]

    torch.manual_seed(0)
    initial = [value.clone() for value in build(RBFEnergy(0.8)).state_dict().values()]
    for route in ("svi", "torch"):
        fast, generic = train(True, route), train(False, route)
        assert all(not torch.equal(got, start) for got, start in zip(fast, initial, strict=True))
        for got, want in zip(fast, generic, strict=True):
            assert_close(got, want)


def test_the_same_parameters_reach_pyro():
    """Under a trace (SVI's parameter capture) both paths register the same parameters, the
    encoder's and the energy's, with the same values."""
    model = build(RBFEnergy(0.8), "delta", "pair")
    args = data("pair")
    elbo = rpm.RPMELBO()
    elbo.loss(model.model, model.guide, *args)
    traces = {}
    for fast_path in (True, False):
        with poutine.trace(param_only=True) as capture:
            rpm.RPMELBO(fast_path=fast_path).differentiable_loss(model.model, model.guide, *args)
        traces[fast_path] = {name: site["value"] for name, site in capture.trace.nodes.items()}
    assert set(traces[True]) == set(traces[False])
    assert any(name.endswith("energy.lengthscale") for name in traces[True])
    assert any("recognition.net" in name for name in traces[True])
    for name, value in traces[True].items():
        assert torch.equal(value, traces[False][name])


class ScaledRBF(RBFEnergy):
    def forward(self, z, z2):
        return 3.0 * super().forward(z, z2)


class ShiftedDelta(rpm.DeltaRecognition):
    def forward(self, x):
        return Delta(super().forward(x).v + 1.0, event_dim=1)


class ModelOverride(rpm.RPM):
    @pyro_method
    def model(self, *args, **kwargs):
        return super().model(*args, **kwargs)


class InitOnly(rpm.RPM):
    def __init__(self, net):
        super().__init__(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy(0.5)))


def loop_loss(energy, z, z2) -> float:
    """-sum_i [f(z_i, z'_i) - log(1/N sum_j exp f(z_i, z'_j))], f from forward on single rows."""
    total = 0.0
    with torch.no_grad():
        for i in range(z.shape[0]):
            logits = [float(energy(z[i:i + 1], z2[j:j + 1])) for j in range(z2.shape[0])]
            top = max(logits)
            total += logits[i] - (top + math.log(sum(math.exp(v - top) for v in logits) / len(logits)))
    return -total


@pytest.mark.parametrize("override", ["energy", "recognition", "model"])
def test_a_subclass_overriding_forward_takes_the_generic_path(monkeypatch, override):
    torch.manual_seed(2)
    energy = ScaledRBF(0.9) if override == "energy" else RBFEnergy(0.9)
    net = torch.nn.Linear(IN, DIM).double()
    rec = ShiftedDelta(net) if override == "recognition" else rpm.DeltaRecognition(net)
    cls = ModelOverride if override == "model" else rpm.RPM
    model = cls(rec, ImplicitPrior(energy))
    x, x2 = data("pair")
    elbo = rpm.RPMELBO()
    calls = spy(monkeypatch)
    for _ in range(2):
        got = elbo.loss(model.model, model.guide, x, x2)
    assert fast_step.plan(model, elbo, (x, x2), {}) is None and not calls
    shift = 1.0 if override == "recognition" else 0.0
    with torch.no_grad():
        z, z2 = net(x) + shift, net(x2) + shift
    assert got == pytest.approx(loop_loss(energy, z, z2), rel=1e-12, abs=1e-12)


def test_a_subclass_changing_only_init_keeps_the_fast_path(monkeypatch):
    model = InitOnly(torch.nn.Linear(IN, DIM)).double()
    args = data("pair")
    elbo = rpm.RPMELBO()
    elbo.loss(model.model, model.guide, *args)
    calls = spy(monkeypatch)
    got = elbo.loss(model.model, model.guide, *args)
    assert len(calls) == 1
    assert got == pytest.approx(rpm.RPMELBO(fast_path=False).loss(model.model, model.guide, *args),
                                rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("where", ["energy", "recognition", "recognition-pre", "global"])
def test_a_hook_takes_the_generic_path_and_runs(monkeypatch, where):
    model = build(RBFEnergy(0.8), "delta", "pair")
    args = data("pair")
    elbo = rpm.RPMELBO()
    want = elbo.loss(model.model, model.guide, *args)
    fired = []
    if where == "energy":
        handle = model.prior.energy.register_forward_hook(lambda *a: fired.append(1))
    elif where == "recognition":
        handle = model.recognition.register_forward_hook(lambda *a: fired.append(1))
    elif where == "recognition-pre":
        handle = model.recognition.register_forward_pre_hook(lambda *a: fired.append(1))
    else:
        handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: fired.append(1))
    calls = spy(monkeypatch)
    try:
        assert fast_step.plan(model, elbo, args, {}) is None
        got = elbo.loss(model.model, model.guide, *args)
    finally:
        handle.remove()
    assert not calls and fired
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    elbo.loss(model.model, model.guide, *args)
    assert len(calls) == 1  # the hook removed, the fast path again


@pytest.mark.parametrize("case", ["queue", "block_size", "global_batch", "particles", "mask",
                                  "streamed", "pair-prior-list", "fast_path=False", "tracing"])
def test_steps_the_fast_path_does_not_cover_take_the_generic_path(case):
    queue = rpm.inference.LatentQueue(4, DIM) if case == "queue" else None
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(IN, DIM)), ImplicitPrior(RBFEnergy()),
                    queue=queue)
    num = 600 if case == "streamed" else N
    x, x2 = torch.randn(num, IN), torch.randn(num, IN)
    args = ([x, x2],) if case == "pair-prior-list" else (x, x2)
    kwargs = {"block_size": 4} if case == "block_size" else {
        "global_batch": True} if case == "global_batch" else {
        "num_particles": 2} if case == "particles" else {"fast_path": False} if case == (
        "fast_path=False") else {}
    elbo = rpm.RPMELBO(**kwargs)
    elbo.loss(model.model, model.guide, *args)
    reference = rpm.RPMELBO()
    reference.loss(model.model, model.guide, x, x2)
    if case == "mask":
        assert fast_step.plan(model, elbo, args, {"mask": torch.ones(N, 2, dtype=torch.bool)}) is None
    elif case == "tracing":
        monkeypatch_tracing = torch.jit.is_tracing
        try:
            torch.jit.is_tracing = lambda: True
            assert fast_step.plan(model, elbo, args, {}) is None
        finally:
            torch.jit.is_tracing = monkeypatch_tracing
    elif case == "fast_path=False":
        assert not elbo.fast_path
    else:
        assert fast_step.plan(model, elbo, args, {}) is None
    if case in ("mask", "tracing", "fast_path=False"):
        assert fast_step.plan(model, reference, (x, x2), {}) is not None


def test_the_first_batch_of_a_signature_is_checked():
    model = build(RBFEnergy(), "delta", "pair")
    x, x2 = data("pair")
    x[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"x has NaN or infinite entries in 1 of its 6 rows \(rows 2\)"):
        rpm.RPMELBO().loss(model.model, model.guide, x, x2)
    with pytest.raises(ValueError, match="same batch size"):
        rpm.RPMELBO().loss(model.model, model.guide, x[:5], x2)


def test_a_bad_later_batch_still_names_its_rows(monkeypatch):
    """A batch of a signature that passed takes the fast path; an infinite input that makes the
    ELBO non-finite is still named (the step is evaluated again with every check)."""
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(IN, DIM)), ImplicitPrior(RBFEnergy())).double()
    x, x2 = data("pair")
    elbo = rpm.RPMELBO()
    elbo.loss(model.model, model.guide, x, x2)
    bad = x2.clone()
    bad[4, 0] = float("inf")
    assert fast_step.plan(model, elbo, (x, bad), {}) is not None
    calls = spy(monkeypatch)
    with pytest.raises(ValueError, match=r"x2 has NaN or infinite entries in 1 of its 6 rows \(rows 4\)"):
        elbo.loss(model.model, model.guide, x, bad)
    assert len(calls) == 1  # the fast path ran, refused, and the step was checked in full


def test_a_recognition_asked_to_validate_checks_on_the_fast_path(monkeypatch):
    net = torch.nn.Linear(IN, DIM).double()
    model = rpm.RPM(rpm.DeltaRecognition(net, validate=True), ImplicitPrior(RBFEnergy()))
    x, x2 = data("pair")
    elbo = rpm.RPMELBO()
    calls = spy(monkeypatch)
    with pyro.validation_enabled(False):
        elbo.loss(model.model, model.guide, x, x2)
        with torch.no_grad():
            net.bias.fill_(float("nan"))
        with pytest.raises(ValueError, match="NaN or infinite latents"):
            elbo.loss(model.model, model.guide, x, x2)
    assert calls  # checked on the fast path itself (validation off: no second evaluation)


def test_validation_off_takes_the_fast_path_with_the_same_value(monkeypatch):
    model = build(CosineEnergy(5.0), "delta", "J=4")
    args = data("J=4")
    elbo = rpm.RPMELBO()
    with pyro.validation_enabled(False):
        elbo.loss(model.model, model.guide, *args)
        calls = spy(monkeypatch)
        got = elbo.loss(model.model, model.guide, *args)
        want = rpm.RPMELBO(fast_path=False).loss(model.model, model.guide, *args)
    assert len(calls) == 1
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_fast_path_argument_is_checked():
    with pytest.raises(TypeError, match="fast_path"):
        rpm.RPMELBO(fast_path="yes")


def test_a_replaced_module_is_decided_again(monkeypatch):
    """The class checks are cached per set of modules: a replaced energy (here one overriding
    forward) or recognition model is checked again."""
    model = build(RBFEnergy(0.8), "delta", "pair")
    args = data("pair")
    elbo = rpm.RPMELBO()
    for _ in range(2):
        elbo.loss(model.model, model.guide, *args)
    assert fast_step.plan(model, elbo, args, {}) is not None
    model.prior.energy = ScaledRBF(0.8)
    calls = spy(monkeypatch)
    got = elbo.loss(model.model, model.guide, *args)
    assert fast_step.plan(model, elbo, args, {}) is None and not calls
    with torch.no_grad():
        z, z2 = (model.recognition.net(view) for view in args)
    assert got == pytest.approx(loop_loss(model.prior.energy, z, z2), rel=1e-12, abs=1e-12)
    model.recognition = ShiftedDelta(torch.nn.Linear(IN, DIM).double())
    model.prior.energy = RBFEnergy(0.8)
    elbo.loss(model.model, model.guide, *args)
    assert fast_step.plan(model, elbo, args, {}) is None


def test_the_pyro_context_is_skipped_only_where_nothing_reads_pyro_state(monkeypatch):
    """Without a handler, with a parameter-free energy and networks the store holds, the fast
    path runs outside the model's Pyro context; an energy with parameters, a trace, or a store
    cleared between steps (the network registered again, as on the generic path) keep it."""
    model = build(CosineEnergy(4.0), "delta", "pair")
    args = data("pair")
    elbo = rpm.RPMELBO()
    elbo.loss(model.model, model.guide, *args)
    step = fast_step.plan(model, elbo, args, {})
    assert not fast_step.needs_context(step)
    with poutine.trace(param_only=True):
        assert fast_step.needs_context(step)
    pyro.clear_param_store()
    assert fast_step.needs_context(step)
    elbo.loss(model.model, model.guide, *args)
    fast_names = set(pyro.get_param_store().keys())
    pyro.clear_param_store()
    rpm.RPMELBO(fast_path=False).loss(model.model, model.guide, *args)
    assert fast_names == set(pyro.get_param_store().keys()) and fast_names
    learned = build(RBFEnergy(0.8), "delta", "pair")
    elbo.loss(learned.model, learned.guide, *args)
    assert fast_step.needs_context(fast_step.plan(learned, elbo, args, {}))
    gaussian = build(CosineEnergy(4.0), "gaussian", "pair")
    elbo.loss(gaussian.model, gaussian.guide, *args)
    assert fast_step.needs_context(fast_step.plan(gaussian, elbo, args, {}))
