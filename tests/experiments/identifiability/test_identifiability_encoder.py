"""The residual MLP encoder: its output space, its identity initialisation, its equation and
its argument checks."""

import pytest
import torch

from rpm.experiments.identifiability.encoder import MLPEncoder


@pytest.mark.parametrize("space", ["sphere", "box", "unbounded"])
def test_encoder_outputs_live_in_the_encoder_space(space):
    encoder = MLPEncoder(5, hidden=16, depth=2, space=space)
    h = encoder(10 * torch.randn(64, 5))
    assert h.shape == (64, 5)
    if space == "sphere":
        torch.testing.assert_close(h.norm(dim=-1), torch.ones(64))
    elif space == "box":
        assert h.abs().max() <= 1.0
    else:
        assert h.abs().max() > 1.0  # no squashing: inputs of scale 10 give outputs beyond 1


def test_untrained_encoder_is_the_projected_identity():
    x = torch.randn(32, 4)
    torch.testing.assert_close(MLPEncoder(4, 8, 2, "sphere")(x), x / x.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(MLPEncoder(4, 8, 2, "box")(x), torch.tanh(x))


def test_encoder_function_matches_its_equation():
    """The functional encoder against the equation of the docstring, written with the modules."""
    torch.set_default_dtype(torch.float64)
    encoder = MLPEncoder(3, hidden=6, depth=3, space="unbounded")
    for param in encoder.parameters():  # leave the identity initialisation
        torch.nn.init.normal_(param)
    x = torch.randn(7, 3)
    a = encoder.inp(x)
    for k in range(2):
        a = a + encoder.blocks[k](torch.nn.functional.leaky_relu(encoder.norms[k](a), 0.2))
    u = encoder.skip(x) + encoder.out(torch.nn.functional.leaky_relu(encoder.norms[2](a), 0.2))
    torch.testing.assert_close(encoder(x), u)
    encoder.space = "sphere"
    torch.testing.assert_close(encoder(x), u / u.norm(dim=-1, keepdim=True))


def test_encoder_rejects_bad_arguments():
    with pytest.raises(ValueError, match="hidden"):
        MLPEncoder(3, hidden=0)
    with pytest.raises(TypeError, match="depth"):
        MLPEncoder(3, depth=2.0)
    with pytest.raises(TypeError, match="dim"):
        MLPEncoder(True)
    with pytest.raises(ValueError, match="space"):
        MLPEncoder(3, space="ball")


def test_in_dim_starts_at_the_rectangular_identity():
    """P inputs to n outputs: the untrained unbounded encoder keeps the first min(P, n)
    coordinates (and pads with zeros)."""
    x = torch.randn(6, 5)
    torch.testing.assert_close(MLPEncoder(2, 8, 2, "unbounded", in_dim=5)(x), x[:, :2])
    wide = MLPEncoder(7, 8, 2, "unbounded", in_dim=5)(x)
    torch.testing.assert_close(wide, torch.cat([x, torch.zeros(6, 2)], 1))
