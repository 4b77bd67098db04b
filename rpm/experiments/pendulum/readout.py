r"""A nonlinear read-out of the pendulum's state from the smoothed latents, reported beside the
linear :math:`R^2` of the floor (``rpm pendulum``, ``results.json`` ``knn_r2``).

The floor scores an affine map from the smoothed latents :math:`E[s_t | \mu_{1:T}]` to
:math:`(\sin\theta, \cos\theta, \omega)`. The smoothed latents are linear in the recognition
means, and the velocity is not linear in any window of :math:`(\sin\theta_t, \cos\theta_t)`:
:math:`\omega = \cos\theta\, \tfrac{d}{dt}\sin\theta - \sin\theta\, \tfrac{d}{dt}\cos\theta`, a
product. So an encoder that gives the angle exactly still caps the linear :math:`R^2` of
:math:`\omega` below 1 (``benchmarks/README.md``). The k-nearest-neighbour regression

.. math::

    \hat y(s) = \frac{1}{k} \sum_{j \in \mathcal{N}_k(s)} y_j,

over the training videos' frames (Euclidean distance between smoothed latents standardised by
the training frames' mean and standard deviation), scored by the held-out :math:`R^2` per
coordinate (:math:`1 - \sum (y - \hat y)^2 / \sum (y - \bar y)^2` over the held-out frames, as
:func:`rpm.metrics.r2_per_dimension` scores the affine map), measures what the latents carry
without that cap.
"""

from __future__ import annotations

import torch

__all__ = ["knn_heldout_r2"]


def knn_heldout_r2(states: torch.Tensor, latents: torch.Tensor, num_train: int,
                   k: int = 10) -> torch.Tensor:
    r"""Held-out :math:`R^2` per coordinate of the k-nearest-neighbour regression of ``states``
    on ``latents`` fitted on the frames of the first ``num_train`` sequences (module docstring).

    :param torch.Tensor states: (N, T, K).
    :param torch.Tensor latents: (N, T, H).
    :param int num_train: training sequences, 1 <= num_train < N.
    :param int k: neighbours, at most the training frames.
    :return: (K,), float64.
    """
    from sklearn.neighbors import KNeighborsRegressor

    frames = num_train * states.shape[1]
    features = latents.flatten(0, 1).to(torch.float64)
    targets = states.flatten(0, 1).to(torch.float64)
    if not 1 <= k <= frames:
        raise ValueError(f"k must lie in [1, {frames}] (the training frames), got {k}")
    mean, std = features[:frames].mean(0), features[:frames].std(0).clamp(min=1e-12)
    features = ((features - mean) / std).numpy()
    regression = KNeighborsRegressor(n_neighbors=k).fit(features[:frames], targets[:frames].numpy())
    predicted = torch.as_tensor(regression.predict(features[frames:]), dtype=torch.float64)
    test = targets[frames:]
    total = (test - test.mean(0)).square().sum(0)
    return 1.0 - (test - predicted).square().sum(0) / total
