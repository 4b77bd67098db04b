r"""Model of the ``rpm identifiability`` experiment: an MLP encoder whose outputs are projected
onto the encoder space, the energies of the implicit prior, and the RPM that joins them.

The RPM is :math:`Q(z|x) = \delta(z - h(x))` with the implicit prior of energy f (Eq. 21-22 of
Aitchison & Ganev), so its negative ELBO per pair is the InfoNCE loss with critic f minus
:math:`\log N` (Eq. 23-25); with the cosine energy this is the vMF-InfoNCE of Zimmermann et al.
(2021) and with the anisotropic energy AnInfoNCE (Rusak et al., 2024).

The temperature ``tau`` sets the scale of every energy, :math:`f \propto 1/\tau`:

===========  ===================================================  ==========================
energy       f(z, z')                                             parameters from ``tau``
===========  ===================================================  ==========================
cosine       :math:`\kappa\, \hat z^\top \hat z'`                 :math:`\kappa = 1/\tau`
anisotropic  :math:`-\tfrac12 (z - z')^\top \Lambda (z - z')`     :math:`\Lambda_0 = I/\tau` (learned)
lp           :math:`-\lVert z - z' \rVert_p^p / \tau`             :math:`\tau`
rbf          :math:`-\lVert z - z' \rVert^2 / (2 l^2)`            :math:`2 l^2 = \tau`
bilinear     :math:`z^\top W z'`                                  :math:`W_0 = I/\tau` (learned)
===========  ===================================================  ==========================
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import rpm
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    ImplicitPrior,
    LpEnergy,
    RBFEnergy,
)

__all__ = ["ENERGIES", "ENCODER_SPACES", "MLPEncoder", "build_energy", "build_rpm",
           "energy_parameters", "residual_mlp"]

ENERGIES = ("cosine", "anisotropic", "lp", "rbf", "bilinear")
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

    :param int dim: input and output dimension n.
    :param int hidden: width H of the hidden layers.
    :param int depth: number L >= 1 of hidden layers.
    :param str space: ``"sphere"``, ``"box"`` or ``"unbounded"``.
    :param bool compile: run :func:`residual_mlp` through :func:`torch.compile` (the parameters
        are still fetched eagerly, e.g. from Pyro's param store).
    """

    def __init__(self, dim: int, hidden: int = 256, depth: int = 3, space: str = "sphere",
                 compile: bool = False) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("hidden", hidden), ("depth", depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if space not in ENCODER_SPACES:
            raise ValueError(f"space must be one of {ENCODER_SPACES}, got {space!r}")
        self.space = space
        self.skip = nn.Linear(dim, dim)
        self.inp = nn.Linear(dim, hidden)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(depth))
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(depth - 1))
        self.out = nn.Linear(hidden, dim)
        with torch.no_grad():
            self.skip.weight.copy_(torch.eye(dim))
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
        """Encodes a batch. Shape: (N, n) -> (N, n)."""
        return self.function(x, self.parameter_list(), self.space)


def build_energy(name: str, dim: int, tau: float = 1.0, p: float = 1.0,
                 learn_temperature: bool = False, encoder_space: str = "sphere"):
    r"""The energy ``name`` with scale :math:`1/\tau` (module table).

    :param str name: one of :data:`ENERGIES`.
    :param int dim: latent dimension n.
    :param float tau: temperature :math:`\tau > 0`.
    :param float p: exponent of the ``lp`` energy.
    :param bool learn_temperature: learn :math:`\kappa`, :math:`\tau` or l (the anisotropic
        :math:`\Lambda` and the bilinear W are always learned).
    :param str encoder_space: the anisotropic energy normalises its inputs on the sphere only.
    """
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    if name == "cosine":
        return CosineEnergy(kappa=1.0 / tau, learn_kappa=learn_temperature)
    if name == "anisotropic":
        return AnisotropicEnergy(dim, normalize=encoder_space == "sphere", init=1.0 / tau)
    if name == "lp":
        return LpEnergy(p=p, tau=tau, learn_tau=learn_temperature)
    if name == "rbf":
        return RBFEnergy(lengthscale=math.sqrt(tau / 2.0), learn_lengthscale=learn_temperature)
    if name == "bilinear":
        return BilinearEnergy(dim, init_scale=1.0 / tau)
    raise ValueError(f"energy must be one of {ENERGIES}, got {name!r}")


def build_rpm(encoder: nn.Module, energy) -> rpm.RPM:
    """The RPM with Delta recognition ``encoder`` and the implicit prior of ``energy``.
    Recognition-output validation is off: it would synchronise with the device every step."""
    return rpm.RPM(rpm.DeltaRecognition(encoder, validate=False), ImplicitPrior(energy))


@torch.no_grad()
def energy_parameters(energy) -> dict:
    """The energy's current parameters as JSON-ready numbers and lists."""
    if isinstance(energy, CosineEnergy):
        return {"kappa": float(energy.kappa)}
    if isinstance(energy, AnisotropicEnergy):
        return {"concentration": energy.concentration.cpu().tolist()}
    if isinstance(energy, LpEnergy):
        return {"p": energy.p, "tau": float(energy.tau)}
    if isinstance(energy, RBFEnergy):
        return {"lengthscale": float(energy.lengthscale)}
    if isinstance(energy, BilinearEnergy):
        return {"weight": energy.weight.cpu().tolist()}
    return {}
