r"""Critics f(x, y) that score every pair of a batch: the matrix :math:`F_{ij} = f(x_i, y_j)`,
shape (N, N), positives on the diagonal, which the bounds of ``rpm.mi._bounds`` take.

Three families (Poole et al. 2019, section 4):

* :class:`SeparableCritic`: :math:`f(x, y) = g(x)^\top h(y)` with two MLPs g, h; N + N network
  evaluations for the N^2 scores. Its optimum can only be a low-rank approximation of
  :math:`\log r(x, y)`.
* :class:`BilinearCritic`: :math:`f(x, y) = x^\top W y` (CPC's critic), the separable critic with
  identity networks.
* :class:`JointCritic`: an MLP on the concatenated pair :math:`[x; y]`, evaluated on all N^2
  pairs: it can represent any :math:`\log r`, at N^2 network evaluations. The first layer's
  product :math:`W [x; y] = W_x x + W_y y` is computed once per x and once per y and added over
  the grid (the same function, with N times fewer first-layer products).

``copies = K`` holds K independent critics of the same architecture in one module (weights with
a leading dimension K, batched matrix products), so that K estimators train in one step; the
scores then have shape (K, N, N). Summed losses of distinct copies give each copy its own
gradient, and Adam, being elementwise, is then exactly K independent optimisers.
"""

from __future__ import annotations

import math

import torch

from rpm._validation import check_positive_int, check_positive_int_or_none

__all__ = ["BilinearCritic", "JointCritic", "SeparableCritic"]


class _StackedLinear(torch.nn.Module):
    """K affine maps of the same shape: (K, ..., in) -> (K, ..., out); PyTorch's default
    initialisation (uniform in +-1/sqrt(in)) for each copy."""

    def __init__(self, copies: int, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.weight = torch.nn.Parameter(
            torch.empty(copies, in_features, out_features).uniform_(-bound, bound))
        self.bias = (torch.nn.Parameter(torch.empty(copies, 1, out_features).uniform_(-bound, bound))
                     if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(shape[0], -1, shape[-1])                    # (K, M, in)
        out = flat @ self.weight if self.bias is None else torch.baddbmm(self.bias, flat,
                                                                         self.weight)
        return out.reshape(*shape[:-1], out.shape[-1])


def _mlp(copies: int, in_features: int, hidden: int, layers: int, out_features: int
         ) -> torch.nn.Sequential:
    """``layers`` hidden ReLU layers of width ``hidden``, then a linear read-out."""
    modules: list[torch.nn.Module] = []
    width = in_features
    for _ in range(layers):
        modules += [_StackedLinear(copies, width, hidden), torch.nn.ReLU()]
        width = hidden
    modules.append(_StackedLinear(copies, width, out_features))
    return torch.nn.Sequential(*modules)


def _check_inputs(x: torch.Tensor, y: torch.Tensor, x_dim: int, y_dim: int) -> None:
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must be batches of N pairs, shapes (N, {x_dim}) and "
                         f"(N, {y_dim}); got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[1] != x_dim or y.shape[1] != y_dim:
        raise ValueError(f"the critic takes x of dimension {x_dim} and y of dimension {y_dim}; "
                         f"got {x.shape[1]} and {y.shape[1]}")


class _Critic(torch.nn.Module):
    def __init__(self, x_dim: int, y_dim: int, copies: int | None):
        super().__init__()
        self.x_dim = check_positive_int("x_dim", x_dim)
        self.y_dim = check_positive_int("y_dim", y_dim)
        self.copies = check_positive_int_or_none("copies", copies)
        self._k = 1 if copies is None else copies

    def _scores(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The K copies' score matrices: x (K, N, x_dim), y (K, N, y_dim) -> (K, N, N)."""
        raise NotImplementedError(f"{type(self).__name__} must define _scores")

    def _stack(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(0).expand(self._k, *x.shape)                # (K, N, D)

    def _result(self, scores: torch.Tensor) -> torch.Tensor:
        return scores[0] if self.copies is None else scores

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r""":math:`F_{ij} = f(x_i, y_j)`.

        :param torch.Tensor x: shape (N, x_dim).
        :param torch.Tensor y: shape (N, y_dim); :math:`(x_i, y_i)` are the positive pairs.
        :return: shape (N, N), or (copies, N, N).
        """
        _check_inputs(x, y, self.x_dim, self.y_dim)
        return self._result(self._scores(self._stack(x), self._stack(y)))


class SeparableCritic(_Critic):
    r"""The separable critic :math:`f(x, y) = g(x)^\top h(y)`, g and h MLPs with ``layers``
    hidden ReLU layers of width ``hidden`` and outputs of dimension ``embed_dim``.

    :param int x_dim: dimension of x.
    :param int y_dim: dimension of y.
    :param int embed_dim: dimension of g(x) and h(y).
    :param int hidden: hidden width.
    :param int layers: hidden layers (0: linear maps).
    :param copies: K independent critics (scores (K, N, N)), or None (scores (N, N)).
    """

    def __init__(self, x_dim: int, y_dim: int, embed_dim: int = 32, hidden: int = 256,
                 layers: int = 1, copies: int | None = None):
        super().__init__(x_dim, y_dim, copies)
        embed_dim, hidden = check_positive_int("embed_dim", embed_dim), check_positive_int(
            "hidden", hidden)
        self.g = _mlp(self._k, x_dim, hidden, layers, embed_dim)
        self.h = _mlp(self._k, y_dim, hidden, layers, embed_dim)

    def _scores(self, x, y):
        return self.g(x) @ self.h(y).transpose(-1, -2)                  # (K, N, N)


class BilinearCritic(_Critic):
    r"""The bilinear critic :math:`f(x, y) = x^\top W y` (CPC), W of shape (x_dim, y_dim),
    started at zero (every pair scores 0).

    :param int x_dim: dimension of x.
    :param int y_dim: dimension of y.
    :param copies: K independent critics (scores (K, N, N)), or None (scores (N, N)).
    """

    def __init__(self, x_dim: int, y_dim: int, copies: int | None = None):
        super().__init__(x_dim, y_dim, copies)
        self.weight = torch.nn.Parameter(torch.zeros(self._k, x_dim, y_dim))

    def _scores(self, x, y):
        return x @ self.weight @ y.transpose(-1, -2)                    # (K, N, N)


class JointCritic(_Critic):
    r"""The joint (concatenated) critic :math:`f(x, y) = \mathrm{MLP}([x; y])` on all N^2 pairs,
    ``layers`` >= 1 hidden ReLU layers of width ``hidden`` and a scalar read-out.

    :param int x_dim: dimension of x.
    :param int y_dim: dimension of y.
    :param int hidden: hidden width.
    :param int layers: hidden layers, >= 1.
    :param copies: K independent critics (scores (K, N, N)), or None (scores (N, N)).
    """

    def __init__(self, x_dim: int, y_dim: int, hidden: int = 256, layers: int = 1,
                 copies: int | None = None):
        super().__init__(x_dim, y_dim, copies)
        hidden, layers = check_positive_int("hidden", hidden), check_positive_int("layers", layers)
        # the first layer on [x; y], split into its x and y columns (module docstring)
        self.first_x = _StackedLinear(self._k, x_dim, hidden)
        self.first_y = _StackedLinear(self._k, y_dim, hidden, bias=False)
        self.rest = torch.nn.Sequential(torch.nn.ReLU(),
                                        *list(_mlp(self._k, hidden, hidden, layers - 1, 1)))
        with torch.no_grad():  # the default initialisation of a layer with x_dim + y_dim inputs
            bound = 1.0 / math.sqrt(x_dim + y_dim)
            assert self.first_x.bias is not None  # built with bias=True
            for tensor in (self.first_x.weight, self.first_x.bias, self.first_y.weight):
                tensor.uniform_(-bound, bound)

    def _scores(self, x, y):
        hidden = self.first_x(x).unsqueeze(-2) + self.first_y(y).unsqueeze(-3)  # (K, N, N, H)
        return self.rest(hidden).squeeze(-1)                                    # (K, N, N)
