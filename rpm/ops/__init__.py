r"""Numerical kernels of the package, apart from the distributions that use them (as
:mod:`pyro.ops`): the minibatch-mixture log-density (Gaussian components through matrix
products, dense or streamed in blocks, or fused in Triton kernels on CUDA; any other family in
row blocks over its ``log_prob``),
the underflow-safe log-sum-exp and the streamed log-sum-exp of a matrix product, weighted
squared and Lp distances, and the Kalman filter, smoother, forecast and backward sampler of
linear-Gaussian state-space models with masks over frames (square-root recursions, associative
scans over time for long sequences: :mod:`rpm.ops.kalman_scan`, or the window's dense joint
Gaussian for short ones: :mod:`rpm.ops.kalman_dense`), and the stationary covariance of a
linear recursion.

The package exports the kernels a user writing a prior, an energy or a marginal calls; the
dispatch policies, block sizes, rounding bounds and dense variants the core uses stay in their
modules (:mod:`rpm.ops.dispatch`, :mod:`rpm.ops.distances`, :mod:`rpm.ops.gaussian_mixture`,
:mod:`rpm.ops.logsumexp`, :mod:`rpm.ops.streaming` ...)."""

from rpm.ops.distances import squared_distances
from rpm.ops.distribution_mixture import distribution_mixture_log_prob
from rpm.ops.gaussian_mixture import gaussian_mixture_log_prob
from rpm.ops.kalman import (
    backward_sample,
    kalman_filter,
    kalman_forecast,
    kalman_log_prob,
    rts_smoother,
)
from rpm.ops.logsumexp import safe_logsumexp, streaming_matmul_logsumexp
from rpm.ops.lp_distances import lp_distances
from rpm.ops.lyapunov import stationary_covariance

__all__ = [
    "backward_sample",
    "distribution_mixture_log_prob",
    "gaussian_mixture_log_prob",
    "kalman_filter",
    "kalman_forecast",
    "kalman_log_prob",
    "lp_distances",
    "rts_smoother",
    "safe_logsumexp",
    "squared_distances",
    "stationary_covariance",
    "streaming_matmul_logsumexp",
]
