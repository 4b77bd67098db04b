r"""Content and style latents (von Kügelgen, Sharma, Gresele et al., 2021, section 5.1 and
Appendix D): the pairs of ``rpm content-style``.

A latent :math:`z = (c, s)` has a content block :math:`c \in \mathbb R^{n_c}` and a style block
:math:`s \in \mathbb R^{n_s}`,

.. math::

    c \sim \mathcal N(0, \Sigma_c), \qquad s \mid c \sim \mathcal N(a + B c, \Sigma_s),

and its positive partner :math:`z' = (c', s')` keeps the content and changes a random subset A of
the style coordinates (each in A independently with probability :math:`p_\text{chg}`):

.. math::

    c' = c, \qquad s'_A \mid s_A \sim \mathcal N(s_A, (\Sigma_A)_{AA}), \qquad
    s'_{\bar A} = s_{\bar A}.

The change is drawn as :math:`s' = s + m \odot \epsilon`, :math:`\epsilon \sim \mathcal N(0,
\Sigma_A)`, :math:`m_k \sim \mathrm{Bernoulli}(p_\text{chg})`: the masked Gaussian's entries on
A are :math:`\mathcal N(0, (\Sigma_A)_{AA})`. The three covariances are the identity, or, with
*statistical dependence*, independent draws from the Wishart distribution
:math:`W(I, n)` of the block's dimension n (the sum of n outer products of standard normal
vectors); with *causal dependence* :math:`a` and :math:`B` have independent standard normal
entries, else they are zero.

The dependence parameters :math:`(\Sigma_c, \Sigma_s, \Sigma_A, a, B)` are drawn once from
``seed`` (the paper's description, the default), or, with ``redraw_every_batch=True``, afresh
for every call of :meth:`ContentStyleProcess.sample_pairs` and
:meth:`~ContentStyleProcess.sample_marginal` from the generator it is given (the behaviour of
the released code, whose every minibatch has its own covariances and its own a, B).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rpm._validation import check_bool, check_int, check_positive_int, check_probability

__all__ = ["ContentStyleParameters", "ContentStyleProcess", "sample_wishart"]


def sample_wishart(dim: int, generator: torch.Generator | None = None,
                   dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    r"""One draw of the Wishart distribution :math:`W(I_n, n)` with n degrees of freedom,

    .. math::

        \Sigma = \sum_{k=1}^{n} x_k x_k^\top, \qquad x_k \sim \mathcal N(0, I_n)
        \ \text{independent}, \qquad \mathbb E\,\Sigma = n I_n,

    positive definite with probability one.

    :param int dim: n.
    :param generator: the random stream (on ``device``).
    :param dtype: floating dtype.
    :param device: where to draw.
    :returns: :math:`\Sigma`. Shape: ``(n, n)``.
    """
    dim = check_positive_int("dim", dim)
    x = torch.randn(dim, dim, generator=generator, dtype=dtype, device=device)  # rows x_k
    return x.T @ x


@dataclass(frozen=True)
class ContentStyleParameters:
    r"""The dependence parameters of one draw (module docstring); float tensors on one device."""

    content_scale_tril: torch.Tensor  #: :math:`\mathrm{chol}\,\Sigma_c`. Shape: (n_c, n_c)
    style_scale_tril: torch.Tensor    #: :math:`\mathrm{chol}\,\Sigma_s`. Shape: (n_s, n_s)
    change_scale_tril: torch.Tensor   #: :math:`\mathrm{chol}\,\Sigma_A`. Shape: (n_s, n_s)
    shift: torch.Tensor               #: a. Shape: (n_s,)
    coupling: torch.Tensor            #: B. Shape: (n_s, n_c)


class ContentStyleProcess:
    r"""Pairs :math:`(z, z')` of content and style latents (module docstring); the first
    ``content_dim`` coordinates of z are c, the rest s.

    :param int content_dim: :math:`n_c \ge 1`.
    :param int style_dim: :math:`n_s \ge 1`.
    :param float p_change: :math:`p_\text{chg} \in [0, 1]`, the probability that a style
        coordinate changes between the views.
    :param bool statistical: Wishart :math:`\Sigma_c, \Sigma_s, \Sigma_A` instead of I.
    :param bool causal: standard normal a, B instead of 0 (style depends on content).
    :param bool redraw_every_batch: draw the dependence parameters afresh at every call
        (the released code) instead of once from ``seed`` (the paper).
    :param int seed: seed of the one draw (unused with ``redraw_every_batch``).
    :param device: where the latents are sampled.
    :param torch.dtype dtype: floating dtype of the latents.
    """

    def __init__(self, content_dim: int = 5, style_dim: int = 5, p_change: float = 1.0,
                 statistical: bool = False, causal: bool = False,
                 redraw_every_batch: bool = False, seed: int = 0, device=None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.content_dim = check_positive_int("content_dim", content_dim)
        self.style_dim = check_positive_int("style_dim", style_dim)
        self.p_change = check_probability("p_change", p_change)
        self.statistical = check_bool("statistical", statistical)
        self.causal = check_bool("causal", causal)
        self.redraw_every_batch = check_bool("redraw_every_batch", redraw_every_batch)
        seed = check_int("seed", seed, minimum=0)
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.device = torch.device("cpu" if device is None else device)
        self.dtype = dtype
        # the one draw, in float64 on the CPU from its own stream, then cast (the same on
        # every device)
        once = self.draw_parameters(torch.Generator().manual_seed(seed), torch.float64, "cpu")
        self.parameters = ContentStyleParameters(
            *(t.to(self.device, dtype) for t in vars(once).values()))

    @property
    def dim(self) -> int:
        """:math:`n_c + n_s`."""
        return self.content_dim + self.style_dim

    def draw_parameters(self, generator: torch.Generator, dtype: torch.dtype | None = None,
                        device=None) -> ContentStyleParameters:
        r"""One draw of :math:`(\Sigma_c, \Sigma_s, \Sigma_A, a, B)` from ``generator``
        (identities and zeros where the process has no dependence).

        :param torch.Generator generator: the random stream, on ``device``.
        :param dtype: default the process's.
        :param device: default the process's.
        """
        dtype = self.dtype if dtype is None else dtype
        device = self.device if device is None else device
        nc, ns = self.content_dim, self.style_dim

        def covariance_tril(n: int) -> torch.Tensor:
            if not self.statistical:
                return torch.eye(n, dtype=dtype, device=device)
            wishart = sample_wishart(n, generator, torch.float64, device)
            return torch.linalg.cholesky(wishart).to(dtype)

        trils = [covariance_tril(n) for n in (nc, ns, ns)]
        if self.causal:
            shift = torch.randn(ns, generator=generator, dtype=dtype, device=device)
            coupling = torch.randn(ns, nc, generator=generator, dtype=dtype, device=device)
        else:
            shift = torch.zeros(ns, dtype=dtype, device=device)
            coupling = torch.zeros(ns, nc, dtype=dtype, device=device)
        return ContentStyleParameters(*trils, shift, coupling)

    def _parameters(self, generator: torch.Generator | None) -> ContentStyleParameters:
        if self.redraw_every_batch:
            if generator is None:
                raise ValueError("redraw_every_batch=True draws the parameters from the "
                                 "generator: pass a torch.Generator")
            return self.draw_parameters(generator)
        return self.parameters

    def sample_marginal(self, num_samples: int, generator: torch.Generator | None = None,
                        parameters: ContentStyleParameters | None = None) -> torch.Tensor:
        r"""Latents :math:`z = (c, s)`, :math:`c \sim \mathcal N(0, \Sigma_c)`,
        :math:`s \sim \mathcal N(a + B c, \Sigma_s)`.

        :param int num_samples: M.
        :param generator: the random stream (on the process's device).
        :param parameters: the dependence parameters; default the one draw, or a fresh draw
            from ``generator`` with ``redraw_every_batch``.
        :returns: Shape: ``(M, n_c + n_s)``.
        """
        num_samples = check_positive_int("num_samples", num_samples)
        p = self._parameters(generator) if parameters is None else parameters
        kwargs = dict(generator=generator, dtype=self.dtype, device=self.device)
        c = torch.randn(num_samples, self.content_dim, **kwargs) @ p.content_scale_tril.T
        s = (p.shift + c @ p.coupling.T
             + torch.randn(num_samples, self.style_dim, **kwargs) @ p.style_scale_tril.T)
        return torch.cat([c, s], dim=-1)                                       # (M, n_c + n_s)

    def sample_pairs(self, num_samples: int, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Positive pairs: z from :meth:`sample_marginal`, then :math:`c' = c`,
        :math:`s' = s + m \odot \epsilon` (module docstring). With ``redraw_every_batch`` the
        M pairs share one fresh draw of the parameters.

        :param int num_samples: M.
        :param generator: the random stream (on the process's device).
        :returns: ``(z, z2)``. Shape: ``(M, n_c + n_s)`` each.
        """
        p = self._parameters(generator)
        z = self.sample_marginal(num_samples, generator, p)
        kwargs = dict(generator=generator, dtype=self.dtype, device=self.device)
        change = torch.randn(num_samples, self.style_dim, **kwargs) @ p.change_scale_tril.T
        mask = torch.rand(num_samples, self.style_dim, **kwargs) < self.p_change
        z2 = z.clone()
        z2[:, self.content_dim:] += mask * change
        return z, z2
