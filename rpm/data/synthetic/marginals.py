r"""Marginals :math:`p(z)` of the synthetic latents (Zimmermann et al., 2021, Tables 1-2).

=============  ==========================================  ==========================================
space          ``"uniform"``                               ``"normal"`` / ``"laplace"`` (scale s)
=============  ==========================================  ==========================================
``sphere``     uniform on :math:`S^{n-1}`                  :math:`z = (e_1 + \epsilon)/\|e_1+\epsilon\|`
``box``        :math:`\mathcal U[-1, 1]^n`                 :math:`\epsilon` truncated to
                                                           :math:`[-1, 1]^n` (exact inversion)
``unbounded``  not normalisable: refused                   :math:`z = \epsilon`
=============  ==========================================  ==========================================

with :math:`\epsilon` factorised :math:`\mathcal N(0, s^2)` or :math:`\mathrm{Laplace}(0, s)` noise
(:class:`~rpm.data.synthetic.noise.FactorisedNoise`). On the sphere the non-uniform marginals
are "normal-projected": concentrated around the fixed mean direction :math:`e_1 = (1, 0, \dots,
0)`, more so for smaller :math:`s` (our construction for the "Sphere, Normal(sigma=1)" rows of
Zimmermann et al., Table 1, whose exact recipe the seeds do not preserve).
"""

from __future__ import annotations

import torch

from rpm._validation import check_choice, check_positive, check_positive_int
from rpm.data.synthetic._checks import check_generator, check_space_dim
from rpm.data.synthetic.noise import FactorisedNoise
from rpm.data.synthetic.spaces import (
    BoxTruncation,
    project_to_sphere,
    sample_uniform_sphere,
)

__all__ = ["MARGINALS", "Marginal"]

MARGINALS = ("uniform", "normal", "laplace")


class Marginal:
    r"""Sampler of the marginal :math:`p(z)` (see the module table).

    :param str space: ``"sphere"``, ``"box"`` or ``"unbounded"``.
    :param str kind: ``"uniform"``, ``"normal"`` or ``"laplace"``.
    :param param: scale :math:`s > 0` of a normal (standard deviation) or Laplace marginal,
        default 1.0; must be None for ``"uniform"``.
    :type param: float or None
    :param int dim: latent dimension :math:`n` (ambient dimension on the sphere).
    :param device: device of the samples.
    :type device: torch.device or str
    :param torch.dtype dtype: floating dtype of the samples.
    """

    def __init__(self, space: str, kind: str, param: float | None, dim: int, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        self.space, self.dim = check_space_dim(space, dim)
        self.kind = check_choice("marginal", kind, MARGINALS)
        self.device = torch.device(device)
        self.dtype = dtype
        if kind == "uniform":
            if param is not None:
                raise ValueError(f"the uniform marginal takes no parameter; got marginal_param="
                                 f"{param!r} (leave it None)")
            if space == "unbounded":
                raise ValueError("a uniform marginal on the unbounded space R^n is not "
                                 "normalisable; use space='box' or a 'normal'/'laplace' marginal")
            self.param: float | None = None
            return
        self.param = 1.0 if param is None else check_positive("marginal_param", param)
        self._noise = FactorisedNoise(kind, self.param, device=self.device, dtype=dtype)
        if space == "box":
            self._box = BoxTruncation(self._noise)
        if space == "sphere":
            self._mean = torch.zeros(dim, device=self.device, dtype=dtype)
            self._mean[0] = 1.0

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        r"""Draw :math:`z_i \sim p(z)`, :math:`i = 1..B`.

        :param int batch_size: number of samples :math:`B`.
        :param generator: optional random generator on ``device``.
        :type generator: torch.Generator or None
        :returns: latents in the space. Shape: ``(B, n)``.
        :rtype: torch.Tensor
        """
        check_positive_int("batch_size", batch_size)
        check_generator(generator, self.device)
        shape = (batch_size, self.dim)
        kw = {"device": self.device, "dtype": self.dtype}
        if self.kind == "uniform":
            if self.space == "sphere":
                return sample_uniform_sphere(batch_size, self.dim, generator=generator, **kw)
            return 2.0 * torch.rand(shape, generator=generator, **kw) - 1.0
        if self.space == "sphere":
            return project_to_sphere(self._mean + self._noise.sample(shape, generator))
        if self.space == "box":
            return self._box.sample(torch.zeros(shape, **kw), generator)
        return self._noise.sample(shape, generator)
