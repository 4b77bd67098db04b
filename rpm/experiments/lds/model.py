r"""The model of ``rpm lds`` (and the sequence part of ``rpm pendulum``): a Gaussian encoder of
each frame and a linear-Gaussian state-space prior over the frames of a window, with the
structured guide.

.. math::

    Q(z_t | x_t) = \mathcal{N}\big(\mu(x_t), \sigma^2 I\big), \qquad
    \mu(x) = W x + c + \mathrm{MLP}(x),

the MLP (one hidden layer of ``hidden`` tanh units, output layer started at zero) added to an
affine path, so that the untrained encoder is a random affine map; ``hidden=0`` keeps the affine
map alone. The recognition noise :math:`\sigma` is a constant (a buffer): the scale of the
means is free, so a learned :math:`\sigma` would only trade against it.

:func:`build_sequence_model` wraps an encoder that returns ``(loc, scale)`` into
:class:`~rpm.RPM` with :class:`~rpm.priors.StateSpacePrior` (A started at ``decay`` I,
C at the first D coordinates of the state) and the structured guide (the chain conditioned on
the recognition means, ``docs/theory.md``, sequences). The marginals :math:`Q_t` are pooled over
all frames of the batch by default: the frames of a stationary process are exchangeable, and
the pooled mixture has N T components instead of N. With the N per-view components only
(``pooled_marginal=False``), the measured runs traded the latent's information for
predictability: on ``rpm lds --size small`` the held-out :math:`R^2` of the encoder's means
fell from 0.99 to 0.5-0.7 within 200-300 steps while the ELBO rose, with 32 windows of 100
frames as with 256 windows of 10; pooled over 64 windows of 25 frames it stayed at 0.99 (at
``--size small``; at medium and large the pooled runs lose it too: ``benchmarks/README.md``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

import rpm
from rpm._validation import check_choice, check_int, check_positive, check_positive_int
from rpm.priors import StateSpacePrior, StationaryStateSpacePrior

__all__ = ["MARGINALS", "PRIORS", "GaussianMLPEncoder", "build_sequence_model",
           "model_from_arguments"]

#: The state-space priors of ``--prior``: the free chain (the default) and the stationary,
#: scale-pinned one.
PRIORS = ("free", "stationary")
#: The estimates of the marginals of ``--marginal`` (module docstring).
MARGINALS = ("per-view", "pooled", "gaussian")


class GaussianMLPEncoder(nn.Module):
    r"""An affine map plus a one-hidden-layer MLP with a constant recognition noise (module
    docstring): :math:`\mu(x) = W x + c + V_2 \tanh(V_1 x + d_1) + d_2`, :math:`\sigma` fixed.

    :param int in_dim: P, the dimension of a frame.
    :param int out_dim: D, the latent dimension.
    :param int hidden: width of the MLP's hidden layer; 0 for the affine map alone.
    :param float noise: :math:`\sigma > 0`, the recognition standard deviation.

    Shape: input (..., P); output ``(loc, scale)``, each (..., D).
    """

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 64, noise: float = 0.1) -> None:
        super().__init__()
        check_positive_int("in_dim", in_dim)
        check_positive_int("out_dim", out_dim)
        check_int("hidden", hidden, minimum=0)
        check_positive("noise", noise)
        self.linear = nn.Linear(in_dim, out_dim)
        self.mlp = None
        if hidden:
            self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, out_dim))
            nn.init.zeros_(self.mlp[2].weight)
            nn.init.zeros_(self.mlp[2].bias)
        self.register_buffer("log_scale", torch.full((out_dim,), math.log(noise)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.linear(x)
        if self.mlp is not None:
            loc = loc + self.mlp(x)
        return loc, self.log_scale.exp().expand_as(loc)


def build_sequence_model(encoder: nn.Module, dim: int, state_dim: int | None = None,
                         decay: float = 0.9, marginal: str = "pooled",
                         prior: str = "free") -> rpm.RPM:
    r"""The :class:`~rpm.RPM` of ``encoder`` (returning ``(loc, scale)`` of dimension
    ``dim``) with a :class:`~rpm.priors.StateSpacePrior` of D = ``dim`` latents and H =
    ``state_dim`` hidden states (A started at ``decay`` I, C at the first D coordinates of the
    state, process noise :math:`\sqrt{1 - decay^2}` so that the chain starts stationary with
    unit variance) and the structured guide. H > D leaves the chain room for what one frame does
    not show (a velocity).

    :param torch.nn.Module encoder: maps frames (M, ...) to ``(loc, scale)``, each (M, D).
    :param int dim: D.
    :param int state_dim: H (default D).
    :param str prior: ``"stationary"``: :class:`~rpm.priors.StationaryStateSpacePrior`
        (:math:`s_t \sim \mathcal{N}(0, I)` at every t, :math:`Q = I - A A^\top`, A started at
        ``decay`` I; C, its offset and R learned), or ``"free"``:
        :class:`~rpm.priors.StateSpacePrior` with every parameter free.
    :param float decay: the start of A, in (0, 1).
    :param str marginal: the estimate of the marginals :math:`Q_t`: ``"pooled"`` (the mixture
        over all frames), ``"per-view"`` (the mixture over each view's N frames) or
        ``"gaussian"`` (the moment-matched Gaussian of all frames, ``rpm.RPM(...,
        marginal="gaussian", pooled_marginal=True)``; module docstring).
    """
    check_positive_int("dim", dim)
    state_dim = dim if state_dim is None else check_positive_int("state_dim", state_dim)
    if not 0.0 < decay < 1.0:
        raise ValueError(f"decay must lie in (0, 1), got {decay!r}")
    check_choice("prior", prior, PRIORS)
    check_choice("marginal", marginal, MARGINALS)
    if prior == "stationary":
        chain = StationaryStateSpacePrior(dim, state_dim, decay=decay, observation_noise=0.1)
    else:
        chain = StateSpacePrior(dim, state_dim=state_dim, constant_velocity=False,
                                init_scale=1.0, process_noise=math.sqrt(1.0 - decay ** 2),
                                observation_noise=0.1)
        with torch.no_grad():
            chain.transition_matrix.mul_(decay)
    recognition = rpm.GaussianRecognition(encoder)
    return rpm.RPM(recognition, chain, guide="structured", pooled_marginal=marginal != "per-view",
                   encoder_calls="concat",
                   marginal="gaussian" if marginal == "gaussian" else "mixture")


def model_from_arguments(arguments: dict) -> rpm.RPM:
    r"""The untrained model of ``rpm lds`` from its model record (:mod:`rpm.experiments.trained`):
    :class:`GaussianMLPEncoder` ``(obs_dim, dim, hidden, recognition_noise)`` and
    :func:`build_sequence_model` ``(encoder, dim, marginal=..., prior=...)``.

    :param dict arguments: ``obs_dim`` (P), ``dim`` (D = H), ``hidden``,
        ``recognition_noise``, ``marginal``, ``prior``.
    """
    encoder = GaussianMLPEncoder(arguments["obs_dim"], arguments["dim"], arguments["hidden"],
                                 arguments["recognition_noise"])
    return build_sequence_model(encoder, arguments["dim"], marginal=arguments["marginal"],
                                prior=arguments["prior"])
