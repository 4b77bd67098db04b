r"""The terms of the J-view implicit priors and of the multi-view losses, from a logits matrix and
two masks (``docs/theory.md#j-view-priors-star-and-mixture-of-partners``).

N instances with J views each give latents :math:`z_{i,j}`; pooled, they are the columns
:math:`u_m`. Each anchor :math:`u_k` (a row) has **positives** :math:`P(k)` (the other views of
its instance) and **candidates** :math:`C(k)` (the latents its normaliser runs over), and the
energy gives the logits :math:`F_{km} = f(u_k, u_m)`. With :math:`D_k = |C(k)|` (plus K queued
latents, which every anchor takes as candidates) and the estimated normaliser

.. math::

    \log \hat Z(u_k) = \log \frac{1}{D_k} \sum_{m \in C(k)} e^{F_{km}},

the two priors' per-anchor ELBO terms are

.. math::

    r^\text{star}_k = \sum_{p \in P(k)} \big[F_{kp} - \log \hat Z(u_k)\big], \qquad
    r^\text{mix}_k = \log \frac{1}{|P(k)|} \sum_{p \in P(k)} e^{F_{kp}} - \log \hat Z(u_k),

the star prior with centre :math:`u_k` (every other view drawn from the implicit conditional of
the centre) and the mixture-of-partners prior (one other view, chosen uniformly, linked to the
centre). The losses users know are the same sums without the constants:

.. math::

    L_\text{out} = \operatorname*{mean}_{k,\ p \in P(k)}
        -\log \frac{e^{F_{kp}}}{\sum_{m \in C(k)} e^{F_{km}}}, \qquad
    L_\text{in} = \operatorname*{mean}_{k}
        -\log \frac{\sum_{p \in P(k)} e^{F_{kp}}}{\sum_{m \in C(k)} e^{F_{km}}}

(SupCon's "outside" and "inside" forms, Khosla et al. 2020, Eq. 2 and 3): affine functions of
the priors' ELBOs, :class:`rpm.losses.NTXentLoss`.

**Candidate sets** (:func:`multiview_masks`): ``"pooled"``, every latent of the batch but the
anchor itself (NT-Xent's, :math:`D = NJ - 1`); ``"cross_view"``, only the other views' columns
(:math:`D = N (J - 1)`); ``"positives"``, only the anchor's own positives, for a queue of
earlier latents to complete (MoCo: :math:`D = (J - 1) + K`). The **multi-crop rule** of SwAV and
DINO (``global_views = G``: views 0..G-1 are global crops, the others local): a local crop's
positives and candidates are the global crops only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from rpm.ops._logsumexp import safe_logsumexp

__all__ = [
    "CANDIDATE_SETS",
    "FORMS",
    "AnchorTerms",
    "multiview_anchor_terms",
    "multiview_masks",
    "positive_index",
]

#: The candidate sets of an anchor (module docstring).
CANDIDATE_SETS = ("pooled", "cross_view", "positives")
#: ``"star"``: the star prior averaged over centres (L_out); ``"mixture"``: the mixture of
#: partners (L_in).
FORMS = ("star", "mixture")


class AnchorTerms(NamedTuple):
    """The result of :func:`multiview_anchor_terms`."""

    #: :math:`r_k`, the anchor's ELBO term (module docstring), shape (R,).
    ratio: torch.Tensor


def multiview_masks(
    row_instance: torch.Tensor, row_view: torch.Tensor, col_instance: torch.Tensor,
    col_view: torch.Tensor, candidates: str = "pooled", global_views: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The positives :math:`P(k)` and candidates :math:`C(k)` of R anchors among C columns, as
    boolean masks (module docstring).

    Anchor k is view ``row_view[k]`` of instance ``row_instance[k]``, column m view
    ``col_view[m]`` of instance ``col_instance[m]``. Positives: the same instance, another view.
    Candidates: ``"pooled"``, every column but the anchor itself; ``"cross_view"``, the columns
    of the other views; ``"positives"``, the positives. With ``global_views = G`` a local anchor
    (view >= G) keeps only the columns of global views (< G) in both masks.

    :param torch.Tensor row_instance: shape (R,), integers.
    :param torch.Tensor row_view: shape (R,), integers.
    :param torch.Tensor col_instance: shape (C,), integers.
    :param torch.Tensor col_view: shape (C,), integers.
    :param str candidates: ``"pooled"``, ``"cross_view"`` or ``"positives"``.
    :param global_views: G, or None (no multi-crop rule).
    :return: ``(positives (R, C), candidates (R, C))``, boolean.
    """
    if candidates not in CANDIDATE_SETS:
        raise ValueError(f"candidates must be one of {CANDIDATE_SETS}, got {candidates!r}")
    same_instance = row_instance[:, None] == col_instance[None, :]
    same_view = row_view[:, None] == col_view[None, :]
    positives = same_instance & ~same_view
    if candidates == "pooled":
        allowed = ~(same_instance & same_view)
    elif candidates == "cross_view":
        allowed = ~same_view
    else:
        allowed = positives
    if global_views is not None:
        keep = (row_view < global_views)[:, None] | (col_view < global_views)[None, :]
        positives = positives & keep
        allowed = allowed & keep
    return positives, allowed


def positive_index(positives: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positives of each row as column indices: ``(index (R, P), valid (R, P))``, P the
    largest number of positives of a row, ``index[k, :|P(k)|]`` the columns of row k's
    positives (in order) and ``valid`` False on the padding. Lets
    :func:`multiview_anchor_terms` read the positives' logits by ``gather`` instead of a pass
    over the (R, C) matrix.

    :param torch.Tensor positives: boolean (R, C).
    """
    counts = positives.sum(-1)                                                # (R,)
    width = max(int(counts.max()), 1) if counts.numel() else 1
    order = positives.to(torch.int32).argsort(dim=-1, descending=True, stable=True)[:, :width]
    valid = torch.arange(width, device=positives.device)[None, :] < counts[:, None]
    return order, valid


def multiview_anchor_terms(
    logits: torch.Tensor, positives: torch.Tensor, candidates: torch.Tensor, form: str,
    queue_logits: torch.Tensor | None = None,
    index: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> AnchorTerms:
    r"""The per-anchor ELBO terms :math:`r_k` of the star or mixture form (module docstring).

    An anchor without positives contributes 0 (it is no centre). Every anchor with positives
    needs at least one candidate.

    :param torch.Tensor logits: :math:`F_{km} = f(u_k, u_m)`, shape (R, C).
    :param torch.Tensor positives: boolean (R, C), :math:`P(k)`.
    :param torch.Tensor candidates: boolean (R, C), :math:`C(k)` without the queue.
    :param str form: ``"star"`` or ``"mixture"``.
    :param queue_logits: :math:`f(u_k, c_q)` against K queued latents, shape (R, K), candidates
        of every anchor; or None.
    :param index: :func:`positive_index` of ``positives``, if the caller holds it (the priors
        cache it with the masks); None computes the positives' terms from the mask.
    :rtype: AnchorTerms
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if logits.dim() != 2 or positives.shape != logits.shape or candidates.shape != logits.shape:
        raise ValueError(
            f"logits (R, C) and the two masks must have one shape, got {tuple(logits.shape)}, "
            f"{tuple(positives.shape)} and {tuple(candidates.shape)}")
    masked = logits.masked_fill(~candidates, -math.inf)
    num_queued = 0
    if queue_logits is not None:
        masked = torch.cat([masked, queue_logits], dim=-1)                  # (R, C + K)
        num_queued = queue_logits.shape[-1]
    num_positives = positives.sum(-1).to(logits.dtype)                     # (R,)
    num_candidates = candidates.sum(-1).to(logits.dtype) + num_queued
    if bool(((num_positives > 0) & (num_candidates == 0)).any()):
        raise ValueError("an anchor with positives has no candidates: give its normaliser at least "
                         "one latent (another candidate set, or a non-empty queue)")
    log_num_candidates = num_candidates.clamp_min(1).log()
    log_normalizer = safe_logsumexp(masked, dim=-1) - log_num_candidates   # log Z-hat(u_k)
    has = num_positives > 0
    if index is None:
        partners, valid = logits, positives                                    # (R, C)
    else:
        partners, valid = logits.gather(1, index[0]), index[1]                 # (R, P)
    if form == "star":
        ratio = partners.masked_fill(~valid, 0.0).sum(-1) - num_positives * torch.where(
            has, log_normalizer, torch.zeros_like(log_normalizer))
    else:
        log_partners = safe_logsumexp(partners.masked_fill(~valid, -math.inf), dim=-1)
        ratio = torch.where(has, log_partners - num_positives.clamp_min(1).log() - log_normalizer,
                            torch.zeros_like(log_normalizer))
    return AnchorTerms(ratio)
