"""The J-view implicit priors (rpm.priors.StarImplicitPrior, PartnerMixturePrior) against float64
loops written from their equations (docs/theory.md, "J-view priors"): the ELBO through rpm.RPM
with RPMELBO and Trace_ELBO, the identities ELBO / (N (J-1)) = -L_out + log D and
ELBO / N = -L_in + log(D / (J-1)) at J = 2, 3, 4, 6 for several energies and both candidate
sets, J = 2 = NT-Xent, the multi-crop rule, and the queue (MoCo: ELBO / N = -L_MoCo + log(K+1),
first in first out, explicit pushes by the loop, checkpoints)."""

import datetime
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pyro.infer import Trace_ELBO

import rpm
from rpm.inference import Candidates, LatentQueue
from rpm.priors import (
    BilinearEnergy,
    CosineEnergy,
    ImplicitPrior,
    LpEnergy,
    PartnerMixturePrior,
    PooledImplicitPrior,
    RBFEnergy,
    StarImplicitPrior,
)
from rpm.priors._multiview_terms import (
    multiview_anchor_terms,
    multiview_masks,
    positive_index,
)
from tests.helpers import GaussianHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D, X_DIM = 3, 4
PRIORS = {"star": StarImplicitPrior, "mixture": PartnerMixturePrior}


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


# -- float64 loops from the equations ----------------------------------------------------------

def _cosine(kappa):
    def f(a, b):
        na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
        return kappa * sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)
    return f


def _rbf(lengthscale):
    return lambda a, b: -sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) / (2 * lengthscale ** 2)


def _lp(p, tau):
    return lambda a, b: -sum(abs(x - y) ** p for x, y in zip(a, b, strict=True)) / tau


def _bilinear(weight):
    w = weight.tolist()
    return lambda a, b: sum(a[r] * w[r][c] * b[c] for r in range(len(a)) for c in range(len(b)))


ENERGIES = {
    # name: (module, its float64 loop)
    "cosine": lambda: (CosineEnergy(kappa=2.5), _cosine(2.5)),
    "rbf": lambda: (RBFEnergy(0.8), _rbf(0.8)),
    "lp1": lambda: (LpEnergy(p=1.0, tau=0.7), _lp(1.0, 0.7)),
    "bilinear": lambda: _bilinear_pair(),
}


def _bilinear_pair():
    energy = BilinearEnergy(D)
    with torch.no_grad():
        energy.weight.add_(0.3 * torch.randn(D, D))
    return energy, _bilinear(energy.weight.detach())


def _sets(z, i, c, candidates, global_views, queue):
    """Positive view indices and candidate latents of anchor (i, c), from the definitions."""
    num, num_views = len(z), len(z[0])
    local = global_views is not None and c >= global_views
    allowed = (lambda j: j < global_views) if local else (lambda j: True)
    positives = [p for p in range(num_views) if p != c and allowed(p)]
    if candidates == "pooled":
        cands = [z[a][b] for a in range(num) for b in range(num_views)
                 if (a, b) != (i, c) and allowed(b)]
    elif candidates == "cross_view":
        cands = [z[a][b] for a in range(num) for b in range(num_views) if b != c and allowed(b)]
    else:
        cands = [z[i][p] for p in positives]
    return positives, cands + list(queue)


def elbo_loop(z, f, form, candidates="pooled", global_views=None, centres=None, queue=()):
    """The prior's ELBO summed over the instances: per instance, the average over the centres c
    of r_c (star: sum over positives of f - log Z-hat; mixture: log mean over positives of e^f -
    log Z-hat), Z-hat the mean of e^f over the candidates."""
    num_views = len(z[0])
    centres = list(range(num_views)) if centres is None else centres
    total = 0.0
    for i in range(len(z)):
        for c in centres:
            positives, cands = _sets(z, i, c, candidates, global_views, queue)
            if not positives:
                continue
            log_z = math.log(sum(math.exp(f(z[i][c], m)) for m in cands) / len(cands))
            if form == "star":
                r = sum(f(z[i][c], z[i][p]) - log_z for p in positives)
            else:
                r = math.log(sum(math.exp(f(z[i][c], z[i][p])) for p in positives)
                             / len(positives)) - log_z
            total += r / len(centres)
    return total


def loss_loop(z, f, form, candidates="pooled", global_views=None, centres=None, queue=()):
    """L_out (mean over anchors k and positives p of -log e^f(k,p) / sum_C e^f) or L_in (mean
    over anchors of -log sum_P e^f / sum_C e^f), and the mean log |C(k)| (star: per positive)."""
    num_views = len(z[0])
    centres = list(range(num_views)) if centres is None else centres
    losses, log_ds = [], []
    for i in range(len(z)):
        for c in centres:
            positives, cands = _sets(z, i, c, candidates, global_views, queue)
            if not positives:
                continue
            log_norm = math.log(sum(math.exp(f(z[i][c], m)) for m in cands))
            if form == "star":
                for p in positives:
                    losses.append(-(f(z[i][c], z[i][p]) - log_norm))
                    log_ds.append(math.log(len(cands)))
            else:
                losses.append(-(math.log(sum(math.exp(f(z[i][c], z[i][p])) for p in positives))
                                - log_norm))
                log_ds.append(math.log(len(cands) / len(positives)))
    return sum(losses) / len(losses), sum(log_ds) / len(log_ds)


def _model(prior, num_views, gaussian=False):
    net = GaussianHead(X_DIM, D) if gaussian else torch.nn.Linear(X_DIM, D)
    wrap = rpm.GaussianRecognition if gaussian else rpm.DeltaRecognition
    return rpm.RPM(wrap(net), prior), net


def _latents(net, views):
    with torch.no_grad():
        return [[net(v)[i].tolist() for v in views] for i in range(views[0].shape[0])]


# -- the identities ------------------------------------------------------------------------------

@pytest.mark.parametrize("num_views,num", [(2, 5), (3, 4), (4, 3), (6, 2)])
@pytest.mark.parametrize("energy", sorted(ENERGIES))
@pytest.mark.parametrize("form", sorted(PRIORS))
@pytest.mark.parametrize("candidates", ["pooled", "cross_view"])
def test_elbo_matches_the_loop_and_the_loss_identity(num_views, num, energy, form, candidates):
    module, f = ENERGIES[energy]()
    model, net = _model(PRIORS[form](module, candidates=candidates), num_views)
    views = [torch.randn(num, X_DIM) for _ in range(num_views)]
    fast = -rpm.RPMELBO().loss(model.model, model.guide, views)
    slow = -Trace_ELBO().loss(model.model, model.guide, views)
    z = _latents(net, views)
    expected = elbo_loop(z, f, form, candidates)
    assert abs(fast - expected) < 1e-10 * max(1.0, abs(expected))
    assert abs(slow - expected) < 1e-10 * max(1.0, abs(expected))
    loss, _ = loss_loop(z, f, form, candidates)
    size = num * num_views - 1 if candidates == "pooled" else num * (num_views - 1)
    if form == "star":  # ELBO / (N (J - 1)) = -L_out + log D
        assert abs(fast / (num * (num_views - 1)) - (-loss + math.log(size))) < 1e-10
    else:  # ELBO / N = -L_in + log(D / (J - 1))
        assert abs(fast / num - (-loss + math.log(size / (num_views - 1)))) < 1e-10


@pytest.mark.parametrize("form", sorted(PRIORS))
def test_two_views_with_pooled_candidates_are_nt_xent(form):
    """J = 2: both priors are PooledImplicitPrior (NT-Xent), in value and gradients."""
    energy = CosineEnergy(kappa=1 / 0.3)
    net = torch.nn.Linear(X_DIM, D)
    views = [torch.randn(7, X_DIM) for _ in range(2)]
    ours = rpm.RPM(rpm.DeltaRecognition(net), PRIORS[form](energy))
    pooled = rpm.RPM(rpm.DeltaRecognition(net), PooledImplicitPrior(energy))
    a = rpm.RPMELBO().differentiable_loss(ours.model, ours.guide, views)
    b = rpm.RPMELBO().differentiable_loss(pooled.model, pooled.guide, *views)
    assert abs(a.item() - b.item()) < 1e-12
    for ga, gb in zip(torch.autograd.grad(a, list(net.parameters())),
                      torch.autograd.grad(b, list(net.parameters())), strict=True):
        assert torch.allclose(ga, gb, atol=1e-12)


@pytest.mark.parametrize("form", sorted(PRIORS))
def test_two_views_with_cross_view_candidates_are_the_symmetric_infonce(form):
    """J = 2, cross-view candidates: the mean of ImplicitPrior's ELBOs in both directions (CLIP)."""
    energy = BilinearEnergy(D)
    net = torch.nn.Linear(X_DIM, D)
    x, x2 = torch.randn(6, X_DIM), torch.randn(6, X_DIM)
    ours = rpm.RPM(rpm.DeltaRecognition(net), PRIORS[form](energy, candidates="cross_view"))
    pair = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(energy))
    value = rpm.RPMELBO().loss(ours.model, ours.guide, [x, x2])
    forward = rpm.RPMELBO().loss(pair.model, pair.guide, x, x2)
    backward = rpm.RPMELBO().loss(pair.model, pair.guide, x2, x)
    assert abs(value - 0.5 * (forward + backward)) < 1e-12


@pytest.mark.parametrize("form", sorted(PRIORS))
@pytest.mark.parametrize("candidates", ["pooled", "cross_view"])
def test_rpmelbo_equals_trace_elbo_in_gradients_and_for_gaussian_encoders(form, candidates):
    energy = RBFEnergy(0.9)
    for gaussian in (False, True):
        model, net = _model(PRIORS[form](energy, candidates=candidates), 3, gaussian=gaussian)
        views = [torch.randn(4, X_DIM) for _ in range(3)]
        params = list(net.parameters()) + list(energy.parameters())
        torch.manual_seed(1)
        a = rpm.RPMELBO().differentiable_loss(model.model, model.guide, views)
        torch.manual_seed(1)
        b = Trace_ELBO().differentiable_loss(model.model, model.guide, views)
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
        for ga, gb in zip(torch.autograd.grad(a, params), torch.autograd.grad(b, params), strict=True):
            assert torch.allclose(ga, gb, rtol=1e-10, atol=1e-12)


def test_the_masks_and_the_terms_against_the_loop():
    """multiview_masks and multiview_anchor_terms on a batch of J = 3 (the losses L_out and L_in
    against loss_loop: tests/test_losses_multiview.py)."""
    num, num_views = 4, 3
    z = torch.randn(num, num_views, D)
    f = _rbf(1.1)
    energy = RBFEnergy(1.1)
    rows = z.reshape(-1, D)
    instance = torch.arange(num).repeat_interleave(num_views)
    view = torch.arange(num_views).repeat(num)
    for candidates in ("pooled", "cross_view"):
        positives, allowed = multiview_masks(instance, view, instance, view, candidates)
        for form in ("star", "mixture"):
            terms = multiview_anchor_terms(energy(rows, rows), positives, allowed, form)
            indexed = multiview_anchor_terms(energy(rows, rows), positives, allowed, form,
                                             index=positive_index(positives))
            assert torch.allclose(indexed.ratio, terms.ratio, rtol=1e-14, atol=1e-14)
            assert abs(terms.ratio.sum().item() / num_views
                       - elbo_loop(z.tolist(), f, form, candidates)) < 1e-10


# -- multi-crop --------------------------------------------------------------------------------

@pytest.mark.parametrize("form", sorted(PRIORS))
@pytest.mark.parametrize("candidates", ["pooled", "cross_view"])
def test_multi_crop_rule_with_per_group_encoders(form, candidates):
    """2 global crops (length 8) and 3 local crops (length 3), one encoder per group: a local
    crop's positives and candidates are the global crops only."""
    global_net, local_net = torch.nn.Linear(8, D), torch.nn.Linear(3, D)
    prior = PRIORS[form](CosineEnergy(kappa=3.0), candidates=candidates, global_views=2)
    model = rpm.RPM([rpm.DeltaRecognition(global_net), rpm.DeltaRecognition(local_net)], prior,
                    groups=[0, 0, 1, 1, 1])
    num = 4
    views = [torch.randn(num, 8), torch.randn(num, 8)] + [torch.randn(num, 3) for _ in range(3)]
    fast = -rpm.RPMELBO().loss(model.model, model.guide, views)
    slow = -Trace_ELBO().loss(model.model, model.guide, views)
    with torch.no_grad():
        latents = torch.stack([global_net(v) for v in views[:2]]
                              + [local_net(v) for v in views[2:]], dim=1)
    expected = elbo_loop(latents.tolist(), _cosine(3.0), form, candidates, global_views=2)
    assert abs(fast - expected) < 1e-10 and abs(slow - expected) < 1e-10
    # the rule changes the value: without it the locals contrast with each other too
    assert abs(elbo_loop(latents.tolist(), _cosine(3.0), form, candidates) - expected) > 1e-3


def test_multi_crop_through_one_encoder_of_views_of_different_shapes():
    """One encoder (pooling over the last axis) for crops of lengths 8 and 3, per view."""

    class PoolThenLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, D)

        def forward(self, x):                        # (N, 2, L) -> (N, D)
            return self.linear(x.mean(-1))

    net = PoolThenLinear()
    model = rpm.RPM(rpm.DeltaRecognition(net), StarImplicitPrior(RBFEnergy(0.7), global_views=2))
    views = [torch.randn(3, 2, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 3), torch.randn(3, 2, 3)]
    value = -rpm.RPMELBO().loss(model.model, model.guide, views)
    expected = elbo_loop(_latents(net, views), _rbf(0.7), "star", global_views=2)
    assert abs(value - expected) < 1e-10


# -- the queue ---------------------------------------------------------------------------------

def test_queue_with_own_positive_candidates_is_moco():
    """centres=[0], candidates {own positive} + queue, J = 2: ELBO / N = -L_MoCo + log(K + 1)."""
    num, size, tau = 5, 7, 0.2
    queue = LatentQueue(size, D)
    queue.push(torch.randn(size, D))
    prior = StarImplicitPrior(CosineEnergy(kappa=1 / tau), candidates="positives", centres=[0],
                              queue=queue)
    model, net = _model(prior, 2)
    views = [torch.randn(num, X_DIM) for _ in range(2)]
    elbo = -rpm.RPMELBO().loss(model.model, model.guide, views)
    z = _latents(net, views)
    bank = queue.latents().tolist()
    f = _cosine(1 / tau)
    moco = sum(-(f(z[i][0], z[i][1]) - math.log(math.exp(f(z[i][0], z[i][1]))
                                                + sum(math.exp(f(z[i][0], c)) for c in bank)))
               for i in range(num)) / num
    assert abs(elbo / num - (-moco + math.log(size + 1))) < 1e-10
    assert abs(-Trace_ELBO().loss(model.model, model.guide, views) - elbo) < 1e-10
    assert abs(elbo - elbo_loop(z, f, "star", "positives", centres=[0], queue=bank)) < 1e-10


@pytest.mark.parametrize("form", sorted(PRIORS))
@pytest.mark.parametrize("global_views,centres", [(None, None), (2, None), (None, [1, 3]),
                                                  (1, [0, 2])])
def test_own_positive_candidates_over_j_views_match_the_loop(form, global_views, centres):
    """candidates="positives" reads only each anchor's own instance's views (and the queue):
    J = 4, the multi-crop rule and chosen centres, against the loop over the whole batch."""
    queue = LatentQueue(6, D)
    queue.push(torch.randn(6, D))
    prior = PRIORS[form](RBFEnergy(1.2), candidates="positives", global_views=global_views,
                         centres=centres, queue=queue)
    z = torch.randn(5, 4, D)
    expected = elbo_loop(z.tolist(), _rbf(1.2), form, "positives", global_views, centres,
                         queue.latents().tolist())
    assert abs(rpm.inference.rpm_elbo(prior, z).item() - expected) < 1e-10


@pytest.mark.parametrize("form", sorted(PRIORS))
def test_queue_joins_pooled_candidates(form):
    queue = LatentQueue(6, D)
    queue.push(torch.randn(6, D))
    model, net = _model(PRIORS[form](RBFEnergy(1.3), queue=queue), 3)
    views = [torch.randn(3, X_DIM) for _ in range(3)]
    value = -rpm.RPMELBO().loss(model.model, model.guide, views)
    expected = elbo_loop(_latents(net, views), _rbf(1.3), form, queue=queue.latents().tolist())
    assert abs(value - expected) < 1e-10


def test_the_loop_pushes_the_partner_views_first_in_first_out():
    queue = LatentQueue(5, D)
    prior = StarImplicitPrior(CosineEnergy(), candidates="positives", centres=[0], queue=queue)
    model, net = _model(prior, 2)
    batches = [[torch.randn(2, X_DIM) for _ in range(2)] for _ in range(3)]
    for views in batches:  # the loop: the step's loss, then the push of view 1's latents
        rpm.RPMELBO().differentiable_loss(model.model, model.guide, views).backward()
        model.prior.push(model.encode_views(views))
    with torch.no_grad():
        pushed = torch.cat([net(views[1]) for views in batches])          # (6, D), oldest first
    assert len(queue) == 5
    assert torch.equal(queue.latents(), pushed[-5:])
    for mode in (model.eval, model.train):
        mode()
        rpm.RPMELBO().loss(model.model, model.guide, batches[0])
        Trace_ELBO().loss(model.model, model.guide, batches[0])
        assert torch.equal(queue.latents(), pushed[-5:])                  # evaluating: no push


def test_averaged_centres_push_every_view_and_the_queue_round_trips_through_a_checkpoint(tmp_path):
    queue = LatentQueue(8, D)
    model, net = _model(StarImplicitPrior(RBFEnergy(), queue=queue), 3)
    views = [torch.randn(2, X_DIM) for _ in range(3)]
    model.prior.push(model.encode_views(views))
    with torch.no_grad():
        expected = torch.stack([net(v) for v in views], dim=1).reshape(-1, D)  # instance-major
    assert torch.equal(queue.latents(), expected)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    fresh, _ = _model(StarImplicitPrior(RBFEnergy(), queue=LatentQueue(8, D)), 3)
    fresh.load_state_dict(torch.load(tmp_path / "model.pt"))
    assert torch.equal(fresh.prior.queue.latents(), expected)
    assert fresh.prior.queue.head.item() == 6
    new = [torch.randn(2, X_DIM) for _ in range(3)]
    fresh.recognition.net.load_state_dict(net.state_dict())
    assert rpm.RPMELBO().loss(fresh.model, fresh.guide, new) == pytest.approx(
        rpm.RPMELBO().loss(model.model, model.guide, new), abs=1e-12)


def test_the_queue_takes_no_gradient_and_later_pushes_do_not_break_backward():
    queue = LatentQueue(4, D)
    queue.push(torch.randn(4, D))
    model, net = _model(StarImplicitPrior(CosineEnergy(), queue=queue), 2)
    views = [torch.randn(3, X_DIM) for _ in range(2)]
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, views)
    model.prior.push(model.encode_views(views))     # a push before the backward pass
    loss.backward()
    assert not queue.memory.requires_grad and all(p.grad is not None for p in net.parameters())


# -- errors ------------------------------------------------------------------------------------

def test_bad_arguments_are_refused_in_one_line():
    energy = CosineEnergy()
    with pytest.raises(ValueError, match="candidates must be one of"):
        StarImplicitPrior(energy, candidates="batch")
    with pytest.raises(ValueError, match="queue=LatentQueue"):
        rpm.inference.rpm_elbo(StarImplicitPrior(energy, candidates="positives"),
                               torch.randn(3, 2, D))
    with pytest.raises(ValueError, match="centres must be a non-empty list"):
        PartnerMixturePrior(energy, centres=[1, 1])
    with pytest.raises(TypeError, match="needs an energy module"):
        StarImplicitPrior(lambda a, b: a @ b.T)
    with pytest.raises(ValueError, match="queue holds latents of dimension 2 but the energy"):
        StarImplicitPrior(BilinearEnergy(3), queue=LatentQueue(4, 2))
    model, _ = _model(StarImplicitPrior(energy, global_views=3), 3)
    with pytest.raises(ValueError, match="leaves no local crop"):
        rpm.RPMELBO().loss(model.model, model.guide, [torch.randn(3, X_DIM) for _ in range(3)])
    model, _ = _model(StarImplicitPrior(energy, centres=[0, 4]), 3)
    with pytest.raises(ValueError, match="has centres"):
        rpm.RPMELBO().loss(model.model, model.guide, [torch.randn(3, X_DIM) for _ in range(3)])


# -- a global batch over two processes ---------------------------------------------------------

SIZES = (3, 4)  # instances per rank


def _global_batch_model():
    torch.manual_seed(2)
    queue = LatentQueue(40, D)
    queue.push(torch.randn(5, D))
    prior = PartnerMixturePrior(BilinearEnergy(D, init_scale=0.7), queue=queue)
    return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)), prior)


def _global_batch_worker(rank, store_path):
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=len(SIZES), timeout=datetime.timedelta(seconds=120))
    try:
        generator = torch.Generator().manual_seed(1)
        views = [torch.randn(sum(SIZES), X_DIM, generator=generator) for _ in range(3)]
        rows = slice(sum(SIZES[:rank]), sum(SIZES[:rank + 1]))
        model = _global_batch_model()
        loss = rpm.RPMELBO(global_batch=True).differentiable_loss(
            model.model, model.guide, [v[rows] for v in views])
        loss.backward()
        model.prior.push(model.encode_views([v[rows] for v in views]),
                         Candidates(global_batch=True))      # the loop's push: every rank's rows
        total = loss.detach().clone()
        dist.all_reduce(total)
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        for grad in grads.values():
            dist.all_reduce(grad)
        reference = _global_batch_model()
        reference_loss = rpm.RPMELBO().differentiable_loss(reference.model, reference.guide, views)
        reference_loss.backward()
        reference.prior.push(reference.encode_views(views))
        torch.testing.assert_close(total, reference_loss.detach(), rtol=0, atol=1e-10)
        for name, p in reference.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-10, msg=name)
        # every rank's queue took the global batch's latents, in the reference's order
        torch.testing.assert_close(model.prior.queue.latents(), reference.prior.queue.latents(),
                                   rtol=0, atol=1e-12)
        assert len(model.prior.queue) == 5 + 3 * sum(SIZES)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
def test_global_batch_over_two_processes_is_the_concatenated_batch_and_fills_the_queue(tmp_path):
    """Ranks of 3 and 4 instances of J = 3 views, a queue: the summed losses and gradients equal
    one process on all 7, and each rank's queue takes every rank's latents."""
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))   # warm lazy imports before fork
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(_global_batch_worker, args=(str(tmp_path / "store"),), nprocs=len(SIZES),
                       join=True, start_method=method)


# -- every energy, the plain-torch route, one encoder called per shape ---------------------------

def _module_loop(energy):
    """f(a, b) from the module's own forward on one pair (for energies without a closed-form
    loop here): the loops above then check the combinatorics of the candidates and positives."""
    def f(a, b):
        with torch.no_grad():
            return energy(torch.tensor([a]), torch.tensor([b])).item()
    return f


@pytest.mark.parametrize("make", [
    lambda: rpm.priors.AnisotropicEnergy(D),
    lambda: rpm.priors.NeuralEnergy(D, hidden=8),
    lambda: CosineEnergy(kappa=1.5, learn_kappa=True),
    lambda: LpEnergy(p=3.0, tau=2.0),
], ids=["anisotropic", "neural", "cosine-learned", "lp3"])
@pytest.mark.parametrize("form", sorted(PRIORS))
def test_every_energy_rpmelbo_trace_elbo_and_the_identity(make, form):
    energy = make()
    num, num_views = 3, 4
    model, net = _model(PRIORS[form](energy), num_views)
    views = [torch.randn(num, X_DIM) for _ in range(num_views)]
    params = list(net.parameters()) + list(energy.parameters())
    a = rpm.RPMELBO().differentiable_loss(model.model, model.guide, views)
    b = Trace_ELBO().differentiable_loss(model.model, model.guide, views)
    assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    for ga, gb in zip(torch.autograd.grad(a, params), torch.autograd.grad(b, params), strict=True):
        assert torch.allclose(ga, gb, rtol=1e-10, atol=1e-12)
    z, f = _latents(net, views), _module_loop(energy)
    assert abs(-a.item() - elbo_loop(z, f, form)) < 1e-10
    loss, _ = loss_loop(z, f, form)
    size = num * num_views - 1
    if form == "star":
        assert abs(-a.item() / (num * (num_views - 1)) - (-loss + math.log(size))) < 1e-10
    else:
        assert abs(-a.item() / num - (-loss + math.log(size / (num_views - 1)))) < 1e-10


@pytest.mark.parametrize("form", sorted(PRIORS))
def test_rpm_elbo_on_embeddings_is_the_model_elbo(form):
    """rpm.inference.rpm_elbo(prior, [z_1, ..., z_J]) for a plain torch loop."""
    prior = PRIORS[form](RBFEnergy(0.6), candidates="cross_view")
    z = torch.randn(4, 3, D)
    value = rpm.inference.rpm_elbo(prior, list(z.unbind(1)))
    assert abs(value.item() - elbo_loop(z.tolist(), _rbf(0.6), form, "cross_view")) < 1e-10


def test_multi_crop_with_one_encoder_called_once_per_shape():
    """One network for 2 global and 3 local crops, encoder_calls='concat': the recognition model
    is given once per group of one shape, so each group is encoded in one call."""

    class PoolThenLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, D)
            self.calls = 0

        def forward(self, x):                        # (B, 2, L) -> (B, D)
            self.calls += 1
            return self.linear(x.mean(-1))

    net = PoolThenLinear()
    recognition = rpm.DeltaRecognition(net)
    model = rpm.RPM([recognition, recognition], StarImplicitPrior(CosineEnergy(2.0), global_views=2),
                    groups=[0, 0, 1, 1, 1], encoder_calls="concat")
    views = [torch.randn(4, 2, 8) for _ in range(2)] + [torch.randn(4, 2, 3) for _ in range(3)]
    value = -rpm.RPMELBO().loss(model.model, model.guide, views)
    assert net.calls == 2
    expected = elbo_loop(_latents(net, views), _cosine(2.0), "star", global_views=2)
    assert abs(value - expected) < 1e-10


def test_the_model_refuses_a_second_queue_naming_the_prior_s_own():
    with pytest.raises(ValueError, match=r"holds its own queue: build it with StarImplicitPrior\("):
        rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)), StarImplicitPrior(CosineEnergy()),
                queue=LatentQueue(4, D))
