r"""The latent generative process of the identifiability experiments: pairs

.. math::

    z \sim p(z), \qquad z' \sim p(z' \mid z), \qquad x = g(z), \quad x' = g(z'),

with the marginal of :mod:`~rpm.data.synthetic.marginals`, the conditional of
:mod:`~rpm.data.synthetic.conditionals` and the mixing :math:`g` of
:mod:`~rpm.data.synthetic.mixing` (Zimmermann et al., 2021; Rusak et al., 2024, for the
anisotropic conditional). Its fields map one to one onto the flags of ``rpm identifiability``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rpm._validation import check_positive_int
from rpm.data.synthetic.conditionals import Conditional
from rpm.data.synthetic.marginals import Marginal

__all__ = ["LatentProcess", "parse_concentrations"]


def parse_concentrations(text: str, dim: int) -> torch.Tensor:
    r"""Parse the per-dimension concentrations :math:`\Lambda = \mathrm{diag}(\lambda)` of the
    anisotropic conditional from a comma-separated string.

    Two values ``"a,b"`` give :math:`\lambda_d = a` for the first ``dim // 2`` dimensions and
    :math:`b` for the remaining ``dim - dim // 2`` (Rusak et al.'s :math:`\Lambda_1, \Lambda_2`);
    ``dim`` values give one per dimension. Anything else raises ``ValueError``.

    :param str text: e.g. ``"5,25"`` or ``"5,10,15,20"``.
    :param int dim: latent dimension :math:`n`.
    :returns: positive concentrations, float64 on the CPU. Shape: ``(n,)``.
    :rtype: torch.Tensor
    """
    if not isinstance(text, str):
        raise TypeError(f"concentrations must be given as a string like '5,25', got "
                        f"{type(text).__name__}")
    dim = check_positive_int("dim", dim)
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"concentrations must be comma-separated numbers like '5,25', got "
                         f"{text!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"concentrations must be finite and > 0, got {text!r}")
    if len(values) == dim:
        return torch.tensor(values, dtype=torch.float64)
    if len(values) == 2:
        half = dim // 2
        return torch.tensor([values[0]] * half + [values[1]] * (dim - half), dtype=torch.float64)
    raise ValueError(f"concentrations need 2 values (first half, second half) or dim={dim} "
                     f"values (one per dimension); got {len(values)} in {text!r}")


@dataclass(frozen=True, eq=False)
class LatentProcess:
    r"""Configuration and sampler of the synthetic latent pairs :math:`(z, z')`.

    Defaults not set here are resolved by the samplers: ``marginal_param`` 1.0, ``conditional_param``
    :math:`\kappa = 1` for vMF and scale 0.05 otherwise, ``gennorm_beta`` 3.0; the resolved values
    are :attr:`marginal_sampler` ``.param`` and :attr:`conditional_sampler` ``.param`` / ``.beta``.
    A parameter that the chosen distribution does not take must stay None (ValueError otherwise).

    Example (the reference setting of Zimmermann et al., Table 1, row 1)::

        process = LatentProcess(dim=10, space="sphere", marginal="uniform",
                                conditional="vmf", conditional_param=1.0)
        z, z_pos = process.sample_pairs(6144)      # (6144, 10) each

    :param int dim: latent dimension :math:`n` (``--dim``; ambient dimension on the sphere).
    :param str space: ``"sphere"``, ``"box"`` or ``"unbounded"`` (``--space``).
    :param str marginal: ``"uniform"``, ``"normal"`` or ``"laplace"`` (``--marginal``).
    :param marginal_param: marginal scale (``--marginal-param``).
    :type marginal_param: float or None
    :param str conditional: ``"vmf"``, ``"normal"``, ``"laplace"``, ``"gennorm"`` or
        ``"anisotropic"`` (``--conditional``).
    :param conditional_param: :math:`\kappa` (vmf) or scale (``--conditional-param``).
    :type conditional_param: float or None
    :param gennorm_beta: generalised-normal shape (``--gennorm-beta``).
    :type gennorm_beta: float or None
    :param concentrations: :math:`\Lambda` of the anisotropic conditional, a tensor of shape
        ``(n,)`` or a string parsed by :func:`parse_concentrations` (``--concentrations "5,25"``);
        stored as a float64 tensor.
    :type concentrations: torch.Tensor or str or None
    :param device: device of all samples.
    :type device: torch.device or str
    :param torch.dtype dtype: floating dtype of all samples.
    """

    dim: int                                         # n, latent (ambient on the sphere) dimension
    space: str = "sphere"                            # sphere | box | unbounded
    marginal: str = "uniform"                        # uniform | normal | laplace
    marginal_param: float | None = None              # normal / laplace scale (default 1.0)
    conditional: str = "vmf"                         # vmf | normal | laplace | gennorm | anisotropic
    conditional_param: float | None = None           # kappa (vmf, default 1) or scale (0.05)
    gennorm_beta: float | None = None                # gennorm shape (default 3.0)
    concentrations: torch.Tensor | str | None = None  # (n,) precisions of "anisotropic"
    device: torch.device | str = "cpu"               # where samples are drawn
    dtype: torch.dtype = torch.float32               # dtype of the samples
    marginal_sampler: Marginal = field(init=False, repr=False)
    conditional_sampler: Conditional = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {self.dtype!r}")
        device = torch.device(self.device)
        object.__setattr__(self, "device", device)
        conc = self.concentrations
        if isinstance(conc, str):
            conc = parse_concentrations(conc, self.dim)
        elif conc is not None and not isinstance(conc, torch.Tensor):
            raise TypeError(f"concentrations must be a tensor, a string like '5,25' or None, got "
                            f"{type(conc).__name__}")
        marginal = Marginal(self.space, self.marginal, self.marginal_param, self.dim,
                            device=device, dtype=self.dtype)
        conditional = Conditional(self.space, self.conditional, self.conditional_param, self.dim,
                                  beta=self.gennorm_beta, concentrations=conc,
                                  device=device, dtype=self.dtype)
        object.__setattr__(self, "concentrations", conditional.concentrations)
        object.__setattr__(self, "marginal_sampler", marginal)
        object.__setattr__(self, "conditional_sampler", conditional)

    def sample_marginal(self, batch_size: int, generator: torch.Generator | None = None
                        ) -> torch.Tensor:
        r"""Draw anchors :math:`z_i \sim p(z)`.

        :param int batch_size: number of samples :math:`B`.
        :param generator: optional random generator on ``device``.
        :type generator: torch.Generator or None
        :returns: latents. Shape: ``(B, n)``.
        :rtype: torch.Tensor
        """
        return self.marginal_sampler.sample(batch_size, generator)

    def sample_conditional(self, z: torch.Tensor, generator: torch.Generator | None = None
                           ) -> torch.Tensor:
        r"""Draw positives :math:`z'_i \sim p(z' \mid z_i)`.

        :param torch.Tensor z: anchors. Shape: ``(B, n)``.
        :param generator: optional random generator on ``device``.
        :type generator: torch.Generator or None
        :returns: positives. Shape: ``(B, n)``.
        :rtype: torch.Tensor
        """
        return self.conditional_sampler.sample(z, generator)

    def sample_pairs(self, batch_size: int, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Draw positive pairs :math:`z_i \sim p(z)`, :math:`z'_i \sim p(z' \mid z_i)`.

        Fully vectorised. The only host synchronisation is one boolean read per call of a
        rejection sampler (the vMF conditional, and the gennorm conditional on the box) to decide
        whether a rare fallback round is needed; all other settings never synchronise.

        :param int batch_size: number of pairs :math:`B`.
        :param generator: optional random generator on ``device`` (same seed, same pairs).
        :type generator: torch.Generator or None
        :returns: ``(z, z_pos)``. Shape: ``(B, n)`` each.
        :rtype: tuple[torch.Tensor, torch.Tensor]
        """
        z = self.sample_marginal(batch_size, generator)
        return z, self.sample_conditional(z, generator)
