r"""A physics-aware explicit prior for the bouncing-balls video: every ball keeps its speed and
turns by an unknown angle.

What the physics of the video (Appendix D of Aitchison & Ganev; :mod:`rpm.data.bouncing_balls`)
says about a *pair* of consecutive frames:

* the scene is ``K`` separate objects, each with a position :math:`c_k \in \mathbb{R}^2`;
* between two frames every ball moves by exactly one diameter, :math:`\lVert c'_k - c_k \rVert = d`;
* the direction of that move is the previous direction plus noise, so it depends on the
  *velocity*, which one frame does not show. A prior over a pair of frames sees two positions
  and no velocity: a linear-Gaussian model on position and velocity is not identifiable from a
  pair, and the best a pair prior can do is to marginalise the unknown heading. Over the video
  the headings are spread uniformly on the circle.

Marginalising a uniform heading :math:`\theta` of a step of length r, blurred by isotropic
Gaussian noise of scale w (the encoder's read-out error and its recognition noise), gives the
**circular-step** density of a displacement :math:`\delta \in \mathbb{R}^2`, with
:math:`\rho = \lVert\delta\rVert`,

.. math::

    p(\delta) = \frac{1}{2\pi} \int_0^{2\pi} \mathcal{N}\big(\delta;\ r (\cos\theta, \sin\theta),\
        w^2 I\big)\, d\theta
      = \frac{1}{2\pi w^2} \exp\Big(-\frac{\rho^2 + r^2}{2 w^2}\Big)\, I_0\Big(\frac{r\rho}{w^2}\Big),

(:math:`I_0` the modified Bessel function of the first kind; the radius :math:`\rho` is Rice
distributed). At r = 0 it is the Gaussian random walk :math:`\mathcal{N}(0, w^2 I)`, the
explicit twin of the RBF energy (Eq. 27); for r > 0 it puts its mass on a ring, which says
"every ball moves, and by a fixed amount", something the RBF prior cannot express.

:class:`BallDynamicsPrior` is the explicit prior

.. math::

    P(z) = \mathcal{N}\big(m, \operatorname{diag} s^2\big), \qquad
    P(z'|z) = \prod_{k=1}^{K} p_{r_k, w_k}\big(z'_k - z_k\big),

on latents :math:`z = (x_1, y_1, \dots, x_K, y_K)` (the centre-of-mass read-out of
:class:`~rpm.experiments.bouncing_balls.encoders.BallEncoder`), with m, s, the step lengths
:math:`r_k` and the noise scales :math:`w_k` learned (one r and w per ball, because each
feature map may read its ball out at its own scale). Being an explicit density it needs a
recognition model with a density (``DeltaRecognition(net, noise_scale=eps)``, Appendix B).

What it learns (``rpm bouncing-balls``, eps = 0.3): a step noise :math:`w_k` close to
:math:`\sqrt2\,\epsilon`, the noise of the two frames' recognition models alone, so the
encoder's means do move by an almost constant step, and a ring about as wide as its radius,
whose density is close to a Gaussian random walk; a Gaussian random walk with the same
recognition noise reaches the same held-out R^2. What lifts the explicit prior above the RBF
prior is therefore an explicit, normalised transition density with small recognition noise;
the constant-speed ring costs nothing and states the physics. The learned values and the
scores over seeds are in ``benchmarks/README.md`` (measured numbers go stale in a docstring).

References:
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition
    parameterised model", Section 5, Appendix B and D.
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro.distributions import Normal, TorchDistribution
from pyro.nn import PyroModule, PyroParam
from torch.distributions import constraints
from torch.distributions.utils import broadcast_all

from rpm._validation import check_positive, check_positive_int, check_real

__all__ = ["BallDynamicsPrior", "CircularStep"]


class CircularStep(TorchDistribution):
    r"""Positions of K balls after one step of length :math:`r_k` in a uniformly random
    direction, blurred by isotropic Gaussian noise :math:`w_k`:

    .. math::

        z'_k = z_k + r_k (\cos\theta_k, \sin\theta_k) + w_k \epsilon_k, \qquad
        \theta_k \sim \mathcal{U}[0, 2\pi),\ \epsilon_k \sim \mathcal{N}(0, I_2),

    with log-density, :math:`\rho_k = \lVert z'_k - z_k \rVert`,

    .. math::

        \log p(z') = \sum_{k=1}^K \Big[-\log(2\pi w_k^2) - \frac{(\rho_k - r_k)^2}{2 w_k^2}
            + \log \operatorname{i0e}\Big(\frac{r_k \rho_k}{w_k^2}\Big)\Big],

    where :math:`\operatorname{i0e}(a) = e^{-a} I_0(a)` keeps the Bessel factor finite. The
    event is the flat vector :math:`(x_1, y_1, \dots, x_K, y_K)`.

    :param torch.Tensor loc: the positions before the step, :math:`z`. Shape: (..., 2K).
    :param step_length: :math:`r_k \ge 0`, broadcastable to (..., K).
    :param noise: :math:`w_k > 0`, broadcastable to (..., K).
    """

    arg_constraints = {
        "loc": constraints.real_vector,
        "step_length": constraints.nonnegative,
        "noise": constraints.positive,
    }
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: torch.Tensor, step_length, noise, validate_args=None):
        if not isinstance(loc, torch.Tensor) or loc.dim() < 1 or loc.shape[-1] % 2:
            shape = tuple(loc.shape) if isinstance(loc, torch.Tensor) else type(loc).__name__
            raise ValueError(
                "loc must be a tensor of shape (..., 2K) holding (x_1, y_1, ..., x_K, y_K), got "
                f"{shape}"
            )
        num_balls = loc.shape[-1] // 2
        ball_loc = loc.reshape(*loc.shape[:-1], num_balls, 2)  # (..., K, 2)
        step_length, noise = broadcast_all(step_length, noise)
        step_length = step_length.to(loc) + torch.zeros_like(ball_loc[..., 0])  # (..., K)
        noise = noise.to(loc) + torch.zeros_like(ball_loc[..., 0])  # (..., K)
        self.loc = loc + torch.zeros_like(step_length).repeat_interleave(2, dim=-1)  # (..., 2K)
        self.step_length, self.noise = step_length, noise
        self.num_balls = num_balls
        super().__init__(self.loc.shape[:-1], self.loc.shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(CircularStep, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        new.step_length = self.step_length.expand(batch_shape + (self.num_balls,))
        new.noise = self.noise.expand(batch_shape + (self.num_balls,))
        new.num_balls = self.num_balls
        super(CircularStep, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> torch.Tensor:
        """The directions average out: the mean is ``loc``. Shape: (..., 2K)."""
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        r""":math:`r_k^2 / 2 + w_k^2` for each coordinate of ball k. Shape: (..., 2K)."""
        per_ball = 0.5 * self.step_length.square() + self.noise.square()  # (..., K)
        return per_ball.repeat_interleave(2, dim=-1)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)  # sample_shape + batch + (2K,)
        ball_shape = shape[:-1] + (self.num_balls,)
        angle = 2.0 * math.pi * torch.rand(ball_shape, dtype=self.loc.dtype,
                                           device=self.loc.device)  # (..., K)
        direction = torch.stack((angle.cos(), angle.sin()), dim=-1)  # (..., K, 2)
        noise = torch.randn(ball_shape + (2,), dtype=self.loc.dtype, device=self.loc.device)
        step = self.step_length[..., None] * direction + self.noise[..., None] * noise
        return self.loc + step.reshape(shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        delta = (value - self.loc).reshape(*value.shape[:-1], self.num_balls, 2)  # (..., K, 2)
        # rho = |delta|, floored so that its gradient stays finite at delta = 0 (where the
        # density is smooth and its true gradient vanishes by symmetry).
        rho = delta.square().sum(-1).clamp_min(1e-30).sqrt()  # (..., K)
        variance = self.noise.square()
        log_density = (
            -torch.log(2.0 * math.pi * variance)
            - (rho - self.step_length).square() / (2.0 * variance)
            + torch.special.i0e(self.step_length * rho / variance).log()
        )  # (..., K)
        return log_density.sum(-1)


def _positive_vector(name: str, value: float, size: int) -> torch.Tensor:
    return torch.full((size,), check_positive(name, value))


class BallDynamicsPrior(PyroModule):
    r"""The explicit bouncing-balls prior (module docstring):
    :math:`P(z) = \mathcal{N}(m, \operatorname{diag} s^2)`, :math:`P(z'|z) =` :class:`CircularStep`
    (each ball moves by a learned length :math:`r_k` in a uniformly random direction, with
    learned noise :math:`w_k`).

    Called inside the model's plate as ``prior(q, q2)`` (q, q2 unused), it declares the sample
    sites ``"z"`` and ``"z2"`` and returns them, each of shape (N, 2K).

    :param int num_balls: K; the latent dimension is 2K.
    :param float centre: initial m (every coordinate), e.g. the middle of the image.
    :param float spread: initial s > 0.
    :param float step_length: initial :math:`r_k > 0`.
    :param float noise: initial :math:`w_k > 0`.
    """

    def __init__(self, num_balls: int = 3, centre: float = 0.0, spread: float = 1.0,
                 step_length: float = 1.0, noise: float = 1.0):
        super().__init__()
        num_balls = check_positive_int("num_balls", num_balls)
        centre = check_real("centre", centre)
        self.num_balls = num_balls
        self.dim = 2 * num_balls
        self.loc = torch.nn.Parameter(torch.full((self.dim,), centre))  # m, (2K,)
        self.spread = PyroParam(_positive_vector("spread", spread, self.dim),
                                constraints.positive)  # s, (2K,)
        self.step_length = PyroParam(_positive_vector("step_length", step_length, num_balls),
                                     constraints.positive)  # r, (K,)
        self.noise = PyroParam(_positive_vector("noise", noise, num_balls),
                               constraints.positive)  # w, (K,)

    def forward(self, q=None, q2=None):
        """Declares ``z ~ N(m, diag s^2)`` and ``z2 ~ CircularStep(z, r, w)``; returns
        ``(z, z2)``."""
        z = pyro.sample("z", Normal(self.loc, self.spread).to_event(1))
        z2 = pyro.sample("z2", CircularStep(z, self.step_length, self.noise))
        return z, z2
