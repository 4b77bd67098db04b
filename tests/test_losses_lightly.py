"""rpm.losses.NTXentLoss (lightly's conventions) against float64 loops written from the NT-Xent and
MoCo equations (docs/theory.md, "NT-Xent" and the queue), against cross_entropy written the SimCLR
way, and the ELBO identities it is built on."""

import math

import pytest
import torch

from rpm.losses import NTXentLoss


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
    loss_fn = NTXentLoss(tau, memory_bank_size=(k, 3)).double()
    bank = loss_fn.bank.latents().clone()
    assert bank.shape == (k, 3)
    torch.testing.assert_close(bank.norm(dim=1), torch.ones(k, dtype=torch.float64))  # random unit
    elbo = loss_fn.elbo(out0, out1)
    loss = loss_fn(out0, out1)
    assert float(loss) == pytest.approx(_moco_loop(out0, out1, bank, tau), abs=1e-10)
    assert float(-loss + math.log(k + 1)) == pytest.approx(float(elbo), abs=1e-10)


def test_memory_bank_is_a_fifo_of_earlier_out1_and_frozen_in_eval_mode():
    generator = torch.Generator().manual_seed(11)
    first0, first1, second0, second1 = torch.randn(4, 3, 2, generator=generator, dtype=torch.float64)
    loss_fn = NTXentLoss(0.2, memory_bank_size=6).double()  # an int: the bank is made at the first call
    assert loss_fn.bank is None
    loss_fn(first0, first1)
    bank = loss_fn.bank.latents().clone()
    # the first call's normalised out1 entered last; three random rows were dropped, first in first out
    torch.testing.assert_close(bank[-3:], torch.nn.functional.normalize(first1, dim=1))
    loss = loss_fn(second0, second1)
    assert float(loss) == pytest.approx(_moco_loop(second0, second1, bank, 0.2), abs=1e-10)
    torch.testing.assert_close(loss_fn.bank.latents(),
                               torch.nn.functional.normalize(torch.cat([first1, second1]), dim=1))
    loss_fn.eval()
    frozen = loss_fn.bank.latents().clone()
    loss_fn(first0, first1)
    assert torch.equal(loss_fn.bank.latents(), frozen)
    assert "bank.memory" in loss_fn.state_dict()


def test_memory_bank_gradients_match_autograd_through_the_loop():
    generator = torch.Generator().manual_seed(13)
    out0 = torch.randn(5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    out1 = torch.randn(5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    loss_fn = NTXentLoss(0.3, memory_bank_size=(7, 4)).double()
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
