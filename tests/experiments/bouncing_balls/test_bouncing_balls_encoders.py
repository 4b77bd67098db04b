"""Tests of the bouncing-balls encoders (Appendix D, Fig. 2); their centre-of-mass read-out is
tested in tests/models/test_center_of_mass.py."""

import pytest
import torch

from rpm.data.bouncing_balls import generate_bouncing_balls
from rpm.experiments.bouncing_balls.encoders import BallEncoder, GaussianBallEncoder
from rpm.experiments.center_of_mass import CenterOfMass


@pytest.mark.parametrize("normalized", [False, True])
def test_encoder_output_shape_and_range(normalized):
    size = 12
    encoder = BallEncoder(in_channels=3, hidden_channels=4, num_maps=3, normalized=normalized)
    x = torch.rand(5, 3, size, size)
    z = encoder(x)
    assert z.shape == (5, 6) and encoder.output_dim == 6
    low, high = (-1.0, 1.0) if normalized else (0.0, float(size))
    assert z.min() > low and z.max() < high
    maps = encoder.feature_maps(x)
    assert maps.shape == (5, 3, size, size)
    assert maps.min() > 0 and maps.max() < 1
    # the output is the centre of mass of the maps, x then y per map
    torch.testing.assert_close(z, CenterOfMass(normalized=normalized)(maps))


def test_encoder_has_the_papers_architecture():
    encoder = BallEncoder(in_channels=3, hidden_channels=16, kernel_size=5, num_maps=3)
    convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in encoder.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert [tuple(c.weight.shape) for c in convs] == [(16, 3, 5, 5), (3, 16, 5, 5)]
    assert len(norms) == 2


def test_gradients_reach_every_parameter():
    encoder = BallEncoder(hidden_channels=4)
    encoder(torch.rand(6, 3, 10, 10)).pow(2).sum().backward()
    for name, parameter in encoder.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_train_and_eval_modes():
    encoder = BallEncoder(hidden_channels=4)
    x = torch.rand(8, 3, 10, 10)
    encoder.train()
    z_train = encoder(x)
    assert torch.isfinite(z_train).all()
    # train mode normalises with the batch statistics: a frame's code depends on its batch
    assert not torch.allclose(encoder(x[:4])[0], z_train[0])
    encoder.eval()
    with torch.no_grad():
        z_eval = encoder(x)
        # eval mode uses the running statistics: each frame's code is independent of its batch
        torch.testing.assert_close(encoder(x[:1]), z_eval[:1])
    assert not torch.allclose(z_eval, z_train)


def test_encoder_rejects_frames_of_the_wrong_shape():
    encoder = BallEncoder(in_channels=3)
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\).*without its batch axis; add it with "
                                         r"x.unsqueeze\(0\)"):
        encoder(torch.rand(3, 10, 10))
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\).*takes 3 channels on axis 1 .*not 1"):
        encoder(torch.rand(2, 1, 10, 10))
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\), got \(2, 3, 10\)$"):
        encoder(torch.rand(2, 3, 10))
    with pytest.raises(TypeError, match="hidden_channels"):
        BallEncoder(hidden_channels=4.0)
    with pytest.raises(ValueError, match="num_maps"):
        BallEncoder(num_maps=0)


def test_gaussian_encoder_returns_the_encoder_mean_and_a_learned_scale():
    torch.manual_seed(0)
    gaussian = GaussianBallEncoder(hidden_channels=4, init_scale=0.3)
    torch.manual_seed(0)
    plain = BallEncoder(hidden_channels=4)
    x = torch.rand(5, 3, 10, 10)
    loc, scale = gaussian(x)
    assert loc.shape == scale.shape == (5, 6) and gaussian.output_dim == 6
    torch.testing.assert_close(loc, plain(x))
    torch.testing.assert_close(scale, torch.full((5, 6), 0.3))
    # the scale is a parameter: the Gaussian log-density sends a gradient to it
    z = loc.detach() + 0.1
    log_prob = torch.distributions.Normal(loc, scale).log_prob(z).sum()
    log_prob.backward()
    # d/ds sum_n log N(z | mu, e^s) = sum_n ((z - mu)^2 / e^{2s} - 1) = 5 (0.01 / 0.09 - 1)
    expected = torch.full((6,), 5 * (0.01 / 0.09 - 1))
    torch.testing.assert_close(gaussian.log_scale.grad, expected)
    assert gaussian.feature_maps(x).shape == (5, 3, 10, 10)
    with pytest.raises(ValueError, match="init_scale"):
        GaussianBallEncoder(init_scale=0.0)


@pytest.mark.parametrize("gaussian", [False, True])
def test_encoders_plug_into_the_rpm_recognition_models(gaussian):
    import rpm
    from rpm.priors import ImplicitPrior, RBFEnergy

    frames = generate_bouncing_balls(num_frames=9, image_size=12, ball_diameter=3.0).frames
    x, x2 = frames[:-1], frames[1:]  # 8 pairs of consecutive frames
    if gaussian:
        recognition = rpm.GaussianRecognition(GaussianBallEncoder(hidden_channels=4))
    else:
        recognition = rpm.DeltaRecognition(BallEncoder(hidden_channels=4))
    model = rpm.RPM(recognition, ImplicitPrior(RBFEnergy(lengthscale=2.0)))
    q, _ = model.recognise(x, x2)
    assert q.batch_shape == (8,) and q.event_shape == (6,)
    before = [p.detach().clone() for p in model.parameters()]
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
    assert torch.isfinite(loss)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
    changed = [not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)]
    assert all(changed)  # every conv weight, BN affine, lengthscale (and log_scale) is trained
