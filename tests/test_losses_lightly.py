"""rpm.losses.NTXentLoss (lightly's conventions) against float64 loops written from the NT-Xent and
MoCo equations (docs/theory.md, "NT-Xent" and the queue), against cross_entropy written the SimCLR
way, and the ELBO identities it is built on; its memory bank against lightly's rules over a
sequence of calls; zero rows, an empty batch and an int bank size as lightly takes them."""

import math
import warnings

import pytest
import torch

from rpm.losses import NTXentLoss
from tests.helpers import float64_bank_loss


def _unit(v):
    return [[c / math.sqrt(sum(c * c for c in x)) for c in x] for x in v]


def _dot(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True))


def _ntxent_loop(out0, out1, tau):
    """NT-Xent anchor by anchor: u = (z_1..z_N, z'_1..z'_N), positive the partner, candidates the
    2N - 1 others; float64 Python arithmetic."""
    n = len(out0)
    u = _unit(out0.tolist()) + _unit(out1.tolist())
    total = 0.0
    for k in range(2 * n):
        partner = (k + n) % (2 * n)
        denominator = sum(math.exp(_dot(u[k], u[m]) / tau) for m in range(2 * n) if m != k)
        total += -(_dot(u[k], u[partner]) / tau - math.log(denominator))
    return total / (2 * n)


def _moco_loop(out0, out1, bank, tau):
    """MoCo's loss: anchors out0, positive out1[i], negatives the bank's rows (unit vectors)."""
    z, z2, c = _unit(out0.tolist()), _unit(out1.tolist()), bank.tolist()
    total = 0.0
    for i in range(len(z)):
        positive = _dot(z[i], z2[i]) / tau
        denominator = math.exp(positive) + sum(math.exp(_dot(z[i], ck) / tau) for ck in c)
        total += -(positive - math.log(denominator))
    return total / len(z)


def _simclr_cross_entropy(out0, out1, tau):
    """SimCLR's implementation: the 2N x 2N similarity matrix, the diagonal masked out, labels the
    partners."""
    n = out0.shape[0]
    u = torch.nn.functional.normalize(torch.cat([out0, out1]), dim=1)
    logits = u @ u.T / tau
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    labels = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return torch.nn.functional.cross_entropy(logits, labels)


@pytest.mark.parametrize("n,d,tau", [(2, 3, 0.5), (5, 4, 0.1), (9, 2, 1.7), (16, 8, 0.07)])
def test_ntxent_matches_the_loop_cross_entropy_and_the_elbo_identity(n, d, tau):
    generator = torch.Generator().manual_seed(n * 100 + d)
    out0 = torch.randn(n, d, generator=generator, dtype=torch.float64)
    out1 = torch.randn(n, d, generator=generator, dtype=torch.float64)
    loss_fn = NTXentLoss(temperature=tau)
    loss = loss_fn(out0, out1)
    assert float(loss) == pytest.approx(_ntxent_loop(out0, out1, tau), abs=1e-10)
    assert float(loss) == pytest.approx(float(_simclr_cross_entropy(out0, out1, tau)), abs=1e-10)
    assert float(loss) > 0
    elbo = loss_fn.elbo(out0, out1)
    assert float(-loss + math.log(2 * n - 1)) == pytest.approx(float(elbo), abs=1e-10)


def test_ntxent_float32_and_gather_distributed_without_a_process_group_changes_nothing():
    generator = torch.Generator().manual_seed(3)
    out0, out1 = torch.randn(2, 7, 5, generator=generator)
    plain = NTXentLoss(0.3)(out0, out1)
    gathered = NTXentLoss(0.3, gather_distributed=True)(out0, out1)
    assert torch.equal(plain, gathered)
    assert float(plain) == pytest.approx(_ntxent_loop(out0.double(), out1.double(), 0.3), abs=1e-5)


def test_ntxent_gradients_match_autograd_through_the_loop():
    generator = torch.Generator().manual_seed(5)
    out0 = torch.randn(6, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    out1 = torch.randn(6, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    grads = torch.autograd.grad(NTXentLoss(0.4)(out0, out1), [out0, out1])
    reference = torch.autograd.grad(_simclr_cross_entropy_loop_torch(out0, out1, 0.4), [out0, out1])
    for grad, ref in zip(grads, reference, strict=True):
        torch.testing.assert_close(grad, ref, atol=1e-10, rtol=0)


def _simclr_cross_entropy_loop_torch(out0, out1, tau):
    """The NT-Xent loop in torch scalars (autograd through it), anchor by anchor."""
    n = out0.shape[0]
    u = [row / row.norm() for row in torch.cat([out0, out1])]
    total = 0.0
    for k in range(2 * n):
        partner = (k + n) % (2 * n)
        others = torch.stack([u[k] @ u[m] / tau for m in range(2 * n) if m != k])
        total = total - (u[k] @ u[partner] / tau - torch.logsumexp(others, 0))
    return total / (2 * n)


def _moco_loop_torch(out0, out1, bank, tau):
    total = 0.0
    for i in range(out0.shape[0]):
        z, z2 = out0[i] / out0[i].norm(), out1[i] / out1[i].norm()
        logits = torch.cat([(z @ z2 / tau).reshape(1), bank @ z / tau])
        total = total - (logits[0] - torch.logsumexp(logits, 0))
    return total / out0.shape[0]


@pytest.mark.parametrize("k,tau", [(4, 0.5), (12, 0.07)])
def test_memory_bank_matches_the_loop_and_the_elbo_identity(k, tau):
    generator = torch.Generator().manual_seed(k)
    out0 = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    out1 = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    loss_fn = float64_bank_loss(tau, memory_bank_size=(k, 3))
    bank = loss_fn.bank.latents().clone()
    assert bank.shape == (k, 3)
    torch.testing.assert_close(bank.norm(dim=1), torch.ones(k, dtype=torch.float64))  # random unit
    elbo = loss_fn.elbo(out0, out1)
    loss = loss_fn(out0, out1)
    assert float(loss) == pytest.approx(_moco_loop(out0, out1, bank, tau), abs=1e-10)
    assert float(-loss + math.log(k + 1)) == pytest.approx(float(elbo), abs=1e-10)


class _LightlyBank:
    """lightly's memory bank (lightly/models/modules/memory_bank.py) as plain Python float64
    lists: K rows in a ring and a pointer. The loss of a call reads the bank as it was before
    the call; a call whose out0 requires a gradient then writes its normalised out1 from the
    pointer on, and a batch that reaches the end of the bank fills it to the end, drops its
    remaining rows and sends the pointer back to 0."""

    def __init__(self, rows):
        self.rows = [list(row) for row in rows]
        self.ptr = 0

    def update(self, out1):
        batch = _unit_or_zero(out1.tolist())
        size = len(self.rows)
        if self.ptr + len(batch) >= size:
            self.rows[self.ptr:] = batch[: size - self.ptr]
            self.ptr = 0
        else:
            self.rows[self.ptr:self.ptr + len(batch)] = batch
            self.ptr += len(batch)


def _unit_or_zero(v):
    """F.normalize's rule: each row divided by max(norm, 1e-12), so a row of zeros stays zero."""
    return [[c / max(math.sqrt(sum(c * c for c in x)), 1e-12) for c in x] for x in v]


def _lightly_moco_loop(out0, out1, bank_rows, tau):
    """lightly's NT-Xent with a memory bank, one anchor at a time: -log of the softmax of the
    positive among (positive, the K banked rows), averaged."""
    z, z2 = _unit_or_zero(out0.tolist()), _unit_or_zero(out1.tolist())
    total = 0.0
    for i in range(len(z)):
        logits = [_dot(z[i], z2[i]) / tau] + [_dot(z[i], row) / tau for row in bank_rows]
        top = max(logits)
        total += -(logits[0] - top - math.log(sum(math.exp(v - top) for v in logits)))
    return total / len(z)


@pytest.mark.parametrize("k,batches", [
    (6, [3, 3, 3, 3, 3, 3, 3]),      # batches that divide the bank
    (7, [3, 3, 3, 2, 5, 3, 4]),      # batches that reach the end of the bank: rows dropped
    (5, [2, 9, 3, 2, 4, 1, 6]),      # a batch larger than the bank
])
def test_a_sequence_of_train_steps_and_a_no_grad_validation_pass_is_lightlys(k, batches):
    """Train steps, a validation pass under torch.no_grad() in train mode, a call in eval mode
    with gradients, train steps: each loss, its gradients and the bank after each call are
    those of lightly's formulas (float64 loops), the bank taking a batch exactly when out0
    requires a gradient."""
    tau, dim = 0.3, 3
    generator = torch.Generator().manual_seed(k)
    loss_fn = float64_bank_loss(tau, memory_bank_size=(k, dim))
    lightly = _LightlyBank(loss_fn.bank.memory.tolist())
    # (batch size, grad enabled, module mode): the fourth call is the validation pass
    calls = [(b, True, "train") for b in batches[:3]] + [(batches[3], False, "train")] \
        + [(batches[4], True, "eval")] + [(b, True, "train") for b in batches[5:]]
    for size, grad, mode in calls:
        out0, out1 = torch.randn(2, size, dim, generator=generator, dtype=torch.float64)
        out0.requires_grad_(True)
        out1.requires_grad_(True)
        loss_fn.train(mode == "train")
        expected = _lightly_moco_loop(out0, out1, lightly.rows, tau)
        reference_grads = torch.autograd.grad(
            _moco_loop_torch(out0, out1, torch.tensor(lightly.rows, dtype=torch.float64), tau),
            [out0, out1])
        with torch.set_grad_enabled(grad):
            loss = loss_fn(out0, out1)
        assert float(loss.detach()) == pytest.approx(expected, abs=1e-12)
        if grad:
            for got, ref in zip(torch.autograd.grad(loss, [out0, out1]), reference_grads,
                                strict=True):
                torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)
            lightly.update(out1.detach())
        torch.testing.assert_close(loss_fn.bank.memory,
                                   torch.tensor(lightly.rows, dtype=torch.float64), atol=1e-15, rtol=0)
        assert int(loss_fn.bank.head) == lightly.ptr


def test_the_bank_is_outside_the_state_dict_and_moves_with_the_module():
    loss_fn = NTXentLoss(0.2, memory_bank_size=(8, 3))
    assert not [key for key in loss_fn.state_dict() if "bank" in key]
    bank = loss_fn.bank.memory.clone()
    fresh = NTXentLoss(0.2, memory_bank_size=(8, 3))
    fresh.load_state_dict(loss_fn.state_dict())  # strict: the same keys, no bank among them
    assert not torch.equal(fresh.bank.memory, bank)  # each starts its own random bank
    loss_fn.double()
    assert loss_fn.bank.memory.dtype == torch.float64
    torch.testing.assert_close(loss_fn.bank.memory, bank.double())


def test_an_int_memory_bank_size_warns_as_lightly_and_is_accepted():
    with pytest.warns(UserWarning) as record:
        loss_fn = NTXentLoss(0.2, memory_bank_size=6)
    assert [str(w.message) for w in record] == [
        "Memory bank size 'size=6' does not specify feature dimension. It is recommended to set "
        "the feature dimension with 'size=(n, dim)' when creating the memory bank. Distributed "
        "training might fail if the feature dimension is not set."]
    assert record[0].filename == __file__  # the warning points at the caller's line
    assert loss_fn.bank is None
    out0 = torch.randn(4, 5, requires_grad=True)
    loss_fn(out0, torch.randn(4, 5))
    assert loss_fn.bank.memory.shape == (6, 5)  # made at the first call, of the outputs' dimension
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NTXentLoss(memory_bank_size=0)
        NTXentLoss(memory_bank_size=(6, 5))


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("bank", [0, 5])
def test_a_row_of_zeros_gives_lightlys_finite_value(dtype, tolerance, bank):
    """F.normalize maps a row of zeros to zero, so its logits are 0: the loss is lightly's and
    finite, and so are its gradients, in float32 and float64."""
    generator = torch.Generator().manual_seed(17)
    out0, out1 = torch.randn(2, 4, 3, generator=generator, dtype=torch.float64)
    out0[1] = 0.0
    out1[2] = 0.0
    loss_fn = float64_bank_loss(0.5, memory_bank_size=(bank, 3) if bank else 0).to(dtype)
    negatives = loss_fn.bank.memory.clone() if bank else None
    if bank:
        expected = _lightly_moco_loop(out0, out1, negatives.double().tolist(), 0.5)
    else:
        expected = _ntxent_loop_zero_rows(out0, out1, 0.5)
    inputs = [out0.to(dtype).requires_grad_(True), out1.to(dtype).requires_grad_(True)]
    loss = loss_fn(*inputs)
    assert float(loss.detach()) == pytest.approx(expected, abs=tolerance)
    grads = torch.autograd.grad(loss, inputs)
    assert all(bool(torch.isfinite(grad).all()) for grad in grads)
    if dtype == torch.float64:  # lightly's gradients: its logits through F.normalize
        unit0, unit1 = (torch.nn.functional.normalize(v, dim=1) for v in inputs)
        if bank:
            logits = torch.cat([(unit0 * unit1).sum(1, keepdim=True), unit0 @ negatives.T], 1)
            reference = torch.nn.functional.cross_entropy(logits / 0.5, torch.zeros(4, dtype=torch.long))
        else:
            reference = _simclr_cross_entropy(*inputs, 0.5)
        for grad, ref in zip(grads, torch.autograd.grad(reference, inputs), strict=True):
            torch.testing.assert_close(grad, ref, rtol=1e-10, atol=1e-10)


def _ntxent_loop_zero_rows(out0, out1, tau):
    """NT-Xent anchor by anchor with F.normalize's rule (a zero row stays zero)."""
    n = len(out0)
    u = _unit_or_zero(out0.tolist()) + _unit_or_zero(out1.tolist())
    total = 0.0
    for k in range(2 * n):
        partner = (k + n) % (2 * n)
        denominator = sum(math.exp(_dot(u[k], u[m]) / tau) for m in range(2 * n) if m != k)
        total += -(_dot(u[k], u[partner]) / tau - math.log(denominator))
    return total / (2 * n)


@pytest.mark.parametrize("kwargs,views", [
    ({}, 2), ({"memory_bank_size": (4, 3)}, 2), ({}, 3)])
def test_an_empty_batch_is_one_clear_line(kwargs, views):
    with pytest.raises(ValueError) as error:
        NTXentLoss(**kwargs)(*[torch.zeros(0, 3) for _ in range(views)])
    message = str(error.value)
    assert "\n" not in message and "no rows" in message and "(0, 3)" in message


def test_memory_bank_gradients_match_autograd_through_the_loop():
    generator = torch.Generator().manual_seed(13)
    out0 = torch.randn(5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    out1 = torch.randn(5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    loss_fn = float64_bank_loss(0.3, memory_bank_size=(7, 4))
    bank = loss_fn.bank.latents().clone()
    grads = torch.autograd.grad(loss_fn(out0, out1), [out0, out1])
    reference = torch.autograd.grad(_moco_loop_torch(out0, out1, bank, 0.3), [out0, out1])
    for grad, ref in zip(grads, reference, strict=True):
        torch.testing.assert_close(grad, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -0.5}, "temperature"),
    ({"memory_bank_size": -1}, "memory_bank_size"),
    ({"memory_bank_size": (4, 0)}, "dimension"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NTXentLoss(**kwargs)


def test_bad_inputs():
    loss_fn = NTXentLoss()
    with pytest.raises(ValueError, match="same shape"):
        loss_fn(torch.randn(4, 3), torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        loss_fn(torch.randn(4), torch.randn(4))
    with pytest.raises(ValueError, match="memory bank holds latents of dimension 3"):
        NTXentLoss(memory_bank_size=(8, 3))(torch.randn(4, 5), torch.randn(4, 5))
    with pytest.raises(TypeError, match="memory_bank_size"):
        NTXentLoss(memory_bank_size=2.5)


def _pooled_cosine_rpm_loss(out0, out1, tau):
    """-ELBO of rpm.RPM with Delta encoders and PooledImplicitPrior(CosineEnergy(1/tau)), through
    RPMELBO's differentiable loss (the Pyro program's value)."""
    import pyro

    import rpm
    from rpm.priors import CosineEnergy, PooledImplicitPrior

    pyro.clear_param_store()
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()),
                    PooledImplicitPrior(CosineEnergy(kappa=1.0 / tau)).to(out0.dtype))
    return rpm.RPMELBO().differentiable_loss(model.model, model.guide, out0, out1)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 2e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("scale", [1e-25, 1.0, 1e25])
def test_scaled_outputs_give_the_unscaled_nt_xent_through_the_loss_and_the_prior(
        dtype, tolerance, scale):
    """The cosine energy is invariant to the scale of the outputs, through NTXentLoss and through
    rpm.RPM + PooledImplicitPrior(CosineEnergy) alike: outputs scaled by 1e-25 or 1e25 give the
    float64 loop's NT-Xent of the unscaled ones, the two agree by loss = -ELBO/N + log(2N - 1),
    and the gradients are finite and scale as 1/c (L(c z) = L(z))."""
    n, tau = 6, 0.5
    generator = torch.Generator().manual_seed(23)
    out0, out1 = torch.randn(2, n, 4, generator=generator, dtype=torch.float64)
    expected = _ntxent_loop(out0, out1, tau)
    inputs = [(v * scale).to(dtype).requires_grad_(True) for v in (out0, out1)]

    loss = NTXentLoss(tau)(*inputs)
    assert float(loss.detach()) == pytest.approx(expected, abs=tolerance)
    rpm_loss = _pooled_cosine_rpm_loss(*inputs, tau)
    assert float(rpm_loss.detach() / n + math.log(2 * n - 1)) == pytest.approx(expected, abs=tolerance)

    unscaled = [v.clone().requires_grad_(True) for v in (out0, out1)]
    reference = torch.autograd.grad(_simclr_cross_entropy(*unscaled, tau), unscaled)
    for value in (loss, rpm_loss / n):
        grads = torch.autograd.grad(value, inputs)
        for grad, ref in zip(grads, reference, strict=True):
            assert bool(torch.isfinite(grad).all())
            torch.testing.assert_close(grad.double() * scale, ref, atol=10 * tolerance, rtol=0)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 2e-5), (torch.float64, 1e-12)])
def test_a_row_of_zeros_through_the_prior_is_the_losss_finite_value(dtype, tolerance):
    """A row of zeros is the zero vector in rpm.RPM + PooledImplicitPrior(CosineEnergy) as in
    NTXentLoss (F.normalize's rule): under Pyro's validation the ELBO is finite, equal by the
    NT-Xent identity to the float64 loop's value, and so are its gradients."""
    n, tau = 4, 0.5
    generator = torch.Generator().manual_seed(29)
    out0, out1 = torch.randn(2, n, 3, generator=generator, dtype=torch.float64)
    out0[1] = 0.0
    out1[2] = 0.0
    expected = _ntxent_loop_zero_rows(out0, out1, tau)
    inputs = [v.to(dtype).requires_grad_(True) for v in (out0, out1)]
    rpm_loss = _pooled_cosine_rpm_loss(*inputs, tau)
    assert float(rpm_loss.detach() / n + math.log(2 * n - 1)) == pytest.approx(expected, abs=tolerance)
    assert float(NTXentLoss(tau)(*inputs).detach()) == pytest.approx(expected, abs=tolerance)
    grads = torch.autograd.grad(rpm_loss, inputs)
    assert all(bool(torch.isfinite(grad).all()) for grad in grads)
