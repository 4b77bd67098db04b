"""Augmentations: shapes and ranges, identities, the noise's moments (Monte Carlo), the shift's
bound (centre of mass), per-sample independence, reproducibility, device and dtype."""

import pytest
import torch

from rpm.data.augment import MultiViewTransform, RandomView, multi_crop_views
from rpm.data.digits import load_digits_split

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IDENTITY = {"degrees": 0.0, "translate": 0.0, "scale": (1.0, 1.0), "shear": 0.0, "noise_std": 0.0}


@pytest.fixture(scope="module")
def digits():
    return load_digits_split().train.images[:64]  # (64, 1, 8, 8)


def test_views_have_the_requested_shapes_and_stay_in_the_unit_interval(digits):
    views = multi_crop_views(num_global=2, num_local=3, local_size=4)(digits)
    assert [tuple(v.shape) for v in views] == [(64, 1, 8, 8)] * 2 + [(64, 1, 4, 4)] * 3
    for v in views:
        assert v.dtype == digits.dtype and not v.requires_grad
        assert float(v.min()) >= 0.0 and float(v.max()) <= 1.0
    cropped = RandomView(size=6, crop_scale=(0.5, 0.9))(digits)
    assert cropped.shape == (64, 1, 6, 6)


def test_identity_settings_return_the_input(digits):
    torch.testing.assert_close(RandomView(**IDENTITY)(digits), digits, rtol=0, atol=1e-6)
    full_crop = RandomView(size=8, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), **IDENTITY)
    torch.testing.assert_close(full_crop(digits), digits, rtol=0, atol=1e-5)


def test_noise_has_the_requested_mean_and_standard_deviation():
    # a grey image far from the clipping bounds: the view is 0.5 + sigma * eps pixel by pixel
    images = torch.full((2000, 1, 8, 8), 0.5, dtype=torch.float64)
    sigma = 0.05
    noise = RandomView(**{**IDENTITY, "noise_std": sigma})(images) - 0.5
    n = noise.numel()
    assert abs(float(noise.mean())) < 4 * sigma / n**0.5
    # the sample standard deviation of n normal draws has relative s.e. 1 / sqrt(2 n)
    assert abs(float(noise.std()) / sigma - 1) < 4 / (2 * n) ** 0.5


def test_shift_moves_the_centre_of_mass_by_at_most_translate_times_the_side():
    images = torch.zeros(500, 1, 8, 8, dtype=torch.float64)
    images[:, :, 3:5, 3:5] = 1.0  # a 2 x 2 block in the middle: stays inside under shifts < 3 px
    translate = 0.1  # at most 0.8 px on an 8 px side
    views = RandomView(**{**IDENTITY, "translate": translate})(images)
    grid = torch.arange(8, dtype=torch.float64)

    def centre(x):
        mass = x.sum(dim=(-1, -2))
        return torch.stack([(x.sum(-1) * grid).sum(-1) / mass, (x.sum(-2) * grid).sum(-1) / mass], -1)

    # bilinear resampling under a pure shift moves the mass with it (nothing leaves the image)
    torch.testing.assert_close(views.sum(dim=(-1, -2)), images.sum(dim=(-1, -2)))
    shift = centre(views) - centre(images)  # (500, 1, 2)
    assert float(shift.abs().max()) <= translate * 8 + 1e-9
    assert float(shift.abs().max()) > 0.7 * translate * 8  # the range is used, not a fixed shift


def test_views_differ_and_every_image_draws_its_own_parameters(digits):
    one = digits[:1].expand(50, -1, -1, -1).contiguous()  # 50 copies of one image
    for view in (RandomView(noise_std=0.0), RandomView(**{**IDENTITY, "degrees": 15.0})):
        out = view(one).flatten(1)  # (50, 64)
        gaps = torch.cdist(out, out) + torch.eye(50) * 1e9
        assert float(gaps.min()) > 1e-6, "two images of the batch got the same augmentation"
    # kornia's crop boxes have integer corners: an 8 x 8 image has few boxes of 40-80% of its
    # area, so copies may share one; far more than one distinct box must still be drawn
    crops = RandomView(size=8, crop_scale=(0.4, 0.8), **IDENTITY)(one).flatten(1)
    assert torch.unique(crops, dim=0).shape[0] >= 20
    a, b = MultiViewTransform([RandomView(), RandomView()])(digits)
    assert bool(((a - b).flatten(1).abs().amax(1) > 1e-6).all())


def test_a_generator_makes_views_reproducible_and_leaves_the_global_stream_alone(digits):
    transform = multi_crop_views(num_global=2, num_local=2)
    state = torch.get_rng_state()
    first = transform(digits, torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), state)
    again = transform(digits, torch.Generator().manual_seed(7))
    other = transform(digits, torch.Generator().manual_seed(8))
    for x, y, z in zip(first, again, other, strict=True):
        assert torch.equal(x, y) and not torch.equal(x, z)
    torch.manual_seed(3)
    g1 = transform(digits)
    torch.manual_seed(3)
    g2 = transform(digits)
    assert all(torch.equal(x, y) for x, y in zip(g1, g2, strict=True))


def test_views_follow_the_input_dtype_and_device(digits):
    out = RandomView()(digits.double())
    assert out.dtype == torch.float64 and out.device == digits.device


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_views_are_computed_on_the_cuda_device_and_match_the_cpu(digits):
    view = RandomView(size=8, crop_scale=(0.5, 1.0))
    on_gpu = view(digits.cuda(), torch.Generator().manual_seed(1))
    assert on_gpu.device.type == "cuda"
    on_cpu = view(digits, torch.Generator().manual_seed(1))
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=0, atol=1e-5)


@pytest.mark.parametrize("call, error, match", [
    (lambda: RandomView()(torch.zeros(2, 8, 8)), ValueError, r"shape \(N, C, H, W\)"),
    (lambda: RandomView()(torch.zeros(2, 1, 8, 8, dtype=torch.uint8)), TypeError, "floating point"),
    (lambda: RandomView(size=8)(torch.zeros(2, 1, 6, 6)), ValueError, "must be 8 x 8"),
    (lambda: RandomView()(torch.zeros(2, 1, 8, 8), generator=3), TypeError, "torch.Generator"),
    (lambda: RandomView(crop_scale=(0.5, 1.0)), ValueError, "size is needed"),
    (lambda: RandomView(size=4, crop_scale=(0.9, 0.5)), ValueError, "crop_scale must satisfy"),
    (lambda: RandomView(translate=1.0), ValueError, "translate must be < 1"),
    (lambda: RandomView(noise_std=-0.1), ValueError, "noise_std"),
    (lambda: multi_crop_views(num_local=1, local_size=10), ValueError, "local_size must be <="),
    (lambda: MultiViewTransform(RandomView()), TypeError, "non-empty list"),
])
def test_bad_arguments_are_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()
