"""Models of ``rpm digits``: the plain-torch NT-Xent against a float64 loop and against rpm's
pooled prior, the encoder's shapes."""

import math

import pytest
import torch

import rpm
from rpm.experiments.digits import command
from rpm.experiments.digits.model import METHODS, DigitsEncoder, build_method, torch_ntxent_loss
from rpm.experiments.digits.train import reported_loss
from rpm.priors import CosineEnergy, ImplicitPrior, PooledImplicitPrior

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _ntxent_loop(z1, z2, tau):
    """NT-Xent from its definition (SimCLR, Eq. 1), float64, anchor by anchor."""
    u = torch.cat([z1, z2]).double()
    u = u / u.norm(dim=1, keepdim=True)
    n2 = u.shape[0]
    total = 0.0
    for k in range(n2):
        p = (k + n2 // 2) % n2
        denominator = sum(math.exp(float(u[k] @ u[m]) / tau) for m in range(n2) if m != k)
        total += -(float(u[k] @ u[p]) / tau - math.log(denominator))
    return total / n2


def _infonce_loop(z1, z2, tau):
    """Cross-view InfoNCE with the cosine critic, anchors z1, candidates all of z2, float64."""
    a = z1.double() / z1.double().norm(dim=1, keepdim=True)
    b = z2.double() / z2.double().norm(dim=1, keepdim=True)
    total = 0.0
    for i in range(a.shape[0]):
        denominator = sum(math.exp(float(a[i] @ b[j]) / tau) for j in range(b.shape[0]))
        total += -(float(a[i] @ b[i]) / tau - math.log(denominator))
    return total / a.shape[0]


@pytest.mark.parametrize("name,prior,loop", [
    ("ntxent", PooledImplicitPrior, _ntxent_loop),
    ("infonce", ImplicitPrior, _infonce_loop),
])
def test_the_reported_loss_is_the_cross_entropy_a_contrastive_user_reads(name, prior, loop):
    """-ELBO/N of the method's RPM plus the reported offset is NT-Xent (lightly's value) or
    InfoNCE, from their definitions; the J-view methods report -ELBO/N itself."""
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(2, 9, 4, generator=g, dtype=torch.float64)
    tau = 0.4
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), prior(CosineEnergy(kappa=1 / tau)))
    negative_elbo = float(rpm.RPMELBO().differentiable_loss(model.model, model.guide, z1, z2)) / 9
    loss_name, offset = reported_loss(name, 9)
    assert loss_name == {"ntxent": "NT-Xent", "infonce": "InfoNCE"}[name]
    assert negative_elbo + offset == pytest.approx(loop(z1, z2, tau), abs=1e-10)
    assert reported_loss("torch_ntxent", 9) == reported_loss("ntxent", 9)
    assert reported_loss("star4", 9) == ("-ELBO/N", 0.0)


def test_torch_ntxent_is_the_loop_minus_log_2n_minus_1_and_rpms_negative_elbo():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(7, 5, generator=g, dtype=torch.float64), torch.randn(7, 5, generator=g,
                                                                               dtype=torch.float64)
    tau = 0.3
    value = float(torch_ntxent_loss(z1, z2, tau))
    assert value == pytest.approx(_ntxent_loop(z1, z2, tau) - math.log(13), abs=1e-10)
    prior = PooledImplicitPrior(CosineEnergy(kappa=1 / tau))
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), prior)
    negative_elbo = float(rpm.RPMELBO().differentiable_loss(model.model, model.guide, z1, z2)) / 7
    assert value == pytest.approx(negative_elbo, abs=1e-10)


def test_encoder_shapes_for_global_and_local_crops():
    encoder = DigitsEncoder(width=4, latent_dim=6)
    assert encoder(torch.rand(5, 1, 8, 8)).shape == (5, 6)
    assert encoder(torch.rand(5, 1, 4, 4)).shape == (5, 6)
    assert encoder.backbone(torch.rand(5, 1, 8, 8)).shape == (5, 16)
    loc, scale = DigitsEncoder(width=4, latent_dim=6, gaussian=True)(torch.rand(5, 1, 8, 8))
    assert loc.shape == scale.shape == (5, 6) and bool((scale >= 1e-3).all())


def test_every_method_builds_and_the_command_lists_them():
    assert command.METHODS == METHODS
    for name in METHODS:
        module, encoder = build_method(name, width=4, latent_dim=6, temperature=0.5)
        assert any(p is q for p in module.parameters() for q in encoder.backbone.parameters())
    with pytest.raises(ValueError, match="method must be one of"):
        build_method("simclr", 4, 6, 0.5)


def test_the_queue_methods_step_is_rpmelbos_loss_and_leaves_the_push_to_the_loop():
    """rpm_step_loss of the ``queue`` method: the negative ELBO RPMELBO gives the model (the
    MoCo loop of the queue as it stands, in float64), its latents the encoder's outputs of the
    step (pushed by the loop: view 1, the positive of centre 0), and the queue unchanged."""
    from rpm.experiments.digits.train import rpm_step_loss

    torch.manual_seed(3)
    module, encoder = build_method("queue", 4, 8, 0.5)
    module.prior.queue.push(torch.randn(5, 8))
    views = [torch.randn(6, 1, 8, 8) for _ in range(2)]
    before = module.prior.queue.memory.clone()
    loss, z = rpm_step_loss(module, views)
    assert torch.equal(module.prior.queue.memory, before) and len(module.prior.queue) == 5
    module.eval()  # fixed batch-norm statistics, so that the encoder's outputs can be compared
    loss, z = rpm_step_loss(module, views)
    reference = rpm.RPMELBO().differentiable_loss(module.model, module.guide, views)
    assert torch.equal(loss, reference)
    with torch.no_grad():
        outputs = torch.stack([encoder(v) for v in views], dim=1).double()
    torch.testing.assert_close(z.double(), outputs, rtol=1e-6, atol=1e-6)
    a = outputs[:, 0] / outputs[:, 0].norm(dim=1, keepdim=True)
    b = outputs[:, 1] / outputs[:, 1].norm(dim=1, keepdim=True)
    bank = module.prior.queue.latents().double()
    bank = bank / bank.norm(dim=1, keepdim=True)
    expected = 0.0
    for i in range(6):
        positive = float(a[i] @ b[i]) / 0.5
        others = sum(math.exp(float(a[i] @ c) / 0.5) for c in bank)
        expected -= positive - math.log((math.exp(positive) + others) / 6)  # K + 1 = 6
    assert abs(loss.item() - expected) < 1e-4
    module.prior.push(z)
    assert torch.equal(module.prior.queue.latents()[5:], z[:, 1].detach())
