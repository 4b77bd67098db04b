r"""Numerical kernels of the package, apart from the distributions that use them (as
:mod:`pyro.ops`): the minibatch-mixture log-density, dense, streamed in blocks and fused in
Triton kernels on CUDA (for any other family of recognition distributions, in row blocks over
its ``log_prob``), the streamed log-sum-exp of a matrix product and the underflow-safe dense
one, weighted squared distances, powers of Lp distances in blocks, and the Kalman filter,
smoother and backward sampler of linear-Gaussian state-space models (square-root recursions,
associative scans over time for long sequences: :mod:`rpm.ops.kalman_scan`, or the window's
dense joint Gaussian for short ones: :mod:`rpm.ops.kalman_dense`), with masks over frames."""

from rpm.ops.dispatch import (
    default_block_size,
    fused_mixture_kernel,
    ieee_float32_matmul,
    triton_available,
    use_fused_mixture,
    use_streaming,
)
from rpm.ops.distances import (
    expansion_rounding_bound,
    squared_distance_factors,
    squared_distances,
)
from rpm.ops.distribution_mixture import (
    distribution_mixture_block_rows,
    distribution_mixture_log_prob,
)
from rpm.ops.gaussian_mixture import (
    dense_gaussian_mixture_log_prob,
    fused_gaussian_mixture_log_prob,
    gaussian_mixture_log_prob,
)
from rpm.ops.kalman import (
    backward_sample,
    kalman_filter,
    kalman_forecast,
    kalman_log_prob,
    rts_smoother,
)
from rpm.ops.logsumexp import (
    diagonal_log_softmax,
    exp_floor,
    safe_logsumexp,
    streaming_matmul_logsumexp,
)
from rpm.ops.lp_distances import lp_distances, lp_paired_distances
from rpm.ops.lyapunov import stationary_covariance
from rpm.ops.streaming import check_mixture_arguments, streaming_gaussian_mixture_log_prob

__all__ = [
    "backward_sample",
    "check_mixture_arguments",
    "default_block_size",
    "dense_gaussian_mixture_log_prob",
    "diagonal_log_softmax",
    "distribution_mixture_block_rows",
    "distribution_mixture_log_prob",
    "exp_floor",
    "expansion_rounding_bound",
    "fused_gaussian_mixture_log_prob",
    "fused_mixture_kernel",
    "gaussian_mixture_log_prob",
    "ieee_float32_matmul",
    "kalman_filter",
    "kalman_forecast",
    "kalman_log_prob",
    "lp_distances",
    "lp_paired_distances",
    "rts_smoother",
    "safe_logsumexp",
    "stationary_covariance",
    "squared_distance_factors",
    "squared_distances",
    "streaming_gaussian_mixture_log_prob",
    "streaming_matmul_logsumexp",
    "triton_available",
    "use_fused_mixture",
    "use_streaming",
]
