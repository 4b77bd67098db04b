r"""Scores of ``rpm rpm-hmm``: the learned states matched to the digit classes by the Hungarian
algorithm, the state accuracy and the transition matrix's error after that matching.

The model's states are identifiable only up to a permutation. :func:`match_states` picks the
one-to-one map :math:`\sigma` from states to classes that maximises the frames whose predicted
state :math:`\hat z_t` maps to their class :math:`c_t` (the maximum-weight matching of the K x K
confusion counts, ``scipy.optimize.linear_sum_assignment``). Then

.. math::

    \text{state accuracy} = \frac1T \sum_t [\sigma(\hat z_t) = c_t], \qquad
    \text{transition error} = \max_{i,j} \big|\hat A_{\sigma^{-1}(i) \sigma^{-1}(j)}
        - A_{ij}\big|,

:math:`\hat A` the learned transition matrix and A the true one, both rows old -> new.
"""

from __future__ import annotations

import torch

__all__ = ["match_states", "matched_transition_matrix", "state_accuracy", "transition_error"]


def match_states(predicted: torch.Tensor, classes: torch.Tensor, num_states: int) -> torch.Tensor:
    r"""The map :math:`\sigma` from states to classes (module docstring): ``sigma[k]`` is the
    class of state k, a permutation of 0..K-1 maximising the frames it gets right.

    :param torch.Tensor predicted: the predicted states, int64 in 0..K-1. Shape: (T,).
    :param torch.Tensor classes: the true classes, int64 in 0..K-1. Shape: (T,).
    :param int num_states: K.
    :returns: int64. Shape: (K,).
    """
    from rpm.evaluation import match_clusters

    if predicted.shape != classes.shape or predicted.dim() != 1:
        raise ValueError(f"predicted and classes must be paths of one shape (T,), got "
                         f"{tuple(predicted.shape)} and {tuple(classes.shape)}")
    return match_clusters(predicted.cpu(), classes.cpu(), num_states, num_states).label_of_cluster


def state_accuracy(predicted: torch.Tensor, classes: torch.Tensor, sigma: torch.Tensor) -> float:
    r"""The share of frames whose predicted state maps to their class, :math:`\frac1T \sum_t
    [\sigma(\hat z_t) = c_t]`.

    :param torch.Tensor predicted: (T,) states. :param torch.Tensor classes: (T,) classes.
    :param torch.Tensor sigma: (K,) the map of :func:`match_states`.
    """
    return float((sigma[predicted.cpu()] == classes.cpu()).double().mean())


def matched_transition_matrix(learned: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    r"""The learned transition matrix with its states renamed as classes: entry (i, j) is
    :math:`\hat A_{\sigma^{-1}(i) \sigma^{-1}(j)}`. Shape: (K, K)."""
    inverse = torch.argsort(sigma)  # inverse[class] = state
    return learned.cpu()[inverse][:, inverse]


def transition_error(learned: torch.Tensor, true: torch.Tensor, sigma: torch.Tensor) -> float:
    r""":math:`\max_{ij} |\hat A_{\sigma^{-1}(i)\sigma^{-1}(j)} - A_{ij}|` (module docstring).

    :param torch.Tensor learned: :math:`\hat A`, the model's states. Shape: (K, K).
    :param torch.Tensor true: A, the classes. Shape: (K, K).
    :param torch.Tensor sigma: (K,) the map of :func:`match_states`.
    """
    difference = matched_transition_matrix(learned, sigma).double() - true.cpu().double()
    return float(difference.abs().max())
