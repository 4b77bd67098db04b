r"""Numerical kernels of the package, apart from the distributions that use them (as
:mod:`pyro.ops`): the minibatch-mixture log-density (Gaussian components through matrix
products, dense or streamed in blocks, or fused in Triton kernels on CUDA; any other family in
row blocks over its ``log_prob``),
the underflow-safe log-sum-exp and the streamed log-sum-exp of a matrix product, weighted
squared and Lp distances, and the Kalman filter, smoother, forecast and backward sampler of
linear-Gaussian state-space models with masks over frames (square-root recursions, associative
scans over time for long sequences: ``rpm.ops._kalman_scan``, or the window's dense joint
Gaussian for short ones: ``rpm.ops._kalman_dense``), and the stationary covariance of a
linear recursion.

The package exports the kernels a user writing a prior, an energy or a marginal calls, and
:func:`fused_mixture_kernel`, the scoped switch of the fused kernel; the other dispatch
policies, block sizes, rounding bounds and dense variants the core uses stay in their modules
(``rpm.ops._dispatch``, ``rpm.ops._distances``, ``rpm.ops._gaussian_mixture``,
``rpm.ops._logsumexp``, ``rpm.ops._streaming`` ...)."""

from rpm.ops._dispatch import fused_mixture_kernel
from rpm.ops._distances import squared_distances
from rpm.ops._distribution_mixture import distribution_mixture_log_prob
from rpm.ops._gaussian_mixture import gaussian_mixture_log_prob
from rpm.ops._kalman import (
    KalmanFilterResult,
    KalmanForecast,
    KalmanSmootherResult,
    backward_sample,
    kalman_filter,
    kalman_forecast,
    kalman_log_prob,
    rts_smoother,
)
from rpm.ops._logsumexp import safe_logsumexp, streaming_matmul_logsumexp
from rpm.ops._lp_distances import lp_distances
from rpm.ops._lyapunov import stationary_covariance

__all__ = [
    "KalmanFilterResult",
    "KalmanForecast",
    "KalmanSmootherResult",
    "backward_sample",
    "distribution_mixture_log_prob",
    "fused_mixture_kernel",
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
