"""rpm.losses over J views (NTXentLoss's L_out and L_in forms, the multi-crop rule), InfoNCELoss
(info-nce-pytorch's value) and the learned temperature bounded as CLIP's, against float64 loops
written from the equations (docs/theory.md, "J-view priors"), and each loss's ELBO against its
prior's ELBO through rpm.RPM and RPMELBO."""

import math

import pytest
import torch

import rpm
from rpm.losses import InfoNCELoss, NTXentLoss, ScaledCosineEnergy
from tests.priors.test_multiview import _cosine, elbo_loop, loss_loop

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _outputs(num, num_views, dim, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(num, dim, generator=generator, dtype=torch.float64)
            for _ in range(num_views)]


def _stacked(views):
    return torch.stack(views, dim=1).tolist()


def _rpm_elbo_per_instance(prior, views):
    """-RPMELBO / N of rpm.RPM(DeltaRecognition(identity), prior) on the outputs themselves."""
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), prior)
    args = views if len(views) == 2 and not isinstance(prior, rpm.priors.SequencePrior) else [views]
    return -rpm.RPMELBO().loss(model.model, model.guide, *args) / views[0].shape[0]


@pytest.mark.parametrize("num_views,num", [(3, 4), (4, 3), (6, 2)])
@pytest.mark.parametrize("form,prior_form", [("out", "star"), ("in", "mixture")])
@pytest.mark.parametrize("candidates", ["pooled", "cross_view"])
def test_j_view_ntxent_matches_the_loop_the_identity_and_the_prior(num_views, num, form,
                                                                   prior_form, candidates):
    tau = 0.3
    views = _outputs(num, num_views, 3, seed=num_views * 10 + num)
    loss_fn = NTXentLoss(tau, form=form, candidates=candidates)
    loss = loss_fn(*views)
    assert torch.equal(loss, loss_fn(views))                      # a list of J views
    expected, _ = loss_loop(_stacked(views), _cosine(1 / tau), prior_form, candidates)
    assert abs(loss.item() - expected) < 1e-10
    elbo = loss_fn.elbo(*views)
    size = num * num_views - 1 if candidates == "pooled" else num * (num_views - 1)
    if form == "out":
        assert abs(elbo.item() - (num_views - 1) * (-loss.item() + math.log(size))) < 1e-10
    else:
        assert abs(elbo.item() - (-loss.item() + math.log(size / (num_views - 1)))) < 1e-10
    assert abs(elbo.item() - elbo_loop(_stacked(views), _cosine(1 / tau), prior_form,
                                       candidates) / num) < 1e-10
    through_rpm = _rpm_elbo_per_instance(loss_fn.rpm_prior(num_views), views)
    assert abs(through_rpm - elbo.item()) < 1e-10


def test_two_views_are_unchanged_and_equal_to_the_prior_through_rpm():
    views = _outputs(6, 2, 4, seed=3)
    for form in ("out", "in"):
        loss_fn = NTXentLoss(0.5, form=form)
        assert loss_fn(*views).item() == pytest.approx(NTXentLoss(0.5)(*views).item(), abs=1e-14)
        assert type(loss_fn.rpm_prior(2)).__name__ == "PooledImplicitPrior"
        assert abs(_rpm_elbo_per_instance(loss_fn.rpm_prior(2), views)
                   - loss_fn.elbo(*views).item()) < 1e-12
    # cross-view candidates at J = 2: the symmetric InfoNCE, the mean of both directions
    clip = NTXentLoss(0.5, candidates="cross_view")(*views)
    info = InfoNCELoss(0.5)
    assert clip.item() == pytest.approx(0.5 * (info(*views) + info(views[1], views[0])).item(),
                                        abs=1e-12)


def test_multi_crop_rule_matches_the_loop():
    views = _outputs(3, 5, 3, seed=8)
    for form, prior_form in (("out", "star"), ("in", "mixture")):
        loss_fn = NTXentLoss(0.4, form=form, global_views=2)
        expected, _ = loss_loop(_stacked(views), _cosine(1 / 0.4), prior_form, global_views=2)
        assert abs(loss_fn(*views).item() - expected) < 1e-10
        assert abs(_rpm_elbo_per_instance(loss_fn.rpm_prior(5), views)
                   - loss_fn.elbo(*views).item()) < 1e-10


def test_memory_bank_elbo_is_the_moco_prior_through_rpm():
    views = _outputs(5, 2, 3, seed=21)
    loss_fn = NTXentLoss(0.2, memory_bank_size=(9, 3)).double()
    with torch.no_grad():  # float64 unit rows, so that the prior's own normalisation is exact
        rows = torch.randn(9, 3, dtype=torch.float64)
        loss_fn.bank.memory.copy_(torch.nn.functional.normalize(rows, dim=1))
    prior = loss_fn.rpm_prior()  # evaluating it leaves the bank as it is, in training mode too
    elbo = loss_fn.elbo(*views)
    assert abs(_rpm_elbo_per_instance(prior, views) - elbo.item()) < 1e-10
    assert abs(elbo.item() - (-loss_fn(*views).item() + math.log(10))) < 1e-10
    with pytest.raises(ValueError, match="memory bank is MoCo's two-view form"):
        loss_fn(*_outputs(5, 3, 3, seed=1))


def test_gather_distributed_without_a_process_group_changes_nothing_over_j_views():
    views = _outputs(4, 3, 5, seed=2)
    assert torch.equal(NTXentLoss(0.3)(*views), NTXentLoss(0.3, gather_distributed=True)(*views))


# -- InfoNCELoss -------------------------------------------------------------------------------

def _info_nce_reference(query, positive_key, negative_keys, tau, reduction):
    """info-nce-pytorch's computation: normalise, logits, cross_entropy against the positives."""
    q, k = (torch.nn.functional.normalize(v, dim=-1) for v in (query, positive_key))
    if negative_keys is None:
        logits, labels = q @ k.T, torch.arange(len(q))
    else:
        n = torch.nn.functional.normalize(negative_keys, dim=-1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ n.T], dim=1)
        labels = torch.zeros(len(q), dtype=torch.long)
    return torch.nn.functional.cross_entropy(logits / tau, labels, reduction=reduction)


def _info_nce_loop(query, positive_key, negative_keys, tau):
    f = _cosine(1 / tau)
    q, k = query.tolist(), positive_key.tolist()
    total = 0.0
    for i in range(len(q)):
        cands = k if negative_keys is None else [k[i]] + negative_keys.tolist()
        total += -(f(q[i], k[i]) - math.log(sum(math.exp(f(q[i], c)) for c in cands)))
    return total / len(q)


@pytest.mark.parametrize("negatives", [None, 7])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_info_nce_is_info_nce_pytorch_and_its_prior(negatives, reduction):
    query, key, extra = _outputs(6, 3, 4, seed=5)
    negative_keys = None if negatives is None else torch.cat([extra, extra[:1] * 2.0])[:negatives]
    loss_fn = InfoNCELoss(reduction=reduction)          # temperature 0.1, as info-nce-pytorch
    value = loss_fn(query, key, negative_keys)
    reference = _info_nce_reference(query, key, negative_keys, 0.1, reduction)
    torch.testing.assert_close(value, reference, atol=1e-12, rtol=0)
    mean = InfoNCELoss()(query, key, negative_keys)
    assert abs(mean.item() - _info_nce_loop(query, key, negative_keys, 0.1)) < 1e-10
    size = 6 if negative_keys is None else negative_keys.shape[0] + 1
    elbo = loss_fn.elbo(query, key, negative_keys)
    assert abs(elbo.item() - (-mean.item() + math.log(size))) < 1e-10
    prior = loss_fn.rpm_prior(negative_keys)
    assert abs(_rpm_elbo_per_instance(prior, [query, key]) - elbo.item()) < 1e-10


# -- the learned temperature -----------------------------------------------------------------

def test_learned_temperature_trains_matches_the_loop_and_is_bounded_as_clip():
    views = _outputs(5, 3, 3, seed=9)
    loss_fn = NTXentLoss(0.07, learn_temperature=True, form="in")
    assert loss_fn.temperature == pytest.approx(0.07, rel=1e-12)
    assert [name for name, _ in loss_fn.named_parameters()] == ["energy.log_scale"]
    loss = loss_fn(*views)
    expected, _ = loss_loop(_stacked(views), _cosine(1 / 0.07), "mixture")
    assert abs(loss.item() - expected) < 1e-10
    (grad,) = torch.autograd.grad(loss, [loss_fn.energy.log_scale])
    step = 1e-6  # central difference of the loop in log(1/tau)
    plus, _ = loss_loop(_stacked(views), _cosine(math.exp(math.log(1 / 0.07) + step)), "mixture")
    minus, _ = loss_loop(_stacked(views), _cosine(math.exp(math.log(1 / 0.07) - step)), "mixture")
    assert grad.item() == pytest.approx((plus - minus) / (2 * step), rel=1e-6)
    assert abs(_rpm_elbo_per_instance(loss_fn.rpm_prior(3), views) - loss_fn.elbo(*views).item()) < 1e-10
    with torch.no_grad():
        loss_fn.energy.log_scale.fill_(math.log(400.0))   # beyond the bound: the scale is 100
    assert loss_fn.energy.logit_scale().item() == pytest.approx(100.0, rel=1e-12)
    assert loss_fn.temperature == pytest.approx(0.01, rel=1e-12)
    bounded, _ = loss_loop(_stacked(views), _cosine(100.0), "mixture")
    loss = loss_fn(*views)
    assert abs(loss.item() - bounded) < 1e-9
    (grad,) = torch.autograd.grad(loss, [loss_fn.energy.log_scale])
    assert grad.item() == 0.0


def test_learned_temperature_of_info_nce_moves_under_an_optimiser():
    query, key = _outputs(8, 2, 4, seed=4)
    loss_fn = InfoNCELoss(temperature=1.0, learn_temperature=True)
    optimiser = torch.optim.SGD(loss_fn.parameters(), lr=0.5)
    before = loss_fn(query, key).item()
    for _ in range(5):
        optimiser.zero_grad()
        loss_fn(query, key).backward()
        optimiser.step()
    assert loss_fn(query, key).item() < before and loss_fn.temperature != 1.0


@pytest.mark.parametrize("make,match", [
    (lambda: ScaledCosineEnergy(0.005, learn=True), "bounded below by 1/100"),
    (lambda: NTXentLoss(form="inside"), "form must be 'out'"),
    (lambda: NTXentLoss(candidates="queue"), "candidates must be 'pooled' or 'cross_view'"),
    (lambda: NTXentLoss(memory_bank_size=4, candidates="cross_view"), "memory bank is MoCo"),
    (lambda: InfoNCELoss(reduction="avg"), "reduction must be"),
    (lambda: InfoNCELoss(negative_mode="paired"), "negative_mode must be 'unpaired'"),
    (lambda: InfoNCELoss(temperature=0.0), "temperature must be"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_inputs():
    with pytest.raises(ValueError, match="two outputs"):
        NTXentLoss()(torch.randn(4, 3))
    with pytest.raises(ValueError, match="the views of the same shape"):
        NTXentLoss()(torch.randn(4, 3), torch.randn(4, 3), torch.randn(5, 3))
    with pytest.raises(ValueError, match="negative_keys of shape"):
        InfoNCELoss()(torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 2))
    with pytest.raises(ValueError, match="query and positive_key of the same shape"):
        InfoNCELoss()(torch.randn(4, 3), torch.randn(3, 3))


def test_info_nce_gradients_reach_the_negatives_as_info_nce_pytorchs_and_nothing_is_kept():
    """The negatives are candidates of MoCo's prior read as given: the gradients in the query,
    the positive keys and the negatives are the reference's (float64), in training mode too, and
    the loss keeps no state (no buffer, the same state_dict) after the call."""
    query, key, negatives = (v.requires_grad_(True) for v in _outputs(5, 3, 4, seed=31))
    negatives = negatives[:4]
    loss_fn = InfoNCELoss(temperature=0.2)
    loss_fn.train()
    keys = list(loss_fn.state_dict())
    inputs = [query, key, negatives]
    grads = torch.autograd.grad(loss_fn(*inputs), inputs)
    reference = torch.autograd.grad(_info_nce_reference(*inputs, 0.2, "mean"), inputs)
    for grad, ref in zip(grads, reference, strict=True):
        torch.testing.assert_close(grad, ref, atol=1e-12, rtol=0)
    assert list(loss_fn.state_dict()) == keys
    assert [name for name, _ in loss_fn.named_buffers()] == ["energy.scale"]


def test_evaluating_the_bank_never_pushes_and_the_state_dict_keeps_its_keys():
    """elbo() in training mode with gradients, and forward under no_grad, leave the bank as it
    is (only forward with gradients pushes, by lightly's rule); an int K, whose bank is made at
    the first call, keeps the state_dict's keys."""
    with pytest.warns(UserWarning):
        loss_fn = NTXentLoss(0.3, memory_bank_size=6).double()
    keys = list(loss_fn.state_dict())
    out0, out1 = (v.requires_grad_(True) for v in _outputs(4, 2, 3, seed=12))
    loss_fn.train()
    loss_fn.elbo(out0, out1)
    memory, head = loss_fn.bank.memory.clone(), int(loss_fn.bank.head)
    loss_fn.elbo(out0, out1)
    with torch.no_grad():
        loss_fn(out0, out1)
    assert torch.equal(loss_fn.bank.memory, memory) and int(loss_fn.bank.head) == head
    loss_fn(out0, out1)
    assert int(loss_fn.bank.head) == (head + 4) % 6
    assert list(loss_fn.state_dict()) == keys
