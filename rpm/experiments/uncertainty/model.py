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
* ``controlled-means``: the first phase of the controlled encoder, a Delta encoder
  :math:`Q(z \mid x) = \delta(z - (m(x), w(x), b(x)))` (:class:`WidthAwareMeans`) of the
  direction network :math:`m`, the log width :math:`w(x) = -\log\kappa(x)` of the concentration
  network and a partner log weight :math:`b(x)`, under the implicit prior of
  :class:`ConvolvedCosineEnergy` (:func:`build_means_rpm`): InfoNCE whose critic is the
  log-density of a vMF of the partner's direction about the anchor's, at the pair
  concentration :math:`\tau` of a learned coupling :math:`a` convolved with both inputs'
  widths, plus the partner's weight. A Delta encoder under a cosine energy of one
  concentration fits every input's pairs with one slope, and its map bends to absorb what the
  posteriors' widths (and the partners' marginal, unlike the inputs') do to the pairs: the
  concentration phase then reads those bends as uncertainty. With the widths and the weight
  in the critic the map bends far less, and the widths it learns are the second phase's
  start.
* ``digits`` (:class:`DigitsEncoder`): an 8 x 8 image, flattened, through two ReLU layers of
  ``hidden`` units shared by a linear direction head (``latent_dim``) and a linear
  :math:`\log\kappa` head; :math:`\kappa_+` learned from ``kappa_pos``.

The last layer of each :math:`\log\kappa` head (and of the partner weight network) starts at
zero weights and bias 0, so every input starts at :math:`\kappa_0` (``initial_concentration``).

:func:`model_from_arguments` rebuilds either from its model record (``rpm.load``).
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam
from torch import nn

import rpm
from rpm.distributions._von_mises_fisher import TabulatedLogNormaliser, uniform_log_density
from rpm.experiments.uncertainty.process import leaky_mlp
from rpm.priors import CosineEnergy, Energy, ImplicitPrior
from rpm.priors._base import positive_hyperparameter
from rpm.priors._energies import _in_dtype, unit_vectors

__all__ = ["ControlledEncoder", "ConvolvedCosineEnergy", "DigitsEncoder", "PARTS",
           "PositiveRuleEnergy", "WidthAwareMeans", "build_means_rpm", "build_rpm",
           "model_from_arguments"]

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

    def log_concentration(self, x: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\kappa(x) = \log\kappa_0 + h(x)`, shape (N, 1)."""
        return self.log_initial + self.concentration_net(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mean_net(x), torch.exp(self.log_concentration(x)[:, 0])


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


class ConvolvedCosineEnergy(Energy):
    r"""The energy of the first phase's Delta RPM (module docstring): latents
    :math:`z = (d, w, b) \in \mathbb R^{D+2}` carry a direction :math:`d`, a log width
    :math:`w` (the posterior's :math:`1/\kappa`, as a logarithm) and a log partner weight
    :math:`b`, and

    .. math::

        f(z, z') = \log \frac{\mathrm{vMF}(\hat d'; \hat d, \tau)}{C_D(0)} + b'
        = \tau\, \hat d^\top \hat d' + \log C_D(\tau) - \log C_D(0) + b', \qquad
        \frac 1\tau = \frac 1a + e^{w} + e^{w'}.

    :math:`\tau` is the Gaussian approximation to the concentration of a vMF of concentration
    :math:`a` (the positive pairs' coupling) convolved with the two posteriors
    :math:`\mathrm{vMF}(\hat d, e^{-w})` and :math:`\mathrm{vMF}(\hat d', e^{-w'})`: a Delta
    encoder of the means alone fits the pair log-ratio with one slope for every input and bends
    its map to absorb the inputs' widths, while this energy lets each input's width set its own
    slope. :math:`\log C_D(\tau)` normalises the conditional of :math:`\hat d'` for every
    :math:`\tau`, so a width changes how spread an input's partners are, not only the scale of
    the critic. :math:`b'` is a term of the partner alone: where partners are distributed
    unlike the inputs (:math:`\log P_\text{partner}(x') / P(x')`), InfoNCE's optimal critic
    carries it, and a critic without it bends the map instead. Under
    :class:`~rpm.priors.ImplicitPrior` the RPM ELBO is InfoNCE with this critic (the anchor's
    row normalised over the batch's partners; a term of the anchor alone would cancel).
    :math:`\log C_D(\tau) + \tau` is tabulated
    (:class:`~rpm.distributions._von_mises_fisher.TabulatedLogNormaliser`).

    :param int dim: D >= 2, the direction's dimension (the latents have D + 2).
    :param float pair_concentration: :math:`a > 0` (its initial value when learned).
    :param bool learn_pair_concentration: learn :math:`a` (a positive :class:`PyroParam`).
    """

    def __init__(self, dim: int, pair_concentration: float,
                 learn_pair_concentration: bool = True) -> None:
        super().__init__()
        if not (isinstance(dim, int) and dim >= 2):
            raise ValueError(f"ConvolvedCosineEnergy needs the direction's dimension D >= 2, "
                             f"got {dim!r}")
        self.direction_dim = dim
        self.dim = dim + 2
        value = positive_hyperparameter("pair_concentration", pair_concentration)
        if learn_pair_concentration:
            self.pair_concentration: torch.Tensor = PyroParam(  # type: ignore[assignment]
                value, constraints.positive)
        else:
            self.register_buffer("pair_concentration", value)
        self.log_normaliser = TabulatedLogNormaliser(dim)
        self.log_uniform = uniform_log_density(dim)

    def check_latents(self, z: torch.Tensor, z2: torch.Tensor) -> None:
        if (isinstance(z, torch.Tensor) and z.dim() == 2 and isinstance(z2, torch.Tensor)
                and z2.dim() == 2 and z.shape[1] == z2.shape[1] and z.shape[1] != self.dim):
            raise ValueError(f"ConvolvedCosineEnergy(dim={self.direction_dim}) takes latents "
                             f"(direction, log width, log partner weight) of dimension "
                             f"{self.dim}, got {z.shape[1]}; the encoder must return "
                             "D + 2 columns")
        super().check_latents(z, z2)

    def _of(self, cosines: torch.Tensor, width: torch.Tensor, width2: torch.Tensor,
            weight2: torch.Tensor) -> torch.Tensor:
        pair = _in_dtype(self.pair_concentration, cosines.dtype)
        tau = 1 / (1 / pair + width.exp() + width2.exp())
        # tau (c - 1) + (log C_D(tau) + tau): nothing of size tau cancels
        return (tau * (cosines - 1) + self.log_normaliser(tau) - self.log_uniform + weight2)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        D = self.direction_dim
        cosines = unit_vectors(z[:, :D]) @ unit_vectors(z2[:, :D]).T
        return self._of(cosines, z[:, D, None], z2[None, :, D], z2[None, :, D + 1])

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        D = self.direction_dim
        cosines = (unit_vectors(z[:, :D]) * unit_vectors(z2[:, :D])).sum(-1)
        return self._of(cosines, z[:, D], z2[:, D], z2[:, D + 1])


class WidthAwareMeans(nn.Module):
    r"""The first phase's encoder of the means (module docstring): x (N, P) ->
    :math:`(m(x), w(x), b(x))` (N, D + 2) for :class:`ConvolvedCosineEnergy`, with the
    direction network :math:`m` and the log width :math:`w(x) = -\log\kappa(x)` of a
    :class:`ControlledEncoder` (its own two networks, trained in place: after this phase the
    encoder's concentration is :math:`e^{-w(x)}`), and a partner log weight :math:`b(x)` from a
    LeakyReLU network of one hidden layer of ``weight_hidden`` units whose last layer starts at
    zero.
    """

    def __init__(self, encoder: ControlledEncoder, weight_hidden: int) -> None:
        super().__init__()
        self.encoder = encoder
        obs_dim = encoder.mean_net[0].in_features
        self.weight_net = leaky_mlp([obs_dim, weight_hidden, 1])
        _zero_last(self.weight_net[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        encoder = self.encoder
        return torch.cat([encoder.mean_net(x), -encoder.log_concentration(x), self.weight_net(x)],
                         dim=-1)


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


def build_means_rpm(encoder: ControlledEncoder, weight_hidden: int,
                    pair_concentration: float) -> rpm.RPM:
    """The first phase's RPM (module docstring): Delta recognition of
    ``WidthAwareMeans(encoder, weight_hidden)`` and the implicit prior of
    ``ConvolvedCosineEnergy(D, pair_concentration)`` with :math:`a` learned."""
    dim = encoder.mean_net[-1].out_features
    return rpm.RPM(rpm.DeltaRecognition(WidthAwareMeans(encoder, weight_hidden)),
                   ImplicitPrior(ConvolvedCosineEnergy(dim, pair_concentration)))


def _controlled_encoder(arguments: dict) -> ControlledEncoder:
    return ControlledEncoder(arguments["obs_dim"], arguments["dim"], arguments["hidden"],
                             arguments["depth"], arguments["concentration_hidden"],
                             arguments["initial_concentration"])


def model_from_arguments(arguments: dict) -> rpm.RPM:
    """The untrained model of a model record's ``arguments`` (``part`` one of :data:`PARTS`,
    with the sizes of its encoder, ``initial_concentration`` and ``kappa_pos``). A
    ``controlled-means`` record without ``weight_hidden`` is one of the earlier first phase (the
    directions alone under the cosine energy with a learned concentration), rebuilt as such."""
    part = arguments["part"]
    if part == "controlled-means":
        if "weight_hidden" not in arguments:
            # a record of the earlier first phase: the directions alone, as a Delta encoder under
            # the cosine energy with a learned concentration (vMF-InfoNCE)
            direction_net = leaky_mlp([arguments["obs_dim"]] + [arguments["hidden"]]
                                      * arguments["depth"] + [arguments["dim"]])
            return rpm.RPM(rpm.DeltaRecognition(direction_net), ImplicitPrior(
                CosineEnergy(arguments["kappa_pos"], learn_kappa=True)))
        return build_means_rpm(_controlled_encoder(arguments), arguments["weight_hidden"],
                               arguments["kappa_pos"])
    if part == "controlled":
        encoder: nn.Module = _controlled_encoder(arguments)
        rule = (PositiveRuleEnergy(arguments["rule_kappa_pos"], arguments["rule_threshold"])
                if arguments.get("energy") == "rule" else None)
        return build_rpm(encoder, arguments["kappa_pos"], learn_kappa=False, energy=rule)
    if part == "digits":
        encoder = DigitsEncoder(arguments["latent_dim"], arguments["hidden"],
                                arguments["initial_concentration"])
        return build_rpm(encoder, arguments["kappa_pos"], learn_kappa=arguments["learn_kappa"])
    raise ValueError(f"part must be one of {PARTS}, got {part!r}")
