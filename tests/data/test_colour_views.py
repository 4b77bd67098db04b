"""The colour-image views of rpm.data.augment (ColourView, quarter_turn_pair)."""

import pytest
import torch

from rpm.data.augment import ColourView, quarter_turn_pair


def _images(n=16, size=16, seed=0):
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_views_are_reproducible_from_a_generator_and_leave_the_global_stream_alone():
    images = _images()
    view = ColourView(crop_scale=(0.08, 1.0), colour_strength=1.0)
    state = torch.random.get_rng_state()
    a = view(images, torch.Generator().manual_seed(4))
    assert torch.equal(torch.random.get_rng_state(), state)
    b = view(images, torch.Generator().manual_seed(4))
    c = view(images, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == images.shape and 0 <= a.min() and a.max() <= 1


def test_no_crop_and_no_colour_is_the_identity():
    images = _images()
    assert torch.equal(ColourView()(images, torch.Generator().manual_seed(0)), images)


def test_a_full_crop_only_flips():
    images = _images(64)
    out = ColourView(crop_scale=(1.0, 1.0))(images, torch.Generator().manual_seed(1))
    # a crop of the whole image with aspect ratio in [3/4, 4/3] and area 1 is the image itself
    flipped = torch.flip(images, dims=(-1,))
    same = [(o - i).abs().max() < 1e-4 for o, i in zip(out, images, strict=True)]
    mirrored = [(o - f).abs().max() < 1e-4 for o, f in zip(out, flipped, strict=True)]
    assert all(s or m for s, m in zip(same, mirrored, strict=True))
    assert 16 <= sum(mirrored) <= 48  # flips with probability 1/2 (64 draws: 4 sigma)


def test_colour_distortion_keeps_geometry_and_changes_colour():
    # a grey image gains no structure: each pixel's colour is a function of its own colour,
    # so two pixels of one colour stay equal
    images = torch.zeros(200, 3, 8, 8)
    images[:, 0, :, :4] = 0.8
    images[:, 2, :, 4:] = 0.6
    out = ColourView(colour_strength=1.0)(images, torch.Generator().manual_seed(2))
    assert torch.equal(out[:, :, :, :4], out[:, :, :, :1].expand(-1, -1, -1, 4).expand_as(
        out[:, :, :, :4]))
    changed = (out - images).abs().flatten(1).amax(1) > 1e-3
    # jittered with probability 0.8, greyed with 0.2: at least one of them for ~84%
    assert 0.7 < changed.double().mean() < 0.95
    grey = (out[:, 0] == out[:, 1]) & (out[:, 1] == out[:, 2])
    assert 0.1 < grey.flatten(1).all(1).double().mean() < 0.3


def test_quarter_turns_differ_between_the_views():
    images = _images(200, 8)
    first, second = quarter_turn_pair(images, torch.Generator().manual_seed(3))
    turns = []
    for view in (first, second):
        k = []
        for v, x in zip(view, images, strict=True):
            matches = [j for j in range(4) if torch.equal(v, torch.rot90(x, j, dims=(-2, -1)))]
            assert len(matches) == 1
            k.append(matches[0])
        turns.append(torch.tensor(k))
    assert (turns[0] != turns[1]).all()
    counts = torch.bincount(turns[0], minlength=4).double() / 200
    assert torch.allclose(counts, torch.full((4,), 0.25, dtype=torch.float64), atol=0.1)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="RGB"):
        ColourView(colour_strength=1.0)(torch.rand(2, 1, 8, 8))
    with pytest.raises(ValueError, match="square"):
        quarter_turn_pair(torch.rand(2, 3, 8, 6))
    with pytest.raises(ValueError, match="colour_strength"):
        ColourView(colour_strength=-1.0)
    with pytest.raises(ValueError, match="hue_shift must be <= 0.5"):
        ColourView(colour_strength=1.0, hue_shift=0.6)


def test_the_hue_shift_defaults_to_simclrs_and_reaches_the_whole_circle():
    assert ColourView(colour_strength=1.0).hue_shift == pytest.approx(0.2)
    assert ColourView(colour_strength=3.0).hue_shift == 0.5
    # a pure red image, shifted by up to half a turn, no brightness/contrast/saturation change:
    # the hue of the output spreads over the whole circle (kornia's rgb_to_hsv, radians)
    from kornia.color import rgb_to_hsv

    images = torch.zeros(400, 3, 4, 4)
    images[:, 0] = 0.9
    view = ColourView(colour_strength=1e-6, hue_shift=0.5)
    out = view(images, torch.Generator().manual_seed(0))
    jittered = (out - images).abs().flatten(1).amax(1) > 1e-3
    hue = rgb_to_hsv(out[jittered])[:, 0, 0, 0] / (2 * torch.pi)
    counts = torch.histc(hue, bins=4, min=0, max=1)
    assert counts.min() > 0.15 * len(hue)
