r"""The moment-matched Gaussian estimate of the recognition marginals of a batch: the
"estimated marginal" of Aitchison & Ganev's appendix, ``RPM(..., marginal="gaussian")``
(``docs/theory.md#gaussian-rpm``).

The recognition marginal of a view, :math:`Q(z) = E_{P_\text{true}(x)}[Q(z|x)]` (Eq. 11 of
Aitchison & Ganev), is estimated by the minibatch mixture of the batch's M components
(:class:`~rpm.marginals.MixtureMarginal`, :class:`~rpm.marginals.SequenceMixtureMarginal`).
This module estimates it by the Gaussian with the mixture's first two moments,

.. math::

    Q(z) \approx \mathcal{N}(z;\ m, S), \qquad
    m = \frac1M \sum_k \mu_k, \qquad
    S = \frac1M \sum_k \Big[(\mu_k - m)(\mu_k - m)^\top + \operatorname{diag}\sigma_k^2\Big],
    \qquad\text{(G2)}

over the components :math:`\mathcal{N}(\mu_k, \operatorname{diag}\sigma_k^2)` of the batch's
observed rows (:math:`\sigma_k = 0` for Delta recognition): one Gaussian per view, over the
view's N instances, or one pooled over the N J views of a batch of J views (``pooled``, for
exchangeable views: the frames of a stationary sequence through one encoder).

**The normaliser is 1/M, not 1/(M - 1).** (m, S) are the exact moments of the minibatch mixture
that the Gaussian replaces (the mixture's covariance is a 1/M average), and the maximum-likelihood
Gaussian of the batch's latents: with Delta recognition :math:`\operatorname{mean}_k \log
\mathcal{N}(\mu_k; m, S) = -\tfrac D2 (1 + \log 2\pi) - \tfrac12 \log\det S` exactly, the closed
form of the Gaussian RPM (G4). The unbiased 1/(M - 1) would make S larger by M/(M - 1) and that
identity false.

**When it is exact.** If the recognition means :math:`\mu(x)` are Gaussian over the data and
the noise :math:`\sigma` is constant (an affine encoder of a linear-Gaussian system, ``rpm
lds``), the population marginal *is* :math:`\mathcal{N}(E\mu, \operatorname{Cov}\mu + \sigma^2
I)`, and (m, S) are its moment estimates over the batch: a consistent estimate of the exact
marginal with D + D(D+1)/2 numbers instead of M components. Otherwise the Gaussian has the
largest entropy among densities of those moments, and :math:`-E\log Q` over the marginal's
draws is over-estimated by the marginal's non-Gaussianity (its negentropy): an approximation,
not a bound.

**Why it matters.** Once the M components are separated by more than their widths,
:math:`-\log` of the mixture at a latent drawn near its own component is about :math:`\log M`
plus that component's entropy whatever the spread: the mixture rewards at most about
:math:`\log M` nats per view of information in the latents (the InfoNCE ceiling). The
Gaussian's :math:`-\log Q` keeps growing with :math:`\tfrac12 \log\det S`. And with Delta
recognition it is a density, so an explicit prior's ELBO is well defined where the mixture's
is not (Appendix B).

**A singular S.** With Delta recognition S is the covariance of M points in :math:`\mathbb R^D`,
singular unless M >= D + 1 (and the points span the space): such a batch is refused, naming the
batch size needed. Gaussian recognition adds :math:`\operatorname{diag}\sigma^2 > 0`, so S is
positive definite for any M >= 1.

**Missing views.** With the recognition distributions masked over the views (``q.mask(mask)``,
(N, J) bool, True = observed) only observed views are components (view j's Gaussian runs over
its :math:`N_j` observed instances), and a missing view's term is 0, as for the mixture.

**The global batch.** Under ``torch.distributed`` with ``Candidates(global_batch=True)`` the M
components are every process's rows: each process gathers the recognition parameters (and
which views are observed) with :func:`rpm.distributed.all_gather_with_grad`, computes (m, S)
over the :math:`M = \sum_r N_r` rows, and evaluates the Gaussian at its own rows. Summed over
the processes, the ELBO and its gradient are those of one process on the concatenated batch
(the gather's backward sums every process's gradient of (m, S)). A queue of earlier latents or
explicit negatives does not enter the moments (refused).
"""

from __future__ import annotations

import torch
from pyro.distributions import MultivariateNormal, TorchDistribution
from torch.distributions import constraints

from rpm._validation import check_bool
from rpm.marginals._candidates import Candidates
from rpm.marginals._mixture_marginal import recognition_components
from rpm.marginals._sequence_marginal import sequence_components, sequence_mask

__all__ = ["MomentMatchedMarginal"]


class MomentMatchedMarginal(TorchDistribution):
    r"""The moment-matched Gaussian :math:`\mathcal{N}(m, S)` of each view's minibatch mixture
    (G2, module docstring), as the marginals of a batch.

    * One view (q with batch_shape (N,), event_shape (D,), a view of a pair): ``batch_shape``
      (N,), ``event_shape`` (D,); ``log_prob`` of a value (N, D) is
      :math:`\log\mathcal{N}(z_n; m, S)`, shape (N,).
    * J views (q with batch_shape (N, J)): ``batch_shape`` (N,), ``event_shape`` (J, D);
      ``log_prob`` of a value (N, J, D) is :math:`\sum_j \log\mathcal{N}(z_{n,j}; m_j, S_j)`
      over the observed views, shape (N,), each view with its own moments (or, ``pooled``,
      every view with the moments of all N J rows); :meth:`view_log_prob` gives the terms,
      shape (N, J).

    S uses the normaliser 1/M (the mixture's moments, the maximum-likelihood Gaussian; module
    docstring). The moments are this batch's, or with ``candidates`` a global batch the
    global batch's (module docstring); ``log_prob`` is evaluated at this process's rows.

    :param q: the recognition distributions, ``Normal(loc, scale).to_event(1)`` or
        ``Delta(v, event_dim=1)``, batch_shape (N,) or (N, J), event_shape (D,); J views
        optionally masked over the views.
    :param bool pooled: J views: one Gaussian of all N J rows for every view (default False:
        one per view).
    :param candidates: the step's :class:`~rpm.marginals._candidates.Candidates`: with a global
        batch the moments run over every process's rows (every process must pass the same kind
        of recognition, Delta or Gaussian, and the same number of views); None or the batch's
        own: this batch's rows.
    :raises ValueError: for Delta recognition with fewer rows than D + 1 in a view (or, pooled,
        in all), for latents that span fewer than D dimensions (a singular S), for a view with
        no observed instance, ``pooled`` with one view, or candidates with a queue or explicit
        negatives.
    """

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, q: TorchDistribution, pooled: bool = False,
                 candidates: Candidates | None = None, validate_args=None):
        self.pooled = check_bool("pooled", pooled)
        if candidates is not None and candidates.appended() is not None:
            raise ValueError(GAUSSIAN_TAKES_NO_QUEUE)
        self.frame_mask = None  # (N, J) bool, or None: every view observed
        if len(q.batch_shape) == 1:  # one view: batch (N,), event (D,)
            if pooled:
                raise ValueError("pooled=True pools the moments over J views; q holds one view "
                                 f"(batch_shape {tuple(q.batch_shape)}): pass pooled=False")
            loc, scale = recognition_components(q)
            loc, scale = loc.unsqueeze(1), None if scale is None else scale.unsqueeze(1)
        else:
            loc, scale = sequence_components(q)  # (N, J, D) each
            self.frame_mask = sequence_mask(q)
        self.single_view = len(q.batch_shape) == 1
        self.loc, self.scale = loc, scale
        num, num_views, dim = loc.shape
        means, variances = loc, None if scale is None else scale.square()
        observed = (torch.ones(num, num_views, dtype=torch.bool, device=loc.device)
                    if self.frame_mask is None else self.frame_mask.expand(num, num_views))
        masked = self.frame_mask is not None
        if candidates is not None and candidates.is_global:
            means, variances, observed = _gather_components(candidates, means, variances, observed)
            masked = not bool(observed.all())
        if pooled:  # one group of all N J rows
            groups = [(means.reshape(-1, dim), None if variances is None
                       else variances.reshape(-1, dim), observed.reshape(-1), "the batch")]
        else:
            groups = [(means[:, j], None if variances is None else variances[:, j],
                       observed[:, j], "the batch" if self.single_view else f"view {j}")
                      for j in range(num_views)]
        centres, covariances = [], []
        for rows, row_variances, keep, name in groups:
            centre, covariance = _moments(rows, row_variances, keep, masked, name)
            centres.append(centre)
            covariances.append(covariance)
        if len(groups) == 1:  # batch (): the same Gaussian for every row and view
            centre, covariance = centres[0], covariances[0]
        else:  # batch (J,): view j's Gaussian
            centre, covariance = torch.stack(centres), torch.stack(covariances)
        scale_tril, info = torch.linalg.cholesky_ex(covariance)
        if bool((info != 0).any()):
            count = means.shape[0] * num_views if pooled else means.shape[0]
            raise ValueError(
                f"the moment-matched marginal's covariance S is singular: the {count} latents of "
                f"a view span fewer than D = {dim} dimensions (a collapsed encoder, or repeated "
                "rows); marginal='gaussian' needs latents that vary in every direction (or "
                "Gaussian recognition, whose noise keeps S positive definite)")
        self.gaussian = MultivariateNormal(centre, scale_tril=scale_tril)
        event_shape = torch.Size([dim]) if self.single_view else torch.Size([num_views, dim])
        super().__init__(torch.Size([num]), event_shape, validate_args=validate_args)

    @property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def covariance_matrix(self) -> torch.Tensor:
        """S: (D, D) for one view or pooled, (J, D, D) per view."""
        return self.gaussian.covariance_matrix

    @property
    def mean(self) -> torch.Tensor:
        """m at every row, (N, D) or (N, J, D)."""
        return self.gaussian.loc.expand(self.batch_shape + self.event_shape)

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != self.batch_shape:
            raise ValueError(
                f"the marginals of {self.batch_shape[0]} instances cannot be expanded to "
                f"{tuple(batch_shape)}; use a plate of the number of instances")
        return self

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        """Draws from the Gaussians, shape ``sample_shape + (N, D)`` or ``(N, J, D)``."""
        shape = torch.Size(sample_shape) + self.batch_shape
        if not self.single_view and self.gaussian.batch_shape == ():
            shape = shape + self.event_shape[:1]  # pooled: one Gaussian for the J views
        return self.gaussian.sample(shape)

    def view_log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\mathcal{N}(z_{n,j}; m_j, S_j)` for a value (N, J, D), 0 at missing views,
        shape (N, J); for one view :math:`\log\mathcal{N}(z_n; m, S)` of a value (N, D), (N,)."""
        shape = self.batch_shape + self.event_shape
        if value.shape[-len(shape):] != shape:
            raise ValueError(f"the marginals are evaluated at the batch's latents, shape "
                             f"{tuple(shape)}; got {tuple(value.shape)}")
        terms = self.gaussian.log_prob(value)  # (..., N, J) or (..., N)
        if self.frame_mask is not None:
            terms = torch.where(self.frame_mask, terms,
                                torch.zeros((), dtype=terms.dtype, device=terms.device))
        return terms

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        terms = self.view_log_prob(value)
        return terms if self.single_view else terms.sum(-1)


#: Why the moment-matched marginal takes no queue or explicit negatives.
GAUSSIAN_TAKES_NO_QUEUE = ("marginal='gaussian' estimates the marginals' moments from the batch's rows "
                     "(every process's with global_batch=True): train without a queue and without "
                     "explicit negatives (or use marginal='mixture')")


def _gather_components(candidates: Candidates, means: torch.Tensor,
                       variances: torch.Tensor | None, observed: torch.Tensor) -> tuple:
    """Every process's ``means`` (N_r, J, D), ``variances`` (N_r, J, D) or None and ``observed``
    (N_r, J) bool, concatenated in rank order with one differentiable gather
    (:meth:`~rpm.marginals._candidates.Candidates.gather`)."""
    dim = means.shape[-1]
    parts = [means] + ([] if variances is None else [variances]) \
        + [observed.to(means.dtype).unsqueeze(-1)]
    gathered = candidates.gather(torch.cat(parts, dim=-1))          # (M, J, D [+ D] + 1)
    means = gathered[..., :dim]
    variances = None if variances is None else gathered[..., dim:2 * dim]
    return means, variances, gathered[..., -1] > 0.5


def _moments(means: torch.Tensor, variances: torch.Tensor | None, keep: torch.Tensor,
             masked: bool, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, S) of G2 over the rows ``keep`` of ``means`` (M, D) and ``variances`` (M, D) (None:
    Delta recognition), with the checks of the module docstring."""
    dim = means.shape[-1]
    if masked:
        if not bool(keep.any()):
            raise ValueError(f"every frame of {name} is missing: its marginal has no component; "
                             "drop such batches")
        means = means[keep]
        variances = None if variances is None else variances[keep]
    count = means.shape[0]
    if variances is None and count < dim + 1:
        raise ValueError(
            f"marginal='gaussian' with Delta recognition needs at least D + 1 = {dim + 1} rows "
            f"in each view's moments: the covariance of the {count} latents of {name} in D = "
            f"{dim} dimensions is singular; use a batch of N >= {dim + 1} (or Gaussian "
            "recognition)")
    centre = means.mean(0)  # m, (D,)
    deviations = means - centre
    covariance = deviations.T @ deviations / count  # (D, D)
    if variances is not None:
        covariance = covariance + torch.diag(variances.mean(0))
    return centre, covariance
