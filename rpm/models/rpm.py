r"""The recognition parameterised model (RPM) as a Pyro model and guide (SPEC section 4).

Generative model (Eq. 9 of Aitchison & Ganev): :math:`P(x, x', z, z') = P(z, z') P(x|z) P(x'|z')`
with the likelihood defined from the recognition joint (Eq. 10):

.. math::

    P(x|z) = \frac{Q(z|x)\, P_\text{true}(x)}{Q(z)},

where :math:`Q(z)` is the minibatch-mixture recognition marginal. :math:`P_\text{true}(x)` is
constant in every parameter and is left out, so the likelihood enters the model as the factor
:math:`\log Q(z|x) - \log Q(z)`. The guide is the recognition models themselves,
:math:`Q(z, z'|x, x') = Q(z|x) Q(z'|x')` (Eq. 14), so Pyro's ``Trace_ELBO`` on ``(model, guide)``
computes Eq. 15 summed over the batch:

.. math::

    \sum_i \mathbb{E}_{Q(z_i|x_i) Q(z'_i|x'_i)}\big[\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)\big].
"""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from pyro.distributions import Delta, TorchDistribution
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule, pyro_method

from rpm.marginals import MixtureMarginal

__all__ = ["RPM"]


def _is_point_mass(q: TorchDistribution) -> bool:
    return isinstance(q, Delta)


def _prior_dim(prior) -> int | None:
    dim = getattr(prior, "dim", None)
    if dim is None:
        dim = getattr(getattr(prior, "energy", None), "dim", None)
    return dim if isinstance(dim, int) else None


class RPM(PyroModule):
    r"""A recognition parameterised model with a prior over a pair of latents.

    .. code-block:: python

        rpm = RPM(DeltaRecognition(encoder), ImplicitPrior(CosineEnergy(kappa=10.0)))
        svi = pyro.infer.SVI(rpm.model, rpm.guide, pyro.optim.Adam({"lr": 1e-3}), RPMELBO())
        svi.step(x, x2)   # x, x2: (N, ...) paired views

    ``model(x, x2)`` declares, inside ``pyro.plate("pairs", N)``, the prior's sample sites
    ``"z"`` and ``"z2"`` and the likelihood factors ``"x"`` and ``"x2"`` with log-densities
    :math:`\log Q(z|x) - \log Q(z)` and :math:`\log Q(z'|x') - \log Q(z')` (Eq. 10).
    ``guide(x, x2)`` samples ``"z" ~ Q(z|x)`` and ``"z2" ~ Q(z'|x')``.

    :param recognition: Q(z|x), a :class:`~rpm.GaussianRecognition` or
        :class:`~rpm.DeltaRecognition` (any module returning a batch of distributions with
        batch_shape (N,) and event_shape (D,)).
    :param prior: a callable ``prior(q, q2) -> (z, z2)`` declaring the sites ``"z"`` and
        ``"z2"`` (see :mod:`rpm.priors`).
    :param recognition2: Q(z'|x') for the second view; by default the first view's model is
        shared.
    :raises ValueError: for a deterministic encoder (Delta, no noise) with a prior that is an
        explicit continuous density (Appendix B of Aitchison & Ganev).
    """

    def __init__(self, recognition, prior, recognition2=None):
        super().__init__()
        for name, module in (("recognition", recognition), ("recognition2", recognition2)):
            if module is not None and not callable(module):
                raise TypeError(f"{name} must be callable (x -> distribution), got {module!r}")
        if not callable(prior):
            raise TypeError(f"prior must be callable as prior(q, q2), got {prior!r}")
        self.recognition = recognition
        self.recognition2 = recognition2
        self.prior = prior
        if not getattr(prior, "accepts_delta_recognition", False):
            for name, module in (("recognition", recognition), ("recognition2", recognition2)):
                if getattr(module, "is_deterministic", False):
                    raise ValueError(_delta_with_density_message(name, prior))

    def recognise(
        self, x: torch.Tensor, x2: torch.Tensor
    ) -> tuple[TorchDistribution, TorchDistribution]:
        """Validates a batch of pairs and returns the recognition distributions (q, q2),
        each with batch_shape (N,) and event_shape (D,)."""
        for name, value in (("x", x), ("x2", x2)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
            if value.dim() < 1:
                raise ValueError(f"{name} must have a batch dimension, got a scalar")
        if x.shape[0] != x2.shape[0]:
            raise ValueError(
                f"x and x2 are paired views and need the same batch size, got {x.shape[0]} and "
                f"{x2.shape[0]}; pass the two views of the same N pairs (x[i] and x2[i] form "
                "pair i)"
            )
        if x.shape[0] < 2:
            raise ValueError(
                f"a batch of {x.shape[0]} pair has nothing to contrast: the recognition marginal "
                "is a mixture over the batch, so use at least 2 pairs (in practice many more)"
            )
        if is_validation_enabled():
            for name, value in (("x", x), ("x2", x2)):
                _check_finite_input(name, value)
        q = self.recognition(x)
        q2 = (self.recognition2 or self.recognition)(x2)
        for name, dist in (("recognition", q), ("recognition2", q2)):
            if dist.batch_shape != (x.shape[0],) or len(dist.event_shape) != 1:
                raise ValueError(
                    f"{name} must return a distribution with batch_shape (N,) = ({x.shape[0]},) "
                    f"and event_shape (D,), got batch_shape {tuple(dist.batch_shape)} and "
                    f"event_shape {tuple(dist.event_shape)}"
                )
        if q.event_shape != q2.event_shape:
            raise ValueError(
                f"the two views' latents have different dimensions {q.event_shape[0]} and "
                f"{q2.event_shape[0]}; both encoders must output the same latent dimension"
            )
        prior_dim = _prior_dim(self.prior)
        if prior_dim is not None and prior_dim != q.event_shape[0]:
            raise ValueError(
                f"the prior was built for latent dimension {prior_dim} but the encoder outputs "
                f"dimension {q.event_shape[0]}; make them agree (e.g. dim={q.event_shape[0]})"
            )
        if not getattr(self.prior, "accepts_delta_recognition", False):
            for name, dist in (("recognition", q), ("recognition2", q2)):
                if _is_point_mass(dist):
                    raise ValueError(_delta_with_density_message(name, self.prior))
        return q, q2

    def sample_prior(self, q: TorchDistribution, q2: TorchDistribution):
        """Runs the prior inside the current plate and checks it declared ``"z"`` and ``"z2"``."""
        with poutine.trace() as tracer:
            result = self.prior(q, q2)
        missing = [name for name in ("z", "z2") if name not in tracer.trace.nodes]
        if missing:
            raise ValueError(
                f"the prior {type(self.prior).__name__} did not declare the sample site(s) "
                f"{missing}; a prior must call pyro.sample('z', ...) and pyro.sample('z2', ...) "
                "and return (z, z2)"
            )
        if not (isinstance(result, tuple) and len(result) == 2):
            got = type(result).__name__
            if isinstance(result, (tuple, list)):
                got += f" of length {len(result)}"
            raise ValueError(
                f"the prior {type(self.prior).__name__} must return the pair (z, z2), got "
                f"{got}; end its forward with `return z, z2`"
            )
        return result

    def model(self, x: torch.Tensor, x2: torch.Tensor):
        r"""The generative model of Eq. 9-10: prior sites "z", "z2"; likelihood factors "x", "x2"."""
        q, q2 = self.recognise(x, x2)
        with pyro.plate("pairs", x.shape[0]):
            z, z2 = self.sample_prior(q, q2)
            pyro.factor("x", q.log_prob(z) - MixtureMarginal(q).log_prob(z))
            pyro.factor("x2", q2.log_prob(z2) - MixtureMarginal(q2).log_prob(z2))
        return z, z2

    def guide(self, x: torch.Tensor, x2: torch.Tensor):
        r"""The approximate posterior of Eq. 14: the recognition models, Q(z|x) Q(z'|x')."""
        q, q2 = self.recognise(x, x2)
        with pyro.plate("pairs", x.shape[0]):
            z = pyro.sample("z", q)
            z2 = pyro.sample("z2", q2)
        return z, z2

    @pyro_method
    def call_with_cached_params(self, fn, *args, **kwargs):
        """Calls ``fn(*args, **kwargs)`` with this module's Pyro params fetched once and cached
        for the whole call (Pyro's ``pyro_method`` context), instead of once per access."""
        return fn(*args, **kwargs)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The recognition mean of the first view, shape (N, D): the learned representation."""
        return self.recognition(x).mean


def _check_finite_input(name: str, value: torch.Tensor) -> None:
    """Raises ValueError naming the rows of ``value`` (N, ...) that hold NaN or infinite entries."""
    if not value.is_floating_point() and not value.is_complex():
        return
    finite = torch.isfinite(value).reshape(value.shape[0], -1).all(-1)  # (N,)
    if not finite.all():
        rows = torch.nonzero(~finite).flatten().tolist()
        shown = ", ".join(str(row) for row in rows[:5]) + (", ..." if len(rows) > 5 else "")
        raise ValueError(
            f"{name} has NaN or infinite entries in {len(rows)} of its {value.shape[0]} rows "
            f"(rows {shown}); clean or drop those pairs before training (this check runs "
            "under pyro.enable_validation)"
        )


def _delta_with_density_message(name: str, prior) -> str:
    return (
        f"{name} is deterministic (DeltaRecognition with noise_scale=0) but the prior "
        f"{type(prior).__name__} is an explicit continuous density: the recognition marginal "
        "Q(z) is then a discrete distribution on the batch points and log P(z) - log Q(z) is "
        "ill-defined (Appendix B of Aitchison & Ganev). Use DeltaRecognition(net, "
        "noise_scale=1e-2) (any eps > 0) or a GaussianRecognition, or an ImplicitPrior"
    )
