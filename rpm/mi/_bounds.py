r"""Variational bounds on the mutual information I(X; Y) as functions of a critic-score matrix
(Poole et al. 2019, "On variational bounds of mutual information"; Song & Ermon 2020).

Every function takes the scores of a batch of N pairs :math:`(x_i, y_i) \sim p(x, y)`,

.. math::

    F_{ij} = f(x_i, y_j), \qquad \text{shape } (\ldots, N, N),

with the positives on the diagonal; the off-diagonal entries are N(N-1) (dependent) draws from
:math:`p(x)p(y)`. Leading dimensions are a batch of independent matrices (several critics trained
at once) and the result has those dimensions. Everything is in nats. Each function returns the
bound's estimate on the batch, whose gradient is the one its estimator trains with (for
:func:`js` and :func:`smile` the value of one objective carries the gradient of another: the
value is what is reported, the gradient is what trains the critic).

Let :math:`r(x, y) = p(x, y) / (p(x) p(y))`. Which critic makes each bound tight (its population
value then equals I):

============================ =============================== ==================================
bound                        tight at                        ceiling of the batch estimate
============================ =============================== ==================================
:func:`barber_agakov`        :math:`q(y|x) = p(y|x)`         none
:func:`tuba`                 :math:`f = \log r + \log a(x)`  none
:func:`nwj`                  :math:`f = 1 + \log r`          none
:func:`dv`, :class:`MINE`    :math:`f = \log r + c`          none
:func:`js`                   :math:`f = \log r` (JS optimum)  none
:func:`info_nce_bound`       :math:`f = \log r + c(x)`       :math:`\log N`
:func:`interpolated`         (mixed)                         :math:`1 + \log((N-1)/\alpha)`
:func:`smile`                :math:`f = \log r`, large tau   :math:`\tau` + positive term
============================ =============================== ==================================

Convention: normalisers run over the row (a fixed :math:`x_i` against the :math:`y_j`), and the
baseline :math:`a(x)` of TUBA and I_alpha is a function of x, shape (..., N). MI is symmetric,
so the transposed convention (Poole et al. write a(y)) gives the same bounds with x and y
exchanged.

References:
    B. Poole, S. Ozair, A. van den Oord, A. A. Alemi and G. Tucker, "On variational bounds of
    mutual information", ICML 2019.
    J. Song and S. Ermon, "Understanding the limitations of variational mutual information
    estimators", ICLR 2020.
    M. I. Belghazi et al., "Mutual information neural estimation", ICML 2018.
    X. Nguyen, M. J. Wainwright and M. I. Jordan, "Estimating divergence functionals and the
    likelihood ratio by convex risk minimization", IEEE Trans. Inf. Theory 2010.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rpm.ops._logsumexp import diagonal_log_softmax

__all__ = ["MINE", "barber_agakov", "dv", "info_nce_bound", "interpolated", "js", "nwj",
           "smile", "tuba"]


def _check_scores(scores: torch.Tensor, name: str = "scores") -> int:
    if not isinstance(scores, torch.Tensor) or not scores.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor F_ij = f(x_i, y_j), got "
                        f"{type(scores).__name__ if not isinstance(scores, torch.Tensor) else scores.dtype}")
    if scores.dim() < 2 or scores.shape[-1] != scores.shape[-2] or scores.shape[-1] < 2:
        raise ValueError(f"{name} must be square, shape (..., N, N) with N >= 2 and the "
                         f"positives on the diagonal; got {tuple(scores.shape)}")
    return scores.shape[-1]


def _diagonal(scores: torch.Tensor) -> torch.Tensor:
    return scores.diagonal(dim1=-2, dim2=-1)  # (..., N)


def _off_diagonal(scores: torch.Tensor) -> torch.Tensor:
    """The N(N-1) off-diagonal entries, shape (..., N(N-1))."""
    n = scores.shape[-1]
    keep = ~torch.eye(n, dtype=torch.bool, device=scores.device)
    return scores[..., keep]


def _log_mean_exp_off_diagonal(scores: torch.Tensor) -> torch.Tensor:
    r""":math:`\log \frac{1}{N(N-1)} \sum_{i \ne j} e^{F_{ij}}`, shape (...)."""
    off = _off_diagonal(scores)
    return torch.logsumexp(off, -1) - math.log(off.shape[-1])


def barber_agakov(log_conditional: torch.Tensor, log_marginal: torch.Tensor) -> torch.Tensor:
    r"""The Barber-Agakov bound with a variational conditional q(y|x) and the true marginal:

    .. math::

        I_\text{BA} = \mathbb{E}_{p(x,y)}[\log q(y|x) - \log p(y)]
                    = I(X;Y) - \mathbb{E}_{p(x)} \mathrm{KL}(p(y|x) \,\|\, q(y|x)).

    Needs a normalised q(y|x) and the marginal density (or the entropy h(Y), whose Monte Carlo
    estimate is the mean of :math:`-\log p(y_i)`); tight at :math:`q = p(y|x)`. Its variance is
    that of the log-ratio under p(x, y) (no exponential: low variance), its bias is the
    expected KL, which a tractable q(y|x) in high dimension makes large. No ceiling.

    :param torch.Tensor log_conditional: :math:`\log q(y_i | x_i)`, shape (..., N).
    :param torch.Tensor log_marginal: :math:`\log p(y_i)`, shape (..., N).
    :return: shape (...).
    """
    if log_conditional.shape != log_marginal.shape or log_conditional.dim() < 1:
        raise ValueError("log_conditional and log_marginal must have the same shape (..., N); "
                         f"got {tuple(log_conditional.shape)} and {tuple(log_marginal.shape)}")
    return (log_conditional - log_marginal).mean(-1)


def tuba(scores: torch.Tensor, log_baseline: torch.Tensor | float = 0.0) -> torch.Tensor:
    r"""The tractable unnormalised Barber-Agakov bound with a baseline a(x) > 0 (Poole et al.
    Eq. 8-9):

    .. math::

        I_\text{TUBA} = 1 + \mathbb{E}_{p(x,y)}[f(x,y) - \log a(x)]
            - \mathbb{E}_{p(x)p(y)}\big[e^{f(x,y)} / a(x)\big],

    estimated with the diagonal (positives) and the N(N-1) off-diagonal entries (negatives).
    Unbiased (linear in the expectations); tight at :math:`f = \log r + \log a(x)` for any a.
    Its variance is that of :math:`e^{f}` under :math:`p(x)p(y)`, which grows exponentially with
    the MI for a critic near the optimum. No ceiling.

    :param torch.Tensor scores: F, shape (..., N, N).
    :param log_baseline: :math:`\log a(x_i)`, shape (..., N) (broadcast), or a number.
    :return: shape (...).
    """
    _check_scores(scores)
    if isinstance(log_baseline, torch.Tensor):
        shifted = scores - log_baseline.unsqueeze(-1)  # a(x_i) divides row i
    else:
        shifted = scores - float(log_baseline)
    joint = _diagonal(shifted).mean(-1)
    marginal = _log_mean_exp_off_diagonal(shifted).exp()
    return 1.0 + joint - marginal


def nwj(scores: torch.Tensor) -> torch.Tensor:
    r"""The NWJ bound (f-divergence / KL dual; Nguyen, Wainwright & Jordan 2010; MINE-f):

    .. math::

        I_\text{NWJ} = \mathbb{E}_{p(x,y)}[f(x,y)] - e^{-1}\,\mathbb{E}_{p(x)p(y)}[e^{f(x,y)}],

    :func:`tuba` with the constant baseline a = e. Unbiased, tight at :math:`f = 1 + \log r`;
    variance exponential in the MI (the partition term). No ceiling.

    :param torch.Tensor scores: F, shape (..., N, N).
    :return: shape (...).
    """
    return tuba(scores, 1.0)


def dv(scores: torch.Tensor) -> torch.Tensor:
    r"""The Donsker-Varadhan bound (MINE's value):

    .. math::

        I_\text{DV} = \mathbb{E}_{p(x,y)}[f(x,y)] - \log \mathbb{E}_{p(x)p(y)}[e^{f(x,y)}].

    Tight at :math:`f = \log r + c` for any constant c. The log of the Monte Carlo mean over the
    N(N-1) negatives makes the batch estimate biased upward (Jensen; it is not a bound on the
    batch) and its gradient biased; variance exponential in the MI. The batch estimate cannot
    exceed :math:`\max_i F_{ii} - \min_{i \ne j} F_{ij}`, no fixed ceiling.

    :param torch.Tensor scores: F, shape (..., N, N).
    :return: shape (...).
    """
    _check_scores(scores)
    return _diagonal(scores).mean(-1) - _log_mean_exp_off_diagonal(scores)


class MINE(torch.nn.Module):
    r"""The DV bound with MINE's moving-average gradient correction (Belghazi et al. 2018).

    The gradient of :math:`\log \mathbb{E}[e^f]` is :math:`\nabla \mathbb{E}[e^f] /
    \mathbb{E}[e^f]`, and its minibatch version divides by a minibatch mean (biased). MINE
    divides instead by an exponential moving average m of the minibatch means:

    .. math::

        m \leftarrow \beta m + (1 - \beta) \bar e_t, \qquad \bar e_t = \frac{1}{N(N-1)}
        \sum_{i \ne j} e^{F_{ij}}, \qquad
        \text{value} = I_\text{DV}, \qquad \nabla = \nabla \bar F_{ii} - \nabla \bar e_t / m.

    Calling the module returns a tensor whose value is :func:`dv` and whose gradient is the
    corrected one, and updates m (a buffer, one per leading index of the scores). The first
    call starts m at :math:`\bar e_1`.

    :param float momentum: :math:`\beta \in [0, 1)`.
    """

    running_mean: torch.Tensor  # the buffer m

    def __init__(self, momentum: float = 0.99):
        super().__init__()
        momentum = float(momentum)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
        self.momentum = momentum
        self.register_buffer("running_mean", torch.empty(0))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        """:param torch.Tensor scores: F, shape (..., N, N). :return: shape (...)."""
        _check_scores(scores)
        log_mean = _log_mean_exp_off_diagonal(scores)              # (...)
        mean = log_mean.exp()
        with torch.no_grad():
            if self.running_mean.shape != mean.shape:
                self.running_mean = mean.detach().clone()
            else:
                self.running_mean.mul_(self.momentum).add_((1 - self.momentum) * mean)
        joint = _diagonal(scores).mean(-1)
        surrogate = joint - mean / self.running_mean            # gradient: grad(mean) / m
        value = joint - log_mean
        return surrogate + (value - surrogate).detach()


def _js_fgan(scores: torch.Tensor) -> torch.Tensor:
    r"""The f-GAN Jensen-Shannon objective :math:`\mathbb{E}_p[-\mathrm{softplus}(-f)] -
    \mathbb{E}_{p(x)p(y)}[\mathrm{softplus}(f)]`, maximised by :math:`f = \log r`."""
    return (-F.softplus(-_diagonal(scores))).mean(-1) - F.softplus(_off_diagonal(scores)).mean(-1)


def js(scores: torch.Tensor) -> torch.Tensor:
    r"""The critic trained by the f-GAN Jensen-Shannon objective, scored by NWJ (Poole et al.
    section 2.3; Hjelm et al.'s Deep InfoMax):

    .. math::

        \text{gradient of } J = \mathbb{E}_{p}[-\mathrm{softplus}(-f)]
            - \mathbb{E}_{p(x)p(y)}[\mathrm{softplus}(f)], \qquad
        \text{value} = I_\text{NWJ}(1 + f) = 1 + \mathbb{E}_p[f] - \mathbb{E}_{p(x)p(y)}[e^f].

    The JS objective's optimum is the logit :math:`f = \log r` of the classifier of positives
    against negatives, and NWJ's is :math:`1 + \log r`, so the value is NWJ at :math:`1 + f`:
    exactly I at the JS optimum. Training is low-variance (bounded softplus terms); the value
    has NWJ's variance. No ceiling.

    :param torch.Tensor scores: F, shape (..., N, N).
    :return: shape (...).
    """
    objective = _js_fgan(scores)
    value = tuba(scores, 0.0)  # = nwj(1 + f)
    return objective + (value - objective).detach()


def info_nce_bound(scores: torch.Tensor) -> torch.Tensor:
    r"""The InfoNCE bound (CPC; Oord et al. 2018), the RPM ELBO per pair of the implicit prior
    (Eq. 23-25 of Aitchison & Ganev):

    .. math::

        I_\text{NCE} = \frac1N \sum_i \Big[F_{ii} - \log \frac1N \sum_j e^{F_{ij}}\Big]
            = \log N - \text{InfoNCE loss}.

    Computed by ``rpm.ops._logsumexp.diagonal_log_softmax`` with offset :math:`\log N` (the package's
    one InfoNCE kernel). A lower bound on I in expectation for every critic, tight as
    :math:`N \to \infty` at :math:`f = \log r + c(x)`; low variance (each term is a log-softmax,
    at most 0); biased: each term is at most :math:`\log N`, so the estimate never exceeds
    :math:`\log N` and saturates there when I is larger.

    :param torch.Tensor scores: F, shape (..., N, N).
    :return: shape (...).
    """
    n = _check_scores(scores)
    return diagonal_log_softmax(scores, math.log(n)).mean(-1)


def interpolated(scores: torch.Tensor, log_baseline: torch.Tensor | float, alpha: float
                 ) -> torch.Tensor:
    r"""The interpolated bound :math:`I_\alpha` of Poole et al. (Eq. 14), between InfoNCE
    (:math:`\alpha = 1`) and TUBA / NWJ (:math:`\alpha = 0`), written over rows: with the
    leave-one-out row mean :math:`m_{i,-l} = \frac{1}{N-1} \sum_{k \ne l} e^{F_{ik}}` (the
    :math:`K = N - 1` samples of y other than :math:`y_l`) and the baseline
    :math:`b_{i,l} = \alpha\, m_{i,-l} + (1 - \alpha)\, a(x_i)`,

    .. math::

        I_\alpha = 1 + \frac{1}{N(N-1)} \sum_{i} \sum_{l \ne i} \big[F_{ii} - \log b_{i,l}\big]
            - \frac{1}{N(N-1)} \sum_{i \ne j} \frac{e^{F_{ij}}}{b_{i,j}}.

    In the first sum :math:`y_i` is among the K samples of the row mean; in the second
    :math:`y_j` is left out of it, so the baseline is independent of the negative, as the bound
    requires. Since :math:`b_{i,l} \ge \alpha e^{F_{ii}} / (N-1)` for :math:`l \ne i`, every
    estimate is at most :math:`1 + \log((N-1)/\alpha)`: alpha trades InfoNCE's low variance
    and its ceiling against NWJ's unbiasedness. The leave-one-out sums come from prefix and
    suffix log-cumulative sums (O(N^2), no cancellation).

    :param torch.Tensor scores: F, shape (..., N, N).
    :param log_baseline: :math:`\log a(x_i)`, shape (..., N) (broadcast), or a number.
    :param float alpha: in [0, 1].
    :return: shape (...).
    """
    n = _check_scores(scores)
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if not isinstance(log_baseline, torch.Tensor):
        log_baseline = scores.new_tensor(float(log_baseline))
    log_baseline = log_baseline.expand(scores.shape[:-1]).unsqueeze(-1)        # (..., N, 1)
    eye = torch.eye(n, dtype=torch.bool, device=scores.device)
    log_loo = _leave_one_out_logsumexp(scores) - math.log(n - 1)               # (..., N, N)
    if alpha == 0.0:
        log_b = log_baseline.expand_as(log_loo)
    elif alpha == 1.0:
        log_b = log_loo
    else:
        log_b = torch.logaddexp(math.log(alpha) + log_loo,
                                math.log1p(-alpha) + log_baseline)              # (..., N, N)
    scale = 1.0 / (n * (n - 1))
    joint = (_diagonal(scores).unsqueeze(-1) - log_b).masked_fill(eye, 0.0).sum((-2, -1)) * scale
    marginal = (scores - log_b).masked_fill(eye, -math.inf).exp().sum((-2, -1)) * scale
    return 1.0 + joint - marginal


def _leave_one_out_logsumexp(scores: torch.Tensor) -> torch.Tensor:
    r"""[..., i, l] = :math:`\log \sum_{k \ne l} e^{F_{ik}}`, from the log-sum-exp of the entries
    before l and of those after l (exact, without subtracting exponentials)."""
    pad = torch.full_like(scores[..., :1], -math.inf)
    before = torch.cat([pad, torch.logcumsumexp(scores, -1)[..., :-1]], -1)
    after = torch.cat([torch.logcumsumexp(scores.flip(-1), -1).flip(-1)[..., 1:], pad], -1)
    return torch.logaddexp(before, after)


def smile(scores: torch.Tensor, tau: float = 5.0) -> torch.Tensor:
    r"""SMILE (Song & Ermon 2020): the DV bound with the partition term's ratios clipped to
    :math:`[e^{-\tau}, e^{\tau}]`, scored on a critic trained by the JS objective:

    .. math::

        \text{value} = \mathbb{E}_{p}[f] - \log \mathbb{E}_{p(x)p(y)}
            \big[\mathrm{clip}(e^{f}, e^{-\tau}, e^{\tau})\big], \qquad
        \text{gradient of } J \text{ (as in :func:`js`)}.

    Clipping bounds the variance of the partition term (at most :math:`(e^\tau - e^{-\tau})^2
    / 4` per sample) at the price of a bias, which vanishes as :math:`\tau \to \infty` (DV)
    and is the change of the log-partition by the clip at :math:`f = \log r`. Not a bound for
    finite tau; the partition term is at least :math:`-\tau`, so the estimate is at most
    :math:`\tau` plus the mean positive score.

    :param torch.Tensor scores: F, shape (..., N, N).
    :param float tau: the clip, > 0.
    :return: shape (...).
    """
    _check_scores(scores)
    tau = float(tau)
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    value = _diagonal(scores).mean(-1) - _log_mean_exp_off_diagonal(scores.clamp(-tau, tau))
    objective = _js_fgan(scores)
    return objective + (value - objective).detach()
