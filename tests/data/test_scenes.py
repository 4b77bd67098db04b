"""The procedural Causal3DIdent renderer and its causal graph (rpm.data.scenes), against
independent computations: colorsys and math for the pixels, scipy's truncated normal for the
latent distributions."""

import colorsys
import math

import numpy as np
import pytest
import torch
from scipy import stats

from rpm.data import scenes as S
from rpm.data.scenes import LATENTS, SHAPES, CausalScenes, Scenes, render_scenes, shape_masks


def _scene(shape=0, **values):
    latents = torch.zeros(1, len(LATENTS), dtype=torch.float64)
    for name, value in values.items():
        latents[0, LATENTS.index(name)] = value
    return Scenes(torch.tensor([shape]), latents)


def _pixel_centre(i, size):
    return (i + 0.5) / size * 2 - 1


def _expected_pixel(values, row, col, size, inside):
    """The renderer's equation at one pixel, from colorsys and math (float64)."""
    def rgb(latent, sv):
        return np.array(colorsys.hsv_to_rgb((S.HUE_SPAN * latent) % 1.0, *sv))

    albedo = rgb(values["hue_object"], S.OBJECT_SV) if inside else rgb(
        values["hue_background"], S.BACKGROUND_SV)
    theta = S.SPOT_RANGE * values["spotlight"]
    px, py = _pixel_centre(col, size), _pixel_centre(row, size)
    d2 = (px - S.SPOT_RADIUS * math.cos(theta)) ** 2 + (py - S.SPOT_RADIUS * math.sin(theta)) ** 2
    light = math.exp(-d2 / (2 * S.SPOT_WIDTH ** 2))
    return np.clip(albedo * (S.AMBIENT + S.GAIN * light * rgb(values["hue_spotlight"], S.SPOT_SV)),
                   0, 1)


def test_pixels_follow_the_rendering_equation():
    rng = np.random.default_rng(0)
    size = 32
    for _ in range(5):
        values = dict(zip(LATENTS, rng.uniform(-1, 1, len(LATENTS)), strict=True))
        values["x"], values["y"] = 0.0, 0.0  # object at the centre, background at the corners
        scene = _scene(int(rng.integers(7)), **values)
        image = render_scenes(scene, size)[0].numpy()
        mask = shape_masks(scene, size)[0].numpy()
        inside = np.argwhere(mask == 1.0)
        row, col = inside[len(inside) // 2]
        np.testing.assert_allclose(image[:, row, col],
                                   _expected_pixel(values, row, col, size, True), atol=1e-6)
        for row, col in ((0, 0), (0, size - 1), (size - 1, 0), (size - 1, size - 1)):
            assert mask[row, col] == 0.0
            np.testing.assert_allclose(image[:, row, col],
                                       _expected_pixel(values, row, col, size, False), atol=1e-6)


def _centroid(mask):
    rows, cols = np.indices(mask.shape)
    total = mask.sum()
    return np.array([(cols * mask).sum() / total, (rows * mask).sum() / total])


@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_position_moves_the_mask_centroid(shape):
    size = 64
    base = shape_masks(_scene(shape, x=-0.3, y=0.1), size)[0].numpy()
    moved = shape_masks(_scene(shape, x=0.4, y=-0.5), size)[0].numpy()
    shift_pixels = S.POSITION_RANGE * np.array([0.7, -0.6]) * size / 2
    np.testing.assert_allclose(_centroid(moved) - _centroid(base), shift_pixels, atol=0.25)


@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_rotation_turns_the_mask_about_the_object_centre(shape):
    size = 64
    rows, cols = np.indices((size, size))
    offsets = np.stack([cols, rows], -1) - (size / 2 - 0.5)  # pixels about the grid's centre
    moments = []
    for rotation in (0.0, 0.4):
        mask = shape_masks(_scene(shape, rotation=rotation), size)[0].numpy()
        first = (offsets * mask[..., None]).sum((0, 1)) / mask.sum()
        second = np.einsum("ija,ijb,ij->ab", offsets, offsets, mask) / mask.sum()
        moments.append((first, second))
    angle = S.ROTATION_RANGE * 0.4
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    (first0, second0), (first1, second1) = moments
    np.testing.assert_allclose(first1, rot @ first0, atol=0.3)
    np.testing.assert_allclose(second1, rot @ second0 @ rot.T, rtol=0.03, atol=0.5)
    eigenvalues = np.linalg.eigvalsh(second0)
    # the moments see the turn: an area centre off the origin or an elongated area
    assert np.linalg.norm(first0) > 1.0 or eigenvalues[1] > 1.2 * eigenvalues[0]


def test_the_spotlight_is_brightest_where_its_latent_puts_it():
    size = 64
    for spotlight in (-0.7, 0.1, 0.6):
        # object far from the spot; white-ish light on a grey-free background hue
        scene = _scene(0, x=-1.0, y=-1.0, spotlight=spotlight, hue_background=0.3,
                       hue_spotlight=0.3)
        if spotlight < 0:
            scene = _scene(0, x=1.0, y=1.0, spotlight=spotlight, hue_background=0.3,
                           hue_spotlight=0.3)
        brightness = render_scenes(scene, size)[0].sum(0).numpy()
        mask = shape_masks(scene, size)[0].numpy()
        brightness[mask > 0] = 0
        row, col = np.unravel_index(brightness.argmax(), brightness.shape)
        theta = S.SPOT_RANGE * spotlight
        want = (np.array([math.cos(theta), math.sin(theta)]) * S.SPOT_RADIUS + 1) * size / 2 - 0.5
        assert abs(col - want[0]) <= 1.5 and abs(row - want[1]) <= 1.5


def test_hues_colour_their_own_pixels():
    size = 32
    a = render_scenes(_scene(2, hue_object=-0.5), size)[0]
    b = render_scenes(_scene(2, hue_object=0.5), size)[0]
    alpha = shape_masks(_scene(2), size)[0]
    assert (a - b).abs().sum(0)[alpha == 1].min() > 0.05  # every object pixel changes
    assert (a - b).abs().sum(0)[alpha == 0].max() == 0  # no background pixel does
    c = render_scenes(_scene(2, hue_background=0.5), size)[0]
    base = render_scenes(_scene(2), size)[0]
    assert (c - base).abs().sum(0)[alpha == 0].min() > 0.02
    assert (c - base).abs().sum(0)[alpha == 1].max() == 0


def test_shapes_are_distinct():
    masks = shape_masks(Scenes(torch.arange(7), torch.zeros(7, len(LATENTS))), 64)
    binary = masks > 0.5
    for i in range(7):
        for j in range(i + 1, 7):
            inter = (binary[i] & binary[j]).sum().item()
            union = (binary[i] | binary[j]).sum().item()
            assert inter / union < 0.75, (SHAPES[i], SHAPES[j], inter / union)


def test_rendering_is_deterministic_per_seed():
    scenes = CausalScenes()
    draws = []
    for seed in (5, 5, 6):
        z = scenes.sample(64, torch.Generator().manual_seed(seed))
        draws.append(render_scenes(z, 32))
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])
    assert draws[0].shape == (64, 3, 32, 32) and 0 <= draws[0].min() and draws[0].max() <= 1


def test_truncated_normal_matches_scipy():
    mean = torch.full((200_000,), 0.6, dtype=torch.float64)
    draws = S.truncated_normal(mean, 0.5, torch.Generator().manual_seed(0)).numpy()
    law = stats.truncnorm((-1 - 0.6) / 0.5, (1 - 0.6) / 0.5, loc=0.6, scale=0.5)
    assert draws.min() >= -1 and draws.max() <= 1
    assert stats.kstest(draws[:20_000], law.cdf).pvalue > 1e-3
    assert draws.mean() == pytest.approx(law.mean(), abs=4 * law.std() / math.sqrt(len(draws)))


def test_the_causal_graph_by_monte_carlo():
    scenes = CausalScenes(noise_scale=0.6, hue_noise=0.3, dtype=torch.float64)
    z = scenes.sample(200_000, torch.Generator().manual_seed(1))
    col = {name: z.latents[:, i].numpy() for i, name in enumerate(LATENTS)}
    k = z.shape.numpy()
    assert np.bincount(k, minlength=7) / len(k) == pytest.approx(np.full(7, 1 / 7), abs=0.005)
    for cls in (0, 3):  # class -> object position: truncated normal about the class mean
        angle = 2 * math.pi * cls / 7
        for name, mu in (("x", 0.5 * math.cos(angle)), ("y", 0.5 * math.sin(angle))):
            law = stats.truncnorm((-1 - mu) / 0.6, (1 - mu) / 0.6, loc=mu, scale=0.6)
            assert col[name][k == cls].mean() == pytest.approx(law.mean(), abs=0.01)
    # object position -> spotlight; spotlight hue -> object hue; roots uniform and independent
    near = np.abs(col["x"] - 0.5) < 0.02
    law = stats.truncnorm((-1 - 0.5) / 0.6, (1 - 0.5) / 0.6, loc=0.5, scale=0.6)
    assert col["spotlight"][near].mean() == pytest.approx(law.mean(), abs=0.02)
    # the hue difference on the circle is a wrapped normal: E[cos(pi d)] = exp(-(pi s)^2 / 2)
    difference = np.pi * (col["hue_object"] - col["hue_spotlight"])
    assert np.cos(difference).mean() == pytest.approx(np.exp(-(np.pi * 0.3) ** 2 / 2), abs=0.01)
    assert abs(np.sin(difference).mean()) < 0.01
    assert col["hue_object"].min() >= -1 and col["hue_object"].max() < 1
    for name in ("rotation", "hue_background", "hue_spotlight"):
        assert stats.kstest(col[name][:20_000], stats.uniform(-1, 2).cdf).pvalue > 1e-3
    assert abs(np.corrcoef(col["rotation"], col["x"])[0, 1]) < 0.01


def test_latent_transformations_keep_the_rest():
    scenes = CausalScenes(change_scale=1.0, dtype=torch.float64)
    z = scenes.sample(50_000, torch.Generator().manual_seed(2))
    z[1][:, LATENTS.index("rotation")] = 0.4
    z[1][:, LATENTS.index("hue_object")] = 0.4
    changed = scenes.transform(z, ["rotations", "hues"], torch.Generator().manual_seed(3))
    columns = [LATENTS.index(n) for n in (*S.CHANGE_GROUPS["hues"], "rotation")]
    kept = [i for i in range(len(LATENTS)) if i not in columns]
    assert torch.equal(changed.shape, z.shape)
    assert torch.equal(changed.latents[:, kept], z.latents[:, kept])
    law = stats.truncnorm((-1 - 0.4) / 1.0, (1 - 0.4) / 1.0, loc=0.4, scale=1.0)
    rotation = changed.latents[:, LATENTS.index("rotation")].numpy()
    assert stats.kstest(rotation[:20_000], law.cdf).pvalue > 1e-3
    # a hue: the wrapped normal about 0.4, its density summed over the periods -1, 0, 1
    def wrapped_cdf(h):
        return sum(stats.norm(0.4 + 2 * k, 1.0).cdf(h) - stats.norm(0.4 + 2 * k, 1.0).cdf(-1)
                   for k in range(-4, 5))
    hue = changed.latents[:, LATENTS.index("hue_object")].numpy()
    assert stats.kstest(hue[:20_000], wrapped_cdf).pvalue > 1e-3
    with pytest.raises(ValueError, match="change must name"):
        scenes.transform(z, ["colours"])


def test_bad_scenes_are_refused():
    with pytest.raises(ValueError, match="latents must be a float tensor"):
        render_scenes(Scenes(torch.tensor([0]), torch.zeros(1, 3)))
    with pytest.raises(ValueError, match="classes 0..6"):
        render_scenes(Scenes(torch.tensor([7]), torch.zeros(1, 7)))
    with pytest.raises(TypeError, match="Scenes"):
        render_scenes(torch.zeros(1, 7))
    with pytest.raises(ValueError, match="size must be >= 8"):
        render_scenes(Scenes(torch.tensor([0]), torch.zeros(1, 7)), 4)
