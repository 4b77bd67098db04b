"""One dispatch policy for the mixture marginal and the InfoNCE normaliser."""

import pytest
import torch

import rpm.ops._dispatch as dispatch
import rpm.ops._logsumexp as logsumexp
from rpm.ops import gaussian_mixture_log_prob
from rpm.ops._dispatch import ieee_float32_matmul, use_streaming
from rpm.priors import CosineEnergy, ImplicitPrior


def test_policy_by_size_device_and_block_size():
    cpu, cuda = dispatch.STREAMING_MIN_PAIRS["cpu"], dispatch.STREAMING_MIN_PAIRS["cuda"]
    assert cpu < cuda
    assert not use_streaming(cpu, 1, "cpu") and use_streaming(cpu + 1, 1, "cpu")
    assert not use_streaming(cuda, 1, "cuda") and use_streaming(cuda, 2, torch.device("cuda"))
    assert use_streaming(2, 2, "cpu", block_size=1)  # a block size always streams


def test_mixture_and_normalizer_follow_the_same_threshold(monkeypatch):
    calls = []
    original = logsumexp._StreamingMatmulLogsumexp.apply

    def counting(*args):
        calls.append("normalizer")
        return original(*args)

    monkeypatch.setattr(logsumexp._StreamingMatmulLogsumexp, "apply", counting)
    z, z2 = torch.randn(12, 3, requires_grad=True), torch.randn(12, 3)
    scale = 0.5 + torch.rand(12, 3)
    prior = ImplicitPrior(CosineEnergy(kappa=2.0))
    for limit, streamed in ((144, False), (143, True)):
        monkeypatch.setitem(dispatch.STREAMING_MIN_PAIRS, "cpu", limit)
        calls.clear()
        mixture = gaussian_mixture_log_prob(z, z2, scale)
        prior.log_ratio(z, z2)
        assert ("Streaming" in type(mixture.grad_fn).__name__) == streamed
        assert (calls == ["normalizer"]) == streamed


def test_ieee_float32_matmul_restores_tf32_even_on_error():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with pytest.raises(RuntimeError), ieee_float32_matmul():
            assert torch.backends.cuda.matmul.allow_tf32 is False
            raise RuntimeError("inside")
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
