r"""Recognition models Q(z|x): user networks wrapped as batches of Pyro distributions.

Calling a recognition model on a batch x of N observations returns a distribution with
batch_shape (N,) and event_shape (D,):

* :class:`GaussianRecognition`: :math:`Q(z|x) = \mathcal{N}(\mu(x), \operatorname{diag}\sigma(x)^2)`,
  reparameterised (``rsample``), the stochastic encoder (Eq. 3 of Aitchison & Ganev).
* :class:`DeltaRecognition`: :math:`Q(z|x) = \delta(z - \mu(x))`, the usual deterministic SSL
  encoder; with ``noise_scale`` :math:`\epsilon > 0` it is :math:`\mathcal{N}(\mu(x), \epsilon^2 I)`,
  the smoothing that makes Q(z) absolutely continuous (Appendix B of Aitchison & Ganev).
* :class:`VonMisesFisherRecognition`: :math:`Q(z|x) = \mathrm{vMF}(\mu(x), \kappa(x))` on the
  unit sphere :math:`S^{D-1}`, reparameterised, the probabilistic encoder of Kirchhof, Kasneci
  & Oh (2023), whose concentration is the encoder's certainty
  (``docs/theory.md#calibrated-posteriors``).

:class:`CategoricalRecognition` is the discrete factor of Walker et al. (2023),
:math:`f(Z|x) = \operatorname{softmax}(g(x))_Z` over K classes: batch_shape (N,), event_shape
(), the recognition model of :class:`~rpm.DiscreteRPM`.

The wrapped network is held as it is, never converted or otherwise changed: a plain
``torch.nn.Module`` is registered with Pyro (``pyro.module``, under the model's name) in each
call of an RPM's ``model``, ``guide`` or ``elbo`` under a Pyro handler, so ``pyro.infer.SVI``
sees and optimises its parameters, and a
``torch.optim`` loop finds them in ``rpm.parameters()``. One recognition model may serve
several RPMs (its network is then registered under the name of the model that adopted the
recognition model last).

A Gaussian encoder trained under an implicit prior has no reason to keep any noise: the
recognition entropy cancels from the ELBO and the information the latents share can only fall
as the noise grows (``docs/theory.md#stochastic-encoders``), so a learned scale falls to the
smallest value the network can output. Given that floor (``min_scale``),
:class:`GaussianRecognition` says so with a :class:`ScaleFloorWarning`, once per model.
"""

from __future__ import annotations

import warnings

import pyro
import torch
from pyro.distributions import Categorical, Delta, Normal, TorchDistribution
from pyro.infer.util import is_validation_enabled
from pyro.params.param_store import param_with_module_name
from pyro.poutine.runtime import am_i_wrapped

from rpm._pyro_compat import pyro_name
from rpm._validation import check_int
from rpm.distributions import VonMisesFisher
from rpm.models._checked_batches import checks_skipped
from rpm.nn import NamedModule, _registration_scope
from rpm.ops._finite import all_finite
from rpm.priors._energies import unit_vectors

__all__ = ["CategoricalRecognition", "DeltaRecognition", "GaussianRecognition", "ScaleFloorWarning",
           "VonMisesFisherRecognition"]


def _network(module: NamedModule) -> torch.nn.Module:
    """The wrapped network, registered with Pyro (``pyro.module``, through
    :class:`~pyro.nn.PyroModule`'s attribute access) when the registration can matter.

    The registration records a param site per tensor for Pyro's handlers (``SVI``'s parameter
    capture, ``poutine.trace``) and puts the tensors in the param store under the model's
    names, where a name already present keeps its tensor. So it is skipped

    * on a second evaluation within one outermost call of a model's method (an RPM's
      ``model``, ``guide`` or ``elbo`` evaluates the recognition model once per view): the
      param sites of that call are recorded already (``rpm.nn._registration_scope``);
    * when no Pyro handler is active (a ``torch.optim`` loop over :class:`~rpm.RPMELBO`'s loss)
      and the store holds the network under this name already: it would change nothing.

    A frozen parameter (``requires_grad=False``, e.g. a pretrained backbone) is left out of
    the registration, as intended; Pyro's warning about it at every step is silenced here."""
    net = module._modules["net"]
    assert net is not None  # the constructor sets it (_check_network)
    scope = _registration_scope()
    if scope is not None:
        for seen in scope:
            if seen is module:
                return net
    if not am_i_wrapped() and _registered(module, net):
        if scope is not None:
            scope.append(module)
        return net
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not registered in the param store because "
                                                  "requires_grad=False")
        net = module.net
    if scope is not None:
        scope.append(module)
    return net


def _registered(module: NamedModule, net: torch.nn.Module) -> bool:
    """True when Pyro's param store holds ``net`` under ``module``'s current name (the store
    name of its first parameter, cached per name: ``pyro.module`` never replaces an entry, so
    a present name suffices), or ``net`` has no parameters."""
    name = pyro_name(module)
    cached = module.__dict__.get("_registration")
    if cached is None or cached[0] != name:
        first = next(iter(net.named_parameters()), None)
        stored = first and param_with_module_name(name + ".net", first[0])
        cached = (name, stored)
        module.__dict__["_registration"] = cached
    return cached[1] is None or cached[1] in pyro.get_param_store()


def _check_network(net: torch.nn.Module) -> torch.nn.Module:
    if not isinstance(net, torch.nn.Module):
        raise TypeError(
            f"the recognition network must be a torch.nn.Module, got {type(net).__name__}"
        )
    return net


def _validating(flag: bool | None) -> bool:
    """``validate`` given: that; None: Pyro's validation, except for a model's batch whose
    signature passed its checks before with validation off (``rpm.models._checked_batches``)."""
    if flag is None:
        return is_validation_enabled() and not checks_skipped()
    return flag


def _check_batch(name: str, tensor: torch.Tensor, batch_size: int) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(
            f"the recognition network must return {name} of shape (N, D) for a batch of N "
            f"observations, got {shape}; flatten the latent to a vector per observation"
        )
    if tensor.shape[0] != batch_size:
        raise ValueError(
            f"the recognition network returned {tensor.shape[0]} rows of {name} for a batch of "
            f"{batch_size} observations"
        )


def _check_finite(name: str, tensor: torch.Tensor) -> None:
    if not all_finite(tensor):
        raise ValueError(
            f"the recognition network returned NaN or infinite {name}; check the inputs for "
            "NaN/Inf and the network for overflow (e.g. an unbounded exp)"
        )


class ScaleFloorWarning(UserWarning):
    r"""A learned scale of a :class:`GaussianRecognition` sits at its floor.

    Issued (once per recognition model) when, in a training call, at least half of the
    standard deviations :math:`\sigma_d(x_n)` of the batch are within 10% of the floor
    :math:`\sigma_\text{min}` that the network cannot go below: the encoder has become
    deterministic up to the floor, and its scale carries no information. Under an implicit
    prior this is the optimum of the ELBO, not a bug (``docs/theory.md#stochastic-encoders``):
    use :class:`DeltaRecognition`, or, if the scale should mean something, an explicit prior
    or the importance-weighted ELBO with an energy of fixed width
    (``RPMELBO(num_particles=S, importance_weighted=True)``,
    ``docs/theory.md#calibrated-posteriors``).
    Silence it with ``warnings.filterwarnings("ignore", category=rpm.models.ScaleFloorWarning)``.
    """


def _scale_at_floor(scale: torch.Tensor, floor: float) -> bool:
    """True when at least half of the entries of ``scale`` are at most 1.1 times ``floor``."""
    return bool((scale.detach() <= 1.1 * floor).float().mean() >= 0.5)


class GaussianRecognition(NamedModule):
    r"""Diagonal Gaussian recognition :math:`Q(z|x) = \mathcal{N}(\mu(x), \mathrm{diag}\,\sigma(x)^2)`.

    **The floor check.** With ``min_scale`` :math:`\sigma_\text{min} > 0`, the smallest
    standard deviation the network can return (the ``1e-3`` of ``softplus(raw) + 1e-3``), every
    :attr:`floor_check_every`-th call in training (gradients enabled, the network in train
    mode) checks whether at least half of the batch's scales satisfy
    :math:`\sigma_d(x_n) \le 1.1\,\sigma_\text{min}` and, the first time they do, issues a
    :class:`ScaleFloorWarning` (one check reads one number back from the device). Under the
    implicit priors the scale goes to its floor (``docs/theory.md#stochastic-encoders``).

    :param torch.nn.Module net: maps a batch x (N, ...) to ``(loc, scale)``, each of shape
        (N, D), scale positive (e.g. through ``softplus``).
    :param validate: check shapes, positivity and finiteness on every call (cheap reductions,
        but each synchronises with the device); ``None`` follows
        :func:`pyro.enable_validation` (on by default; ``rpm.models._checked_batches``).
    :param min_scale: :math:`\sigma_\text{min} > 0`, the floor of the network's scale, or
        None (no floor check).
    """

    #: Calls in training between two floor checks (the first check is on the first call).
    floor_check_every: int = 100
    #: Whether this model has issued its :class:`ScaleFloorWarning` (set by the floor check).
    floor_warned: bool

    def __init__(self, net: torch.nn.Module, validate: bool | None = None,
                 min_scale: float | None = None):
        super().__init__()
        if min_scale is not None:
            if isinstance(min_scale, bool) or not isinstance(min_scale, (int, float)) or not (
                    0.0 < float(min_scale) < float("inf")):
                raise ValueError(f"min_scale must be a finite number > 0 (the smallest scale the "
                                 f"network returns, e.g. 1e-3) or None, got {min_scale!r}")
            min_scale = float(min_scale)
        self.net = _check_network(net)
        self.validate = validate
        self.min_scale = min_scale
        self._training_calls = 0
        self.floor_warned = False

    def _check_floor(self, scale: torch.Tensor, floor: float) -> None:
        """The floor check of the class docstring (``floor`` is ``min_scale``)."""
        net = self._modules["net"]
        if self.floor_warned or not (torch.is_grad_enabled() and net is not None and net.training):
            return
        calls, self._training_calls = self._training_calls, self._training_calls + 1
        if calls % self.floor_check_every or not _scale_at_floor(scale, floor):
            return
        self.floor_warned = True
        warnings.warn(
            f"GaussianRecognition: at least half of the learned scales are at their floor "
            f"min_scale={self.min_scale:g} (the encoder is deterministic up to the floor); under an "
            "implicit prior that is the ELBO's optimum (docs/theory.md#stochastic-encoders): use "
            "DeltaRecognition, or for a scale that carries information an explicit prior or "
            "RPMELBO(num_particles=S, importance_weighted=True) with a fixed-width energy "
            "(docs/theory.md#calibrated-posteriors)",
            ScaleFloorWarning, stacklevel=2)

    def forward(self, x: torch.Tensor) -> TorchDistribution:
        """Returns ``Normal(loc, scale).to_event(1)`` with batch_shape (N,), event_shape (D,)."""
        output = _network(self)(x)
        if not (isinstance(output, (tuple, list)) and len(output) == 2):
            raise ValueError(
                "GaussianRecognition expects the network to return a pair (loc, scale); got "
                f"{type(output).__name__}. For a network that returns only loc use "
                "DeltaRecognition(net, noise_scale=...)"
            )
        loc, scale = output
        if _validating(self.validate):
            batch_size = x.shape[0]
            _check_batch("loc", loc, batch_size)
            if scale.shape != loc.shape:
                raise ValueError(
                    f"scale must have the shape of loc {tuple(loc.shape)}, got "
                    f"{tuple(scale.shape)}"
                )
            _check_finite("loc", loc)
            _check_finite("scale", scale)
            if not (scale > 0).all():
                raise ValueError(
                    "the recognition network returned a non-positive scale; map it through "
                    "softplus or exp (plus a small floor) to keep it positive"
                )
        if self.min_scale is not None:
            self._check_floor(scale, self.min_scale)
        return Normal(loc, scale).to_event(1)


class DeltaRecognition(NamedModule):
    r"""Deterministic recognition model :math:`Q(z|x) = \delta(z - \mu(x))`.

    With ``noise_scale`` :math:`\epsilon > 0` the recognition model is
    :math:`\mathcal{N}(\mu(x), \epsilon^2 I)` instead (Appendix B of Aitchison & Ganev): needed
    when the prior is an explicit continuous density, for which the recognition marginal must
    have a density too.

    :param torch.nn.Module net: maps a batch x (N, ...) to the latent means, shape (N, D).
    :param float noise_scale: :math:`\epsilon \ge 0`.
    :param validate: check shapes and finiteness on every call; ``None`` follows
        :func:`pyro.enable_validation` (``rpm.models._checked_batches``).
    """

    def __init__(self, net: torch.nn.Module, noise_scale: float = 0.0, validate: bool | None = None):
        super().__init__()
        noise_scale = float(noise_scale)
        if not noise_scale >= 0.0 or noise_scale == float("inf"):
            raise ValueError(
                f"noise_scale must be a finite number >= 0, got {noise_scale}; use 0 for a "
                "deterministic encoder or a small positive value such as 1e-2"
            )
        self.net = _check_network(net)
        self.noise_scale = noise_scale
        self.validate = validate

    def _zero_log_density(self, loc: torch.Tensor) -> torch.Tensor:
        """Zeros of shape (N,) in the latents' dtype and device: the log-density of the point
        mass (Pyro's ``Delta`` fills a new tensor at each call when given the number 0); made
        once per shape, dtype and device and shared by the distributions it returns (read
        only, never part of the autograd graph)."""
        zeros = self.__dict__.get("_zeros")
        if (zeros is None or zeros.shape != loc.shape[:-1] or zeros.dtype != loc.dtype
                or zeros.device != loc.device):
            zeros = self.__dict__["_zeros"] = loc.new_zeros(loc.shape[:-1])
        return zeros

    @property
    def is_deterministic(self) -> bool:
        """True when Q(z|x) is a point mass (``noise_scale == 0``)."""
        return self.noise_scale == 0.0

    def forward(self, x: torch.Tensor) -> TorchDistribution:
        """Returns ``Delta(mu, event_dim=1)`` or ``Normal(mu, eps).to_event(1)``, batch (N,)."""
        loc = _network(self)(x)
        if _validating(self.validate):
            _check_batch("latents", loc, x.shape[0])
            _check_finite("latents", loc)
        if self.is_deterministic:
            # Delta's own argument check (a real log-density of zeros) would add a reduction
            # and a synchronisation per call; the latents were checked above
            return Delta(loc, log_density=self._zero_log_density(loc), event_dim=1,
                         validate_args=False)
        return Normal(loc, torch.full_like(loc, self.noise_scale)).to_event(1)


class VonMisesFisherRecognition(NamedModule):
    r"""Von Mises-Fisher recognition :math:`Q(z|x) = \mathrm{vMF}(\mu(x), \kappa(x))` on the unit
    sphere :math:`S^{D-1} \subset \mathbb R^D`, :math:`D \ge 2`
    (:class:`~rpm.distributions.VonMisesFisher`, reparameterised in both parameters).

    The network returns a pair ``(direction, concentration)``:

    * ``direction`` (N, D), any nonzero vectors: the mean direction is
      :math:`\mu(x) = d(x) / \lVert d(x) \rVert` (the normalisation of the cosine energy);
    * ``concentration`` (N,) or (N, 1): with ``concentration="softplus"`` (the default) an
      unconstrained number :math:`c(x)`, mapped to
      :math:`\kappa(x) = \operatorname{softplus}(c(x)) + \kappa_\text{min}`, so that every
      finite output is a valid concentration of at least ``min_concentration``; with
      ``concentration="raw"`` the concentration :math:`\kappa(x) > 0` itself (the network
      keeps it positive).

    :math:`\kappa(x)` is the encoder's certainty about x: the vMF's mean resultant length is
    :math:`A_D(\kappa) = E[\mu^\top z]`, near 0 for :math:`\kappa \ll D` (z nearly uniform on
    the sphere, an ambiguous input) and :math:`1 - (D-1)/(2\kappa) + O(\kappa^{-2})` for large
    :math:`\kappa`. Trained by MC-InfoNCE (the implicit prior with a finite positive
    concentration, the particles averaged inside the logarithm:
    ``RPMELBO(num_particles=S, importance_weighted=True)``, with ``normaliser="anchor"`` as
    Kirchhof et al. estimate it) it learns the posterior's width
    (``docs/theory.md#calibrated-posteriors``); under the plain ELBO of an implicit prior
    :math:`\kappa` grows without bound instead (``docs/theory.md#stochastic-encoders``).

    The distribution's ``mean`` is :math:`A_D(\kappa)\, \mu` (inside the ball, so
    :meth:`rpm.RPM.encode <rpm.models._rpm.RPM.encode>` returns the directions shortened by the
    certainty); ``mode`` and ``loc`` are :math:`\mu`, ``concentration`` is :math:`\kappa`.

    :param torch.nn.Module net: maps a batch x (N, ...) to ``(direction, concentration)``.
    :param str concentration: ``"softplus"`` or ``"raw"`` (above).
    :param min_concentration: :math:`\kappa_\text{min} > 0`, the smallest concentration of the
        softplus map; None: 0.01 (nearly uniform on the sphere: in D = 3 the mean resultant
        length of :math:`\kappa = 0.01` is 0.0033). Only for ``"softplus"``.
    :param validate: check the shapes (N, D) with D >= 2 and (N,) or (N, 1), finiteness, nonzero
        directions and, for ``"raw"``, positivity on every call; ``None`` follows
        :func:`pyro.enable_validation` (``rpm.models._checked_batches``).

    References:
        M. Kirchhof, E. Kasneci and S. J. Oh, "Probabilistic contrastive learning recovers the
        correct aleatoric uncertainty of ambiguous inputs", ICML 2023.
    """

    #: The maps from the network's concentration output to :math:`\kappa`.
    CONCENTRATIONS = ("softplus", "raw")

    #: :math:`\kappa_\text{min}` of the softplus map when none is given.
    DEFAULT_MIN_CONCENTRATION = 1e-2

    def __init__(self, net: torch.nn.Module, concentration: str = "softplus",
                 min_concentration: float | None = None, validate: bool | None = None):
        super().__init__()
        if concentration not in self.CONCENTRATIONS:
            raise ValueError(f"concentration must be one of {self.CONCENTRATIONS} (how the "
                             f"network's second output becomes kappa), got {concentration!r}")
        if concentration == "raw" and min_concentration is not None:
            raise ValueError("min_concentration is the floor of the softplus map; with "
                             "concentration='raw' the network's kappa is used as it is: leave "
                             "min_concentration=None")
        if min_concentration is None:
            min_concentration = self.DEFAULT_MIN_CONCENTRATION
        if isinstance(min_concentration, bool) or not isinstance(min_concentration, (int, float)) \
                or not 0.0 < float(min_concentration) < float("inf"):
            raise ValueError(f"min_concentration must be a finite number > 0 (the smallest kappa "
                             f"of softplus(c) + min_concentration, e.g. 1e-2), got "
                             f"{min_concentration!r}")
        self.net = _check_network(net)
        self.concentration = concentration
        self.min_concentration = float(min_concentration)
        self.validate = validate

    def forward(self, x: torch.Tensor) -> VonMisesFisher:
        """Returns ``VonMisesFisher(mu, kappa)`` with batch_shape (N,), event_shape (D,)."""
        output = _network(self)(x)
        if not (isinstance(output, (tuple, list)) and len(output) == 2):
            raise ValueError(
                "VonMisesFisherRecognition expects the network to return a pair (direction, "
                f"concentration) of shapes (N, D) and (N,) or (N, 1); got {type(output).__name__}"
            )
        direction, raw = output
        validating = _validating(self.validate)
        if validating:
            self._check_outputs(direction, raw, x.shape[0])
        if raw.dim() == 2:  # (N, 1), e.g. the output of a Linear(., 1)
            raw = raw.squeeze(-1)
        if self.concentration == "softplus":
            kappa = torch.nn.functional.softplus(raw) + self.min_concentration
        else:
            kappa = raw
        return VonMisesFisher(unit_vectors(direction), kappa, validate_args=False)

    def _check_outputs(self, direction, raw, batch_size: int) -> None:
        """The checks of ``validate`` (class docstring), each with a one-line error."""
        _check_batch("direction", direction, batch_size)
        if direction.shape[1] < 2:
            raise ValueError(
                f"VonMisesFisherRecognition needs latents of dimension D >= 2 (a sphere "
                f"S^(D-1)), got direction of shape {tuple(direction.shape)}; for an angle use "
                "D = 2 (a point on the circle)")
        if not isinstance(raw, torch.Tensor) or raw.shape not in ((batch_size,), (batch_size, 1)):
            got = tuple(raw.shape) if isinstance(raw, torch.Tensor) else type(raw).__name__
            raise ValueError(
                f"the recognition network must return a concentration of shape ({batch_size},) "
                f"or ({batch_size}, 1), one per observation, got {got}")
        _check_finite("direction", direction)
        _check_finite("concentration", raw)
        if not bool((direction != 0).any(-1).all()):
            row = int((direction == 0).all(-1).nonzero()[0, 0])
            raise ValueError(
                f"the recognition network returned a zero direction (row {row}), which has no "
                "mean direction on the sphere; keep the directions away from 0 (e.g. add a "
                "small constant vector)")
        if self.concentration == "raw" and not bool((raw > 0).all()):
            bad = raw[~(raw > 0)].flatten()[0].item()
            raise ValueError(
                f"concentration='raw' needs the network's kappa > 0, got {bad:g}; map it "
                "through softplus (concentration='softplus', the default) or exp")


class CategoricalRecognition(NamedModule):
    r"""Categorical recognition factor :math:`f(Z|x) = \operatorname{softmax}(g(x))_Z` over K
    classes (Walker et al., 2023): the recognition model of :class:`~rpm.DiscreteRPM`.

    The network returns unnormalised logits :math:`g(x)` of shape (N, K); the factor is the
    normalised ``Categorical(logits=g(x))``, batch_shape (N,), event_shape () (Pyro normalises
    the logits: ``.logits`` holds :math:`\log f(Z|x_n)`, ``.probs`` :math:`f(Z|x_n)`).

    :param torch.nn.Module net: maps a batch x (N, ...) to logits of shape (N, K).
    :param int num_classes: K >= 2, the number of values of the latent Z.
    :param validate: check the logits' shape and finiteness on every call; ``None`` follows
        :func:`pyro.enable_validation` (``rpm.models._checked_batches``).

    References:
        W. I. Walker, H. Soulat, C. Yu, M. Sahani, "Unsupervised representation learning with
        recognition-parametrised probabilistic models", AISTATS 2023.
    """

    def __init__(self, net: torch.nn.Module, num_classes: int, validate: bool | None = None):
        super().__init__()
        num_classes = check_int("num_classes", num_classes)
        if num_classes < 2:
            raise ValueError(
                f"num_classes must be K >= 2 (the number of values of the discrete latent, "
                f"e.g. 10 for the digits), got {num_classes}")
        self.net = _check_network(net)
        self.num_classes = num_classes
        self.validate = validate

    def forward(self, x: torch.Tensor) -> TorchDistribution:
        """Returns ``Categorical(logits=net(x))`` with batch_shape (N,) over K classes."""
        logits = _network(self)(x)
        if _validating(self.validate):
            if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or \
                    logits.shape[-1] != self.num_classes:
                got = (tuple(logits.shape) if isinstance(logits, torch.Tensor)
                       else type(logits).__name__)
                raise ValueError(
                    f"CategoricalRecognition(num_classes={self.num_classes}) needs the network "
                    f"to return logits of shape (N, {self.num_classes}), got {got}; make the "
                    f"network's last layer output {self.num_classes} features (or set "
                    "num_classes to its width)")
            _check_batch("logits", logits, x.shape[0])
            _check_finite("logits", logits)
        return Categorical(logits=logits)
