"""RPMELBO against Pyro's Trace_ELBO and against InfoNCE written as a loop."""

import math

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO

import rpm
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    GaussianRandomWalkPrior,
    ImplicitPrior,
    LinearDynamicsPrior,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
)
from tests.helpers import GaussianHead

N, X_DIM, D = 12, 5, 3

ENERGIES = {
    "bilinear": lambda: BilinearEnergy(D, init_scale=0.7),
    "cosine": lambda: CosineEnergy(kappa=4.0),
    "rbf": lambda: RBFEnergy(lengthscale=0.8),
    "anisotropic": lambda: AnisotropicEnergy(D),
    "lp1": lambda: LpEnergy(p=1.0, tau=0.5),
    "neural": lambda: NeuralEnergy(D, hidden=6),
}
RECOGNITION = {
    "delta": lambda: rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
    "delta_noise": lambda: rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D), noise_scale=0.1),
    "gaussian": lambda: rpm.GaussianRecognition(GaussianHead(X_DIM, D)),
}
EXPLICIT = {
    "random_walk": lambda: GaussianRandomWalkPrior(D, scale=1.3, step=0.4),
    "linear_dynamics": lambda: LinearDynamicsPrior(D, scale=1.1, noise=0.5),
}


@pytest.fixture
def batch():
    torch.set_default_dtype(torch.float64)
    x = torch.randn(N, X_DIM)
    return x, x + 0.3 * torch.randn(N, X_DIM)


def info_nce_loop(logits):
    """Mean over i of -log(exp F_ii / sum_j exp F_ij), one row at a time, float64."""
    total = 0.0
    for i in range(logits.shape[0]):
        row = [math.exp(v) for v in logits[i].tolist()]
        total += -math.log(row[i] / sum(row))
    return total / logits.shape[0]


def losses_with_same_samples(model, batch):
    pyro.set_rng_seed(123)
    trace_loss = Trace_ELBO().differentiable_loss(model.model, model.guide, *batch)
    pyro.set_rng_seed(123)
    rpm_loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, *batch)
    return trace_loss, rpm_loss


@pytest.mark.parametrize("energy", sorted(ENERGIES))
def test_elbo_is_minus_infonce_plus_log_n(energy, batch):
    """Delta encoders, implicit prior: ELBO / N == -InfoNCE + log N (loss = -ELBO)."""
    model = rpm.RPM(RECOGNITION["delta"](), ImplicitPrior(ENERGIES[energy]()))
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, *batch)
    with torch.no_grad():
        z = model.recognition.net(batch[0])
        z2 = model.recognition.net(batch[1])
        logits = model.prior.energy(z, z2)
    expected = -info_nce_loop(logits) + math.log(N)
    assert abs(-loss.item() / N - expected) < 1e-10
    assert abs(rpm.losses.info_nce(logits).item() - info_nce_loop(logits)) < 1e-10
    per_pair = model.prior.log_ratio(z, z2)
    assert abs(per_pair.mean().item() - expected) < 1e-10
    # Pyro's own Trace_ELBO on the same model gives the same number.
    trace_loss = Trace_ELBO().loss(model.model, model.guide, *batch)
    assert abs(trace_loss - loss.item()) <= 1e-6 * abs(loss.item()) + 1e-12


@pytest.mark.parametrize("recognition", sorted(RECOGNITION))
@pytest.mark.parametrize("energy", ["cosine", "rbf", "bilinear"])
def test_rpmelbo_equals_trace_elbo_implicit(recognition, energy, batch):
    model = rpm.RPM(RECOGNITION[recognition](), ImplicitPrior(ENERGIES[energy]()))
    trace_loss, rpm_loss = losses_with_same_samples(model, batch)
    assert abs(trace_loss.item() - rpm_loss.item()) <= 1e-6 * abs(trace_loss.item())
    params = list(model.parameters())
    trace_grads = torch.autograd.grad(trace_loss, params)
    rpm_grads = torch.autograd.grad(rpm_loss, params)
    for a, b in zip(trace_grads, rpm_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("recognition", ["delta_noise", "gaussian"])
@pytest.mark.parametrize("prior", sorted(EXPLICIT))
def test_rpmelbo_equals_trace_elbo_explicit(recognition, prior, batch):
    model = rpm.RPM(RECOGNITION[recognition](), EXPLICIT[prior]())
    trace_loss, rpm_loss = losses_with_same_samples(model, batch)
    assert abs(trace_loss.item() - rpm_loss.item()) <= 1e-6 * abs(trace_loss.item())
    params = list(model.parameters())
    grads = (torch.autograd.grad(trace_loss, params), torch.autograd.grad(rpm_loss, params))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_custom_prior_through_generic_path(batch):
    """A user-written prior (no log_ratio method) is traced; Trace_ELBO agrees."""

    class LaplaceWalk(pyro.nn.PyroModule):
        def __init__(self):
            super().__init__()
            self.step = pyro.nn.PyroParam(torch.tensor(0.5), pyro.distributions.constraints.positive)

        def forward(self, q, q2):
            z = pyro.sample("z", pyro.distributions.Normal(0.0, 1.0).expand([D]).to_event(1))
            z2 = pyro.sample("z2", pyro.distributions.Laplace(z, self.step).to_event(1))
            return z, z2

    model = rpm.RPM(RECOGNITION["gaussian"](), LaplaceWalk())
    trace_loss, rpm_loss = losses_with_same_samples(model, batch)
    assert abs(trace_loss.item() - rpm_loss.item()) <= 1e-6 * abs(trace_loss.item())


def test_svi_with_both_elbos_and_elbo_module(batch):
    for loss in (Trace_ELBO(), rpm.RPMELBO()):
        pyro.clear_param_store()
        model = rpm.RPM(RECOGNITION["delta"](), ImplicitPrior(RBFEnergy()))
        svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.05}), loss)
        before = model.prior.energy.lengthscale.item()
        losses = [svi.step(*batch) for _ in range(5)]
        assert all(math.isfinite(v) for v in losses)
        assert model.prior.energy.lengthscale.item() != before
    module = rpm.RPMELBO()(model.model, model.guide)
    assert isinstance(module, torch.nn.Module)
    assert module(*batch).requires_grad


def test_trace_shows_sites_and_likelihood_factors(batch):
    model = rpm.RPM(RECOGNITION["gaussian"](), ImplicitPrior(CosineEnergy()))
    guide_trace = pyro.poutine.trace(model.guide).get_trace(*batch)
    trace = pyro.poutine.trace(pyro.poutine.replay(model.model, trace=guide_trace)).get_trace(*batch)
    trace.compute_log_prob()
    for name in ("x", "x2"):  # the likelihood factors are per pair, in the plate
        assert trace.nodes[name]["log_prob"].shape == (N,)
    for name in ("z", "z2"):  # the implicit prior couples the pairs: one event per batch
        assert trace.nodes[name]["log_prob"].shape == ()
        assert trace.nodes[name]["fn"].event_shape == (N, D)
        assert guide_trace.nodes[name]["fn"].event_shape == (N, D)
    q = model.recognition(batch[0])
    z = guide_trace.nodes["z"]["value"]
    expected = q.log_prob(z) - rpm.MixtureMarginal(q).log_prob(z)
    torch.testing.assert_close(trace.nodes["x"]["log_prob"], expected)


def test_rpmelbo_of_another_program_is_trace_elbo(batch):
    def model(x, x2):
        pyro.sample("u", pyro.distributions.Normal(0.0, 1.0))

    def guide(x, x2):
        pyro.sample("u", pyro.distributions.Normal(0.5, 2.0))

    torch.manual_seed(0)
    got = rpm.RPMELBO().loss(model, guide, *batch)
    torch.manual_seed(0)
    assert got == pyro.infer.Trace_ELBO().loss(model, guide, *batch)
    with pytest.raises(ValueError, match="num_particles"):
        rpm.RPMELBO(num_particles=0)


@pytest.mark.parametrize("elbo, recognition, prior", [
    ("TraceGraph_ELBO", "delta", "implicit"),
    ("TraceGraph_ELBO", "gaussian", "implicit"),
    ("TraceGraph_ELBO", "gaussian", "random_walk"),
    ("JitTrace_ELBO", "delta", "implicit"),
])
def test_rpmelbo_equals_pyros_other_elbos(elbo, recognition, prior, batch):
    """Values and gradients of Pyro's TraceGraph_ELBO and JitTrace_ELBO (loss_and_grads) on the
    same random numbers (the JIT compiles on a first call; it is compared with deterministic
    encoders only, because its traced sampler draws other numbers from the same seed)."""
    build = (lambda: ImplicitPrior(RBFEnergy(lengthscale=0.8))) if prior == "implicit" \
        else EXPLICIT[prior]
    model = rpm.RPM(RECOGNITION[recognition](), build())
    params = list(model.parameters())

    def loss_and_grads(loss):
        for param in params:
            param.grad = None
        pyro.set_rng_seed(7)
        value = loss.loss_and_grads(model.model, model.guide, *batch)
        return value, [param.grad.clone() for param in params]

    ours, our_grads = loss_and_grads(rpm.RPMELBO())
    pyro_elbo = getattr(pyro.infer, elbo)(ignore_jit_warnings=True) if elbo == "JitTrace_ELBO" \
        else getattr(pyro.infer, elbo)()
    loss_and_grads(pyro_elbo)
    theirs, their_grads = loss_and_grads(pyro_elbo)
    assert theirs == pytest.approx(ours, rel=1e-9)
    for a, b in zip(their_grads, our_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
