"""The pooled implicit prior against NT-Xent written as a loop, SimCLR's loss written from the
paper, and Pyro's Trace_ELBO (values and gradients), float64."""

import datetime
import math

import numpy as np
import pyro
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pyro import poutine
from pyro.infer import Predictive, Trace_ELBO

import rpm
from rpm.marginals import Candidates, LatentQueue, MixtureMarginal
from rpm.marginals._mixture_marginal import Atoms
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    Energy,
    ImplicitPrior,
    LpEnergy,
    NeuralEnergy,
    PooledImplicitPrior,
    RBFEnergy,
)
from rpm.priors._pooled import pooled_log_normalizer, pooled_marginal
from tests.helpers import GaussianHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, X_DIM, D = 7, 5, 3

ENERGIES = {
    "bilinear": lambda: BilinearEnergy(D, init_scale=0.7),
    "cosine": lambda: CosineEnergy(kappa=4.0),
    "rbf": lambda: RBFEnergy(lengthscale=0.8),
    "anisotropic": lambda: AnisotropicEnergy(D),
    "lp1": lambda: LpEnergy(p=1.0, tau=0.5),
    "lp2": lambda: LpEnergy(p=2.0, tau=0.7),
    "neural": lambda: NeuralEnergy(D, hidden=6),
}
RECOGNITION = {
    "delta": lambda: rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
    "gaussian": lambda: rpm.GaussianRecognition(GaussianHead(X_DIM, D)),
}


@pytest.fixture
def batch():
    torch.set_default_dtype(torch.float64)
    x = torch.randn(N, X_DIM)
    return x, x + 0.3 * torch.randn(N, X_DIM)


def scalar_energy(energy, a, b):
    return energy(a[None], b[None])[0, 0].item()


def nt_xent_loop(energy, z, z2, anchors=None):
    """(1/K) sum_k -log(exp f(u_k, u_p(k)) / sum_{m != k} exp f(u_k, u_m)) over the K anchors k
    (default all 2N: NT-Xent; range(N): the direction view 1 -> 2), one pair at a time."""
    u = torch.cat([z, z2])
    n = z.shape[0]
    anchors = range(2 * n) if anchors is None else anchors
    total = 0.0
    for k in anchors:
        partner = (k + n) % (2 * n)
        numerator = math.exp(scalar_energy(energy, u[k], u[partner]))
        denominator = sum(math.exp(scalar_energy(energy, u[k], u[m]))
                          for m in range(2 * n) if m != k)
        total += -math.log(numerator / denominator)
    return total / len(anchors)


def encode(model, batch):
    with torch.no_grad():
        return model.recognition.net(batch[0]), model.recognition.net(batch[1])


@pytest.mark.parametrize("energy", sorted(ENERGIES))
def test_loss_is_nt_xent_minus_log_2n_minus_1(energy, batch):
    """Delta encoders: RPMELBO loss / N == NT-Xent - log(2N - 1) (the ELBO is -loss)."""
    model = rpm.RPM(RECOGNITION["delta"](), PooledImplicitPrior(ENERGIES[energy]()))
    loss = rpm.RPMELBO().loss(model.model, model.guide, *batch)
    z, z2 = encode(model, batch)
    expected = nt_xent_loop(model.prior.energy, z, z2) - math.log(2 * N - 1)
    assert abs(loss / N - expected) < 1e-10
    trace_loss = Trace_ELBO().loss(model.model, model.guide, *batch)
    assert abs(trace_loss / N - expected) < 1e-10


def simclr_loss(h, h2, tau):
    """SimCLR's NT-Xent (Chen et al. 2020, Eq. 1 and Algorithm 1), numpy: the 2N views are
    interleaved, view 2k and 2k+1 being the two augmentations of example k;
    l(i, j) = -log exp(sim(i, j)/tau) / sum_{k != i} exp(sim(i, k)/tau) with cosine sim, and
    L = 1/(2N) sum_k [l(2k, 2k+1) + l(2k+1, 2k)]."""
    n = h.shape[0]
    views = np.empty((2 * n, h.shape[1]))
    views[0::2], views[1::2] = h, h2
    sim = np.array([[a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) for b in views]
                    for a in views])

    def ell(i, j):
        others = sum(np.exp(sim[i, k] / tau) for k in range(2 * n) if k != i)
        return -np.log(np.exp(sim[i, j] / tau) / others)

    return sum(ell(2 * k, 2 * k + 1) + ell(2 * k + 1, 2 * k) for k in range(n)) / (2 * n)


@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_cosine_with_kappa_one_over_tau_is_simclr(tau, batch):
    model = rpm.RPM(RECOGNITION["delta"](), PooledImplicitPrior(CosineEnergy(kappa=1 / tau)))
    loss = rpm.RPMELBO().loss(model.model, model.guide, *batch)
    z, z2 = encode(model, batch)
    assert abs(loss / N + math.log(2 * N - 1) - simclr_loss(z.numpy(), z2.numpy(), tau)) < 1e-10


def test_differs_from_the_cross_view_form(batch):
    """The pooled form (2N - 1 candidates) is not the one-directional cross-view InfoNCE."""
    recognition = RECOGNITION["delta"]()
    pooled = rpm.RPM(recognition, PooledImplicitPrior(CosineEnergy(kappa=4.0)))
    cross = rpm.RPM(recognition, ImplicitPrior(CosineEnergy(kappa=4.0)))
    pooled_loss = rpm.RPMELBO().loss(pooled.model, pooled.guide, *batch)
    cross_loss = rpm.RPMELBO().loss(cross.model, cross.guide, *batch)
    assert abs(pooled_loss - cross_loss) > 1e-3


def losses_with_same_samples(model, batch):
    pyro.set_rng_seed(123)
    trace_loss = Trace_ELBO().differentiable_loss(model.model, model.guide, *batch)
    pyro.set_rng_seed(123)
    rpm_loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, *batch)
    return trace_loss, rpm_loss


@pytest.mark.parametrize("direction", ["forward", "backward", "both"])
@pytest.mark.parametrize("recognition", sorted(RECOGNITION))
@pytest.mark.parametrize("energy", ["bilinear", "cosine", "rbf", "neural"])
def test_rpmelbo_equals_trace_elbo_values_and_gradients(energy, recognition, direction, batch):
    model = rpm.RPM(RECOGNITION[recognition](),
                    PooledImplicitPrior(ENERGIES[energy](), direction=direction))
    trace_loss, rpm_loss = losses_with_same_samples(model, batch)
    assert abs(trace_loss.item() - rpm_loss.item()) <= 1e-10 * (1 + abs(trace_loss.item()))
    params = list(model.parameters())
    trace_grads = torch.autograd.grad(trace_loss, params)
    rpm_grads = torch.autograd.grad(rpm_loss, params)
    for a, b in zip(trace_grads, rpm_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("recognition", sorted(RECOGNITION))
def test_both_directions_is_the_mean_of_the_two_one_directional_elbos(recognition, batch):
    encoder = RECOGNITION[recognition]()
    energy = BilinearEnergy(D, init_scale=0.7)
    losses = {}
    for direction in ("forward", "backward", "both"):   # one encoder and energy, shared
        model = rpm.RPM(encoder, PooledImplicitPrior(energy, direction=direction))
        pyro.set_rng_seed(7)
        losses[direction] = Trace_ELBO().loss(model.model, model.guide, *batch)
    mean = 0.5 * (losses["forward"] + losses["backward"])
    assert abs(losses["both"] - mean) < 1e-10 * (1 + abs(mean))
    assert abs(losses["forward"] - losses["backward"]) > 1e-6   # W is not symmetric


def test_model_sites_are_whole_batch_events(batch):
    model = rpm.RPM(RECOGNITION["gaussian"](), PooledImplicitPrior(RBFEnergy()))
    trace = poutine.trace(model.model).get_trace(*batch)
    for name in ("z", "z2"):
        fn = trace.nodes[name]["fn"]
        assert fn.batch_shape == () and fn.event_shape == (N, D)
        assert isinstance(fn.base_dist, MixtureMarginal) and fn.base_dist.loc.shape == (2 * N, D)
    for name in ("z_to_z2", "z2_to_z"):
        assert trace.nodes[name]["is_observed"] and trace.nodes[name]["fn"].batch_shape == ()
    for name in ("x", "x2"):
        assert trace.nodes[name]["fn"].batch_shape == (N,)
    assert set(trace.observation_nodes) == {"z_to_z2", "z2_to_z", "x", "x2"}
    for direction, factor, absent in (("forward", "z_to_z2", "z2_to_z"),
                                      ("backward", "z2_to_z", "z_to_z2")):
        one = rpm.RPM(model.recognition, PooledImplicitPrior(RBFEnergy(), direction=direction))
        trace = poutine.trace(one.model).get_trace(*batch)
        for name in ("z", "z2"):
            fn = trace.nodes[name]["fn"]
            assert fn.event_shape == (N, D) and isinstance(fn.base_dist, MixtureMarginal)
        assert trace.nodes[factor]["is_observed"] and absent not in trace.nodes


def test_likelihood_factors_divide_by_the_pooled_marginal(batch):
    """"x" and "x2" are log Q(z_i|x_i) - log Q_pool(z_i), Q_pool written as a loop over the 2N
    recognition densities of both views."""
    model = rpm.RPM(RECOGNITION["gaussian"](), PooledImplicitPrior(RBFEnergy()))
    trace = poutine.trace(model.model).get_trace(*batch)
    trace.compute_log_prob()
    q, q2 = model.recognise(*batch)
    components = [q.log_prob, q2.log_prob]
    for name, view, site in (("x", q, "z"), ("x2", q2, "z2")):
        z = trace.nodes[site]["value"]
        expected = torch.stack([
            view.log_prob(z)[i]
            - (torch.logsumexp(torch.cat([c(z[i]) for c in components]), 0) - math.log(2 * N))
            for i in range(N)])
        torch.testing.assert_close(trace.nodes[name]["log_prob"], expected, rtol=1e-12, atol=1e-12)


class TracedPooledPrior(PooledImplicitPrior):
    """The pooled prior without its analytic log-ratio: RPMELBO traces it and subtracts the
    marginals its likelihood_marginals hook names."""

    def log_ratio(self, z, z2, q=None, q2=None, candidates=None, block_size=None):
        return None


@pytest.mark.parametrize("block_size", [None, 3])
@pytest.mark.parametrize("recognition", sorted(RECOGNITION))
def test_traced_elbo_subtracts_the_likelihood_marginals(recognition, block_size, batch):
    encoder = RECOGNITION[recognition]()
    traced = rpm.RPM(encoder, TracedPooledPrior(BilinearEnergy(D, init_scale=0.7)))
    analytic = rpm.RPM(encoder, PooledImplicitPrior(traced.prior.energy))
    pyro.set_rng_seed(3)
    trace_loss = Trace_ELBO().differentiable_loss(traced.model, traced.guide, *batch)
    pyro.set_rng_seed(3)
    traced_loss = rpm.RPMELBO(block_size=block_size).differentiable_loss(
        traced.model, traced.guide, *batch)
    pyro.set_rng_seed(3)
    analytic_loss = rpm.RPMELBO().differentiable_loss(analytic.model, analytic.guide, *batch)
    for loss in (traced_loss, analytic_loss):
        assert abs(loss.item() - trace_loss.item()) < 1e-10 * (1 + abs(trace_loss.item()))
    params = list(traced.parameters())
    for a, b in zip(torch.autograd.grad(trace_loss, params),
                    torch.autograd.grad(traced_loss, params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    if recognition == "delta":
        z, z2 = encode(traced, batch)
        expected = nt_xent_loop(traced.prior.energy, z, z2) - math.log(2 * N - 1)
        assert abs(traced_loss.item() / N - expected) < 1e-10


def test_pooled_marginal_is_the_mixture_of_both_views(batch):
    recognition = RECOGNITION["gaussian"]()
    q, q2 = recognition(batch[0]), recognition(batch[1])
    marginal = pooled_marginal(q, q2)
    value = torch.randn(4, D)
    expected = torch.stack([
        torch.logsumexp(torch.cat([q.log_prob(v), q2.log_prob(v)]), 0) - math.log(2 * N)
        for v in value])
    torch.testing.assert_close(marginal.log_prob(value), expected, rtol=1e-12, atol=1e-12)
    assert marginal.batch_shape == (N,) and marginal.event_shape == (D,)
    assert marginal.sample().shape == (N, D)
    assert marginal.sample((3,)).shape == (3, N, D)


@pytest.mark.parametrize("direction", ["forward", "backward", "both"])
def test_factors_are_the_tilts_of_the_loop(direction, batch):
    """The factors of each direction, at conditioned latents, against the loop of the tilt
    r_i = f(a_i, v_i) - log (1/(2N - 1)) sum_{m != i} exp f(a_i, u_m), u = (z, z2) pooled, with
    weight 1/2 for "both"; every row of the partners moves the forward factor."""
    recognition = RECOGNITION["gaussian"]()
    q, q2 = recognition(batch[0]), recognition(batch[1])
    energy = CosineEnergy(kappa=3.0)
    z, z2 = torch.randn(N, D), torch.randn(N, D, requires_grad=True)
    prior = PooledImplicitPrior(energy, direction=direction)
    trace = poutine.trace(poutine.condition(prior, data={"z": z, "z2": z2})).get_trace(q, q2)
    trace.compute_log_prob()
    u = torch.cat([z, z2]).detach()

    def tilt_loop(anchors, partners, offset):
        total = 0.0
        for i in range(N):
            others = [energy(anchors[i:i + 1], u[m:m + 1]).item()
                      for m in range(2 * N) if m != i + offset]
            log_z = math.log(sum(math.exp(v) for v in others) / (2 * N - 1))
            total += energy(anchors[i:i + 1], partners[i:i + 1]).item() - log_z
        return total

    weight = 0.5 if direction == "both" else 1.0
    expected = {"z_to_z2": weight * tilt_loop(z, z2.detach(), 0),
                "z2_to_z": weight * tilt_loop(z2.detach(), z, N)}
    names = {"forward": ["z_to_z2"], "backward": ["z2_to_z"], "both": ["z_to_z2", "z2_to_z"]}
    for name in names[direction]:
        assert abs(trace.nodes[name]["log_prob"].item() - expected[name]) < 1e-10
    if direction == "forward":
        (grad,) = torch.autograd.grad(trace.nodes["z_to_z2"]["log_prob"], z2)
        assert (grad.abs().sum(-1) > 0).all()


def test_called_with_candidates_as_an_implicit_prior(batch):
    """ImplicitPrior's forward takes (q, q2, candidates), and so does the pooled prior's: the
    batch's own candidates leave every site's log-density as without them; a queue is refused
    as log_ratio refuses it."""
    recognition = RECOGNITION["gaussian"]()
    q, q2 = recognition(batch[0]), recognition(batch[1])
    z, z2 = torch.randn(N, D), torch.randn(N, D)
    prior = PooledImplicitPrior(CosineEnergy(kappa=3.0))

    def log_probs(*candidates):
        conditioned = poutine.condition(prior, data={"z": z, "z2": z2})
        trace = poutine.trace(conditioned).get_trace(q, q2, *candidates)
        trace.compute_log_prob()
        return [trace.nodes[name]["log_prob"] for name in ("z", "z2", "z_to_z2", "z2_to_z")]

    for got, expected in zip(log_probs(Candidates()), log_probs(), strict=True):
        assert torch.equal(got, expected)
    queue = LatentQueue(size=4, dim=D)
    queue.push(torch.randn(3, D))
    with pytest.raises(ValueError, match="no queue form"):
        log_probs(Candidates(queue=queue))


def test_vectorised_particles_with_delta_encoders_equal_one_particle(batch):
    model = rpm.RPM(RECOGNITION["delta"](), PooledImplicitPrior(BilinearEnergy(D, 0.7)))
    single = Trace_ELBO().loss(model.model, model.guide, *batch)
    vectorised = Trace_ELBO(num_particles=3, vectorize_particles=True, max_plate_nesting=1)
    assert abs(vectorised.loss(model.model, model.guide, *batch) - single) < 1e-10 * abs(single)
    assert abs(rpm.RPMELBO().loss(model.model, model.guide, *batch) - single) < 1e-10 * abs(single)


@pytest.mark.parametrize("direction", ["forward", "both"])
def test_vectorised_particles_with_gaussian_encoders_average_the_particles(direction, batch):
    """The same random numbers drawn by hand (z then z2, shape (P, N, D)): the loss is the mean
    over the particles of N (NT-Xent - log(2N - 1)), NT-Xent over the direction's anchors
    written as a loop (the pooled marginals cancel for Gaussian encoders too)."""
    model = rpm.RPM(RECOGNITION["gaussian"](),
                    PooledImplicitPrior(RBFEnergy(lengthscale=0.8), direction=direction))
    particles = 3
    torch.manual_seed(5)
    loss = Trace_ELBO(num_particles=particles, vectorize_particles=True,
                      max_plate_nesting=1).loss(model.model, model.guide, *batch)
    q, q2 = model.recognise(*batch)
    torch.manual_seed(5)
    z, z2 = q.rsample((particles,)).detach(), q2.rsample((particles,)).detach()
    anchors = range(N) if direction == "forward" else None
    expected = sum(N * (nt_xent_loop(model.prior.energy, z[p], z2[p], anchors)
                        - math.log(2 * N - 1)) for p in range(particles)) / particles
    assert abs(loss - expected) < 1e-10 * abs(loss)


def test_predictive_in_parallel(batch):
    model = rpm.RPM(RECOGNITION["delta"](), PooledImplicitPrior(CosineEnergy(kappa=2.0)))
    posterior = Predictive(model.model, guide=model.guide, num_samples=3, parallel=True,
                           return_sites=["z", "z2"])(*batch)
    assert posterior["z"].shape == (3, 1, N, D) and posterior["z2"].shape == (3, 1, N, D)
    torch.testing.assert_close(posterior["z"][1, 0], model.encode(batch[0]).detach())
    for direction in ("both", "forward", "backward"):
        model.prior.direction = direction
        prior_draws = Predictive(model.model, num_samples=2, parallel=True,
                                 return_sites=["z", "z2"])(*batch)
        atoms = torch.cat([model.encode(batch[0]), model.encode(batch[1])]).detach()
        assert prior_draws["z2"].shape == (2, 1, N, D)
        assert Atoms(atoms, 2).check(prior_draws["z"]).all()
        assert Atoms(atoms, 2).check(prior_draws["z2"]).all()


def test_conditioning_z_off_the_atoms_gives_minus_infinity_not_nan(batch):
    model = rpm.RPM(RECOGNITION["delta"](), PooledImplicitPrior(CosineEnergy(kappa=2.0)))
    off = {"z": torch.randn(N, D), "z2": model.encode(batch[1]).detach()}
    pyro.enable_validation(False)
    trace = poutine.trace(poutine.condition(model.model, data=off)).get_trace(*batch)
    trace.compute_log_prob()
    assert trace.log_prob_sum().item() == -math.inf
    for site in trace.nodes.values():
        if site["type"] == "sample":
            assert not torch.isnan(site["log_prob"]).any()


@pytest.mark.parametrize("energy", ["bilinear", "cosine", "rbf", "anisotropic", "lp2", "lp1"])
def test_streamed_normaliser_matches_the_dense_loop(energy):
    """Blocks of 4 rows over 2 x 9 pooled latents: every block boundary case, against a loop."""
    torch.set_default_dtype(torch.float64)
    f = ENERGIES[energy]()
    u = torch.randn(18, D, requires_grad=True)
    expected = torch.stack([
        torch.logsumexp(torch.stack([f(u[k:k + 1], u[m:m + 1])[0, 0]
                                     for m in range(18) if m != k]), 0)
        for k in range(18)])
    for start, stop in [(0, 18), (0, 9), (9, 18), (3, 14)]:
        for block_size in (None, 4, 5, 100):
            got = pooled_log_normalizer(f, u, start, stop, block_size=block_size)
            torch.testing.assert_close(got, expected[start:stop], rtol=1e-12, atol=1e-12)
    weights = torch.randn(18)
    streamed_grad, = torch.autograd.grad((pooled_log_normalizer(f, u, block_size=4)
                                          * weights).sum(), u)
    dense_grad, = torch.autograd.grad((expected * weights).sum(), u)
    torch.testing.assert_close(streamed_grad, dense_grad, rtol=1e-10, atol=1e-12)


class CountingDotEnergy(Energy):
    """A user's energy in a few lines: f(z, z') = z^T z' with its matrix-product factors."""

    calls = 0

    def forward(self, z, z2):
        CountingDotEnergy.calls += 1
        return z @ z2.T

    def logit_factors(self, z, z2):
        return z, z2, None


def test_a_custom_energy_streams_through_its_factorisation_hook():
    torch.set_default_dtype(torch.float64)
    u = torch.randn(18, D)
    f = CountingDotEnergy()
    dense = pooled_log_normalizer(f, u)
    assert CountingDotEnergy.calls == 1
    streamed = pooled_log_normalizer(f, u, block_size=4)
    assert CountingDotEnergy.calls == 1                  # the matrix was never built
    torch.testing.assert_close(streamed, dense, rtol=1e-12, atol=1e-12)


def test_streamed_elbo_matches_dense(batch):
    model = rpm.RPM(RECOGNITION["delta"](), PooledImplicitPrior(CosineEnergy(kappa=5.0)))
    dense = rpm.RPMELBO().loss(model.model, model.guide, *batch)
    streamed = rpm.RPMELBO(block_size=3).loss(model.model, model.guide, *batch)
    assert abs(dense - streamed) < 1e-10 * abs(dense)


def test_streamed_normaliser_in_float32_with_a_dominant_self_term():
    """RBF with far-apart latents: each anchor's own entry (f = 0) would dwarf every candidate,
    so removing it by subtraction would lose everything; the masked blocks keep float32 accuracy."""
    generator = torch.Generator().manual_seed(0)
    u = 30 * torch.randn(64, 4, generator=generator)
    f = RBFEnergy(lengthscale=1.0)
    expected = pooled_log_normalizer(f, u.double(), block_size=None)
    got = pooled_log_normalizer(f, u, block_size=16)
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-3)


def test_bad_arguments_are_refused(batch):
    with pytest.raises(ValueError, match="direction must be one of"):
        PooledImplicitPrior(CosineEnergy(), direction="sideways")
    with pytest.raises(TypeError, match="energy module"):
        PooledImplicitPrior(lambda z, z2: z @ z2.T)
    prior = PooledImplicitPrior(CosineEnergy())
    z, z2 = torch.randn(N, D), torch.randn(N, D)
    with pytest.raises(ValueError, match="global batch"):
        prior.log_ratio(z, z2, candidates=torch.randn(2 * N, D))   # not distributed
    with pytest.raises(ValueError, match="one shape"):
        prior.log_ratio(z, z2[:-1])
    delta = rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D))
    gaussian = rpm.GaussianRecognition(GaussianHead(X_DIM, D))
    with pytest.raises(TypeError, match="both must be Delta"):
        pooled_marginal(delta(batch[0]), gaussian(batch[1]))


SIZES = (5, 7)  # pairs per rank of a global batch


def _global_batch_model():
    torch.manual_seed(2)
    return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
                   PooledImplicitPrior(BilinearEnergy(D, init_scale=0.7)))


def _global_batch_worker(rank, store_path):
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=len(SIZES), timeout=datetime.timedelta(seconds=120))
    try:
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(sum(SIZES), X_DIM, generator=generator)
        x2 = x + 0.3 * torch.randn(sum(SIZES), X_DIM, generator=generator)
        rows = slice(sum(SIZES[:rank]), sum(SIZES[:rank + 1]))
        model = _global_batch_model()
        loss = rpm.RPMELBO(global_batch=True).differentiable_loss(
            model.model, model.guide, x[rows], x2[rows])
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        for grad in grads.values():
            dist.all_reduce(grad)
        reference = _global_batch_model()
        reference_loss = rpm.RPMELBO().differentiable_loss(reference.model, reference.guide, x, x2)
        reference_loss.backward()
        z, z2 = encode(reference, (x, x2))
        expected = nt_xent_loop(reference.prior.energy, z, z2) - math.log(2 * sum(SIZES) - 1)
        assert abs(total.item() / sum(SIZES) - expected) < 1e-10
        torch.testing.assert_close(total, reference_loss.detach(), rtol=0, atol=1e-10)
        for name, p in reference.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-10, msg=name)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
def test_global_batch_over_two_processes_is_nt_xent_of_the_concatenated_batch(tmp_path):
    """Ranks of 5 and 7 pairs: the candidates of every anchor are the 2 x 12 - 1 other latents of
    the global batch; the summed losses and gradients equal one process on all 12 pairs."""
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))   # warm lazy imports before fork
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(_global_batch_worker, args=(str(tmp_path / "store"),), nprocs=len(SIZES),
                       join=True, start_method=method)


def test_svi_lowers_nt_xent():
    """Pyro's SVI with RPMELBO trains the encoder on NT-Xent: near-duplicate pairs of 32 points,
    cosine energy; loss / N is NT-Xent - log 63 >= -log 63."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, X_DIM, generator=generator)
    x2 = x + 0.1 * torch.randn(32, X_DIM, generator=generator)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
                    PooledImplicitPrior(CosineEnergy(kappa=5.0)))
    svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.05}), rpm.RPMELBO())
    before = rpm.RPMELBO().loss(model.model, model.guide, x, x2) / 32
    for _ in range(60):
        svi.step(x, x2)
    after = rpm.RPMELBO().loss(model.model, model.guide, x, x2) / 32
    assert -math.log(63) <= after < before - 0.3
