r"""The recognition marginal Q(z) of a batch, as a Pyro distribution.

For a batch of recognition distributions :math:`Q(z|x_1), \dots, Q(z|x_N)` the minibatch
estimate of the recognition marginal (Eq. 11 of Aitchison & Ganev) is the equally weighted
mixture

.. math::

    Q(z) \approx \frac{1}{N} \sum_{n=1}^N Q(z | x_n), \qquad
    \log Q(z) \approx \operatorname{logsumexp}_n \log Q(z | x_n) - \log N.

For Gaussian recognition it is a Gaussian mixture; for deterministic (Delta) recognition it is
the empirical distribution on the batch points, a discrete distribution with mass 1/N on each
point (Appendix A.1), whose log-probability at a batch point is
:math:`\log(\#\{n : \mu_n = z\} / N)`, consistent with Pyro's ``Delta.log_prob``. Those two
families have fast kernels (:func:`~rpm.ops.gaussian_mixture_log_prob`, streamed in blocks,
and :func:`delta_mixture_log_prob`). Any other family with batch_shape (N,) and event_shape
(D,) (a Student-t, ``ProjectedNormal`` on the sphere, a mixture) is evaluated through its own
``log_prob`` in row blocks (:func:`~rpm.ops.distribution_mixture_log_prob`).
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import Delta, Independent, Normal, TorchDistribution
from torch.distributions import constraints

from rpm.ops._distribution_mixture import distribution_mixture_log_prob
from rpm.ops._gaussian_mixture import gaussian_mixture_log_prob

__all__ = [
    "Atoms",
    "MixtureMarginal",
    "delta_mixture_log_prob",
    "fast_components",
    "recognition_components",
]


def delta_mixture_log_prob(
    z: torch.Tensor, points: torch.Tensor, exclude_self: bool = False
) -> torch.Tensor:
    r"""Log-probability under the empirical distribution of a batch of points.

    .. math::

        \log Q(z_m) = \log \#\{n : \mu_n = z_m\} - \log N

    (:math:`-\infty` when z_m is none of the points). Appendix A.1 of Aitchison & Ganev.

    :param torch.Tensor z: points, shape (M, D).
    :param torch.Tensor points: the atoms :math:`\mu_n`, shape (N, D).
    :param bool exclude_self: leave atom m out of row m (requires M == N).
    :return: shape (M,); carries no gradient (the empirical mass is piecewise constant).
    """
    if z.dim() != 2 or points.dim() != 2 or z.shape[1] != points.shape[1]:
        raise ValueError(
            f"expected z (M, D) and points (N, D) with equal D, got {tuple(z.shape)} and "
            f"{tuple(points.shape)}"
        )
    num_atoms = points.shape[0]
    with torch.no_grad():
        distance = torch.cdist(
            z.detach(), points.detach(), compute_mode="donot_use_mm_for_euclid_dist"
        )  # (M, N), exact zeros for equal rows
        matches = distance == 0
        if exclude_self:
            if z.shape[0] != num_atoms or num_atoms < 2:
                raise ValueError(
                    "exclude_self=True needs as many points as atoms and at least 2 atoms, "
                    f"got {z.shape[0]} and {num_atoms}"
                )
            matches.fill_diagonal_(False)
            num_atoms -= 1
        counts = matches.sum(-1).to(z.dtype)
    return counts.log() - math.log(num_atoms)


def recognition_components(q: TorchDistribution) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (loc, scale) of a batch of recognition distributions; scale is None for Delta.

    Accepts ``Normal(loc, scale).to_event(1)`` (diagonal Gaussian recognition) and
    ``Delta(v, event_dim=1)`` (deterministic recognition), each with batch_shape (N,) and
    event_shape (D,): the families with fast kernels (the pooled marginal and the sequence
    marginals need them). :class:`MixtureMarginal` accepts any other family too.
    """
    components = fast_components(q)
    if components is not None:
        return components
    if isinstance(q, Independent) and isinstance(q.base_dist, Normal):
        raise ValueError(
            "expected a diagonal Gaussian with batch_shape (N,) and event_shape (D,), got "
            f"batch_shape {tuple(q.batch_shape)} and event_shape {tuple(q.event_shape)}"
        )
    if isinstance(q, Delta):
        raise ValueError(
            "expected Delta(v, event_dim=1) with v of shape (N, D), got v of shape "
            f"{tuple(q.v.shape)} and event_dim {q.event_dim}"
        )
    raise TypeError(
        "this computation supports diagonal Gaussian recognition "
        "(Normal(loc, scale).to_event(1)) and deterministic recognition (Delta(v, event_dim=1)); "
        f"got {type(q).__name__}. Wrap your encoder in rpm.GaussianRecognition or "
        "rpm.DeltaRecognition"
    )


def fast_components(q: TorchDistribution) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The parameters of the families with fast kernels, or None.

    :param q: a batch of recognition distributions.
    :return: (loc, scale) of ``Normal(loc, scale).to_event(1)``, (v, None) of
        ``Delta(v, event_dim=1)``, each with parameters of shape (N, D); None for any other
        distribution (which :class:`MixtureMarginal` evaluates through its ``log_prob``).
    """
    if (isinstance(q, Independent) and isinstance(q.base_dist, Normal)
            and q.reinterpreted_batch_ndims == 1 and q.base_dist.loc.dim() == 2):
        return q.base_dist.loc, q.base_dist.scale.expand_as(q.base_dist.loc)
    if isinstance(q, Delta) and q.event_dim == 1 and q.v.dim() == 2:
        return q.v, None
    return None


class Atoms(constraints.Constraint):
    r"""The support of an empirical distribution: the finite set of its atoms :math:`\mu_n`.

    A discrete constraint (``is_discrete``): a value is in the support when each of its rows
    equals one of the atoms exactly, as :func:`delta_mixture_log_prob` counts them.

    :param torch.Tensor points: the atoms, shape (N, D).
    :param int event_dim: 1 for one latent per value (shape (..., D)), 2 for a whole batch of
        latents as one event (shape (..., M, D)), 3 for a batch of several latents each (shape
        (..., M, T, D)).
    """

    is_discrete = True

    def __init__(self, points: torch.Tensor, event_dim: int = 1):
        self.points = points
        self.event_dim = event_dim
        super().__init__()

    def check(self, value: torch.Tensor) -> torch.Tensor:
        flat = value.detach().reshape(-1, value.shape[-1])  # (M, D)
        distance = torch.cdist(flat, self.points.detach(),
                               compute_mode="donot_use_mm_for_euclid_dist")  # (M, N)
        on_atom = (distance == 0).any(-1).reshape(value.shape[:-1])
        if self.event_dim == 1:
            return on_atom
        return on_atom.flatten(start_dim=on_atom.dim() - self.event_dim + 1).all(-1)


def _check_value(value: torch.Tensor, dim: int) -> None:
    """Validation of a value for ``MixtureMarginal.log_prob``: shape (..., D), finite."""
    if value.dim() < 1 or value.shape[-1] != dim:
        raise ValueError(
            f"expected a value of shape (..., {dim}) for a mixture of {dim}-dimensional "
            f"components, got {tuple(value.shape)}"
        )
    if not torch.isfinite(value).all():
        raise ValueError(
            "the value has NaN or infinite entries; the recognition model or the prior "
            "produced non-finite latents"
        )


class MixtureMarginal(TorchDistribution):
    r"""The minibatch-mixture recognition marginal :math:`Q(z) = \frac1N \sum_n Q(z|x_n)`.

    This is :math:`P(z) = Q(z)` of the uniform-implicit prior (Eq. 21 of Aitchison & Ganev) and
    the :math:`Q(z)` in the RPM likelihood :math:`P(x|z) = Q(z|x) P_\text{true}(x) / Q(z)`
    (Eq. 10).

    The distribution stands for N independent draws from the mixture, one per pair of the
    model's plate: batch_shape (N,), event_shape (D,), N being the number of components; given
    the components the draws are independent, so the batch shape is honest, and ``expand``
    gives any other number of draws (e.g. a leading plate of particles). ``log_prob`` of a
    value of shape (..., D) returns the mixture log-density of each row, shape (...);
    ``sample`` picks a component uniformly for each draw and samples from it.

    The components may be of any family with batch_shape (N,) and event_shape (D,). Diagonal
    Gaussians (``Normal(loc, scale).to_event(1)``) and Deltas (``Delta(v, event_dim=1)``) use
    fast kernels (``loc`` and ``scale`` hold their parameters); any other family (a
    Student-t, ``ProjectedNormal`` on the sphere, a mixture) is evaluated through its own
    ``log_prob`` in row blocks, :func:`~rpm.ops.distribution_mixture_log_prob` (``loc``
    and ``scale`` are then None). The support is :math:`\mathbb{R}^D` for Gaussian
    components, the finite set of the atoms (``Atoms``, discrete) for Delta components,
    where a value off every atom has log-density :math:`-\infty`, and the components' own
    support otherwise.

    :param q: recognition distributions with batch_shape (N,) and event_shape (D,).
    :param bool exclude_self: evaluate row n of an (N, D) value without component n.
    """

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, q: TorchDistribution, exclude_self: bool = False, validate_args=None):
        if len(q.batch_shape) != 1 or len(q.event_shape) != 1:
            raise ValueError(
                "the mixture marginal needs recognition distributions with batch_shape (N,) and "
                f"event_shape (D,), got batch_shape {tuple(q.batch_shape)} and event_shape "
                f"{tuple(q.event_shape)}; declare the latent dimension an event with "
                ".to_event(1) (rpm.GaussianRecognition and rpm.DeltaRecognition do)"
            )
        self.q = q
        components = fast_components(q)
        self.family = "generic" if components is None else (
            "delta" if components[1] is None else "gaussian")
        # (N, D) each; scale None for Delta components, both None for another family
        self.loc: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        if components is not None:
            self.loc, self.scale = components
        self.exclude_self = exclude_self
        super().__init__(q.batch_shape, q.event_shape, validate_args=validate_args)

    @property
    def num_components(self) -> int:
        """N, the number of recognition distributions mixed."""
        return self.q.batch_shape[0]

    @property
    def is_discrete(self) -> bool:
        """True for the empirical (Delta) mixture, which has no density on R^D (and for
        components of another family whose support is discrete)."""
        if self.family == "generic":
            return _support(self.q).is_discrete
        return self.family == "delta"

    @property
    def support(self) -> constraints.Constraint:
        """``Atoms`` of the Delta components (discrete), ``real_vector`` for Gaussian
        components, else the components' own support."""
        if self.loc is None:  # another family
            return _support(self.q)
        return Atoms(self.loc) if self.scale is None else constraints.real_vector

    def expand(self, batch_shape, _instance=None):
        """The same mixture for ``batch_shape`` independent draws; with ``exclude_self`` the
        last batch dimension must stay N (row n leaves component n out)."""
        batch_shape = torch.Size(batch_shape)
        num_components = self.num_components
        if self.exclude_self and batch_shape[-1:] != (num_components,):
            raise ValueError(
                f"a mixture marginal with exclude_self pairs row n with component n, so its last "
                f"batch dimension stays {num_components}; got batch_shape {tuple(batch_shape)}"
            )
        new = self._get_checked_instance(MixtureMarginal, _instance)
        new.q, new.loc, new.scale, new.family = self.q, self.loc, self.scale, self.family
        new.exclude_self = self.exclude_self
        super(MixtureMarginal, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            _check_value(value, self.event_shape[0])
        dim = value.shape[-1]
        if self.exclude_self:  # rows (..., N, D): row n against every component but n
            rows = value.reshape(-1, self.num_components, dim)
            result = torch.stack([self.log_prob_rows(block) for block in rows])
        else:
            result = self.log_prob_rows(value.reshape(-1, dim))  # (M,)
        return result.reshape(value.shape[:-1])

    def log_prob_rows(self, rows: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
        r"""Mixture log-density :math:`\log Q(z_m)` of each row of ``rows`` (Eq. 11).

        :param torch.Tensor rows: shape (M, D) (M = N with ``exclude_self``).
        :param block_size: for Gaussian components the block edge of the streamed kernel
            (``None``: by size, :func:`~rpm.ops.gaussian_mixture_log_prob`); for other
            families but Delta, rows per block (``None``: the largest block of at most 2^22
            elements, :func:`~rpm.ops.distribution_mixture_log_prob`).
        :return: shape (M,).
        """
        if self.loc is None:  # another family
            return distribution_mixture_log_prob(self.q, rows, self.exclude_self, block_size)
        if self.scale is None:  # Delta
            return delta_mixture_log_prob(rows, self.loc, self.exclude_self)
        return gaussian_mixture_log_prob(rows, self.loc, self.scale, self.exclude_self,
                                         block_size=block_size)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)  # sample_shape + batch_shape + (D,)
        num_components = self.num_components
        with torch.no_grad():
            if self.loc is None:  # another family
                return _sample_generic(self.q, shape)
            index = torch.randint(
                num_components, shape[:-1], device=self.loc.device
            )  # sample_shape + (N,)
            loc = self.loc[index]
            if self.scale is None:  # Delta
                return loc
            return loc + self.scale[index] * torch.randn_like(loc)


def _support(q: TorchDistribution) -> constraints.Constraint:
    """The support of the components ``q`` (torch types a distribution's support as optional)."""
    support = q.support
    if support is None:
        raise ValueError(f"{type(q).__name__} declares no support: a mixture of its "
                         "distributions has none either; give the class a support constraint")
    return support


def _sample_generic(q: TorchDistribution, shape: torch.Size) -> torch.Tensor:
    """Draws of the mixture of the components ``q`` (batch_shape (N,)), one per entry of
    ``shape[:-1]``, each from a uniformly chosen component; shape ``shape``.

    Each draw takes its own sample of its component: the k-th draw that chose component n takes
    row k of ``q.sample((K,))``, K the largest number of draws of one component (about
    log(M) / log(log(M)) for M draws of N = M components), so memory is O(K N D), not O(M N D)."""
    num_components = q.batch_shape[0]
    num_draws = math.prod(shape[:-1])
    if num_draws == 0:
        return q.sample((1,))[:0].reshape(shape)
    component = torch.randint(num_components, (num_draws,))  # (M,)
    order = torch.argsort(component, stable=True)
    counts = torch.bincount(component, minlength=num_components)  # (N,)
    first = torch.cumsum(counts, 0) - counts  # position of each component's first draw in order
    rank = torch.empty_like(component)
    rank[order] = torch.arange(num_draws) - first[component[order]]  # k: earlier draws of n
    draws = q.sample((int(counts.max()),))  # (K, N, D)
    index = (rank.to(draws.device), component.to(draws.device))
    return draws[index].reshape(shape)
