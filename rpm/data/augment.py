r"""Random augmentations for small grey images (the 8x8 digits), per sample, on the batch's device.

An augmented view of an image :math:`x` is :math:`t(x)` with :math:`t \sim \mathcal{T}` drawn
independently for every image of the batch and every view. The views of one image are the
positive pairs of contrastive learning (Chen et al., 2020; in the RPM reading of Aitchison &
Ganev, the :math:`J` views of an instance are the :math:`J` observations :math:`x_1..x_J` that
share it). :class:`RandomView` draws one view, :class:`MultiViewTransform` returns :math:`J`
views (lightly's ``MultiViewTransform`` convention: a list of views), and
:func:`multi_crop_views` builds the multi-crop family of Caron et al. (2020): global views at
the full size and local views, smaller crops at a smaller size.

The image operations are kornia's (``kornia.augmentation``: ``RandomResizedCrop``,
``RandomAffine``, ``RandomGaussianNoise``), which transform whole batches with per-sample
parameters on the device of the batch.

**Suited to 8 x 8 digits.** A digit fills most of its 8 x 8 box, so the geometry stays within
what handwriting itself varies by: rotations and shears up to 20 degrees, shifts up to 0.15 of
the side (1.2 pixels), zooms of up to 20%, crops that keep most of the digit; plus pixel noise
of standard deviation 0.1. (With ``rpm digits``, these defaults gave higher few-label accuracy
than half of each: benchmarks/README.md.) One resampling per view (each bilinear
resampling of an 8 x 8 image blurs it visibly), so a view applies the crop only where one is
asked for. **No flips**: handwritten digits are not mirror-symmetric and a flip changes what
they show (a mirrored 2 or 5 is not a 2 or a 5, 6 and 9 swap under a vertical flip, 3 becomes a
reversed glyph), so invariance to flips would teach the encoder to ignore exactly what the label
depends on. Colour jitter and greyscale (the other SimCLR staples) have nothing to act on in one
grey channel.

**Randomness and reproducibility.** Every parameter (crop box, angle, shift, zoom, shear and the
noise itself) is drawn on the CPU by kornia from torch's random number generator and then moved
to the batch's device, where the warps run. Called without ``generator``, a view uses torch's
global generator, so ``torch.manual_seed(s)`` makes a run reproducible. Called with a
``torch.Generator`` (a CPU generator), it draws one seed from that generator, runs kornia
under :func:`torch.random.fork_rng` with the CPU generator seeded from it, and leaves the global
generator untouched: the same generator state gives the same views, on every device.

References:
    T. Chen, S. Kornblith, M. Norouzi and G. Hinton, "A simple framework for contrastive learning
    of visual representations", ICML 2020 (Section 3 and Appendix A: the augmentations).
    M. Caron, I. Misra, J. Mairal, P. Goyal, P. Bojanowski and A. Joulin, "Unsupervised learning
    of visual features by contrasting cluster assignments", NeurIPS 2020 (multi-crop).
    E. Riba, D. Mishkin, D. Ponsa, E. Rublee and G. Bradski, "Kornia: an open source
    differentiable computer vision library for PyTorch", WACV 2020.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rpm._random import global_rng_from
from rpm._validation import check_int, check_nonnegative, check_positive_int, check_positive_int_or_none

__all__ = ["ColourView", "MultiViewTransform", "RandomView", "multi_crop_views", "quarter_turn_pair"]


def _check_range(name: str, value: Sequence[float], low: float, high: float) -> tuple[float, float]:
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise TypeError(f"{name} must be a pair of numbers (low, high), got {value!r}")
    a, b = float(value[0]), float(value[1])
    if not low <= a <= b <= high:
        raise ValueError(f"{name} must satisfy {low} <= low <= high <= {high}, got {value!r}")
    return a, b


def _check_images(images: object) -> torch.Tensor:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.ndim != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}; add the "
                         "channel axis with images.unsqueeze(1)")
    if not images.dtype.is_floating_point:
        raise TypeError(f"images must be floating point (intensities in [0, 1]), got {images.dtype}; "
                        "convert with images.float() / 255 or the data's own maximum")
    return images


def _check_generator(generator: object) -> torch.Generator | None:
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (the augmentation parameters are drawn "
                         f"on the CPU), got one on {generator.device}")
    return generator


class RandomView(nn.Module):
    r"""One random view per image: an optional random resized crop, a random affine map and
    Gaussian pixel noise, clipped to :math:`[0, 1]`.

    For an image :math:`x` the view is

    .. math::

        t(x) = \operatorname{clip}\big(W_{A}(C_{b}(x)) + \sigma \varepsilon,\ 0,\ 1\big),
        \qquad \varepsilon \sim \mathcal{N}(0, I),

    with :math:`C_b` the crop of a box :math:`b` (area a fraction in ``crop_scale`` of the image,
    aspect ratio in ``crop_ratio``) resized to ``size`` x ``size`` (skipped when ``crop_scale`` is
    ``None``: the view keeps the input's size), and :math:`W_A` bilinear resampling under an
    affine map :math:`A` about the centre: rotation by an angle uniform in
    :math:`[-\text{degrees}, \text{degrees}]`, a shift uniform in :math:`\pm` ``translate`` of
    the width and height, a zoom uniform in ``scale``, a shear uniform in
    :math:`[-\text{shear}, \text{shear}]` degrees (skipped when all four are the identity).
    Pixels that come from outside the image are 0 (the digits' background). kornia draws crop
    boxes with integer corners, so an 8 x 8 image has only a few dozen boxes of a given area
    range; the affine map's zoom and shift are continuous, which is why the global views of
    :func:`multi_crop_views` zoom and shift instead of cropping by default. Every image of the
    batch draws its own :math:`b, A, \varepsilon`. The defaults suit 8 x 8 digits (module
    docstring: no flips).

    :param size: side of the output, needed with ``crop_scale``; without a crop the input must
        already have this side (no resizing is done), and ``None`` takes the input's side.
    :type size: int or None
    :param crop_scale: range of the crop's area as a fraction of the image, in (0, 1], or
        ``None`` for no crop.
    :type crop_scale: tuple[float, float] or None
    :param tuple crop_ratio: range of the crop's aspect ratio (width / height).
    :param float degrees: largest rotation, in degrees.
    :param float translate: largest shift as a fraction of the width and of the height, in [0, 1).
    :param tuple scale: range of the zoom factor (> 1 enlarges the digit).
    :param float shear: largest shear angle, in degrees.
    :param float noise_std: standard deviation :math:`\sigma` of the pixel noise (0: none).
    """

    def __init__(self, size: int | None = None, crop_scale: tuple[float, float] | None = None,
                 crop_ratio: tuple[float, float] = (3 / 4, 4 / 3), degrees: float = 20.0,
                 translate: float = 0.15, scale: tuple[float, float] = (0.8, 1.2), shear: float = 20.0,
                 noise_std: float = 0.1) -> None:
        super().__init__()
        import kornia.augmentation as K

        self.size = check_positive_int_or_none("size", size)
        self.crop_scale = None if crop_scale is None else _check_range("crop_scale", crop_scale, 1e-6, 1.0)
        if self.crop_scale is not None and self.crop_scale[0] <= 0:
            raise ValueError(f"crop_scale must be > 0, got {crop_scale!r}")
        self.crop_ratio = _check_range("crop_ratio", crop_ratio, 1e-6, 1e6)
        self.degrees = check_nonnegative("degrees", degrees)
        if self.degrees > 180:
            raise ValueError(f"degrees must be <= 180, got {degrees!r}")
        self.translate = check_nonnegative("translate", translate)
        if self.translate >= 1:
            raise ValueError(f"translate must be < 1 (a fraction of the image), got {translate!r}")
        self.scale = _check_range("scale", scale, 1e-6, 1e6)
        self.shear = check_nonnegative("shear", shear)
        if self.shear >= 90:
            raise ValueError(f"shear must be < 90 degrees, got {shear!r}")
        self.noise_std = check_nonnegative("noise_std", noise_std)

        ops: list[nn.Module] = []
        if self.crop_scale is not None and self.size is None:
            raise ValueError("size is needed with crop_scale (the side the crops are resized to), got None")
        if self.crop_scale is not None:
            # "resample": one batched warp for every box (the default "slice" mode crops in a loop)
            ops.append(K.RandomResizedCrop((self.size, self.size), scale=self.crop_scale,
                                           ratio=self.crop_ratio, cropping_mode="resample", p=1.0))
        if self.degrees > 0 or self.translate > 0 or self.scale != (1.0, 1.0) or self.shear > 0:
            ops.append(K.RandomAffine(degrees=self.degrees, translate=(self.translate, self.translate),
                                      scale=self.scale, shear=self.shear, padding_mode="zeros", p=1.0))
        if self.noise_std > 0:
            ops.append(K.RandomGaussianNoise(mean=0.0, std=self.noise_std, p=1.0))
        # Held in a tuple, not as child modules: they hold no tensors, and ``.to(device)`` on a
        # child would move kornia's sampling to that device (the module docstring promises the CPU).
        self._ops = tuple(ops)

    def extra_repr(self) -> str:
        return (f"size={self.size}, crop_scale={self.crop_scale}, crop_ratio={self.crop_ratio}, "
                f"degrees={self.degrees}, translate={self.translate}, scale={self.scale}, "
                f"shear={self.shear}, noise_std={self.noise_std}")

    def _apply_ops(self, images: torch.Tensor) -> torch.Tensor:
        out = images
        for op in self._ops:
            out = op(out)  # (N, C, h, w)
        return out.clamp(0.0, 1.0)

    @torch.no_grad()
    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One view of every image.

        :param torch.Tensor images: intensities in ``[0, 1]``. Shape: (N, C, H, W).
        :param generator: CPU generator the view's randomness is drawn from (module docstring);
            ``None`` uses torch's global generator.
        :type generator: torch.Generator or None
        :returns: the views, on the device and in the dtype of ``images``, no gradient.
            Shape: (N, C, size, size), or (N, C, H, W) with ``size=None``.
        :rtype: torch.Tensor
        """
        images = _check_images(images)
        generator = _check_generator(generator)
        side = self.size
        if self.crop_scale is None and side is not None and tuple(images.shape[-2:]) != (side, side):
            raise ValueError(f"images must be {side} x {side} for this view (size={side} and no crop), "
                             f"got {tuple(images.shape[-2:])}; pass crop_scale to crop and resize")
        return _seeded(self._apply_ops, images, generator)


class MultiViewTransform(nn.Module):
    r"""``J`` views of every image, one from each transform (lightly's ``MultiViewTransform``
    convention: a list, view ``j`` from ``transforms[j]``).

    The views are drawn one after another from the same random stream, so they are independent
    draws of :math:`t \sim \mathcal{T}_j` for each image and each view.

    :param transforms: one :class:`RandomView` (or any module with ``forward(images,
        generator)``) per view; at least one.
    :type transforms: Sequence[nn.Module]
    """

    def __init__(self, transforms: Sequence[nn.Module]) -> None:
        super().__init__()
        if isinstance(transforms, nn.Module) or not isinstance(transforms, (list, tuple)) or not transforms:
            raise TypeError("transforms must be a non-empty list of view transforms (one per view), got "
                            f"{type(transforms).__name__}")
        for i, t in enumerate(transforms):
            if not isinstance(t, nn.Module):
                raise TypeError(f"transforms[{i}] must be an nn.Module, got {type(t).__name__}")
        self.transforms = nn.ModuleList(transforms)

    @property
    def num_views(self) -> int:
        """:math:`J`, the number of views returned."""
        return len(self.transforms)

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        """The ``J`` views of every image.

        :param torch.Tensor images: Shape: (N, C, H, W).
        :param generator: CPU generator of the randomness (``None``: torch's global generator).
        :type generator: torch.Generator or None
        :returns: ``J`` tensors; view ``j`` has the shape that ``transforms[j]`` gives.
        :rtype: list[torch.Tensor]
        """
        return [t(images, generator) for t in self.transforms]


def multi_crop_views(num_global: int = 2, num_local: int = 0, global_size: int = 8, local_size: int = 4,
                     global_crop_scale: tuple[float, float] | None = None,
                     local_crop_scale: tuple[float, float] = (0.2, 0.5),
                     **view_kwargs: float) -> MultiViewTransform:
    r"""The multi-crop views of Caron et al. (2020): ``num_global`` views at ``global_size``
    followed by ``num_local`` smaller crops at ``local_size``.

    Global views are :class:`RandomView` with ``crop_scale=global_crop_scale`` (``None``: no
    crop, the affine map and noise only, so the input must be ``global_size`` x
    ``global_size``); local views crop a box of area in ``local_crop_scale`` and resize it to
    ``local_size`` x ``local_size``. The other augmentations (``degrees``, ``translate``,
    ``scale``, ``shear``, ``noise_std``) are shared, from ``view_kwargs``.

    :param int num_global: number of global views, >= 1.
    :param int num_local: number of local views, >= 0.
    :param int global_size: side of the global views.
    :param int local_size: side of the local views.
    :param global_crop_scale: area range of the global crops, or ``None`` for none.
    :type global_crop_scale: tuple[float, float] or None
    :param tuple local_crop_scale: area range of the local crops.
    :returns: the ``num_global + num_local`` views, globals first.
    :rtype: MultiViewTransform
    """
    num_global = check_positive_int("num_global", num_global)
    num_local = check_int("num_local", num_local, minimum=0)
    global_size = check_positive_int("global_size", global_size)
    local_size = check_positive_int("local_size", local_size)
    if num_local and local_size > global_size:
        raise ValueError(f"local_size must be <= global_size ({global_size}), got {local_size}")
    if global_crop_scale is None:
        globals_ = [RandomView(size=global_size, **view_kwargs) for _ in range(num_global)]
    else:
        globals_ = [RandomView(size=global_size, crop_scale=global_crop_scale, **view_kwargs)
                    for _ in range(num_global)]
    locals_ = [RandomView(size=local_size, crop_scale=local_crop_scale, **view_kwargs)
               for _ in range(num_local)]
    return MultiViewTransform(globals_ + locals_)


def _seeded(apply, images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``apply(images)`` with kornia's randomness from ``generator`` (module docstring), or
    from torch's global generator when it is ``None``."""
    if generator is None:
        return apply(images)
    with global_rng_from(generator):
        return apply(images)


class ColourView(nn.Module):
    r"""One random view per colour image, SimCLR's (Chen et al., 2020, Appendix A): an
    optional random resized crop with a random horizontal flip, then an optional colour
    distortion of strength :math:`s`,

    .. math::

        t(x) = G_{0.2}\big(J_{0.8}(F_{0.5}(C_b(x)))\big),

    with :math:`C_b` the crop of a box of area a fraction in ``crop_scale`` (aspect ratio in
    :math:`[3/4, 4/3]`) resized to the input's side, :math:`F_{0.5}` a horizontal flip with
    probability 1/2, :math:`J_{0.8}` with probability 0.8 a colour jitter (brightness, contrast
    and saturation factors uniform in :math:`[1 - 0.8 s, 1 + 0.8 s]`, a hue shift uniform in
    :math:`\pm` ``hue_shift`` of a turn, SimCLR's :math:`0.2 s` by default; torchvision's
    formulas, kornia's ``ColorJitter``) and
    :math:`G_{0.2}` with probability 0.2 a conversion to grey. For colour images only: the
    digits' views are :class:`RandomView`.

    :param crop_scale: range of the crop's area as a fraction of the image, in (0, 1], or
        ``None`` for no crop and no flip (SimCLR's "small" crops: (0.08, 1); "large": (0.8, 1)).
    :type crop_scale: tuple[float, float] or None
    :param float colour_strength: :math:`s \ge 0`; 0: no colour distortion.
    :param hue_shift: largest hue shift, in turns, in [0, 0.5] (0.5: uniform on the colour
        circle); ``None``: :math:`\min(0.2 s, 0.5)`.
    :type hue_shift: float or None
    """

    def __init__(self, crop_scale: tuple[float, float] | None = None,
                 colour_strength: float = 0.0, hue_shift: float | None = None) -> None:
        super().__init__()
        import kornia.augmentation as K

        self.crop_scale = None if crop_scale is None else _check_range("crop_scale", crop_scale, 1e-6, 1.0)
        self.colour_strength = check_nonnegative("colour_strength", colour_strength)
        self.hue_shift = (min(0.2 * self.colour_strength, 0.5) if hue_shift is None
                          else check_nonnegative("hue_shift", hue_shift))
        if self.hue_shift > 0.5:
            raise ValueError(f"hue_shift must be <= 0.5 (half a turn), got {hue_shift!r}")
        self._crop = None
        if self.crop_scale is not None:
            self._crop = (self.crop_scale, K.RandomHorizontalFlip(p=0.5))
        ops: list[nn.Module] = []
        s = self.colour_strength
        if s > 0:
            ops.append(K.ColorJitter(0.8 * s, 0.8 * s, 0.8 * s, self.hue_shift, p=0.8))
            ops.append(K.RandomGrayscale(p=0.2))
        self._colour = tuple(ops)  # not child modules: kornia samples on the CPU (RandomView)

    def extra_repr(self) -> str:
        return (f"crop_scale={self.crop_scale}, colour_strength={self.colour_strength}, "
                f"hue_shift={self.hue_shift}")

    def _apply_ops(self, images: torch.Tensor) -> torch.Tensor:
        import kornia.augmentation as K

        out = images
        if self._crop is not None:
            scale, flip = self._crop
            side = tuple(images.shape[-2:])
            out = flip(K.RandomResizedCrop(side, scale=scale, cropping_mode="resample", p=1.0)(out))
        for op in self._colour:
            out = op(out)
        return out.clamp(0.0, 1.0)

    @torch.no_grad()
    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One view of every image.

        :param torch.Tensor images: RGB intensities in ``[0, 1]``. Shape: (N, 3, H, W).
        :param generator: CPU generator of the randomness (``None``: torch's global one).
        :type generator: torch.Generator or None
        :returns: the views, same shape, device and dtype, no gradient.
        :rtype: torch.Tensor
        """
        images = _check_images(images)
        if images.shape[1] != 3:
            raise ValueError(f"images must be RGB, shape (N, 3, H, W), got {tuple(images.shape)}")
        return _seeded(self._apply_ops, images, _check_generator(generator))


@torch.no_grad()
def quarter_turn_pair(images: torch.Tensor, generator: torch.Generator | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Two views of every image turned by two *different* multiples of 90 degrees (the
    rotation augmentation of von Kügelgen et al., 2021): :math:`k_1` uniform on
    :math:`\{0, 1, 2, 3\}`, :math:`k_2 = k_1 + 1 + u \bmod 4` with :math:`u` uniform on
    :math:`\{0, 1, 2\}`, and view :math:`j` is ``torch.rot90(x, k_j)`` (counter-clockwise).

    :param torch.Tensor images: square images. Shape: (N, C, H, H).
    :param generator: CPU generator of the turns (``None``: torch's global one).
    :type generator: torch.Generator or None
    :returns: the two views, each of the shape of ``images``.
    :rtype: tuple[torch.Tensor, torch.Tensor]
    """
    images = _check_images(images)
    generator = _check_generator(generator)
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"images must be square to turn by 90 degrees, got {tuple(images.shape[-2:])}")
    n = images.shape[0]
    first = torch.randint(4, (n,), generator=generator)
    second = (first + 1 + torch.randint(3, (n,), generator=generator)) % 4
    views = []
    for turns in (first, second):
        view = torch.empty_like(images)
        for k in range(4):
            rows = (turns == k).nonzero().flatten().to(images.device)
            if rows.numel():
                view[rows] = torch.rot90(images[rows], k, dims=(-2, -1))
        views.append(view)
    return views[0], views[1]
