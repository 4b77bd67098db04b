r"""The uniform-implicit prior of Aitchison & Ganev (Eq. 21-22): the prior under which the RPM
ELBO is InfoNCE.

.. math::

    P(z) = Q(z), \qquad P(z'|z) = \frac{Q(z')\, e^{f(z, z')}}{Z(z)}, \qquad
    Z(z) = \mathbb{E}_{Q(z')} e^{f(z, z')},

with Q the minibatch-mixture recognition marginal. Both factors are honest distributions on the
batch: P(z) is the :class:`~rpm.marginals.MixtureMarginal` of the first view's recognition
distributions, and P(z'|z) is :class:`ImplicitConditional`, the energy-tilted mixture of the
second view's. Z(z_i) is estimated, as InfoNCE does, over the batch's own second-view latents
(positive included): :math:`\hat Z(z_i) = \frac1N \sum_j e^{f(z_i, z'_j)}`. With Delta encoders
P(z'|z) is the categorical softmax over the batch points (Eq. 34), the InfoNCE classifier.

In the ELBO (Eq. 15) :math:`\log Q(z)` and :math:`\log Q(z')` cancel and each pair contributes

.. math::

    f(z_i, z'_i) - \log \frac1N \sum_j e^{f(z_i, z'_j)}
    = -\text{CrossEntropy}(F_{i\cdot}, i) + \log N  \qquad\text{(Eq. 23-25)}.
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro.distributions import Categorical, TorchDistribution
from pyro.nn import PyroModule
from torch.distributions import constraints

from rpm.marginals import MixtureMarginal
from rpm.priors.energies import Energy

__all__ = ["ImplicitConditional", "ImplicitPrior", "implicit_log_ratio"]


def implicit_log_ratio(energy_matrix: torch.Tensor) -> torch.Tensor:
    r"""Per-pair :math:`\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)` under the implicit prior.

    .. math::

        F_{ii} - \operatorname{logsumexp}_j F_{ij} + \log N

    :param torch.Tensor energy_matrix: :math:`F_{ij} = f(z_i, z'_j)`, shape (N, N).
    :return: shape (N,).
    """
    num_pairs = energy_matrix.shape[-1]
    return (
        torch.diagonal(energy_matrix)
        - torch.logsumexp(energy_matrix, dim=-1)
        + math.log(num_pairs)
    )


class ImplicitConditional(TorchDistribution):
    r"""The conditional :math:`P(z'|z) = Q(z') e^{f(z, z')} / \hat Z(z)` of the implicit prior.

    A distribution over the batch of second-view latents, batch_shape (N,), event_shape (D,).
    Its log-probability at the batch :math:`z'_{1:N}` is, for pair i,

    .. math::

        \log Q(z'_i) + f(z_i, z'_i) - \log \frac1N \sum_j e^{f(z_i, z'_j)},

    where the normaliser uses the value's own rows as the negatives (SPEC section 4, caveats),
    so ``log_prob`` takes exactly the (N, D) batch. ``sample`` draws N candidates from Q(z')
    and, for each i, picks candidate j with probability :math:`\operatorname{softmax}_j f(z_i, c_j)`
    (self-normalised importance sampling of the tilted marginal).

    :param torch.Tensor z: first-view latents, shape (N, D).
    :param q2: second-view recognition distributions, batch_shape (N,), event_shape (D,).
    :param Energy energy: the energy f.
    """

    arg_constraints: dict = {}
    support = constraints.real_vector
    has_rsample = False

    def __init__(self, z: torch.Tensor, q2: TorchDistribution, energy: Energy,
                 validate_args=None):
        self.z = z
        self.q2 = q2
        self.energy = energy
        self.marginal = MixtureMarginal(q2)
        super().__init__(self.marginal.batch_shape, self.marginal.event_shape,
                         validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != self.batch_shape:
            raise ValueError(
                f"the implicit conditional of a batch of {self.batch_shape[0]} pairs cannot be "
                f"expanded to {tuple(batch_shape)}; use a plate of the batch size"
            )
        return self

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if value.shape != self.batch_shape + self.event_shape:
            raise ValueError(
                "the implicit conditional is evaluated at the whole batch of second-view "
                f"latents, shape {tuple(self.batch_shape + self.event_shape)}; got "
                f"{tuple(value.shape)}"
            )
        energy_matrix = self.energy(self.z, value)  # (N, N)
        return self.marginal.log_prob(value) + implicit_log_ratio(energy_matrix)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        if sample_shape != torch.Size():
            return torch.stack([self.sample() for _ in range(int(torch.Size(sample_shape).numel()))]
                               ).reshape(self._extended_shape(sample_shape))
        with torch.no_grad():
            candidates = self.q2.sample()  # (N, D)
            index = Categorical(logits=self.energy(self.z, candidates)).sample()  # (N,)
            return candidates[index]


class ImplicitPrior(PyroModule):
    r"""The uniform-implicit prior with energy f (Eq. 21-22 of Aitchison & Ganev).

    .. math::

        P(z) = Q(z), \qquad P(z'|z) = Q(z') e^{f(z,z')} / Z(z).

    Called inside the model's plate as ``prior(q, q2)``, it declares the sample sites ``"z"``
    (a :class:`~rpm.marginals.MixtureMarginal`) and ``"z2"`` (an :class:`ImplicitConditional`)
    and returns their values. Its ELBO is InfoNCE with critic f: per pair,
    ELBO = -CrossEntropy + log N (Eq. 23-25).

    :param Energy energy: f(z, z'), e.g. :class:`~rpm.priors.CosineEnergy`.
    """

    #: P(z'|z) is a density relative to Q(z'), so deterministic (Delta) encoders are fine.
    accepts_delta_recognition = True

    def __init__(self, energy: Energy):
        super().__init__()
        if not isinstance(energy, torch.nn.Module) or not callable(energy):
            raise TypeError(
                "ImplicitPrior needs an energy module mapping (z (N, D), z2 (M, D)) to an (N, M) "
                f"matrix, e.g. rpm.priors.RBFEnergy(); got {type(energy).__name__}"
            )
        self.energy = energy

    def forward(self, q: TorchDistribution, q2: TorchDistribution):
        """Declares ``z ~ Q(z)`` and ``z2 ~ P(z'|z)``; returns ``(z, z2)``, each (N, D)."""
        z = pyro.sample("z", MixtureMarginal(q))
        z2 = pyro.sample("z2", ImplicitConditional(z, q2, self.energy))
        return z, z2

    def log_ratio(self, z: torch.Tensor, z2: torch.Tensor, q=None, q2=None) -> torch.Tensor:
        r"""Per-pair :math:`\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)`, the terms of Eq. 15
        that remain after the analytic cancellation (shape (N,))."""
        return implicit_log_ratio(self.energy(z, z2))
