r"""The invertible mixing :math:`g` of the identifiability experiments: a square leaky-ReLU MLP
(Zimmermann et al., 2021, use an invertible 3-layer leaky-ReLU MLP;
``docs/theory.md#reference-points``).

.. math::

    h_0 = z, \qquad a_l = W_l h_l + b_l, \qquad
    h_{l+1} = \sigma(a_l)\ (l < L - 1), \qquad g(z) = a_{L-1},

with :math:`\sigma(a) = \max(a, \eta a)` (negative slope :math:`0 < \eta \le 1`, so
:math:`\sigma^{-1}(h) = \max(h, h / \eta)`) and no activation after the last layer. Each weight
is built from its singular value decomposition,

.. math::

    W_l = U_l\, \mathrm{diag}(s_l)\, V_l^\top, \qquad
    \log s_{l,i} \sim \mathcal U\big[-\tfrac12 \log c, \tfrac12 \log c\big],

with :math:`U_l, V_l` Haar-random orthogonal matrices (QR of a Gaussian matrix with the signs of
:math:`R`'s diagonal absorbed), so the condition number :math:`s_{\max}/s_{\min} \le c` holds by
construction and :math:`W_l^{-1} = V_l\, \mathrm{diag}(1/s_l)\, U_l^\top` is exact; biases are
:math:`b_l \sim \mathcal N(0, \texttt{bias\_std}^2 I)` so the kinks of the leaky ReLUs do not all
pass through the origin. Everything is drawn in float64 from a private generator seeded by
``seed`` (the global RNG is untouched), then cast to ``dtype``. The module is frozen: its
weights have ``requires_grad=False``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from rpm._validation import check_positive_int

__all__ = ["InvertibleMLP"]


def _haar_orthogonal(dim: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-distributed random orthogonal matrix (float64). Shape: (dim, dim)."""
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


class InvertibleMLP(nn.Module):
    r"""Frozen, well-conditioned, exactly invertible leaky-ReLU MLP :math:`g: \mathbb R^n \to
    \mathbb R^n` (see the module docstring for the construction).

    :param int dim: input and output dimension :math:`n`.
    :param int num_layers: number of linear layers :math:`L \ge 1` (leaky ReLU between them).
    :param float negative_slope: leaky-ReLU slope :math:`\eta \in (0, 1]`.
    :param int seed: seed of the weights.
    :param float max_condition_number: bound :math:`c \ge 1` on each weight's condition number.
    :param float bias_std: standard deviation of the biases (0 for none).
    :param torch.dtype dtype: floating dtype of the weights.
    """

    def __init__(self, dim: int, num_layers: int = 3, negative_slope: float = 0.2, seed: int = 0,
                 max_condition_number: float = 5.0, bias_std: float = 0.1,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        dim = check_positive_int("dim", dim)
        num_layers = check_positive_int("num_layers", num_layers)
        if not 0.0 < negative_slope <= 1.0:
            raise ValueError(f"negative_slope must lie in (0, 1] for g to be invertible, got "
                             f"{negative_slope!r}")
        if not (math.isfinite(max_condition_number) and max_condition_number >= 1.0):
            raise ValueError(f"max_condition_number must be finite and >= 1, got "
                             f"{max_condition_number!r}")
        if not (math.isfinite(bias_std) and bias_std >= 0.0):
            raise ValueError(f"bias_std must be finite and >= 0, got {bias_std!r}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.dim = dim
        self.negative_slope = float(negative_slope)
        self.max_condition_number = float(max_condition_number)
        gen = torch.Generator().manual_seed(seed)
        half_log_c = 0.5 * math.log(max_condition_number)
        self.layers = nn.ModuleList()
        inverses = []
        for _ in range(num_layers):
            u, v = _haar_orthogonal(dim, gen), _haar_orthogonal(dim, gen)
            log_s = (2.0 * torch.rand(dim, generator=gen, dtype=torch.float64) - 1.0) * half_log_c
            s = log_s.exp()
            layer = nn.Linear(dim, dim, dtype=dtype)
            with torch.no_grad():
                layer.weight.copy_(u @ torch.diag(s) @ v.T)                       # W = U S V^T
                layer.bias.copy_(bias_std * torch.randn(dim, generator=gen, dtype=torch.float64))
            layer.requires_grad_(False)
            self.layers.append(layer)
            inverses.append(v @ torch.diag(1.0 / s) @ u.T)                    # W^-1 = V S^-1 U^T
        self.register_buffer("inverse_weights", torch.stack(inverses).to(dtype))  # (L, n, n)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        r"""Mix: :math:`x = g(z)`.

        :param torch.Tensor z: latents. Shape: ``(..., n)``.
        :returns: observations. Shape: ``(..., n)``.
        :rtype: torch.Tensor
        """
        if z.shape[-1] != self.dim:
            raise ValueError(f"expected inputs with last dimension {self.dim}, got shape "
                             f"{tuple(z.shape)}")
        h = z
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = F.leaky_relu(h, self.negative_slope)
        return h

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        r"""Unmix exactly: :math:`z = g^{-1}(x)`, layer by layer
        :math:`h_l = W_l^{-1}(\sigma^{-1}(h_{l+1}) - b_l)`.

        :param torch.Tensor x: observations. Shape: ``(..., n)``.
        :returns: latents. Shape: ``(..., n)``.
        :rtype: torch.Tensor
        """
        if x.shape[-1] != self.dim:
            raise ValueError(f"expected inputs with last dimension {self.dim}, got shape "
                             f"{tuple(x.shape)}")
        h = x
        last = len(self.layers) - 1
        for i in range(last, -1, -1):
            if i < last:
                h = torch.where(h >= 0, h, h / self.negative_slope)              # sigma^-1
            h = (h - self.layers[i].bias) @ self.inverse_weights[i].T
        return h

    def condition_numbers(self) -> list[float]:
        r"""2-norm condition numbers :math:`s_{\max}/s_{\min}` of the weights, computed in float64.

        :returns: one per layer, each :math:`\le` ``max_condition_number``.
        :rtype: list[float]
        """
        return [float(torch.linalg.cond(layer.weight.detach().double())) for layer in self.layers]
