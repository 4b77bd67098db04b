r"""The data of ``rpm rpm-hmm``: a chain of scikit-learn's 8x8 digits whose classes follow a
Markov chain over K states (Walker et al., 2023, the HMM-MNIST experiment, here on the digits
that scikit-learn ships: nothing is downloaded).

The true transition matrix is the RBF kernel over the state indices, row-normalised,

.. math::

    A_{ij} = \frac{k(i, j)}{\sum_{j'} k(i, j')}, \qquad
    k(i, j) = \exp\!\big(-(i - j)^2 / \ell\big), \qquad i, j \in \{0, \dots, K-1\},

with :math:`\ell = 1` by default: Walker et al.'s ``RBF(states, states, 1, 1)`` (variance 1,
length 1, whose squared distance is divided by the length). :math:`\ell = 2` is the kernel
written :math:`\exp(-(i-j)^2 / 2)`.

The states :math:`s_1, \dots, s_T` are a draw of Pyro's
:class:`~pyro.distributions.DiscreteHMM` whose observation is the state itself (a ``Delta`` at
each state's index), with Pyro's convention: :math:`s_0` is drawn from the initial
distribution (uniform here) and the first frame's state is :math:`s_1 \sim A_{s_0, \cdot}`.
Frame t shows an image of the digit :math:`s_t` drawn uniformly, with replacement, from a
pool: the training chain from the training part of :func:`rpm.data.digits.load_digits_split`
(its fixed stratified split), the held-out chain from the test part, so that no image of the
held-out chain is ever trained on.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from pyro.distributions import Delta, DiscreteHMM

from rpm._validation import check_int, check_positive

__all__ = ["DigitChain", "MAX_STATES", "digit_chain", "rbf_transition_matrix", "sample_states"]

#: The most states: one per digit class.
MAX_STATES = 10


class DigitChain(NamedTuple):
    """One chain of digit images (unpacks as ``images, states, rows``).

    :ivar torch.Tensor images: frame t's image, intensities in [0, 1]. Shape: (T, 1, 8, 8).
    :ivar torch.Tensor states: frame t's state, the digit shown, int64. Shape: (T,).
    :ivar torch.Tensor rows: frame t's image as its row in ``sklearn.datasets.load_digits()``,
        int64. Shape: (T,).
    """

    images: torch.Tensor
    states: torch.Tensor
    rows: torch.Tensor


def rbf_transition_matrix(num_states: int, lengthscale: float = 1.0,
                          dtype: torch.dtype = torch.float64) -> torch.Tensor:
    r"""The row-normalised RBF kernel over the states (module docstring):
    :math:`A_{ij} \propto \exp(-(i - j)^2 / \ell)`.

    :param int num_states: K >= 2.
    :param float lengthscale: :math:`\ell > 0`.
    :param torch.dtype dtype: the matrix's floating dtype.
    :returns: A, rows summing to 1. Shape: (K, K).
    """
    num_states = check_int("num_states", num_states, minimum=2)
    lengthscale = check_positive("lengthscale", lengthscale)
    index = torch.arange(num_states, dtype=dtype)
    kernel = torch.exp(-(index[:, None] - index[None, :]) ** 2 / lengthscale)  # (K, K)
    return kernel / kernel.sum(-1, keepdim=True)


def sample_states(transition: torch.Tensor, length: int, seed: int) -> torch.Tensor:
    r"""A state path :math:`s_1, \dots, s_T` of the Markov chain with transition matrix A and a
    uniform initial distribution over :math:`s_0` (Pyro's convention, module docstring), drawn
    by :meth:`pyro.distributions.DiscreteHMM.sample` from a torch generator seeded by ``seed``
    alone (the global generator's state is left as it was).

    :param torch.Tensor transition: A, rows summing to 1 (old state, new state). Shape: (K, K).
    :param int length: T >= 1.
    :param int seed: the seed of the draw.
    :returns: int64. Shape: (T,).
    """
    length = check_int("length", length, minimum=1)
    num_states = transition.shape[-1]
    if transition.shape != (num_states, num_states):
        raise ValueError(f"transition must be a square matrix (K, K), got shape "
                         f"{tuple(transition.shape)}")
    chain = DiscreteHMM(torch.zeros(num_states, dtype=transition.dtype), transition.log(),
                        Delta(torch.arange(num_states, dtype=transition.dtype)),
                        duration=length)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return chain.sample().long()


def digit_chain(states: torch.Tensor, images: torch.Tensor, labels: torch.Tensor,
                rows: torch.Tensor, seed: int) -> DigitChain:
    """The images of a state path: frame t shows an image of the digit ``states[t]`` drawn
    uniformly, with replacement, from the pool (``images`` whose ``labels`` equal it), from a
    generator seeded by ``seed``.

    :param torch.Tensor states: the path, int64 in 0..K-1. Shape: (T,).
    :param torch.Tensor images: the pool. Shape: (N, 1, 8, 8).
    :param torch.Tensor labels: the pool's digits, int64. Shape: (N,).
    :param torch.Tensor rows: the pool's rows in ``load_digits()``. Shape: (N,).
    :param int seed: the seed of the draws.
    :raises ValueError: if a state of the path has no image in the pool.
    """
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.empty_like(states)
    for state in states.unique().tolist():
        pool = (labels == state).nonzero().squeeze(1)  # (N_s,)
        if len(pool) == 0:
            raise ValueError(f"the pool has no image of the digit {state}")
        frames = (states == state).nonzero().squeeze(1)  # (T_s,)
        chosen[frames] = pool[torch.randint(len(pool), (len(frames),), generator=generator)]
    return DigitChain(images[chosen], states, rows[chosen])
