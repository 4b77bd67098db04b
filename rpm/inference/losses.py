r"""The reference InfoNCE loss, to see the identity RPM ELBO = -InfoNCE + log N.

With logits :math:`F_{ij} = f(z_i, z'_j)` for a batch of N positive pairs (i, i):

.. math::

    \text{InfoNCE} = \frac1N \sum_i -\log \frac{e^{F_{ii}}}{\sum_j e^{F_{ij}}}
                   = \text{CrossEntropy}(F, \text{labels}=i),

and the per-pair RPM ELBO under the implicit prior (Eq. 23-25 of Aitchison & Ganev),
:func:`rpm.priors.implicit_log_ratio`, is

.. math::

    \mathcal{L}_i = F_{ii} - \log \frac1N \sum_j e^{F_{ij}} = -\text{CE}_i + \log N.
"""

from __future__ import annotations

import torch

__all__ = ["info_nce"]


def _check_square(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.shape[0] != logits.shape[1]:
        raise ValueError(
            "logits must be the square matrix F_ij = f(z_i, z'_j) of a batch of positive pairs, "
            f"shape (N, N); got {tuple(logits.shape)}"
        )


def info_nce(logits: torch.Tensor) -> torch.Tensor:
    r"""The InfoNCE loss (CPC, Oord et al. 2018): mean cross-entropy of row i against label i.

    :param torch.Tensor logits: :math:`F_{ij}`, shape (N, N); the positives on the diagonal.
    :return: a scalar.
    """
    _check_square(logits)
    labels = torch.arange(logits.shape[0], device=logits.device)
    return torch.nn.functional.cross_entropy(logits, labels)
