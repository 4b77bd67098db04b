"""The RPM of sequences (a prior over T views) against Trace_ELBO, the pair model at T = 2 and
loops written from the equations (float64)."""

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO

from rpm import RPM, RPMELBO, DeltaRecognition, GaussianRecognition, MixtureMarginal
from rpm._objective import elbo
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal
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
    StateSpacePrior,
)
from rpm.priors._sequence import MarkovChain, MarkovImplicitPrior, MarkovPrior
from tests.helpers import GaussianHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, T, X_DIM, D = 6, 4, 5, 2


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def energies():
    return {
        "bilinear": lambda: BilinearEnergy(D),
        "cosine": lambda: CosineEnergy(kappa=2.0, learn_kappa=True),
        "rbf": lambda: RBFEnergy(lengthscale=0.7),
        "anisotropic": lambda: AnisotropicEnergy(D),
        "laplace": lambda: LpEnergy(p=1.0, tau=0.5),
        "neural": lambda: NeuralEnergy(D, hidden=8),
    }


def make(prior, delta=False, **kwargs):
    if delta:
        recognition = DeltaRecognition(torch.nn.Linear(X_DIM, D))
    else:
        recognition = GaussianRecognition(GaussianHead(X_DIM, D))
    return RPM(recognition, prior, **kwargs, encoder_calls="concat")


def priors():
    return {
        "state-space": lambda: StateSpacePrior(D),
        "markov-implicit-rbf": lambda: MarkovImplicitPrior(RBFEnergy(lengthscale=0.7)),
        "markov-linear-dynamics": lambda: MarkovPrior(LinearDynamicsPrior(D)),
    }


def elbo_and_grads(model, loss_fn, x):
    params = [p for p in model.parameters()]
    loss = loss_fn(x)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
    return loss.detach(), grads


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("name", list(priors()))
def test_elbo_agrees_with_trace_elbo(name, pooled):
    model = make(priors()[name](), pooled_marginal=pooled)
    x = torch.randn(N, T, X_DIM)
    model.guide(x)  # materialise parameters
    pyro.set_rng_seed(1)
    ours, our_grads = elbo_and_grads(
        model, lambda x: RPMELBO().differentiable_loss(model.model, model.guide, x), x)
    pyro.set_rng_seed(1)
    theirs, their_grads = elbo_and_grads(
        model, lambda x: Trace_ELBO().differentiable_loss(model.model, model.guide, x), x)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0)
    for a, b in zip(our_grads, their_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("pooled", [False, True])
def test_structured_guide_agrees_with_trace_elbo(pooled):
    model = make(StateSpacePrior(D), pooled_marginal=pooled, guide="structured")
    x = torch.randn(N, T, X_DIM)
    model.guide(x)
    pyro.set_rng_seed(2)
    ours, our_grads = elbo_and_grads(
        model, lambda x: RPMELBO().differentiable_loss(model.model, model.guide, x), x)
    pyro.set_rng_seed(2)
    theirs, their_grads = elbo_and_grads(
        model, lambda x: Trace_ELBO().differentiable_loss(model.model, model.guide, x), x)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0)
    for a, b in zip(our_grads, their_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)


def test_svi_with_rpmelbo_trains_a_sequence_model():
    model = make(StateSpacePrior(D), pooled_marginal=True, guide="structured")
    x = torch.randn(N, T, X_DIM)
    svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 1e-2}), RPMELBO())
    before = model.prior.transition_matrix.detach().clone()
    losses = [svi.step(x) for _ in range(3)]
    assert all(math.isfinite(loss) for loss in losses)
    assert not torch.equal(before, model.prior.transition_matrix.detach())
    own = {id(p) for p in model.parameters()}  # the store shows the model's own tensors
    assert all(id(value) in own for _, value in pyro.get_param_store().named_parameters())


def test_structured_guide_is_tighter_when_the_recognition_is_broad():
    """Broad recognition factors (sigma 1.5) against a prior with slow dynamics: the recognition
    guide samples each frame independently, the structured guide shares evidence along the
    chain. Monte Carlo over 40 particles each: the gap must exceed 5 standard errors."""
    prior = StateSpacePrior(D, process_noise=0.05, observation_noise=0.05)

    class Broad(torch.nn.Module):
        def forward(self, x):
            return x[:, :D], torch.full_like(x[:, :D], 1.5)

    x = torch.randn(N, T, X_DIM)
    values = {}
    for guide in ("recognition", "structured"):
        model = RPM(GaussianRecognition(Broad()), prior, guide=guide, encoder_calls="concat")
        with torch.no_grad():
            samples = torch.stack([elbo(model.objective_inputs(x)) for _ in range(40)])
        values[guide] = (samples.mean(), samples.std() / 40 ** 0.5)
    gap = values["structured"][0] - values["recognition"][0]
    assert gap > 5 * (values["structured"][1] + values["recognition"][1])


@pytest.mark.parametrize("name", list(energies()))
def test_markov_implicit_prior_with_two_views_is_the_pair_model(name):
    """Delta encoders (exact empirical marginals): the sequence RPM's Trace_ELBO at T = 2 equals the
    pair RPM's ELBO with the same energy and network, value and gradients."""
    energy = energies()[name]()
    net = torch.nn.Linear(X_DIM, D)
    x = torch.randn(N, 2, X_DIM)
    sequence = RPM(DeltaRecognition(net), MarkovImplicitPrior(energy), encoder_calls="concat")
    pair = RPM(DeltaRecognition(net), ImplicitPrior(energy))
    sequence_loss = Trace_ELBO().differentiable_loss(sequence.model, sequence.guide, x)
    params = list(net.parameters()) + list(energy.parameters())
    sequence_grads = torch.autograd.grad(sequence_loss, params)
    pair_loss = RPMELBO().differentiable_loss(pair.model, pair.guide, x[:, 0], x[:, 1])
    pair_grads = torch.autograd.grad(pair_loss, params)
    assert torch.allclose(sequence_loss, pair_loss, rtol=1e-12, atol=1e-12)
    for a, b in zip(sequence_grads, pair_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    assert torch.allclose(-elbo(sequence.objective_inputs(x)), pair_loss, rtol=1e-12)


def conditioned_loss(model, guide, data, *args):
    """The negative ELBO integrand at fixed latents: log Q(z|x) - log P(x, z)."""
    guide_trace = poutine.trace(poutine.condition(guide, data=data)).get_trace(*args)
    model_trace = poutine.trace(poutine.condition(model, data=data)).get_trace(*args)
    return (guide_trace.log_prob_sum() - model_trace.log_prob_sum()).item()


def test_markov_prior_refuses_a_pair_prior_joint_over_the_batch():
    with pytest.raises(ValueError, match="MarkovImplicitPrior"):
        MarkovPrior(ImplicitPrior(RBFEnergy(lengthscale=0.7)))


@pytest.mark.parametrize("pair_prior", [
    lambda: LinearDynamicsPrior(D),
    lambda: GaussianRandomWalkPrior(D),
])
def test_markov_prior_with_two_views_is_the_pair_model(pair_prior):
    """Gaussian encoders, the same latents in both models (the guides conditioned on them):
    the wrapped pair prior gives the pair model's ELBO integrand."""
    prior = pair_prior()
    head = GaussianHead(X_DIM, D)
    x = torch.randn(N, 2, X_DIM)
    z = torch.randn(N, 2, D)
    sequence = RPM(GaussianRecognition(head), MarkovPrior(prior), encoder_calls="concat")
    pair = RPM(GaussianRecognition(head), prior)
    ours = conditioned_loss(sequence.model, sequence.guide, {"z": z}, x)
    theirs = conditioned_loss(pair.model, pair.guide, {"z": z[:, 0], "z2": z[:, 1]}, x[:, 0], x[:, 1])
    assert math.isclose(ours, theirs, rel_tol=1e-12)


def test_markov_chain_of_a_pair_prior_is_the_product_of_its_factors():
    prior = LinearDynamicsPrior(D)
    head = GaussianHead(X_DIM, D)
    model = RPM(GaussianRecognition(head), MarkovPrior(prior), encoder_calls="concat")
    x, z = torch.randn(N, T, X_DIM), torch.randn(N, T, D)
    q = model.recognise(x)
    with poutine.trace() as tracer, pyro.plate("sequences", N):
        model.prior(q, model.marginal(q))
    log_prob = tracer.trace.nodes["z"]["fn"].log_prob(z)
    A, S, Sigma = (prior.transition, prior.initial_scale_tril, prior.noise_scale_tril)
    expected = pyro.distributions.MultivariateNormal(torch.zeros(D), scale_tril=S).log_prob(z[:, 0])
    for t in range(1, T):
        expected = expected + pyro.distributions.MultivariateNormal(
            z[:, t - 1] @ A.T, scale_tril=Sigma).log_prob(z[:, t])
    assert torch.allclose(log_prob, expected, atol=1e-12)


@pytest.mark.parametrize("pooled", [False, True])
def test_markov_implicit_prior_log_density_is_the_equation(pooled):
    energy = RBFEnergy(lengthscale=0.8)
    loc, scale = torch.randn(N, T, D), torch.rand(N, T, D) + 0.3
    q = pyro.distributions.Normal(loc, scale).to_event(1)
    marginal = SequenceMixtureMarginal(q, pooled=pooled)
    z = torch.randn(N, T, D)
    prior = MarkovImplicitPrior(energy)
    trace = poutine.trace(poutine.condition(prior, data={"z": z})).get_trace(q, marginal)
    trace.compute_log_prob()
    expected = torch.zeros(N)
    for n in range(N):
        for t in range(T):
            expected[n] += marginal.view_log_prob(z)[n, t]
        for t in range(T - 1):
            f = lambda a, b: -((a - b) ** 2).sum() / (2 * 0.8 ** 2)  # noqa: E731
            normaliser = torch.logsumexp(torch.stack([f(z[n, t], z[j, t + 1]) for j in range(N)]), 0)
            expected[n] += f(z[n, t], z[n, t + 1]) - normaliser + math.log(N)
    # "z": the marginals, one event over the whole batch; "z_chain": the tilt (the normaliser
    # couples the sequences); together the chain's log-density, summed over the batch
    site = trace.nodes["z"]
    assert site["fn"].batch_shape == () and site["fn"].event_shape == (N, T, D)
    assert torch.allclose(site["log_prob"], marginal.log_prob(z).sum(), atol=1e-12)
    log_density = site["log_prob"] + trace.nodes["z_chain"]["log_prob"]
    assert torch.allclose(log_density, expected.sum(), atol=1e-12)
    # and the analytic cancellation of MarkovImplicitPrior.sequence_log_ratio
    assert torch.allclose(prior.sequence_log_ratio(z, q, marginal),
                          expected - marginal.log_prob(z), atol=1e-12)


def test_sequence_marginals_are_the_per_view_and_pooled_mixtures():
    loc, scale = torch.randn(N, T, D), torch.rand(N, T, D) + 0.3
    q = pyro.distributions.Normal(loc, scale).to_event(1)
    z = torch.randn(N, T, D)
    per_view = SequenceMixtureMarginal(q).view_log_prob(z)
    pooled = SequenceMixtureMarginal(q, pooled=True).view_log_prob(z)
    for t in range(T):
        components = pyro.distributions.Normal(loc[:, t], scale[:, t]).to_event(1)
        assert torch.allclose(per_view[:, t], MixtureMarginal(components).log_prob(z[:, t]), atol=1e-12)
    for n in range(N):
        for t in range(T):
            terms = pyro.distributions.Normal(loc.reshape(-1, D), scale.reshape(-1, D)).log_prob(
                z[n, t]).sum(-1)
            assert torch.allclose(pooled[n, t], torch.logsumexp(terms, 0) - math.log(N * T), atol=1e-12)


def test_per_view_recognition_and_shapes():
    heads = [GaussianHead(X_DIM, D) for _ in range(3)]
    model = RPM([GaussianRecognition(h) for h in heads], StateSpacePrior(D), encoder_calls="concat")
    x = torch.randn(N, 3, X_DIM)
    q = model.recognise(x)
    assert q.batch_shape == (N, 3) and q.event_shape == (D,)
    assert torch.allclose(model.encode_views(x)[:, 1], heads[1](x[:, 1])[0])
    trace = poutine.trace(model.model).get_trace(x)
    assert trace.nodes["z"]["fn"].event_shape == (3, D)
    assert trace.nodes["z"]["fn"].batch_shape == (N,)
    guide_trace = poutine.trace(model.guide).get_trace(x)
    assert guide_trace.nodes["z"]["fn"].event_shape == (3, D)


def test_samples_from_the_chains_have_the_sequence_shape():
    x = torch.randn(N, T, X_DIM)
    for prior in (MarkovImplicitPrior(RBFEnergy()), MarkovPrior(LinearDynamicsPrior(D)), StateSpacePrior(D)):
        model = make(prior)
        z = poutine.trace(model.model).get_trace(x).nodes["z"]["value"]
        assert z.shape == (N, T, D) and torch.isfinite(z).all()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="explicit continuous density"):
        make(StateSpacePrior(D), delta=True)
    with pytest.raises(ValueError, match="structured posterior"):
        make(MarkovImplicitPrior(RBFEnergy()), guide="structured")
    model = make(StateSpacePrior(D))
    with pytest.raises(ValueError, match="T >= 2 views"):
        model.recognise(torch.randn(N, 1, X_DIM))
    with pytest.raises(ValueError, match="at least 2 sequences"):
        model.recognise(torch.randn(1, T, X_DIM))
    with pytest.raises(ValueError, match="latent dimension 3"):
        make(StateSpacePrior(3)).recognise(torch.randn(N, T, X_DIM))


def test_the_markov_chain_draws_whole_batches_and_refuses_other_batches_and_shapes():
    loc, scale = torch.randn(N, T, D), torch.rand(N, T, D) + 0.3
    q = pyro.distributions.Normal(loc, scale).to_event(1)
    markov = MarkovChain(LinearDynamicsPrior(D), q)
    torch.manual_seed(3)
    both = markov.sample((2,))
    torch.manual_seed(3)
    one_by_one = torch.stack([markov.sample(), markov.sample()])
    assert both.shape == (2, N, T, D) and torch.equal(both, one_by_one)
    with pytest.raises(ValueError, match=rf"whole batch of sequences, shape \(.*{N}, {T}, {D}\)"):
        markov.log_prob(torch.zeros(N - 1, T, D))
    # per-sequence factors: batch (N,), refusing another batch
    with pytest.raises(ValueError, match="use a plate of the number of sequences"):
        markov.expand((N + 1,))
    assert markov.expand((N,)) is markov
