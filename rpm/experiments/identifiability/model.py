r"""Model of the ``rpm identifiability`` experiment: the energies of the implicit prior and the
RPM that joins them to the encoder (:class:`rpm.experiments.identifiability.encoder.MLPEncoder`).

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

import rpm
from rpm._validation import check_positive
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    ImplicitPrior,
    LpEnergy,
    RBFEnergy,
)

__all__ = ["ENERGIES", "build_energy", "build_rpm", "energy_parameters", "model_from_arguments"]

ENERGIES = ("cosine", "anisotropic", "lp", "rbf", "bilinear")


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
    tau = check_positive("tau", tau)
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


def model_from_arguments(arguments: dict, compile: bool = False) -> rpm.RPM:
    r"""The untrained model of ``rpm identifiability`` from its model record
    (:mod:`rpm.experiments.trained`): :func:`build_rpm` of the
    :class:`~rpm.experiments.identifiability.encoder.MLPEncoder`
    ``(dim, hidden, depth, encoder_space, in_dim=in_dim)`` and
    :func:`build_energy` ``(energy, dim, tau, p, learn_temperature, encoder_space)``.

    :param dict arguments: ``energy``, ``dim`` (the latents n), ``in_dim`` (P, the dimension of
        an observation; n if absent, as in the records written before ``--data``), ``hidden``,
        ``depth``, ``encoder_space``, ``tau``, ``p``, ``learn_temperature``.
    :param bool compile: compile the encoder's MLP
        (:class:`~rpm.experiments.identifiability.encoder.MLPEncoder`; the same parameters
        either way).
    """
    from rpm.experiments.identifiability.encoder import MLPEncoder

    encoder = MLPEncoder(arguments["dim"], arguments["hidden"], arguments["depth"],
                         arguments["encoder_space"], compile=compile,
                         in_dim=arguments.get("in_dim"))
    energy = build_energy(arguments["energy"], arguments["dim"], tau=arguments["tau"],
                          p=arguments["p"], learn_temperature=arguments["learn_temperature"],
                          encoder_space=arguments["encoder_space"])
    return build_rpm(encoder, energy)


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
