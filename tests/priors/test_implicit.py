"""The implicit prior as honest Pyro distributions: its sites are the recognition mixtures as
whole-batch events and its coupling the factor "z_to_z2", checked against a loop written from
the conditional's equation; supports, leading dimensions, off-atom values; the pair model under
vectorised particles, Predictive and poutine.scale."""

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions import Delta, Normal
from pyro.infer import Predictive, Trace_ELBO

import rpm
from rpm.priors import CosineEnergy, ImplicitPrior, RBFEnergy
from rpm.priors._implicit import tilt_factor
from tests.helpers import GaussianHead

N, X_DIM, D = 6, 4, 2


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def loop_log_prob(energy, z, value, loc, scale):
    """sum_i [log Q(z'_i) + f(z_i, z'_i) - log (1/N) sum_j exp f(z_i, z'_j)], Q the Gaussian
    mixture of (loc, scale), each term written out with math."""
    total = 0.0
    for i in range(N):
        mixture = [
            math.exp(sum(-0.5 * ((value[i, d] - loc[n][d]) / scale[n][d]) ** 2
                         - math.log(scale[n][d] * math.sqrt(2 * math.pi)) for d in range(D)))
            for n in range(N)
        ]
        logits = [float(energy(z[i:i + 1], value[j:j + 1])) for j in range(N)]
        total += math.log(sum(mixture) / N) + logits[i] - math.log(
            sum(math.exp(v) for v in logits) / N)
    return total


def gaussian_q():
    loc, scale = torch.randn(N, D), torch.rand(N, D) + 0.5
    return Normal(loc, scale).to_event(1), loc, scale


def prior_trace(prior, q, q2, z, z2):
    """The prior's program with its sites conditioned on (z, z2), log-densities computed."""
    data = {"z": z, "z2": z2}
    trace = poutine.trace(poutine.condition(prior, data=data)).get_trace(q, q2)
    trace.compute_log_prob()
    return trace


def test_sites_are_the_mixtures_and_the_factor_is_the_tilt_matching_the_loop():
    """"z" and "z2" are N draws of each view's recognition mixture, one event over the batch;
    the factor "z_to_z2" is the tilt, and log Q(z'_i) summed plus the tilt is the loop of the
    implicit conditional's equation."""
    q, _, _ = gaussian_q()
    q2, loc, scale = gaussian_q()
    energy = RBFEnergy(lengthscale=0.8)
    z, value = torch.randn(N, D), torch.randn(N, D)
    trace = prior_trace(ImplicitPrior(energy), q, q2, z, value)
    for name, view in (("z", q), ("z2", q2)):
        fn = trace.nodes[name]["fn"]
        assert fn.batch_shape == () and fn.event_shape == (N, D)
        assert isinstance(fn.base_dist, rpm.MixtureMarginal) and fn.base_dist.q is view
        assert not fn.support.is_discrete and fn.support.event_dim == 2
    factor = trace.nodes["z_to_z2"]
    assert factor["is_observed"] and factor["log_prob"].shape == ()
    with torch.no_grad():
        expected = loop_log_prob(energy, z, value, loc.tolist(), scale.tolist())
    got = trace.nodes["z2"]["log_prob"] + factor["log_prob"]
    assert got.item() == pytest.approx(expected, rel=1e-12)
    sites = [name for name, site in trace.nodes.items() if site["type"] == "sample"]
    assert sites == ["z", "z2", "z_to_z2"]


def test_every_row_of_the_partners_moves_the_factor():
    """The rows are coupled through the normaliser: the gradient of the factor with respect to
    each row of z2 is nonzero (a sum of per-row terms of each row's own would not couple them)."""
    q, _, _ = gaussian_q()
    q2, _, _ = gaussian_q()
    z, value = torch.randn(N, D), torch.randn(N, D, requires_grad=True)
    trace = prior_trace(ImplicitPrior(CosineEnergy(kappa=3.0)), q, q2, z, value)
    (grad,) = torch.autograd.grad(trace.nodes["z_to_z2"]["log_prob"], value)
    assert (grad.abs().sum(-1) > 0).all()


def test_tilt_factor_is_one_value_per_batch_of_the_leading_dimensions():
    """Values (3, N, D) against (N, D): the factor is (3,), each entry the tilt of one batch."""
    energy = RBFEnergy()
    z, values = torch.randn(N, D), torch.randn(3, N, D)
    def ratio(a, b):  # Eq. 24 per pair: F_ii - logsumexp_j F_ij + log N
        logits = energy(a, b)
        return logits.diagonal(dim1=-2, dim2=-1) - logits.logsumexp(-1) + math.log(N)

    with poutine.trace() as tracer:
        log_weight = tilt_factor("t", ratio, z, values)
    expected = torch.stack([ratio(z, v).sum() for v in values])
    assert log_weight.shape == (3,)
    torch.testing.assert_close(log_weight, expected, rtol=0, atol=1e-12)
    tracer.trace.compute_log_prob()
    torch.testing.assert_close(tracer.trace.nodes["t"]["log_prob"], expected, rtol=0, atol=0)


def test_delta_sites_are_discrete_and_minus_infinite_off_the_atoms():
    points = torch.randn(N, D)
    q, q2 = Delta(torch.randn(N, D), event_dim=1), Delta(points, event_dim=1)
    pyro.enable_validation(False)
    trace = prior_trace(ImplicitPrior(RBFEnergy()), q, q2, q.v, points[torch.randperm(N)])
    assert trace.nodes["z2"]["fn"].support.is_discrete
    assert torch.isfinite(trace.nodes["z2"]["log_prob"])
    off = points.clone()
    off[2, 0] += 0.5
    trace = prior_trace(ImplicitPrior(RBFEnergy()), q, q2, q.v, off)
    assert trace.nodes["z2"]["log_prob"].item() == -math.inf
    assert torch.isfinite(trace.nodes["z_to_z2"]["log_prob"])


def delta_rpm():
    return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)), ImplicitPrior(RBFEnergy()))


def gaussian_rpm():
    return rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), ImplicitPrior(RBFEnergy()))


def batch():
    x = torch.randn(N, X_DIM)
    return x, x + 0.2 * torch.randn(N, X_DIM)


def test_conditioning_z_off_the_atoms_gives_minus_infinity_not_nan():
    model = delta_rpm()
    x, x2 = batch()
    off = {"z": torch.randn(N, D), "z2": model.encode(x2).detach()}
    pyro.enable_validation(False)
    trace = poutine.trace(poutine.condition(model.model, data=off)).get_trace(x, x2)
    trace.compute_log_prob()
    log_joint = trace.log_prob_sum()
    assert log_joint.item() == -math.inf
    assert not torch.isnan(trace.nodes["x"]["log_prob"]).any()


def test_vectorised_particles_with_delta_encoders_equal_one_particle():
    model = delta_rpm()
    x, x2 = batch()
    single = Trace_ELBO().loss(model.model, model.guide, x, x2)
    vectorised = Trace_ELBO(num_particles=4, vectorize_particles=True, max_plate_nesting=1)
    assert vectorised.loss(model.model, model.guide, x, x2) == pytest.approx(single, rel=1e-12)
    assert rpm.RPMELBO().loss(model.model, model.guide, x, x2) == pytest.approx(single, rel=1e-12)


def test_vectorised_particles_with_gaussian_encoders_average_the_particles():
    """The same random numbers drawn by hand (z then z2, shape (P, N, D)): the mean over the
    particles of the RPM's per-batch log-ratio."""
    model = gaussian_rpm()
    x, x2 = batch()
    particles = 3
    torch.manual_seed(5)
    loss = Trace_ELBO(num_particles=particles, vectorize_particles=True,
                      max_plate_nesting=1).loss(model.model, model.guide, x, x2)
    q, q2 = model.recognise(x, x2)
    torch.manual_seed(5)
    z, z2 = q.rsample((particles,)), q2.rsample((particles,))
    with torch.no_grad():
        expected = -sum(rpm.inference.rpm_elbo(model.prior, [z[p], z2[p]], [q, q2]).item()
                        for p in range(particles))
    assert loss == pytest.approx(expected / particles, rel=1e-10)


def test_predictive_in_parallel():
    model = delta_rpm()
    x, x2 = batch()
    samples = Predictive(model.model, guide=model.guide, num_samples=3, parallel=True,
                         return_sites=["z", "z2"])(x, x2)
    # whole-batch events under Predictive's plate at dim -2: batch (3, 1), event (N, D)
    assert samples["z"].shape == (3, 1, N, D) and samples["z2"].shape == (3, 1, N, D)
    torch.testing.assert_close(samples["z"][1, 0], model.encode(x).detach())
    prior_draws = Predictive(model.model, num_samples=2, parallel=True,
                             return_sites=["z", "z2"])(x, x2)
    atoms = model.encode(x2).detach()
    assert prior_draws["z2"].shape == (2, 1, N, D)
    assert rpm.marginals._mixture_marginal.Atoms(atoms, 2).check(prior_draws["z2"]).all()


@pytest.mark.parametrize("build", [delta_rpm, gaussian_rpm], ids=["delta", "gaussian"])
def test_rpmelbo_honours_poutine_scale(build):
    model = build()
    x, x2 = batch()
    scale = 2.5
    scaled = (poutine.scale(model.model, scale=scale), poutine.scale(model.guide, scale=scale))
    torch.manual_seed(1)
    unscaled = rpm.RPMELBO().loss(model.model, model.guide, x, x2)
    torch.manual_seed(1)
    assert rpm.RPMELBO().loss(*scaled, x, x2) == pytest.approx(scale * unscaled, rel=1e-10)
    torch.manual_seed(1)
    assert Trace_ELBO().loss(*scaled, x, x2) == pytest.approx(scale * unscaled, rel=1e-10)
    torch.manual_seed(1)
    with poutine.scale(scale=0.5):
        around = rpm.RPMELBO().loss(*scaled, x, x2)
    assert around == pytest.approx(0.5 * scale * unscaled, rel=1e-10)
    torch.manual_seed(1)
    with poutine.scale(scale=0.5), poutine.trace() as tracer:  # the direct evaluation
        direct = rpm.RPMELBO().loss(model.model, model.guide, x, x2)
    assert direct == pytest.approx(0.5 * unscaled, rel=1e-12)
    assert not any(site["type"] == "sample" for site in tracer.trace.nodes.values())


def test_rpmelbo_defers_to_trace_elbo_under_handlers_it_does_not_compute():
    """A model wrapped in handlers (condition, a scale of the model alone) or a call under
    poutine.mask is evaluated by Pyro's Trace_ELBO, which honours them: the
    same numbers as Trace_ELBO from the same random state."""
    model = gaussian_rpm()
    x, x2 = batch()
    cases = [
        (poutine.condition(model.model, data={"z": torch.zeros(N, D)}), model.guide, None),
        (poutine.scale(model.model, scale=2.0), model.guide, None),
        (model.model, model.guide, 0.5),
    ]
    for fn, guide, mask in cases:
        values = []
        for elbo in (rpm.RPMELBO(), Trace_ELBO()):
            torch.manual_seed(3)
            if mask is None:
                values.append(elbo.loss(fn, guide, x, x2))
            else:
                with poutine.mask(mask=torch.tensor(True)), poutine.scale(scale=mask):
                    values.append(elbo.loss(fn, guide, x, x2))
        assert values[0] == pytest.approx(values[1], rel=1e-12)
    with pytest.raises(NotImplementedError, match="global_batch"):
        rpm.RPMELBO(global_batch=True).loss(poutine.scale(model.model, scale=2.0),
                                            poutine.scale(model.guide, scale=2.0), x, x2)


def loop_infonce_terms(energy, z, candidates):
    """f(z_i, z'_i) - log (1/M) sum_j exp f(z_i, c_j) for each i, written out with math."""
    terms = []
    for i in range(z.shape[0]):
        logits = [float(energy(z[i:i + 1], candidates[j:j + 1])) for j in range(candidates.shape[0])]
        terms.append(logits[i] - math.log(sum(math.exp(v) for v in logits) / len(logits)))
    return terms


@pytest.mark.parametrize("energy", [CosineEnergy(kappa=5.0), RBFEnergy(lengthscale=0.7),
                                    rpm.priors.BilinearEnergy(D, init_scale=0.5)],
                         ids=["cosine", "rbf", "bilinear"])
def test_log_ratio_sum_is_the_sum_of_the_per_pair_terms(energy):
    """The trace form of the implicit prior's sum (the batch's own candidates, dense) equals the
    sum of its per-pair terms and the loop, in value and gradient; streamed (block_size) and
    with a queue (other candidates) it is the sum of log_ratio."""
    prior = ImplicitPrior(energy)
    z = torch.randn(N, D, requires_grad=True)
    z2 = torch.randn(N, D, requires_grad=True)
    total = prior.log_ratio_sum(z, z2)
    assert total.dim() == 0
    assert total.item() == pytest.approx(sum(loop_infonce_terms(energy, z, z2)), rel=1e-12)
    terms = prior.log_ratio(z, z2)
    assert total.item() == pytest.approx(terms.sum().item(), rel=1e-13)
    grads = torch.autograd.grad(total, (z, z2))
    expected = torch.autograd.grad(terms.sum(), (z, z2))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)
    streamed = prior.log_ratio_sum(z, z2, block_size=2)
    assert streamed.item() == pytest.approx(total.item(), rel=1e-12)
    queue = torch.randn(3, D)
    candidates = rpm.inference.Candidates(queue=rpm.inference.LatentQueue(3, D))
    candidates.queue.push(queue)
    queued = prior.log_ratio_sum(z, z2, candidates=candidates)
    loop = loop_infonce_terms(energy, z, torch.cat([z2, queue]))
    assert queued.item() == pytest.approx(sum(loop), rel=1e-12)


def test_a_subclass_that_redefines_log_ratio_gets_the_sum_of_its_own_terms():
    """ImplicitPrior's trace form of the sum is its own log_ratio's; a subclass that redefines
    log_ratio only gets its terms summed, by log_ratio_sum and by RPMELBO."""

    class Shifted(ImplicitPrior):
        def log_ratio(self, z, z2, q=None, q2=None, candidates=None, block_size=None):
            return super().log_ratio(z, z2, q, q2, candidates, block_size) + 1.0

    z, z2 = torch.randn(N, D), torch.randn(N, D)
    plain, shifted = ImplicitPrior(RBFEnergy()), Shifted(RBFEnergy())
    assert shifted.log_ratio_sum(z, z2).item() == pytest.approx(
        plain.log_ratio_sum(z, z2).item() + N, rel=1e-12)
    net = torch.nn.Linear(X_DIM, D)
    x, x2 = torch.randn(N, X_DIM), torch.randn(N, X_DIM)
    losses = [rpm.RPMELBO().loss(model.model, model.guide, x, x2)
              for model in (rpm.RPM(rpm.DeltaRecognition(net), prior(RBFEnergy()))
                            for prior in (ImplicitPrior, Shifted))]
    assert losses[1] == pytest.approx(losses[0] - N, rel=1e-12)
