r"""The models of ``rpm uncertainty``: von Mises-Fisher encoders trained by MC-InfoNCE as RPMs.

Each model is an :class:`rpm.RPM` with :class:`~rpm.VonMisesFisherRecognition`
:math:`Q(z \mid x) = \mathrm{vMF}(\mu(x), \kappa(x))` (``concentration="raw"``: the network
returns :math:`\kappa(x) = \exp(\log\kappa_0 + h(x))` itself) and the implicit prior of the
cosine energy :math:`f(z, z') = \kappa_+ z^\top z'` (``docs/theory.md``, C1-C6) or of the
controlled process's own positive rule (:class:`PositiveRuleEnergy`); trained with
``RPMELBO(num_particles=S, importance_weighted=True, normaliser=...)``.

* ``controlled`` (:class:`ControlledEncoder`): two separate networks of the input
  :math:`x \in [0, 1]^P`, a LeakyReLU MLP with ``depth`` hidden layers of ``hidden`` units for
  the direction and one with a single hidden layer of ``concentration_hidden`` units for
  :math:`\log\kappa` (the reference code also keeps the two apart, so that each can be trained
  alone); the energy the process's positive rule (``energy="rule"`` in its arguments) or the
  cosine energy with :math:`\kappa_+` fixed to the vMF concentration that matches the rule
  (:func:`~rpm.experiments.uncertainty.process.effective_concentration`).
* ``controlled-means``: the first phase of the controlled encoder, its direction network
  alone as a Delta encoder :math:`Q(z \mid x) = \delta(z - m(x))` under the implicit prior of
  the cosine energy with a learned concentration (:func:`build_means_rpm`: vMF-InfoNCE,
  Zimmermann et al. 2021, with a learned temperature). A Delta encoder's pair model is the
  energy at the means, the posteriors' widths folded into the learned concentration, which is
  why it is learned here and fixed in the second phase.
* ``digits`` (:class:`DigitsEncoder`): an 8 x 8 image, flattened, through two ReLU layers of
  ``hidden`` units shared by a linear direction head (``latent_dim``) and a linear
  :math:`\log\kappa` head; :math:`\kappa_+` learned from ``kappa_pos``.

The last layer of each :math:`\log\kappa` head starts at zero weights and bias 0, so every
input starts at :math:`\kappa_0` (``initial_concentration``).

:func:`model_from_arguments` rebuilds either from its model record (``rpm.load``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

import rpm
from rpm.experiments.uncertainty.process import leaky_mlp
from rpm.priors import CosineEnergy, Energy, ImplicitPrior
from rpm.priors._energies import unit_vectors

__all__ = ["ControlledEncoder", "DigitsEncoder", "PARTS", "PositiveRuleEnergy",
           "build_means_rpm", "build_rpm", "model_from_arguments"]

#: The models: the controlled encoder's directions (first phase), the controlled encoder, and
#: the digits encoder.
PARTS = ("controlled-means", "controlled", "digits")
#: Pixels of one of scikit-learn's digits.
PIXELS = 64


def _zero_last(layer: nn.Module) -> None:
    assert isinstance(layer, nn.Linear)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)


class ControlledEncoder(nn.Module):
    r"""x (N, P) -> (direction (N, D), :math:`\kappa` (N,)) from two networks (module
    docstring). ``mean_net`` and ``concentration_net`` are its two parts, trained apart or
    together (a part held with ``requires_grad_(False)`` costs no gradient: for the
    concentration, the implicit gradient of each vMF draw)."""

    def __init__(self, obs_dim: int, dim: int, hidden: int, depth: int,
                 concentration_hidden: int, initial_concentration: float) -> None:
        super().__init__()
        self.mean_net = leaky_mlp([obs_dim] + [hidden] * depth + [dim])
        self.concentration_net = leaky_mlp([obs_dim, concentration_hidden, 1])
        _zero_last(self.concentration_net[-1])
        self.log_initial = math.log(initial_concentration)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mean_net(x), torch.exp(self.log_initial + self.concentration_net(x)[:, 0])


class DigitsEncoder(nn.Module):
    r"""Images (N, 1, 8, 8) -> (direction (N, D), :math:`\kappa` (N,)) through a shared MLP
    (module docstring)."""

    def __init__(self, latent_dim: int, hidden: int, initial_concentration: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(PIXELS, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU())
        self.direction = nn.Linear(hidden, latent_dim)
        self.log_concentration = nn.Linear(hidden, 1)
        _zero_last(self.log_concentration)
        self.log_initial = math.log(initial_concentration)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.direction(h), torch.exp(self.log_initial + self.log_concentration(h)[:, 0])


class PositiveRuleEnergy(Energy):
    r"""The controlled process's positive rule (U3 of
    :mod:`~rpm.experiments.uncertainty.process`) as the energy of the implicit prior,

    .. math::

        f(z, z') = \log \sigma\big(\kappa_+ \hat z^\top \hat z' - \ell\big)
        = -\operatorname{softplus}\big(\ell - \kappa_+ \hat z^\top \hat z'\big),

    so that :math:`P(z' \mid z) \propto Q(z')\, e^{f(z, z')}` is the process's own conditional
    of a partner's latent (a candidate accepted with probability :math:`\sigma(\cdot)`), where
    :class:`~rpm.priors.CosineEnergy` at the matched concentration (U4) approximates it by a vMF.

    :param float kappa_pos: :math:`\kappa_+`.
    :param float threshold: :math:`\ell`.
    """

    def __init__(self, kappa_pos: float, threshold: float) -> None:
        super().__init__()
        self.register_buffer("kappa_pos", torch.tensor(float(kappa_pos), dtype=torch.float64))
        self.register_buffer("threshold", torch.tensor(float(threshold), dtype=torch.float64))

    def _of_cosines(self, cosines: torch.Tensor) -> torch.Tensor:
        kappa_pos, threshold = self.kappa_pos.to(cosines.dtype), self.threshold.to(cosines.dtype)
        # logsigmoid, not -softplus: softplus is linear above its threshold (20), 2e-9 off
        return nn.functional.logsigmoid(kappa_pos * cosines - threshold)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        return self._of_cosines(unit_vectors(z) @ unit_vectors(z2).T)

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        return self._of_cosines((unit_vectors(z) * unit_vectors(z2)).sum(-1))


def build_rpm(encoder: nn.Module, kappa_pos: float, learn_kappa: bool,
              energy: Energy | None = None) -> rpm.RPM:
    """The RPM of an encoder (module docstring): vMF recognition of its raw concentration and
    the implicit prior of ``energy``, by default ``CosineEnergy(kappa_pos, learn_kappa)``."""
    if energy is None:
        energy = CosineEnergy(kappa_pos, learn_kappa=learn_kappa)
    return rpm.RPM(rpm.VonMisesFisherRecognition(encoder, concentration="raw"),
                   ImplicitPrior(energy))


def build_means_rpm(direction_net: nn.Module, kappa_pos: float) -> rpm.RPM:
    """The first phase's RPM (module docstring): Delta recognition of ``direction_net`` and the
    implicit prior of ``CosineEnergy(kappa_pos, learn_kappa=True)``."""
    return rpm.RPM(rpm.DeltaRecognition(direction_net),
                   ImplicitPrior(CosineEnergy(kappa_pos, learn_kappa=True)))


def model_from_arguments(arguments: dict) -> rpm.RPM:
    """The untrained model of a model record's ``arguments`` (``part`` one of :data:`PARTS`,
    with the sizes of its encoder, ``initial_concentration`` and ``kappa_pos``)."""
    part = arguments["part"]
    if part == "controlled-means":
        direction_net = leaky_mlp([arguments["obs_dim"]] + [arguments["hidden"]]
                                  * arguments["depth"] + [arguments["dim"]])
        return build_means_rpm(direction_net, arguments["kappa_pos"])
    if part == "controlled":
        encoder: nn.Module = ControlledEncoder(
            arguments["obs_dim"], arguments["dim"], arguments["hidden"], arguments["depth"],
            arguments["concentration_hidden"], arguments["initial_concentration"])
        rule = (PositiveRuleEnergy(arguments["rule_kappa_pos"], arguments["rule_threshold"])
                if arguments.get("energy") == "rule" else None)
        return build_rpm(encoder, arguments["kappa_pos"], learn_kappa=False, energy=rule)
    if part == "digits":
        encoder = DigitsEncoder(arguments["latent_dim"], arguments["hidden"],
                                arguments["initial_concentration"])
        return build_rpm(encoder, arguments["kappa_pos"], learn_kappa=arguments["learn_kappa"])
    raise ValueError(f"part must be one of {PARTS}, got {part!r}")
