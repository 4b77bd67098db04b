"""``rpm.experiments.identifiability.data``: the pair stream as a pure function of the step and
the held-out set."""

import math

import pytest
import torch

from rpm.data.synthetic import InvertibleMLP, LatentProcess
from rpm.experiments.identifiability.data import PairStream, held_out_set

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _stream(chunk_steps=4, batch_size=8, seed=3, kappa=5.0):
    process = LatentProcess(dim=4, space="sphere", conditional="vmf", conditional_param=kappa)
    mixing = InvertibleMLP(4, seed=1)
    return PairStream(process, mixing, batch_size, seed, chunk_steps), mixing


def test_pair_stream_is_a_pure_function_of_the_step():
    """A fresh stream (a resumed run) gives the minibatch of any step exactly, whatever steps
    were drawn before; different steps give different pairs."""
    stream, _ = _stream()
    sequence = [stream(step) for step in range(10)]
    fresh, _ = _stream()
    for step in (9, 2, 5, 4):  # out of order, across chunk boundaries
        x, x2 = fresh(step)
        assert torch.equal(x, sequence[step][0]) and torch.equal(x2, sequence[step][1])
    assert not torch.equal(sequence[3][0], sequence[4][0])
    other_seed = PairStream(stream.process, stream.mixing, 8, seed=4, chunk_steps=4)
    assert not torch.equal(other_seed(0)[0], sequence[0][0])


def test_pair_stream_observes_the_mixed_vmf_pairs():
    """x = g(z) and x' = g(z') for the recomputed latents; the positives follow vMF(z, kappa):
    E[z^T z'] = A_4(kappa) = I_2(kappa) / I_1(kappa) (Monte Carlo, 4 standard errors)."""
    from scipy.special import iv

    kappa = 5.0
    stream, mixing = _stream(chunk_steps=2, batch_size=4000, kappa=kappa)
    x, x2 = stream(1)
    z, z2 = stream.latents(1)
    torch.testing.assert_close(x, mixing(z))
    torch.testing.assert_close(x2, mixing(z2))
    cosine = (z * z2).sum(-1).double()
    expected = iv(2, kappa) / iv(1, kappa)
    assert abs(cosine.mean().item() - expected) < 4 * cosine.std().item() / math.sqrt(4000)


def test_held_out_set_is_fresh_and_reproducible():
    process = LatentProcess(dim=3, space="box", conditional="laplace")
    mixing = InvertibleMLP(3, seed=0)
    z, x = held_out_set(process, mixing, 100, seed=11)
    z_again, _ = held_out_set(process, mixing, 100, seed=11)
    z_other, _ = held_out_set(process, mixing, 100, seed=12)
    assert torch.equal(z, z_again) and not torch.equal(z, z_other)
    torch.testing.assert_close(x, mixing(z))
    assert z.abs().max() <= 1.0
