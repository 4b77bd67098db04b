r"""An associative (prefix) scan over the leading axis of a tuple of tensors, in O(log T) depth.

For an associative operation :math:`\otimes` and elements :math:`a_1, \dots, a_T` the inclusive
scan returns :math:`a_1,\ a_1 \otimes a_2,\ \dots,\ a_1 \otimes \cdots \otimes a_T`. The
work-efficient recursion (Blelloch 1990, "Prefix sums and their applications"; the form of
``jax.lax.associative_scan``) combines neighbouring pairs, scans the T/2 results recursively and
fills in the even positions with one more combination: :math:`2 \lceil \log_2 T \rceil` levels
of batched tensor operations and O(T) combinations in all, where a sequential loop takes T
dependent steps. Each level is one call of ``combine`` on all pairs of that level at once, so a
combination written with batched torch operations runs the whole level in a few kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["associative_scan"]

Elements = tuple[torch.Tensor, ...]


def _interleave(even: Elements, odd: Elements, length: int) -> Elements:
    """Element-wise: the sequence e_0, o_0, e_1, o_1, ... of ``length`` entries along axis 0."""
    out = []
    for e, o in zip(even, odd, strict=True):
        pairs = torch.stack([e[:o.shape[0]], o], dim=1).reshape(2 * o.shape[0], *o.shape[1:])
        out.append(torch.cat([pairs, e[o.shape[0]:]], dim=0) if length % 2 else pairs)
    return tuple(out)


def associative_scan(combine: Callable[[Elements, Elements], Elements], elements: Elements,
                     reverse: bool = False) -> Elements:
    r"""Inclusive scan of ``elements`` along axis 0 under the associative ``combine``.

    .. math::

        y_t = a_1 \otimes a_2 \otimes \cdots \otimes a_t \quad (t = 1, \dots, T);
        \qquad \text{reverse: } y_t = a_t \otimes a_{t+1} \otimes \cdots \otimes a_T.

    :param combine: ``combine(earlier, later)`` returns :math:`\text{earlier} \otimes
        \text{later}` for two tuples of tensors whose leading axes have the same length (any
        number of pairs at once); it must broadcast over the trailing axes.
    :param tuple elements: the :math:`a_t`, a tuple of tensors of shape (T, ...) each (the
        trailing shapes may differ between the tensors of the tuple).
    :param bool reverse: scan from the end (suffix products), keeping the order of the operands:
        ``combine(earlier, later)`` still receives the earlier time first.
    :return: a tuple of tensors of the shapes of ``elements``.
    """
    elements = tuple(elements)
    lengths = {e.shape[0] for e in elements}
    if len(lengths) != 1:
        raise ValueError(f"all elements of an associative scan must have the same length along "
                         f"axis 0, got the lengths {sorted(lengths)}")
    if reverse:
        flipped = tuple(e.flip(0) for e in elements)
        result = _scan(lambda later, earlier: combine(earlier, later), flipped)
        return tuple(e.flip(0) for e in result)
    return _scan(combine, elements)


def _scan(combine, elements: Elements) -> Elements:
    length = elements[0].shape[0]
    if length < 2:
        return elements
    # Pairs (a_0 a_1), (a_2 a_3), ...: the prefixes at the odd positions, after the recursion.
    reduced = combine(tuple(e[0:-1:2] for e in elements), tuple(e[1::2] for e in elements))
    odd = _scan(combine, reduced)  # odd[i] = a_0 ... a_{2i+1}
    # Even positions 2i >= 2: (a_0 ... a_{2i-1}) a_{2i}.
    tail = tuple(e[2::2] for e in elements)
    head = odd if length % 2 else tuple(o[:-1] for o in odd)
    even = combine(head, tail) if tail[0].shape[0] > 0 else tail
    even = tuple(torch.cat([e[:1], v], dim=0) for e, v in zip(elements, even, strict=True))
    return _interleave(even, odd, length)
