r"""Scores of a trained sequence RPM (``rpm lds``, ``rpm pendulum``): the held-out linear
:math:`R^2` of the true state from the smoothed latents, the learned dynamics' eigenvalues, and
k-step forecasts.

**Smoothed latents.** Given the encoder's means :math:`\mu_{1:T}` and noise :math:`\sigma` of a
whole sequence, the learned chain conditioned on them as pseudo-observations (the structured
guide, :class:`~rpm.distributions.StateSpacePosterior`) is filtered and smoothed (RTS): the smoothed
latents are :math:`E[s_t | \mu_{1:T}]`, shape (N, T, H).

**Held-out R^2.** A least-squares affine map from the smoothed latents to the true state is
fitted on the frames of the training sequences and scored on those of the held-out sequences
(:func:`rpm.metrics.r2_per_dimension`, mean over the state's coordinates): ``r2``.

**Eigenvalues.** The latent chain is identified up to an invertible linear map of the state
(:math:`A \to M A M^{-1}`), which keeps the eigenvalues of A. They are matched to the true
ones by the assignment that minimises the sum of absolute differences (the Hungarian algorithm,
:func:`scipy.optimize.linear_sum_assignment`); ``eigenvalue_error`` is the largest absolute
difference of a matched pair.

**Forecasts.** From the filtered state at frame t, :math:`E[s_{t+k} | \mu_{1:t}] = A^k
E[s_t | \mu_{1:t}]`; decoded to the true state by the affine map fitted on the training
sequences' smoothed latents, and scored on the held-out sequences by the root mean squared
error against the true state at t + k (the error of the k-step forecast of the learned prior).
The baseline fits a VAR(1) by least squares to the encoder's means of the training sequences,
:math:`\mu_{t+1} \approx B [\mu_t; 1]`, iterates it k times from :math:`\mu_t` and decodes
with the affine map fitted on the means: ``var_forecast_error``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from rpm.distributions import StateSpacePosterior
from rpm.metrics import r2_per_dimension
from rpm.ops._kalman import KalmanFilterResult, rts_smoother

__all__ = ["Inference", "affine_apply", "affine_fit", "decoded_states", "eigenvalue_error",
           "forecast_errors", "heldout_r2", "infer_states"]


class Inference(NamedTuple):
    r"""The encoder's means and the learned chain's inference over whole sequences.

    :ivar torch.Tensor means: :math:`\mu_t`, (N, T, D), float64.
    :ivar torch.Tensor smoothed: :math:`E[s_t | \mu_{1:T}]`, (N, T, H), float64.
    :ivar KalmanFilterResult filtered: the filter of the means (its ``filtered_loc``
        :math:`E[s_t | \mu_{1:t}]`, (N, T, H)).
    :ivar torch.Tensor transition_matrix: the learned A, (H, H), float64.
    :ivar torch.Tensor scales: the recognition standard deviations, (N, T, D), float64.
    """

    means: torch.Tensor
    smoothed: torch.Tensor
    filtered: KalmanFilterResult
    transition_matrix: torch.Tensor
    scales: torch.Tensor | None = None


@torch.no_grad()
def infer_states(model, x: torch.Tensor, chunk: int = 64, mask: torch.Tensor | None = None,
                 encoded: Inference | None = None) -> Inference:
    r"""The encoder's means and the smoothed latents of the sequences ``x`` under a trained
    :class:`~rpm.RPM` with a linear-Gaussian prior (module docstring). The encoder is
    put in evaluation mode.

    :param model: a :class:`~rpm.RPM` whose recognition returns a diagonal Gaussian and
        whose prior has ``distribution(T)`` (a :class:`~rpm.distributions.GaussianStateSpace`).
    :param torch.Tensor x: the sequences, shape (N, T, ...).
    :param int chunk: sequences encoded at once.
    :param mask: missing frames: None, or a bool tensor (N, T), True where the frame is
        observed; the chain is conditioned on the observed frames' means only (the filter skips
        the others' updates), and the dropped frames' smoothed latents are imputations.
    :param encoded: an earlier :class:`Inference` of the same ``x`` and model whose means and
        scales are reused instead of encoding ``x`` again (e.g. the same videos with a mask).
    """
    net = model.recognition.net
    net.eval()
    if encoded is not None:
        loc, scale = encoded.means, encoded.scales
    else:
        locs, scales = [], []
        for start in range(0, x.shape[0], chunk):
            batch = x[start:start + chunk]
            loc, scale = net(batch.flatten(0, 1))  # (n T, D)
            locs.append(loc.reshape(*batch.shape[:2], -1))
            scales.append(scale.reshape(*batch.shape[:2], -1))
        loc = torch.cat(locs).to("cpu", torch.float64)
        scale = torch.cat(scales).to("cpu", torch.float64)
    chain = model.prior.distribution(x.shape[1])
    params = {name: getattr(chain, name).detach().to("cpu", torch.float64)
              for name in chain.arg_constraints}
    chain = type(chain)(**params, duration=x.shape[1], mask=mask)
    filtered = StateSpacePosterior(chain, loc, scale).filtered
    smoothed = rts_smoother(filtered, params["transition_matrix"],
                            params["transition_scale_tril"]).loc
    return Inference(loc, smoothed, filtered, params["transition_matrix"], scale)


def affine_fit(features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Least-squares affine map :math:`y \approx [f, 1] B` in float64.

    :param torch.Tensor features: (M, F).
    :param torch.Tensor targets: (M, K).
    :return: B, (F + 1, K), the last row the offset.
    """
    features = features.to(torch.float64)
    design = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], 1)
    return torch.linalg.lstsq(design, targets.to(torch.float64), driver="gelsd").solution


def affine_apply(coef: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    r"""The affine map :math:`y = [f, 1] B` of :func:`affine_fit` applied in float64.

    :param torch.Tensor coef: B, (F + 1, K), the last row the offset.
    :param torch.Tensor features: (..., F).
    :return: (..., K), float64.
    """
    return features.to(torch.float64) @ coef[:-1] + coef[-1]


def decoded_states(latents: torch.Tensor, states: torch.Tensor, num_train: int) -> torch.Tensor:
    r"""The states read out of ``latents`` by the affine map :math:`[z, 1] B` fitted (float64
    least squares, :func:`affine_fit`) on the frames of the first ``num_train`` sequences.

    :param torch.Tensor latents: (N, T, D).
    :param torch.Tensor states: (N, T, K).
    :return: (N, T, K), float64.
    """
    coef = affine_fit(latents[:num_train].flatten(0, 1), states[:num_train].flatten(0, 1))
    return affine_apply(coef, latents)


def heldout_r2(states: torch.Tensor, latents: torch.Tensor, num_train: int) -> torch.Tensor:
    r"""Held-out :math:`R^2` per coordinate of the affine map from ``latents`` to ``states``,
    fitted on the frames of the first ``num_train`` sequences, scored on the others.

    :param torch.Tensor states: the true states, (N, T, K).
    :param torch.Tensor latents: e.g. the smoothed latents, (N, T, H).
    :param int num_train: training sequences (the first ones), 1 <= num_train < N.
    :return: (K,), float64.
    """
    frames = num_train * states.shape[1]
    return r2_per_dimension(states.flatten(0, 1), latents.flatten(0, 1), num_train=frames)


def eigenvalue_error(learned: torch.Tensor, truth: torch.Tensor) -> float:
    r"""The largest absolute difference between matched eigenvalues of two square matrices of
    the same size (module docstring: Hungarian matching on the absolute differences).

    :param torch.Tensor learned: (H, H).
    :param torch.Tensor truth: (H, H).
    """
    if learned.shape != truth.shape or learned.dim() != 2 or learned.shape[0] != learned.shape[1]:
        raise ValueError(f"eigenvalue_error compares two square matrices of one size, got "
                         f"{tuple(learned.shape)} and {tuple(truth.shape)}")
    a = torch.linalg.eigvals(learned.detach().to("cpu", torch.float64)).numpy()
    b = torch.linalg.eigvals(truth.detach().to("cpu", torch.float64)).numpy()
    cost = np.abs(a[:, None] - b[None, :])
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].max())


def _forecast_rmse(predicted: torch.Tensor, states: torch.Tensor, steps: int) -> float:
    """RMSE of predictions of frame t + steps made at frame t, (N, T - steps, K), against the
    true states (N, T, K)."""
    return float((predicted - states[:, steps:]).square().mean().sqrt())


def forecast_errors(inference: Inference, states: torch.Tensor, num_train: int,
                    horizons: tuple[int, ...] = (1, 10)) -> dict[str, dict[str, float]]:
    r"""k-step forecast errors of the learned prior and of a VAR(1) refitted on the encoder's
    means, on the held-out sequences (module docstring).

    :param Inference inference: of all sequences, training ones first.
    :param torch.Tensor states: the true states to forecast, (N, T, K).
    :param int num_train: training sequences.
    :param tuple horizons: the k of each forecast, each < T.
    :return: ``{"model": {str(k): rmse}, "var": {str(k): rmse}}``.
    """
    states = states.to(torch.float64)
    train, test = slice(0, num_train), slice(num_train, None)
    # the learned prior: A^k E[s_t | mu_{1:t}], decoded by the map fitted on the smoothed latents
    decoder = affine_fit(inference.smoothed[train].flatten(0, 1), states[train].flatten(0, 1))
    # the VAR(1) on the means, decoded by the map fitted on the means
    means = inference.means
    var = affine_fit(means[train, :-1].flatten(0, 1), means[train, 1:].flatten(0, 1))
    mean_decoder = affine_fit(means[train].flatten(0, 1), states[train].flatten(0, 1))
    errors: dict[str, dict[str, float]] = {"model": {}, "var": {}}
    transition = inference.transition_matrix
    for k in horizons:
        state = inference.filtered.filtered_loc[test].to(torch.float64)  # (n, T, H)
        mean = means[test]
        for _ in range(k):
            state = state @ transition.T
            mean = affine_apply(var, mean)
        length = states.shape[1] - k
        errors["model"][str(k)] = _forecast_rmse(affine_apply(decoder, state[:, :length]),
                                                 states[test], k)
        errors["var"][str(k)] = _forecast_rmse(affine_apply(mean_decoder, mean[:, :length]),
                                               states[test], k)
    return errors
