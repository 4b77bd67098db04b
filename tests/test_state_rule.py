"""One state rule: evaluating a density never changes state. A queue of earlier latents is pushed
by the training loop (``prior.push(z)``, ``queue.push(z)``) after the optimiser step, or by a
loss class's ``forward`` under lightly's rule (the memory bank of ``rpm.losses.NTXentLoss``);
no ``forward``, log-ratio or ELBO of a prior, model or inference algorithm pushes, in training
or evaluation mode, with or without gradients. Explicit negatives are a tensor of the step's
``Candidates``, checked against float64 loops of the InfoNCE equation."""

import math

import pytest
import torch
from pyro.infer import JitTrace_ELBO, Predictive, Trace_ELBO

import rpm
from rpm.inference import Candidates, LatentQueue
from rpm.losses import InfoNCELoss
from rpm.priors import CosineEnergy, ImplicitPrior, PartnerMixturePrior, RBFEnergy, StarImplicitPrior

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, J, D, X_DIM = 4, 3, 2, 5


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def _queue_model():
    """The case of the rule: the star prior over J = 3 views with the positives and a queue as
    candidates, N = 4 instances; the queue already holds 7 rows, so every evaluation reads it."""
    queue = LatentQueue(1000, D)
    queue.push(torch.randn(7, D))
    prior = StarImplicitPrior(CosineEnergy(5), candidates="positives", queue=queue)
    net = torch.nn.Linear(X_DIM, D)
    return rpm.RPM(rpm.DeltaRecognition(net), prior), queue, net


def _state(queue: LatentQueue) -> tuple:
    return queue.memory.clone(), int(queue.head), int(queue.filled)


def _rpmelbo_loss(model, views):
    return rpm.RPMELBO().loss(model.model, model.guide, views)


def _rpmelbo_particles(model, views):
    return rpm.RPMELBO(num_particles=3).loss(model.model, model.guide, views)


def _rpmelbo_backward(model, views):
    rpm.RPMELBO().differentiable_loss(model.model, model.guide, views).backward()


def _trace_elbo_particles(model, views):
    return Trace_ELBO(num_particles=3).loss(model.model, model.guide, views)


def _jit_trace_elbo(model, views):
    return JitTrace_ELBO(ignore_jit_warnings=True).loss(model.model, model.guide, views)


def _predictive(model, views):
    return Predictive(model.model, guide=model.guide, num_samples=5)(views)


def _no_grad_loss(model, views):
    with torch.no_grad():
        return rpm.RPMELBO().differentiable_loss(model.model, model.guide, views)


def _rpm_elbo_on_latents(model, views):
    return rpm.inference.rpm_elbo(model.prior, model.encode_views(views))


EVALUATIONS = {
    "RPMELBO.loss": _rpmelbo_loss,
    "RPMELBO(num_particles=3)": _rpmelbo_particles,
    "RPMELBO backward": _rpmelbo_backward,
    "Trace_ELBO(num_particles=3)": _trace_elbo_particles,
    "JitTrace_ELBO": _jit_trace_elbo,
    "Predictive(num_samples=5)": _predictive,
    "no_grad loss": _no_grad_loss,
    "rpm_elbo": _rpm_elbo_on_latents,
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("evaluation", sorted(EVALUATIONS))
def test_no_evaluation_changes_the_queue(evaluation, mode):
    model, queue, _ = _queue_model()
    getattr(model, mode)()
    views = [torch.randn(N, X_DIM) for _ in range(J)]
    before = _state(queue)
    EVALUATIONS[evaluation](model, views)
    after = _state(queue)
    assert torch.equal(after[0], before[0]) and after[1:] == before[1:], \
        f"{evaluation} in {mode} mode moved the queue from {before[1:]} to {after[1:]} (head, filled)"


@pytest.mark.parametrize("centres,global_views,num_views,partners", [
    (None, None, 3, [0, 1, 2]),   # every view a centre: every view some centre's positive
    ([0], None, 2, [1]),          # MoCo: the anchor's positive
    ([0], 1, 3, [1, 2]),          # a global centre: every other view
    ([1], 1, 3, [0]),             # a local centre: the global crop only
])
def test_an_explicit_push_appends_the_partner_views_instance_major(centres, global_views,
                                                                    num_views, partners):
    """``prior.push(z)`` appends rows z[i, p] for i = 1..N and p over the views that are some
    centre's positive, in that order, after what the queue held."""
    queue = LatentQueue(20, D)
    held = torch.randn(3, D)
    queue.push(held)
    prior = PartnerMixturePrior(RBFEnergy(), candidates="positives", centres=centres,
                                global_views=global_views, queue=queue)
    z = torch.randn(N, num_views, D, requires_grad=True)
    prior.push(z * 1.0)
    rows = [z[i, p].tolist() for i in range(N) for p in partners]
    expected = torch.tensor(held.tolist() + rows)
    assert torch.equal(queue.latents(), expected)
    assert not queue.memory.requires_grad


def test_training_with_explicit_pushes_uses_the_latents_of_each_step_forward():
    """The loop: loss, backward, optimiser step, then ``prior.push`` of the step's latents.
    Every step's loss reads the queue of the pushes of the earlier steps' forwards only (checked
    against the loop of the MoCo equation with that queue)."""
    model, queue, net = _queue_model()
    model.prior.centres = [0]
    optimiser = torch.optim.SGD(net.parameters(), lr=0.1)
    pushed = queue.latents().tolist()
    f = lambda a, b: 5 * sum(x * y for x, y in zip(a, b, strict=True)) / (  # noqa: E731
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
    for _ in range(3):
        views = [torch.randn(N, X_DIM) for _ in range(J)]
        z = model.encode_views(views)
        loss = -rpm.inference.rpm_elbo(model.prior, z)
        zl = z.tolist()
        expected = 0.0
        for i in range(N):
            cands = [zl[i][1], zl[i][2]] + pushed
            log_z = math.log(sum(math.exp(f(zl[i][0], c)) for c in cands) / len(cands))
            expected += sum(f(zl[i][0], zl[i][p]) - log_z for p in (1, 2))
        assert abs(-loss.item() - expected) < 1e-10
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        model.prior.push(z)
        pushed += [zl[i][p] for i in range(N) for p in (1, 2)]
        assert torch.equal(queue.latents(), torch.tensor(pushed))


def test_pushing_into_a_prior_without_a_queue_names_the_fix():
    prior = StarImplicitPrior(CosineEnergy())
    with pytest.raises(ValueError, match=r"no queue.*queue=LatentQueue\(K, D\)"):
        prior.push(torch.randn(N, J, D))


# -- explicit negatives ------------------------------------------------------------------------

def _cosine_loop(kappa):
    def f(a, b):
        norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
        return kappa * sum(x * y for x, y in zip(a, b, strict=True)) / norm
    return f


def test_explicit_negatives_are_the_moco_normaliser_with_their_gradient():
    """StarImplicitPrior(candidates="positives", centres=[0]) with ``Candidates(negatives=n)``:
    r_i = f(z_i, z'_i) - log[(e^{f(z_i, z'_i)} + sum_m e^{f(z_i, n_m)}) / (M + 1)], the value
    against a float64 loop and the gradient in the negatives against the same loop in torch
    scalars."""
    kappa, num_negatives = 2.5, 6
    z, z2 = torch.randn(N, D), torch.randn(N, D)
    negatives = torch.randn(num_negatives, D, requires_grad=True)
    prior = StarImplicitPrior(CosineEnergy(kappa), candidates="positives", centres=[0])
    ratio = rpm.inference.rpm_elbo(prior, [z, z2], candidates=Candidates(negatives=negatives),
                                   per_instance=True)
    f = _cosine_loop(kappa)
    za, zb, nl = z.tolist(), z2.tolist(), negatives.tolist()
    expected = [f(za[i], zb[i]) - math.log((math.exp(f(za[i], zb[i]))
                                            + sum(math.exp(f(za[i], m)) for m in nl))
                                           / (num_negatives + 1)) for i in range(N)]
    assert torch.allclose(ratio, torch.tensor(expected), rtol=0, atol=1e-12)

    def scalar_f(a, b):
        return kappa * (a * b).sum() / (a.norm() * b.norm())
    loop = sum(scalar_f(z[i], z2[i]) - torch.log(
        (torch.exp(scalar_f(z[i], z2[i])) + sum(torch.exp(scalar_f(z[i], negatives[m]))
                                                 for m in range(num_negatives)))
        / (num_negatives + 1)) for i in range(N))
    (grad,) = torch.autograd.grad(ratio.sum(), negatives)
    (expected_grad,) = torch.autograd.grad(loop, negatives)
    assert grad.abs().max() > 1e-3
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_explicit_negatives_join_the_batch_in_the_implicit_prior():
    """ImplicitPrior with ``Candidates(negatives=n)``: the normaliser over the batch's z2 and
    the M negatives, r_i = f(z_i, z'_i) - log[(sum_j e^{f(z_i, z'_j)} + sum_m e^{f(z_i, n_m)})
    / (N + M)]."""
    z, z2, negatives = torch.randn(N, D), torch.randn(N, D), torch.randn(3, D)
    prior = ImplicitPrior(CosineEnergy(1.5))
    ratio = rpm.inference.rpm_elbo(prior, [z, z2], candidates=Candidates(negatives=negatives),
                                   per_instance=True)
    f = _cosine_loop(1.5)
    za, cands = z.tolist(), z2.tolist() + negatives.tolist()
    expected = [f(za[i], cands[i]) - math.log(sum(math.exp(f(za[i], c)) for c in cands)
                                              / len(cands)) for i in range(N)]
    assert torch.allclose(ratio, torch.tensor(expected), rtol=0, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_info_nce_loss_with_negatives_is_the_equation(reduction):
    """info-nce-pytorch's unpaired negatives: per query
    -log(e^{F_ii} / (e^{F_ii} + sum_m e^{q_i . n_m / tau})) on unit vectors."""
    tau, num_negatives = 0.3, 5
    query, key = torch.randn(N, D), torch.randn(N, D)
    negatives = torch.randn(num_negatives, D)
    loss = InfoNCELoss(temperature=tau, reduction=reduction)(query, key, negatives)
    f = _cosine_loop(1 / tau)
    q, k, nl = query.tolist(), key.tolist(), negatives.tolist()
    per_query = [-(f(q[i], k[i]) - math.log(math.exp(f(q[i], k[i]))
                                            + sum(math.exp(f(q[i], m)) for m in nl)))
                 for i in range(N)]
    expected = {"mean": sum(per_query) / N, "sum": sum(per_query), "none": per_query}[reduction]
    assert torch.allclose(loss, torch.tensor(expected), rtol=0, atol=1e-12)


def test_bad_explicit_negatives_are_refused():
    with pytest.raises(ValueError, match=r"negatives must be a tensor of shape \(M, D\)"):
        Candidates(negatives=torch.zeros(3))
    with pytest.raises(ValueError, match="a queue or explicit negatives, not both"):
        Candidates(queue=LatentQueue(3, D), negatives=torch.zeros(2, D))
    queue_prior = StarImplicitPrior(CosineEnergy(), candidates="positives", queue=LatentQueue(3, D))
    with pytest.raises(ValueError, match="holds its own queue"):
        rpm.inference.rpm_elbo(queue_prior, torch.randn(N, J, D),
                               candidates=Candidates(negatives=torch.randn(2, D)))
    bare = StarImplicitPrior(CosineEnergy(), candidates="positives")
    with pytest.raises(ValueError, match=r"queue=LatentQueue\(K, D\).*Candidates\(negatives="):
        rpm.inference.rpm_elbo(bare, torch.randn(N, J, D))
