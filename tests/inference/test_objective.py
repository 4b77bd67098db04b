"""The objective as functions: rpm_elbo on plain embeddings equals RPMELBO on the model that
produced them and the equations' float64 loops; the queue's normaliser in RPMELBO, Trace_ELBO
and a loop."""

import math

import pytest
import torch
from pyro.distributions import Normal
from pyro.infer import Trace_ELBO

import rpm
from rpm._objective import ObjectiveInputs, elbo
from rpm.inference import Candidates, LatentQueue, rpm_elbo
from rpm.priors import (
    CosineEnergy,
    GaussianRandomWalkPrior,
    ImplicitPrior,
    MarkovImplicitPrior,
    PooledImplicitPrior,
    RBFEnergy,
)
from tests.helpers import GaussianHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, D = 7, 3


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def rbf(a, b, lengthscale=0.8):
    return -float(((a - b) ** 2).sum()) / (2 * lengthscale**2)


def info_nce_terms(z, z2, energy=rbf, extra=()):
    """Per pair f(z_i, z2_i) - log (1/M) sum_m e^{f(z_i, c_m)}, candidates c = z2 then extra."""
    candidates = list(z2) + list(extra)
    terms = []
    for i in range(len(z)):
        logits = [energy(z[i], c) for c in candidates]
        terms.append(energy(z[i], z2[i]) - math.log(sum(math.exp(v) for v in logits) / len(logits)))
    return terms


@pytest.mark.parametrize("prior_kind", ["implicit", "pooled"])
def test_rpm_elbo_on_embeddings_equals_rpmelbo_and_the_loop(prior_kind):
    energy = RBFEnergy(lengthscale=0.8)
    prior = ImplicitPrior(energy) if prior_kind == "implicit" else PooledImplicitPrior(energy)
    z, z2 = torch.randn(N, D, requires_grad=True), torch.randn(N, D, requires_grad=True)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), prior)
    value = rpm_elbo(prior, [z, z2])
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, z, z2)
    assert torch.allclose(value, -loss, rtol=1e-13, atol=1e-13)
    grads = torch.autograd.grad(value, [z, z2])
    expected_grads = torch.autograd.grad(-loss, [z, z2])
    for a, b in zip(grads, expected_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-13)
    with torch.no_grad():
        if prior_kind == "implicit":   # ELBO / N = -InfoNCE + log N
            expected = sum(info_nce_terms(z, z2))
        else:                           # the two directions over the 2N - 1 other latents
            u = torch.cat([z, z2])
            expected = 0.0
            for k in range(2 * N):
                partner = (k + N) % (2 * N)
                others = [rbf(u[k], u[m]) for m in range(2 * N) if m != k]
                expected += 0.5 * (rbf(u[k], u[partner])
                                   - math.log(sum(math.exp(v) for v in others) / (2 * N - 1)))
    assert value.item() == pytest.approx(expected, rel=1e-12)


def test_rpm_elbo_with_gaussian_recognitions_equals_rpmelbo_for_an_explicit_prior():
    net = GaussianHead(4, D)
    recognition = rpm.GaussianRecognition(net)
    prior = GaussianRandomWalkPrior(D)
    model = rpm.RPM(recognition, prior)
    x, x2 = torch.randn(N, 4), torch.randn(N, 4)
    torch.manual_seed(2)
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
    q, q2 = model.recognise(x, x2)
    torch.manual_seed(2)
    z, z2 = q.rsample(), q2.rsample()
    value = rpm_elbo(prior, [z, z2], recognitions=[q, q2])
    assert torch.allclose(value, -loss, rtol=1e-13)
    with pytest.raises(ValueError, match="explicit continuous density"):
        rpm_elbo(prior, [z, z2])       # Delta latents under a density: Appendix B


def test_rpm_elbo_over_j_views_is_the_chain_of_infonce_terms():
    energy = RBFEnergy(lengthscale=0.8)
    views = [torch.randn(N, D) for _ in range(4)]
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), MarkovImplicitPrior(energy))
    value = rpm_elbo(model.prior, views)
    expected = sum(sum(info_nce_terms(views[t], views[t + 1])) for t in range(3))
    assert value.item() == pytest.approx(expected, rel=1e-12)
    loss = rpm.RPMELBO().loss(model.model, model.guide, views)
    assert -loss == pytest.approx(value.item(), rel=1e-13)
    with pytest.raises(ValueError, match="pair prior"):
        rpm_elbo(ImplicitPrior(RBFEnergy()), views)


def test_the_queue_joins_the_normaliser_in_rpmelbo_trace_elbo_and_the_loop():
    """Candidates = the batch's z2 then K queued latents: per pair
    f(z_i, z2_i) - log (1/(N + K)) (sum_j e^{f(z_i, z2_j)} + sum_k e^{f(z_i, c_k)})."""
    net = torch.nn.Linear(4, D)
    queue = LatentQueue(size=5, dim=D)
    queue.push(torch.randn(5, D))
    energy = RBFEnergy(lengthscale=0.8)
    model = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(energy), queue=queue)
    x, x2 = torch.randn(N, 4), torch.randn(N, 4)
    fast = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
    slow = Trace_ELBO().differentiable_loss(model.model, model.guide, x, x2)
    params = list(model.parameters())
    assert torch.allclose(fast, slow, rtol=1e-12)
    for a, b in zip(torch.autograd.grad(fast, params), torch.autograd.grad(slow, params),
                    strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        z, z2 = net(x), net(x2)
        expected = sum(info_nce_terms(z, z2, extra=queue.latents()))
        plain = rpm_elbo(model.prior, [z, z2], candidates=Candidates(queue=queue))
    assert -fast.item() == pytest.approx(expected, rel=1e-12)
    assert plain.item() == pytest.approx(expected, rel=1e-12)
    for name, _ in model.named_parameters():     # the queue's buffers are not trained
        assert not name.startswith("queue")
    with pytest.raises(ValueError, match="no queue form"):
        rpm_elbo(PooledImplicitPrior(RBFEnergy()), [z, z2], candidates=Candidates(queue=queue))


def test_cosine_rpm_elbo_is_minus_infonce_plus_log_n_with_cross_entropy():
    """The plain-torch use: the loss users write with cross_entropy, as an RPM ELBO."""
    z, z2 = torch.randn(N, D), torch.randn(N, D)
    value = rpm_elbo(ImplicitPrior(CosineEnergy(kappa=5.0)), [z, z2])
    logits = 5.0 * torch.nn.functional.normalize(z, dim=-1) @ torch.nn.functional.normalize(z2, dim=-1).T
    info_nce = torch.nn.functional.cross_entropy(logits, torch.arange(N))
    assert (value / N).item() == pytest.approx(-info_nce.item() + math.log(N), rel=1e-12)


def test_per_instance_terms_are_the_loops_and_sum_to_the_elbo():
    """per_instance=True: the N terms log P(z_i, z2_i) - log Q(z_i) - log Q(z2_i), through the
    implicit prior's analytic log-ratio (the InfoNCE loop's terms) and through the traced
    explicit prior (a float64 loop of its Gaussian densities and the mixture marginals)."""
    z, z2 = torch.randn(N, D), torch.randn(N, D)
    implicit = ImplicitPrior(RBFEnergy(lengthscale=0.8))
    terms = rpm_elbo(implicit, [z, z2], per_instance=True)
    assert terms.shape == (N,)
    assert terms.tolist() == pytest.approx(info_nce_terms(z, z2), rel=1e-12)
    assert terms.sum().item() == pytest.approx(rpm_elbo(implicit, [z, z2]).item(), rel=1e-13)

    net = GaussianHead(4, D)
    model = rpm.RPM(rpm.GaussianRecognition(net), GaussianRandomWalkPrior(D))
    q, q2 = model.recognise(torch.randn(N, 4), torch.randn(N, 4))
    z, z2 = q.rsample(), q2.rsample()
    terms = rpm_elbo(model.prior, [z, z2], recognitions=[q, q2], per_instance=True)
    total = rpm_elbo(model.prior, [z, z2], recognitions=[q, q2])
    assert terms.sum().item() == pytest.approx(total.item(), rel=1e-12)
    scale, step = model.prior.scale.item(), model.prior.step.item()

    def normal(x, loc, sd):
        return sum(-0.5 * ((a - b) / s) ** 2 - math.log(s * math.sqrt(2 * math.pi))
                   for a, b, s in zip(x, loc, sd, strict=True))

    def mixture(x, dist):
        locs, sds = dist.base_dist.loc.tolist(), dist.base_dist.scale.tolist()
        return math.log(sum(math.exp(normal(x, m, s)) for m, s in zip(locs, sds, strict=True)) / N)

    with torch.no_grad():
        for i in range(N):
            a, b = z[i].tolist(), z2[i].tolist()
            expected = (normal(a, [0.0] * D, [scale] * D) + normal(b, a, [step] * D)
                        - mixture(a, q) - mixture(b, q2))
            assert terms[i].item() == pytest.approx(expected, rel=1e-10)


def test_per_instance_terms_over_j_views_and_a_prior_without_them():
    views = [torch.randn(N, D) for _ in range(3)]
    prior = MarkovImplicitPrior(RBFEnergy(lengthscale=0.8))
    terms = rpm_elbo(prior, views, per_instance=True)
    expected = [sum(pair) for pair in zip(*(info_nce_terms(views[t], views[t + 1])
                                            for t in range(2)), strict=True)]
    assert terms.tolist() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(TypeError, match="per_instance must be True or False"):
        rpm_elbo(prior, views, per_instance=1)


class _TracedImplicitPrior(ImplicitPrior):
    """The implicit prior without its analytic log-ratio: the ELBO traces its whole-batch sites."""

    def log_ratio(self, *args, **kwargs):
        return None


def test_a_traced_prior_over_the_whole_batch_has_a_sum_and_no_per_instance_terms():
    z, z2 = torch.randn(N, D), torch.randn(N, D)
    prior = _TracedImplicitPrior(RBFEnergy(lengthscale=0.8))
    assert rpm_elbo(prior, [z, z2]).item() == pytest.approx(sum(info_nce_terms(z, z2)), rel=1e-12)
    with pytest.raises(ValueError, match="no per-instance terms"):
        rpm_elbo(prior, [z, z2], per_instance=True)


def test_a_structured_guide_needs_a_prior_over_j_views():
    """structured=True takes the closed-form terms of the prior's posterior: a pair prior has
    none, and the error says which prior is needed."""
    q = Normal(torch.zeros(N, 3, D), 1.0).to_event(1)
    inputs = ObjectiveInputs(prior=ImplicitPrior(RBFEnergy()), guides=(q.to_event(1),),
                             recognitions=(q, None), plate="batch", candidates=None,
                             structured=True, sequence=True)
    with pytest.raises(TypeError, match="SequencePrior"):
        elbo(inputs)
