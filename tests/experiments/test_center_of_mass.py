"""``rpm.experiments.center_of_mass.CenterOfMass``: the soft centre of mass of feature maps against
hand computations and a loop over pixels in float64, and on rendered balls."""

import pytest
import torch

from rpm.data.bouncing_balls import generate_bouncing_balls
from rpm.experiments.center_of_mass import CenterOfMass


def _center_of_mass_loop(maps: torch.Tensor, normalized: bool, eps: float = 0.0) -> torch.Tensor:
    """The centre of mass written pixel by pixel from its definition, in Python floats
    (double precision). (N, K, H, W) -> (N, 2K)."""
    n, k, h, w = maps.shape
    out = torch.zeros(n, 2 * k, dtype=maps.dtype)
    for a in range(n):
        for b in range(k):
            mass = sx = sy = 0.0
            for i in range(h):
                for j in range(w):
                    x, y = j + 0.5, i + 0.5
                    if normalized:
                        x, y = 2 * x / w - 1, 2 * y / h - 1
                    mass += maps[a, b, i, j].item()
                    sx += maps[a, b, i, j].item() * x
                    sy += maps[a, b, i, j].item() * y
            out[a, 2 * b], out[a, 2 * b + 1] = sx / (mass + eps), sy / (mass + eps)
    return out


def test_center_of_mass_of_two_pixels_by_hand():
    maps = torch.zeros(1, 2, 4, 5, dtype=torch.float64)
    maps[0, 0, 0, 0] = 1.0  # pixel centre (x, y) = (0.5, 0.5)
    maps[0, 0, 2, 3] = 3.0  # pixel centre (x, y) = (3.5, 2.5)
    maps[0, 1, 3, 1] = 2.0  # a single pixel: its own centre (1.5, 3.5)
    # map 0: x = (0.5 + 3 * 3.5) / 4 = 2.75, y = (0.5 + 3 * 2.5) / 4 = 2.0
    expected = torch.tensor([[2.75, 2.0, 1.5, 3.5]], dtype=torch.float64)
    torch.testing.assert_close(CenterOfMass(eps=0.0)(maps), expected)
    # normalised: x -> 2 x / W - 1 (W = 5), y -> 2 y / H - 1 (H = 4)
    normalized = torch.tensor([[0.1, 0.0, -0.4, 0.75]], dtype=torch.float64)
    torch.testing.assert_close(CenterOfMass(normalized=True, eps=0.0)(maps), normalized)


@pytest.mark.parametrize("eps", [0.0, 0.3])
@pytest.mark.parametrize("normalized", [False, True])
def test_center_of_mass_matches_a_pixel_loop(normalized, eps):
    maps = torch.rand(3, 2, 5, 7, dtype=torch.float64)
    layer = CenterOfMass(normalized=normalized, eps=eps)
    torch.testing.assert_close(layer(maps), _center_of_mass_loop(maps, normalized, eps),
                               rtol=1e-12, atol=1e-12)


def test_center_of_mass_in_float32_matches_the_float64_loop():
    maps = torch.rand(2, 3, 6, 4, dtype=torch.float64)
    layer = CenterOfMass(eps=1e-6)
    torch.testing.assert_close(layer(maps.float()).double(), _center_of_mass_loop(maps, False, 1e-6),
                               rtol=1e-5, atol=1e-5)


def test_center_of_mass_of_a_zero_map_is_finite_and_gradients_are_exact():
    assert torch.equal(CenterOfMass()(torch.zeros(2, 3, 4, 4)), torch.zeros(2, 6))
    maps = torch.rand(2, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(CenterOfMass(eps=1e-3), (maps,))


def test_center_of_mass_of_rendered_balls_is_their_true_centre():
    video = generate_bouncing_balls(num_frames=40, seed=2, dtype=torch.float64)
    recovered = CenterOfMass(eps=0.0)(video.frames)  # (T, 6) = (x1, y1, x2, y2, x3, y3)
    # rendering discretisation error is below 0.04 px (see tests/data/test_bouncing_balls_data.py)
    torch.testing.assert_close(recovered, video.centres.flatten(1), rtol=0, atol=0.06)


def test_center_of_mass_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\(N, K, H, W\)"):
        CenterOfMass()(torch.rand(3, 4, 4))
    with pytest.raises(ValueError, match="eps"):
        CenterOfMass(eps=-1.0)
    with pytest.raises(TypeError, match="normalized"):
        CenterOfMass(normalized=1)
    with pytest.raises(TypeError, match="eps must be a number"):
        CenterOfMass(eps="0.1")
    with pytest.raises(TypeError, match="maps must be a torch.Tensor"):
        CenterOfMass()([[[[1.0]]]])
