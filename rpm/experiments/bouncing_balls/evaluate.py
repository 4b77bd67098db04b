r"""Evaluation of the bouncing-balls experiment (Section 5 of Aitchison & Ganev): how well a
*linear* decoder reads the true ball positions out of the encoder's 6 numbers.

The encoder, in evaluation mode, maps every frame t to :math:`\hat z_t \in \mathbb{R}^{2K}`; a
least-squares affine decoder :math:`c_t \approx B^\top [\hat z_t; 1]` to the 2K true coordinates
is fitted on the training frames and scored on the held-out frames by

.. math::

    R^2 = \frac{1}{2K} \sum_d \Big(1 - \frac{\sum_{t \in \text{test}} (c_{td} - \hat c_{td})^2}
                                       {\sum_{t \in \text{test}} (c_{td} - \bar c_d)^2}\Big),
    \qquad
    \text{error} = \frac{1}{T_\text{test} K} \sum_{t \in \text{test}} \sum_k
        \lVert c_{tk} - \hat c_{tk} \rVert,

the R^2 being :func:`rpm.metrics.r2_per_dimension` (affine identifiability, ``docs/theory.md``,
*Evaluation*) and the error the mean distance in pixels between decoded and true centres.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rpm.metrics import r2_per_dimension

__all__ = ["Evaluation", "encode", "evaluate", "fit_linear_decoder"]


class Evaluation(NamedTuple):
    """Scores of the linear decoder from the encoder's outputs to the ball centres.

    :ivar float r2: held-out :math:`R^2`, mean over the 2K coordinates.
    :ivar list r2_per_coordinate: the 2K held-out :math:`R^2` values.
    :ivar float pixel_error: mean distance in pixels between decoded and true held-out centres.
    :ivar float train_r2: :math:`R^2` of the fit on the training frames.
    :ivar torch.Tensor decoded: decoded held-out centres, float64. Shape: (T_test, K, 2).
    """

    r2: float
    r2_per_coordinate: list
    pixel_error: float
    train_r2: float
    decoded: torch.Tensor


def fit_linear_decoder(features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Least-squares affine decoder :math:`y \approx [\hat z, 1] B`, in float64 on the CPU.

    :param torch.Tensor features: :math:`\hat z`. Shape: (T, D).
    :param torch.Tensor targets: y. Shape: (T, M).
    :return: B, the last row being the bias. Shape: (D + 1, M).
    """
    features = features.detach().to("cpu", torch.float64)
    design = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], 1)
    targets = targets.detach().to("cpu", torch.float64)
    return torch.linalg.lstsq(design, targets, driver="gelsd").solution


@torch.no_grad()
def encode(encoder: torch.nn.Module, frames: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """The encoder's outputs in evaluation mode (batch normalisation with its running
    statistics, so that a frame's code does not depend on its batch), float64 on the CPU.
    Leaves the encoder in evaluation mode.

    :param torch.nn.Module encoder: e.g. :class:`~rpm.experiments.bouncing_balls.encoders.BallEncoder`.
    :param torch.Tensor frames: Shape: (T, C, H, W).
    :param int chunk: frames per forward pass.
    :return: Shape: (T, 2K).
    """
    encoder.eval()
    return torch.cat([encoder(part).to("cpu", torch.float64) for part in frames.split(chunk)])


def _r2(truth: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor:
    residual = (truth - prediction).square().sum(0)  # (M,)
    total = (truth - truth.mean(0)).square().sum(0)  # (M,)
    return 1.0 - residual / total


def evaluate(encoder: torch.nn.Module, frames: torch.Tensor, centres: torch.Tensor,
             num_train: int) -> Evaluation:
    """Fits the affine decoder on the first ``num_train`` frames and scores it on the others
    (module docstring).

    :param torch.nn.Module encoder: maps frames (N, C, H, W) to (N, 2K); switched to
        evaluation mode.
    :param torch.Tensor frames: the whole video. Shape: (T, C, H, W).
    :param torch.Tensor centres: true centres in pixels. Shape: (T, K, 2).
    :param int num_train: number of leading training frames, at least 2K + 2, leaving at
        least 2 held-out frames.
    """
    features = encode(encoder, frames)  # (T, 2K)
    targets = centres.detach().to("cpu", torch.float64).flatten(1)  # (T, 2K)
    test_r2 = r2_per_dimension(targets, features, num_train=num_train)  # (2K,)
    coef = fit_linear_decoder(features[:num_train], targets[:num_train])  # (2K + 1, 2K)
    design = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], 1)
    prediction = design @ coef  # (T, 2K)
    decoded = prediction[num_train:].reshape(-1, centres.shape[1], 2)  # (T_test, K, 2)
    error = (decoded - targets[num_train:].reshape(decoded.shape)).norm(dim=-1).mean()
    return Evaluation(
        r2=test_r2.mean().item(),
        r2_per_coordinate=test_r2.tolist(),
        pixel_error=error.item(),
        train_r2=_r2(targets[:num_train], prediction[:num_train]).mean().item(),
        decoded=decoded,
    )
