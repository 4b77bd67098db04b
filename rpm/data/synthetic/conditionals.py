r"""Positive-pair conditionals :math:`p(z' \mid z)` of the synthetic latents.

* ``"vmf"`` (sphere only): :math:`z' \sim \mathrm{vMF}(z, \kappa)`, density
  :math:`\propto e^{\kappa z^\top z'}` (:mod:`rpm.data.synthetic.vmf`, Wood's algorithm).
* ``"normal"``, ``"laplace"``, ``"gennorm"``, ``"anisotropic"``: additive factorised noise
  :math:`\tilde z = z + \epsilon` with, per coordinate,

  - normal: :math:`\epsilon_d \sim \mathcal N(0, \sigma^2)`,
    :math:`p \propto e^{-\|z' - z\|_2^2 / (2\sigma^2)}`;
  - laplace: :math:`\epsilon_d \sim \mathrm{Laplace}(0, \lambda)`,
    :math:`p \propto e^{-\|z' - z\|_1 / \lambda}`;
  - gennorm: :math:`\epsilon_d \sim \mathrm{GenNorm}(\beta, \alpha)`,
    :math:`p \propto e^{-\|z' - z\|_\beta^\beta / \alpha^\beta}`;
  - anisotropic (AnInfoNCE, Rusak et al., 2024): :math:`\epsilon \sim \mathcal N(0,
    \Lambda^{-1})`, :math:`\Lambda = \mathrm{diag}(\lambda_1, \dots, \lambda_n)` the per-dimension
    concentrations (precisions): :math:`p \propto e^{-\frac12 (z'-z)^\top \Lambda (z'-z)}`,
    the density the anisotropic energy models (``docs/theory.md#energies``).

  and then, by space:

  - unbounded: :math:`z' = \tilde z`;
  - box: :math:`\tilde z` conditioned on :math:`\tilde z \in [-1, 1]^n`, exactly and per
    coordinate (inversion for normal, Laplace and anisotropic noise, rejection for gennorm;
    :class:`~rpm.data.synthetic.spaces.BoxTruncation`). Rejecting whole vectors, as
    Zimmermann et al. describe, gives the same law;
  - sphere: :math:`z' = \tilde z / \|\tilde z\|`, noise in the ambient space then radial
    projection (our construction for the "Sphere, Normal / Laplace" rows of Zimmermann et al.,
    Table 1, whose exact recipe the seeds do not preserve). For "anisotropic",
    :math:`\Lambda` thus acts on ambient coordinates; for small noise the tangent displacement
    is :math:`(I - z z^\top)\epsilon`.
"""

from __future__ import annotations

import torch

from rpm._validation import check_choice, check_positive
from rpm.data.synthetic._checks import check_generator, check_space_dim
from rpm.data.synthetic.noise import FactorisedNoise
from rpm.data.synthetic.spaces import (
    BoxTruncation,
    project_to_sphere,
)
from rpm.data.synthetic.vmf import VonMisesFisherSampler

__all__ = [
    "CONDITIONALS",
    "Conditional",
    "DEFAULT_GENNORM_BETA",
    "DEFAULT_KAPPA",
    "DEFAULT_SCALE",
]

CONDITIONALS = ("vmf", "normal", "laplace", "gennorm", "anisotropic")
DEFAULT_KAPPA = 1.0         # vMF(kappa = 1): the reference row of Zimmermann et al., Table 1
DEFAULT_SCALE = 0.05        # sigma = lambda = alpha = 0.05: most rows of Zimmermann et al.
DEFAULT_GENNORM_BETA = 3.0  # GenNorm(beta = 3), Zimmermann et al., Table 2


class Conditional:
    r"""Sampler of the positive-pair conditional :math:`p(z' \mid z)` (see the module docstring).

    :param str space: ``"sphere"``, ``"box"`` or ``"unbounded"``.
    :param str kind: ``"vmf"``, ``"normal"``, ``"laplace"``, ``"gennorm"`` or ``"anisotropic"``.
    :param param: :math:`\kappa` for ``"vmf"`` (default 1.0); the scale :math:`\sigma, \lambda,
        \alpha` for ``"normal"``, ``"laplace"``, ``"gennorm"`` (default 0.05); must be None for
        ``"anisotropic"`` (its scales come from ``concentrations``).
    :type param: float or None
    :param int dim: latent dimension :math:`n` (ambient dimension on the sphere).
    :param beta: generalised-normal shape :math:`\beta` (default 3.0); None for other kinds.
    :type beta: float or None
    :param concentrations: :math:`(\lambda_1..\lambda_n)`, required for ``"anisotropic"`` and
        None otherwise. Shape: ``(n,)``.
    :type concentrations: torch.Tensor or None
    :param device: device of the samples.
    :type device: torch.device or str
    :param torch.dtype dtype: floating dtype of the samples.
    """

    def __init__(self, space: str, kind: str, param: float | None, dim: int, *,
                 beta: float | None = None, concentrations: torch.Tensor | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        self.space, self.dim = check_space_dim(space, dim)
        self.kind = check_choice("conditional", kind, CONDITIONALS)
        self.device = torch.device(device)
        self.dtype = dtype
        if kind != "gennorm" and beta is not None:
            raise ValueError(f"gennorm_beta applies only to the 'gennorm' conditional; got "
                             f"gennorm_beta={beta!r} with conditional={kind!r} (leave it None)")
        if kind != "anisotropic" and concentrations is not None:
            raise ValueError(f"concentrations apply only to the 'anisotropic' conditional; got "
                             f"them with conditional={kind!r} (leave them None)")
        self.beta = None
        self.concentrations = None
        if kind == "vmf":
            if space != "sphere":
                raise ValueError(f"the 'vmf' conditional lives on the sphere; got space={space!r}"
                                 " (use space='sphere' or another conditional)")
            self.param: float | None = (DEFAULT_KAPPA if param is None
                                        else check_positive("conditional_param (kappa)", param))
            self._vmf = VonMisesFisherSampler(self.param, dim)
            return
        if kind == "anisotropic":
            if param is not None:
                raise ValueError(f"the 'anisotropic' conditional takes its precisions from "
                                 f"concentrations; got conditional_param={param!r} (leave it None)")
            if not isinstance(concentrations, torch.Tensor):
                raise ValueError("the 'anisotropic' conditional needs concentrations, a tensor of "
                                 f"shape ({dim},); e.g. parse_concentrations('5,25', {dim})")
            if concentrations.shape != (dim,):
                raise ValueError(f"concentrations must have shape ({dim},), got "
                                 f"{tuple(concentrations.shape)}")
            lam = concentrations.detach().to("cpu", torch.float64)
            if not bool(torch.isfinite(lam).all() and (lam > 0).all()):
                raise ValueError(f"concentrations must be finite and > 0, got {lam.tolist()}")
            self.param = None
            self.concentrations = lam
            self._noise = FactorisedNoise("normal", lam.rsqrt(), device=self.device, dtype=dtype)
        else:
            self.param = (DEFAULT_SCALE if param is None
                          else check_positive("conditional_param (scale)", param))
            if kind == "gennorm":
                self.beta = (DEFAULT_GENNORM_BETA if beta is None
                             else check_positive("gennorm_beta", beta))
            self._noise = FactorisedNoise(kind, self.param, self.beta, device=self.device,
                                          dtype=dtype)
        if space == "box":
            self._box = BoxTruncation(self._noise)

    def sample(self, z: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        r"""Draw one positive :math:`z'_i \sim p(z' \mid z_i)` per row of ``z``.

        :param torch.Tensor z: anchors in the space (unit norm on the sphere, inside the box).
            Shape: ``(B, n)``.
        :param generator: optional random generator on ``device``.
        :type generator: torch.Generator or None
        :returns: positives in the space. Shape: ``(B, n)``.
        :rtype: torch.Tensor
        """
        if not isinstance(z, torch.Tensor) or z.ndim != 2 or z.shape[1] != self.dim:
            raise ValueError(f"z must be a tensor of shape (B, {self.dim}), got "
                             f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z)}")
        if z.device.type != self.device.type or z.dtype != self.dtype:
            raise ValueError(f"z is {z.dtype} on {z.device} but the conditional samples "
                             f"{self.dtype} on {self.device}")
        check_generator(generator, self.device)
        if self.kind == "vmf":
            return self._vmf.sample(z, generator)
        if self.space == "box":
            return self._box.sample(z, generator)
        z_tilde = z + self._noise.sample(tuple(z.shape), generator)
        return project_to_sphere(z_tilde) if self.space == "sphere" else z_tilde
