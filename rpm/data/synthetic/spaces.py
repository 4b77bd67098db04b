r"""Latent spaces of the synthetic identifiability data and the operations that keep samples in
them.

* ``"sphere"``: the unit sphere :math:`S^{n-1} = \{z \in \mathbb R^n : \|z\|_2 = 1\}`; ``dim`` is
  the ambient dimension :math:`n` (as in Zimmermann et al., 2021, whose ``n = 10`` latents lie on
  :math:`S^9`).
* ``"box"``: the hypercube :math:`[-1, 1]^n`.
* ``"unbounded"``: :math:`\mathbb R^n`.

Truncation to the box is coordinate by coordinate. For factorised noise the box conditional
factorises,

.. math::

    p(z' \mid z) \propto \prod_d p_d(z'_d - z_d)\, \mathbf 1[|z'_d| \le 1],

so truncating each coordinate separately (by inversion or by rejection) gives exactly the law of
rejecting whole vectors (Zimmermann et al.), without an acceptance rate that decays with
:math:`n`.
"""

from __future__ import annotations

import math

import torch

from rpm._validation import check_positive_int_or_none
from rpm.data.synthetic.noise import FactorisedNoise
from rpm.data.synthetic.rejection import first_accepted, oversampling_factor

__all__ = [
    "SPACES",
    "BoxTruncation",
    "project_to_sphere",
    "sample_uniform_sphere",
]

SPACES = ("sphere", "box", "unbounded")


def project_to_sphere(x: torch.Tensor) -> torch.Tensor:
    r"""Radial projection :math:`x / \|x\|_2` onto the unit sphere.

    :param torch.Tensor x: points of the ambient space. Shape: ``(..., n)``.
    :returns: unit vectors. Shape: ``(..., n)``.
    :rtype: torch.Tensor
    """
    tiny = torch.finfo(x.dtype).tiny
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(tiny)


def sample_uniform_sphere(
    batch_size: int,
    dim: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    r"""Uniform samples on :math:`S^{n-1}`: :math:`z = g / \|g\|`, :math:`g \sim \mathcal N(0, I_n)`.

    :param int batch_size: number of samples :math:`B`.
    :param int dim: ambient dimension :math:`n`.
    :param generator: optional random generator on ``device``.
    :type generator: torch.Generator or None
    :param device: device of the samples.
    :type device: torch.device or str
    :param torch.dtype dtype: floating dtype.
    :returns: unit vectors. Shape: ``(B, n)``.
    :rtype: torch.Tensor
    """
    g = torch.randn((batch_size, dim), generator=generator, device=device, dtype=dtype)
    return project_to_sphere(g)


class BoxTruncation:
    r"""Sampler of :math:`z'_d = c_d + \epsilon_d` conditioned on :math:`|z'_d| \le 1`,
    independently for every coordinate (exact; see the module docstring).

    * Normal and Laplace noise: exact inversion,
      :meth:`~rpm.data.synthetic.noise.FactorisedNoise.sample_interval` on
      :math:`[-1 - c_d, 1 - c_d]`: one uniform per coordinate, no host synchronisation.
    * Generalised normal: vectorised rejection (:mod:`~rpm.data.synthetic.rejection`). The least
      acceptance over the box is :math:`a = P(0 \le \epsilon_d \le 2)` (a centre on a face);
      :math:`K` is set so that :math:`(1-a)^K \le 10^{-9}`. On an accelerator the first round
      draws :math:`K` proposals for every coordinate, so that a second round is almost never
      needed and the call reads the device once (to confirm that); the coordinates still
      missing are gathered and get further rounds of :math:`K` proposals. On the CPU, where
      reading is free but drawing is not, the first round draws one proposal per coordinate
      (most are accepted) and the later rounds :math:`\lceil 1/a \rceil` per missing
      coordinate.

    The result is clamped to :math:`[-1, 1]` to remove float rounding at the faces.

    :param FactorisedNoise noise: the noise :math:`\epsilon`.
    :param int max_rounds: bound on the rejection rounds; exceeding it raises ``RuntimeError``.
    :param first_round: proposals per coordinate in the first rejection round, overriding the
        device-dependent choice above (the law is the same; for tests and tuning).
    :type first_round: int or None
    """

    def __init__(self, noise: FactorisedNoise, max_rounds: int = 1000,
                 first_round: int | None = None) -> None:
        first_round = check_positive_int_or_none("first_round", first_round)
        self.noise = noise
        self.max_rounds = max_rounds
        self.first_round = first_round
        acceptance = 1.0 if noise.has_interval_inverse else float(noise.prob_in(0.0, 2.0).min())
        self.oversample = oversampling_factor(acceptance)
        self._cpu_oversample = math.ceil(1.0 / acceptance)

    def sample(self, centre: torch.Tensor, generator: torch.Generator | None = None
               ) -> torch.Tensor:
        r"""Draw one truncated sample per coordinate of ``centre``.

        :param torch.Tensor centre: centres :math:`c`, inside the box. Shape: ``(B, n)``.
        :param generator: optional random generator on the device of ``centre``.
        :type generator: torch.Generator or None
        :returns: samples in :math:`[-1, 1]^n`. Shape: ``(B, n)``.
        :rtype: torch.Tensor
        """
        if self.noise.has_interval_inverse:
            eps = self.noise.sample_interval(-1.0 - centre, 1.0 - centre, generator)
            return (centre + eps).clamp(-1.0, 1.0)
        on_cpu = centre.device.type == "cpu"
        k = self.first_round or (1 if on_cpu else self.oversample)
        proposal = centre + self.noise.sample((k, *centre.shape), generator)       # (k, B, n)
        k = self._cpu_oversample if on_cpu else self.oversample
        out, found = first_accepted(proposal, proposal.abs() <= 1.0)              # (B, n)
        out, found = out.reshape(-1), found.reshape(-1)                            # (B n,)
        scale = self.noise.scale
        if isinstance(scale, torch.Tensor):
            scale = scale.expand(centre.shape).reshape(-1)
        for _ in range(self.max_rounds):
            missing = (~found).nonzero().squeeze(1)         # (M,): reads the device (one sync)
            if missing.numel() == 0:
                return out.view(centre.shape)
            s = scale[missing] if isinstance(scale, torch.Tensor) else scale
            xi = self.noise.sample_standard((k, missing.numel()), generator)
            proposal = centre.reshape(-1)[missing] + s * xi                         # (K, M)
            value, hit = first_accepted(proposal, proposal.abs() <= 1.0)           # (M,)
            out[missing] = torch.where(hit, value, out[missing])
            found[missing] = hit
        raise RuntimeError(f"box rejection sampling did not finish in {self.max_rounds} rounds "
                           f"of {k} proposals; the noise is far too wide for [-1, 1]")
