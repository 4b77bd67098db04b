"""One dispatch policy for the mixture marginal and the InfoNCE normaliser; the fused kernel's
switch is scoped to a block of one thread or task, and a call's ``fused`` argument."""

import asyncio
import os
import threading

import pytest
import torch

import rpm.ops._dispatch as dispatch
import rpm.ops._logsumexp as logsumexp
from rpm.ops import fused_mixture_kernel, gaussian_mixture_log_prob
from rpm.ops._dispatch import (
    fused_mixture_allowed,
    ieee_float32_matmul,
    triton_available,
    use_fused_mixture,
    use_streaming,
)
from rpm.ops._gaussian_mixture import dense_gaussian_mixture_log_prob
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


def test_fused_switch_holds_inside_its_block_only_and_nests():
    assert fused_mixture_allowed()
    with fused_mixture_kernel(False):
        assert not fused_mixture_allowed()
        with fused_mixture_kernel(True):
            assert fused_mixture_allowed()
        assert not fused_mixture_allowed()
    assert fused_mixture_allowed()
    with pytest.raises(RuntimeError, match="inside"), fused_mixture_kernel(False):
        raise RuntimeError("inside")
    assert fused_mixture_allowed()  # restored on an exception too


def test_fused_switch_does_not_leak_between_threads():
    """A thread's block does not change what another, running thread sees, in either
    direction (the switch is a ContextVar, not process-global state)."""
    entered, main_read, main_entered, worker_read = (threading.Event() for _ in range(4))
    seen = {}

    def worker():
        with fused_mixture_kernel(False):
            seen["worker inside"] = fused_mixture_allowed()
            entered.set()
            main_read.wait(10)
        main_entered.wait(10)  # the main thread is inside its own block now
        seen["worker while main forbids"] = fused_mixture_allowed()
        worker_read.set()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert entered.wait(10)
        seen["main while worker forbids"] = fused_mixture_allowed()
        main_read.set()
        with fused_mixture_kernel(False):
            main_entered.set()
            assert worker_read.wait(10)
            seen["main inside"] = fused_mixture_allowed()
    finally:
        main_read.set()
        main_entered.set()
        thread.join(10)
    assert seen == {"worker inside": False, "main while worker forbids": True,
                    "worker while main forbids": True, "main inside": False}
    assert fused_mixture_allowed()


def test_fused_switch_does_not_leak_between_asyncio_tasks():
    async def forbidding(ready, done):
        with fused_mixture_kernel(False):
            ready.set()
            await done.wait()
            return fused_mixture_allowed()

    async def main():
        ready, done = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(forbidding(ready, done))
        await ready.wait()
        other = fused_mixture_allowed()  # this task, while the other one forbids
        done.set()
        return other, await task

    assert asyncio.run(main()) == (True, False)
    assert fused_mixture_allowed()


def test_a_call_chooses_the_path_and_bad_choices_are_refused():
    """fused=False and fused=None on the CPU give the dense path's values; fused=True asks for
    the kernel, which says why it cannot run here (no Triton, or CPU tensors); the choice is
    a bool or None, and a block size cannot go with fused=True."""
    generator = torch.Generator().manual_seed(0)
    z, loc = torch.randn(6, 3, generator=generator), torch.randn(5, 3, generator=generator)
    scale = 0.5 + torch.rand(5, 3, generator=generator)
    want = dense_gaussian_mixture_log_prob(z, loc, scale)
    for choice in (None, False):
        assert torch.equal(gaussian_mixture_log_prob(z, loc, scale, fused=choice), want)
    assert use_fused_mixture(z, True) and not use_fused_mixture(z, False)
    assert not use_fused_mixture(z)  # CPU tensors are never chosen automatically
    if not triton_available():
        with pytest.raises(RuntimeError, match="needs Triton"):
            gaussian_mixture_log_prob(z, loc, scale, fused=True)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="runs on CUDA tensors"):
            gaussian_mixture_log_prob(z, loc, scale, fused=True)
    with pytest.raises(TypeError, match="fused must be None"):
        gaussian_mixture_log_prob(z, loc, scale, fused=1)
    with pytest.raises(ValueError, match="takes no block_size"):
        gaussian_mixture_log_prob(z, loc, scale, block_size=4, fused=True)
    with pytest.raises(TypeError, match="True or False"):
        with fused_mixture_kernel("no"):
            pass
