r"""A procedural, two-dimensional Causal3DIdent: one of seven object shapes on a coloured
background under a coloured spotlight, rendered with torch, batched, on any device.

Causal3DIdent (von Kügelgen, Sharma, Gresele et al., 2021) renders 3-D objects with Blender from
latents that depend on one another through a causal graph. Here the same kind of scene is drawn
procedurally (no download, no Blender), at ``size`` x ``size`` RGB (32 or 64), from

* the **class** :math:`k \in \{0, \dots, 6\}`, one of :data:`SHAPES` (none has a rotational
  symmetry, so its rotation is visible);
* seven continuous latents in :math:`[-1, 1]`, the columns of :data:`LATENTS`: the object's
  position ``(x, y)``, the spotlight's position (an angle on a circle about the image centre),
  the hues of the object, of the spotlight and of the background (angles: ``h`` is the hue
  :math:`h/2` of a turn, so that -1 and 1 are the same colour), and the object's rotation.

The image is, at pixel :math:`p` (coordinates in :math:`[-1, 1]^2`),

.. math::

    x(p) = \operatorname{clip}\Big(\big(\alpha(p)\, a_\text{obj} + (1 - \alpha(p))\,
    a_\text{bg}\big) \odot \big(\eta + \gamma\, e^{-\lVert p - s \rVert^2 / (2 w^2)}
    \, c_\text{spot}\big),\ 0,\ 1\Big),

with :math:`\alpha` the anti-aliased mask of the shape moved to ``0.5 (x, y)`` and turned by
``0.75 pi rotation``, the albedos :math:`a` and the light's colour :math:`c_\text{spot}` from
their hues (HSV: hue :math:`h/2` of a turn, the object bright and saturated, the background
darker and paler), the spotlight's centre :math:`s = 0.75 (\cos\theta, \sin\theta)` with
:math:`\theta = 0.8 \pi\, \text{spotlight}`, ambient light :math:`\eta` and gain
:math:`\gamma`. The rotation and spotlight ranges stop short of a full turn, so that distinct
latents give distinct images; the hues cover the colour circle, so that a colour distortion's
hue shift of the whole circle makes each hue independent of the other view's (its score is
then read as the point :math:`(\cos \pi h, \sin \pi h)` on the circle).

**The causal graph** (:class:`CausalScenes`). Causal3DIdent's latents depend on one another
through a causal graph; this one has edges of that kind: the class acts on the object's
position, the object's position on the spotlight's, and the spotlight's hue on the object's hue
(the object takes on the tint of its light); rotation and the spotlight's and the background's
hues are roots:

.. math::

    k &\sim \mathcal U\{0..6\}, \quad \text{rotation}, h_\text{bg}, h_\text{spot}
      \sim \mathcal U[-1, 1], \\
    (x, y) \mid k &\sim \mathcal{TN}(\mu_k, \sigma^2 I), \quad
      \mu_k = \tfrac12 (\cos\tfrac{2\pi k}7, \sin\tfrac{2\pi k}7), \\
    \text{spotlight} \mid x &\sim \mathcal{TN}(x, \sigma^2), \qquad
    h_\text{obj} \mid h_\text{spot} \sim \mathcal{WN}(h_\text{spot}, \sigma_h^2),

:math:`\mathcal{TN}` the normal truncated to :math:`[-1, 1]`, :math:`\mathcal{WN}` the normal
wrapped onto the hue circle :math:`[-1, 1)`, :math:`\sigma` = ``noise_scale`` and
:math:`\sigma_h` = ``hue_noise``. The structural equations are this module's (the paper's are
Blender's and not written out as formulas), and so is the choice of edges.

**Latent transformations** (:meth:`CausalScenes.transform`): the paper's conditional
:math:`p(\tilde z \mid z)` for its "LT" rows: the class is kept, each latent of the changed
group is redrawn from :math:`\mathcal{TN}(z_j, \tau^2)` (a hue from
:math:`\mathcal{WN}(z_j, \tau^2)`; :math:`\tau = 1`, the released code's), the others are
copied, and the scene is rendered again.

References:
    J. von Kügelgen, Y. Sharma, L. Gresele, W. Brendel, B. Schölkopf, M. Besserve and
    F. Locatello, "Self-supervised learning with data augmentations provably isolates content
    from style", NeurIPS 2021 (section 5.2, Appendix D: Causal3DIdent).
    R. S. Zimmermann, Y. Sharma, S. Schneider, M. Bethge and W. Brendel, "Contrastive learning
    inverts the data generating process", ICML 2021 (3DIdent).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import torch

from rpm._validation import check_positive, check_positive_int

__all__ = ["CHANGE_GROUPS", "HUE_COLUMNS", "LATENTS", "SHAPES", "CausalScenes", "Scenes",
           "render_scenes", "shape_masks", "truncated_normal", "wrapped_normal"]

#: The object shapes, by class index.
SHAPES = ("triangle", "ell", "tee", "half_disc", "pacman", "flag", "crescent")
#: The continuous latents, by column.
LATENTS = ("x", "y", "spotlight", "hue_object", "hue_spotlight", "hue_background", "rotation")
#: The columns of the hues: angles on the colour circle, -1 and 1 the same hue.
HUE_COLUMNS = tuple(LATENTS.index(n) for n in ("hue_object", "hue_spotlight", "hue_background"))
#: The latents each latent transformation changes (the paper's "change positions / hues /
#: rotations"; the spotlight's position is a position).
CHANGE_GROUPS = {
    "positions": ("x", "y", "spotlight"),
    "hues": ("hue_object", "hue_spotlight", "hue_background"),
    "rotations": ("rotation",),
}

#: Geometry and light of the renderer (module docstring).
POSITION_RANGE = 0.5  # object centre = POSITION_RANGE * (x, y)
OBJECT_RADIUS = 0.5  # shapes are drawn in [-1, 1]^2 of local units, times this
ROTATION_RANGE = 0.75 * math.pi  # radians per unit of the rotation latent
SPOT_RANGE = 0.8 * math.pi  # radians per unit of the spotlight latent
SPOT_RADIUS = 0.75  # the spotlight circles the image centre at this radius
SPOT_WIDTH = 0.45  # w, the spot's Gaussian width
AMBIENT, GAIN = 0.6, 0.8  # eta and gamma
HUE_SPAN = 0.5  # hue in turns = HUE_SPAN * latent (the whole circle)
OBJECT_SV, BACKGROUND_SV, SPOT_SV = (0.9, 1.0), (0.55, 0.55), (0.8, 1.0)


class Scenes(NamedTuple):
    """A batch of scene latents: the class and the seven continuous latents."""

    shape: torch.Tensor  #: the class, int64. Shape: (N,)
    latents: torch.Tensor  #: in [-1, 1], the columns of :data:`LATENTS`. Shape: (N, 7)


def truncated_normal(mean: torch.Tensor, scale: float, generator: torch.Generator | None = None
                     ) -> torch.Tensor:
    r"""Draws of :math:`\mathcal N(\mu, \sigma^2)` truncated to :math:`[-1, 1]`, elementwise,
    by inverting the CDF: :math:`z = \mu + \sigma \Phi^{-1}(u)` with :math:`u` uniform on
    :math:`(\Phi(\frac{-1 - \mu}\sigma), \Phi(\frac{1 - \mu}\sigma))`.

    :param torch.Tensor mean: :math:`\mu`, in [-1, 1].
    :param float scale: :math:`\sigma > 0`.
    :param generator: the random stream (``None``: torch's global one).
    :returns: draws of the shape, dtype and device of ``mean``.
    """
    scale = check_positive("scale", scale)
    low = torch.special.ndtr((-1.0 - mean) / scale)
    high = torch.special.ndtr((1.0 - mean) / scale)
    u = torch.rand(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
    u = (low + u * (high - low)).clamp(1e-12, 1 - 1e-12)
    return (mean + scale * torch.special.ndtri(u)).clamp(-1.0, 1.0)


def wrapped_normal(mean: torch.Tensor, scale: float, generator: torch.Generator | None = None
                   ) -> torch.Tensor:
    r"""Draws of :math:`\mathcal N(\mu, \sigma^2)` wrapped onto the circle :math:`[-1, 1)`
    (period 2), elementwise: :math:`((\mu + \sigma \varepsilon + 1) \bmod 2) - 1`.

    :param torch.Tensor mean: :math:`\mu`.
    :param float scale: :math:`\sigma > 0`.
    :param generator: the random stream (``None``: torch's global one).
    :returns: draws of the shape, dtype and device of ``mean``.
    """
    scale = check_positive("scale", scale)
    noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
    return torch.remainder(mean + scale * noise + 1.0, 2.0) - 1.0


# ---------------------------------------------------------------- shapes as signed distances
def _box(u, v, cx, cy, hx, hy):
    return torch.maximum((u - cx).abs() - hx, (v - cy).abs() - hy)


def _disc(u, v, cx, cy, r):
    return torch.sqrt((u - cx).square() + (v - cy).square()) - r


def _polygon(u, v, vertices):
    """Convex polygon, vertices counter-clockwise: the largest signed edge distance."""
    out = None
    for (ax, ay), (bx, by) in zip(vertices, vertices[1:] + vertices[:1], strict=True):
        ex, ey = bx - ax, by - ay
        length = math.hypot(ex, ey)
        d = ((u - ax) * ey - (v - ay) * ex) / length  # > 0 to the right of the edge: outside
        out = d if out is None else torch.maximum(out, d)
    return out


def _signed_distance(index: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Signed distance (negative inside, local units) of shape ``SHAPES[index]``."""
    name = SHAPES[index]
    if name == "triangle":
        return _polygon(u, v, [(0.95, 0.0), (-0.75, 0.65), (-0.75, -0.65)])
    if name == "ell":
        return torch.minimum(_box(u, v, -0.55, 0.0, 0.3, 0.9), _box(u, v, 0.1, -0.6, 0.85, 0.3))
    if name == "tee":
        return torch.minimum(_box(u, v, 0.0, 0.6, 0.9, 0.28), _box(u, v, 0.0, -0.15, 0.28, 0.75))
    if name == "half_disc":
        return torch.maximum(_disc(u, v, 0.0, 0.4, 0.95), v - 0.4)
    if name == "pacman":
        wedge = torch.maximum(v - 0.7 * u, -v - 0.7 * u)
        return torch.maximum(_disc(u, v, 0.0, 0.0, 0.9), -wedge)
    if name == "flag":
        return torch.minimum(_box(u, v, -0.7, 0.0, 0.15, 0.9),
                             _polygon(u, v, [(-0.6, 0.9), (-0.6, 0.0), (0.95, 0.45)]))
    # crescent
    return torch.maximum(_disc(u, v, 0.0, 0.0, 0.9), -_disc(u, v, 0.45, 0.1, 0.7))


def _pixel_grid(size: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel centres in [-1, 1]: ``(px, py)``, each (size, size), x across, y down the rows."""
    coords = (torch.arange(size, device=device, dtype=dtype) + 0.5) / size * 2 - 1
    py, px = torch.meshgrid(coords, coords, indexing="ij")
    return px, py


def shape_masks(scenes: Scenes, size: int) -> torch.Tensor:
    r"""The anti-aliased object masks :math:`\alpha \in [0, 1]` of a batch of scenes: the shape
    of each class at ``0.5 (x, y)``, turned by ``0.75 pi rotation``, of radius ``0.5`` (the
    signed distance in pixels :math:`d` gives :math:`\alpha = \operatorname{clip}(\frac12 - d,
    0, 1)`).

    :param Scenes scenes: the latents.
    :param int size: side of the image in pixels.
    :returns: the masks. Shape: (N, size, size).
    """
    size = check_positive_int("size", size)
    shape, latents = _check_scenes(scenes)
    px, py = _pixel_grid(size, latents.device, latents.dtype)
    centre = POSITION_RANGE * latents[:, :2]
    angle = ROTATION_RANGE * latents[:, LATENTS.index("rotation")]
    dx = px - centre[:, 0, None, None]
    dy = py - centre[:, 1, None, None]
    cos, sin = torch.cos(angle)[:, None, None], torch.sin(angle)[:, None, None]
    u = (cos * dx + sin * dy) / OBJECT_RADIUS  # the pixel in the object's frame
    v = (-sin * dx + cos * dy) / OBJECT_RADIUS
    distance = torch.empty_like(u)
    for index in range(len(SHAPES)):
        rows = (shape == index).nonzero().flatten()
        if rows.numel():
            distance[rows] = _signed_distance(index, u[rows], v[rows])
    pixels = distance * OBJECT_RADIUS * size / 2
    return (0.5 - pixels).clamp(0.0, 1.0)


def _hsv(hue_latent: torch.Tensor, saturation: float, value: float) -> torch.Tensor:
    """RGB (N, 3) of hue ``HUE_SPAN * latent`` turns (kornia's HSV to RGB)."""
    from kornia.color import hsv_to_rgb

    hue = torch.remainder(HUE_SPAN * hue_latent, 1.0) * (2 * math.pi)
    hsv = torch.stack([hue, torch.full_like(hue, saturation), torch.full_like(hue, value)], dim=1)
    return hsv_to_rgb(hsv[:, :, None, None])[:, :, 0, 0]


def render_scenes(scenes: Scenes, size: int = 32) -> torch.Tensor:
    """The images of a batch of scenes (module docstring's equation).

    :param Scenes scenes: the latents (class and the seven continuous latents).
    :param int size: side in pixels (e.g. 32 or 64), >= 8.
    :returns: RGB intensities in [0, 1], on the latents' device and dtype.
        Shape: (N, 3, size, size).
    """
    size = check_positive_int("size", size)
    if size < 8:
        raise ValueError(f"size must be >= 8 pixels for the shapes to be told apart, got {size}")
    _, latents = _check_scenes(scenes)
    alpha = shape_masks(scenes, size)[:, None]  # (N, 1, S, S)
    column = {name: latents[:, i] for i, name in enumerate(LATENTS)}
    obj = _hsv(column["hue_object"], *OBJECT_SV)[:, :, None, None]
    background = _hsv(column["hue_background"], *BACKGROUND_SV)[:, :, None, None]
    spot = _hsv(column["hue_spotlight"], *SPOT_SV)[:, :, None, None]
    theta = SPOT_RANGE * column["spotlight"]
    sx = (SPOT_RADIUS * torch.cos(theta))[:, None, None]
    sy = (SPOT_RADIUS * torch.sin(theta))[:, None, None]
    px, py = _pixel_grid(size, latents.device, latents.dtype)
    light = torch.exp(-((px - sx).square() + (py - sy).square()) / (2 * SPOT_WIDTH**2))
    albedo = alpha * obj + (1 - alpha) * background
    return (albedo * (AMBIENT + GAIN * light[:, None] * spot)).clamp(0.0, 1.0)


def _check_scenes(scenes: object) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(scenes, Scenes):
        raise TypeError(f"scenes must be rpm.data.scenes.Scenes(shape, latents), got "
                        f"{type(scenes).__name__}")
    shape, latents = scenes
    if latents.ndim != 2 or latents.shape[1] != len(LATENTS) or not latents.is_floating_point():
        raise ValueError(f"scenes.latents must be a float tensor of shape (N, {len(LATENTS)}) "
                         f"(columns {', '.join(LATENTS)}), got {tuple(latents.shape)} "
                         f"{latents.dtype}")
    if shape.shape != latents.shape[:1] or shape.dtype != torch.int64:
        raise ValueError(f"scenes.shape must be an int64 tensor of shape ({latents.shape[0]},), "
                         f"got {tuple(shape.shape)} {shape.dtype}")
    if shape.numel() and (int(shape.min()) < 0 or int(shape.max()) >= len(SHAPES)):
        raise ValueError(f"scenes.shape must hold classes 0..{len(SHAPES) - 1}, got "
                         f"{int(shape.min())}..{int(shape.max())}")
    return shape, latents


class CausalScenes:
    r"""The latent distribution of the scenes, a causal graph (module docstring), and the
    latent transformations :math:`p(\tilde z \mid z)`.

    :param float noise_scale: :math:`\sigma` of the truncated normals of the positions.
    :param float hue_noise: :math:`\sigma_h` of the object's hue about the spotlight's.
    :param float change_scale: :math:`\tau` of the latent transformations.
    :param device: where the latents are drawn.
    :param torch.dtype dtype: their floating dtype.
    """

    def __init__(self, noise_scale: float = 0.6, hue_noise: float = 0.6,
                 change_scale: float = 1.0, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.noise_scale = check_positive("noise_scale", noise_scale)
        self.hue_noise = check_positive("hue_noise", hue_noise)
        self.change_scale = check_positive("change_scale", change_scale)
        self.device = torch.device(device)
        self.dtype = dtype
        angles = 2 * math.pi * torch.arange(len(SHAPES), dtype=torch.float64) / len(SHAPES)
        self.class_means = (0.5 * torch.stack([torch.cos(angles), torch.sin(angles)], 1)).to(
            self.device, dtype)

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Scenes:
        """``num_samples`` scenes from the causal graph, in topological order.

        :param int num_samples: N.
        :param generator: a generator on :attr:`device` (``None``: torch's global one).
        :returns: the latents.
        """
        n = check_positive_int("num_samples", num_samples)
        kw = {"device": self.device, "dtype": self.dtype}
        shape = torch.randint(len(SHAPES), (n,), generator=generator, device=self.device)
        uniform = 2 * torch.rand(n, 3, generator=generator, **kw) - 1  # rotation, two hues
        rotation, hue_background, hue_spotlight = uniform.unbind(1)
        position = truncated_normal(self.class_means[shape], self.noise_scale, generator)
        spotlight = truncated_normal(position[:, 0], self.noise_scale, generator)
        hue_object = wrapped_normal(hue_spotlight, self.hue_noise, generator)
        latents = torch.stack([position[:, 0], position[:, 1], spotlight, hue_object,
                               hue_spotlight, hue_background, rotation], dim=1)
        return Scenes(shape, latents)

    def transform(self, scenes: Scenes, change: Iterable[str],
                  generator: torch.Generator | None = None) -> Scenes:
        r"""A latent transformation: the class and the latents outside ``change`` kept, each
        latent in ``change`` redrawn from :math:`\mathcal{TN}(z_j, \tau^2)` on [-1, 1] (a hue
        from :math:`\mathcal{WN}(z_j, \tau^2)` on the circle [-1, 1)).

        :param Scenes scenes: the first view's latents.
        :param change: names of :data:`CHANGE_GROUPS` (``"positions"``, ``"hues"``,
            ``"rotations"``) or of :data:`LATENTS`.
        :param generator: the random stream.
        :returns: the second view's latents.
        """
        shape, latents = _check_scenes(scenes)
        columns = []
        for name in change:
            names = CHANGE_GROUPS.get(name, (name,))
            for latent in names:
                if latent not in LATENTS:
                    raise ValueError(f"change must name groups {', '.join(CHANGE_GROUPS)} or "
                                     f"latents {', '.join(LATENTS)}, got {name!r}")
                columns.append(LATENTS.index(latent))
        out = latents.clone()
        for column in sorted(set(columns)):
            draw = wrapped_normal if column in HUE_COLUMNS else truncated_normal
            out[:, column] = draw(latents[:, column], self.change_scale, generator)
        return Scenes(shape.clone(), out)
