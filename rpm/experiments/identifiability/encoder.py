r"""A residual MLP encoder :math:`h: \mathbb R^n \to \mathbb R^n` that starts at the identity and
projects onto the sphere, the box :math:`[-1, 1]^n` or nowhere: the encoder of the
identifiability experiment (``rpm identifiability``), for data :math:`x = g(z)` made by an
invertible mixing of the latents.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rpm._validation import check_bool, check_choice, check_positive_int

__all__ = ["ENCODER_SPACES", "MLPEncoder", "residual_mlp"]

#: The spaces :class:`MLPEncoder` projects onto.
ENCODER_SPACES = ("sphere", "box", "unbounded")


def residual_mlp(x: torch.Tensor, params: list[torch.Tensor], space: str) -> torch.Tensor:
    r"""The function of :class:`MLPEncoder` with its parameters as arguments (so that it can be
    compiled apart from Pyro's parameter handling).

    :param torch.Tensor x: inputs. Shape: (N, n).
    :param list params: ``[S, c, W_0, b_0, (g_k, beta_k, W_k, b_k) for k = 1..L-1, g_L, beta_L,
        W_L, b_L]`` with :math:`g, \beta` the layer norms' scales and shifts.
    :param str space: ``"sphere"``, ``"box"`` or ``"unbounded"``.
    :return: Shape: (N, n).
    """
    a = F.linear(x, params[2], params[3])  # (N, H)
    width = a.shape[-1:]
    for k in range(4, len(params) - 4, 4):
        scale, shift, weight, bias = params[k:k + 4]
        a = a + F.linear(F.leaky_relu(F.layer_norm(a, width, scale, shift), 0.2), weight, bias)
    scale, shift, weight, bias = params[-4:]
    u = F.linear(x, params[0], params[1]) + F.linear(
        F.leaky_relu(F.layer_norm(a, width, scale, shift), 0.2), weight, bias)  # (N, n)
    if space == "sphere":
        return F.normalize(u, dim=-1)
    if space == "box":
        return torch.tanh(u)
    return u


class MLPEncoder(nn.Module):
    r"""A linear map plus a residual MLP, :math:`h: \mathbb R^n \to \mathbb R^n`, followed by
    the projection onto the encoder space.

    .. math::

        a_0 = W_0 x + b_0, \qquad a_{k} = a_{k-1} + W_{k}\, \sigma(\mathrm{LN}_k(a_{k-1})) + b_k
        \ (k = 1..L-1), \qquad u = S x + c + W_L\, \sigma(\mathrm{LN}_L(a_{L-1})) + b_L,

    with :math:`\sigma` the leaky ReLU (slope 0.2, the family of the inverse of the mixing
    :math:`g`) and LN a layer normalisation, then :math:`h = u / \lVert u \rVert` on the sphere,
    :math:`h = \tanh u` in the box :math:`[-1, 1]^n` and :math:`h = u` when unbounded.

    The linear path starts at the identity, :math:`S = I`, :math:`c = 0`, and the MLP's output
    layer at zero, :math:`W_L = 0`, :math:`b_L = 0`: the untrained encoder is the (projected)
    identity, which keeps the affine information of x (the identity's :math:`R^2`, about 0.6 for
    the default mixing, against about 0.4 for a randomly initialised MLP), and training learns
    the nonlinear correction. In the sphere / vMF setting this roughly halves the number of
    steps to a given :math:`R^2`.

    :param int dim: output dimension n (and the input's, unless ``in_dim`` is given).
    :param int hidden: width H of the hidden layers.
    :param int depth: number L >= 1 of hidden layers.
    :param str space: ``"sphere"``, ``"box"`` or ``"unbounded"``.
    :param bool compile: run :func:`residual_mlp` through :func:`torch.compile` (the parameters
        are still fetched eagerly, e.g. from Pyro's param store).
    :param int in_dim: input dimension P (default n); for P != n the linear path starts at the
        rectangular identity (:math:`S_{ij} = [i = j]`: the first min(P, n) coordinates).
    """

    def __init__(self, dim: int, hidden: int = 256, depth: int = 3, space: str = "sphere",
                 compile: bool = False, in_dim: int | None = None) -> None:
        super().__init__()
        dim = check_positive_int("dim", dim)
        in_dim = dim if in_dim is None else check_positive_int("in_dim", in_dim)
        hidden = check_positive_int("hidden", hidden)
        depth = check_positive_int("depth", depth)
        check_choice("space", space, ENCODER_SPACES)
        check_bool("compile", compile)
        self.space = space
        self.skip = nn.Linear(in_dim, dim)
        self.inp = nn.Linear(in_dim, hidden)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(depth))
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(depth - 1))
        self.out = nn.Linear(hidden, dim)
        with torch.no_grad():
            self.skip.weight.copy_(torch.eye(dim, in_dim))
            self.skip.bias.zero_()
            self.out.weight.zero_()
            self.out.bias.zero_()
        self.function = torch.compile(residual_mlp, dynamic=False) if compile else residual_mlp

    def parameter_list(self) -> list[torch.Tensor]:
        """The parameters in the order of :func:`residual_mlp`."""
        params = [self.skip.weight, self.skip.bias, self.inp.weight, self.inp.bias]
        for norm, block in zip(self.norms, self.blocks, strict=False):
            params += [norm.weight, norm.bias, block.weight, block.bias]
        return params + [self.norms[-1].weight, self.norms[-1].bias, self.out.weight,
                         self.out.bias]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Encodes a batch. Shape: (N, P) -> (N, n)."""
        return self.function(x, self.parameter_list(), self.space)
