"""The streamed kernels under ``torch.compile`` (CPU, inductor): the same values and gradients
as eager, on one small case with several blocks, anchors and refined pairs."""

import pytest
import torch

from rpm.ops import streaming_matmul_logsumexp
from rpm.ops._mixture_terms import MixtureTerms
from rpm.ops._streaming import streaming_gaussian_mixture_log_prob
from tests.ops.test_mixture_terms import mixture_loop, regime

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


def both_kernels(z, loc, scale):
    mixture = streaming_gaussian_mixture_log_prob(z, loc, scale, block_size=12)
    normalizer = streaming_matmul_logsumexp(z / 1e3, loc / 1e3, block_size=12)
    return mixture, normalizer


def values_and_grads(fn, inputs):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    mixture, normalizer = fn(*leaves)
    (mixture.sum() + normalizer.sum()).backward()
    return [mixture.detach(), normalizer.detach()], [leaf.grad for leaf in leaves]


@pytest.mark.slow
def test_compiled_streamed_kernels_match_eager():
    torch._dynamo.reset()
    z, loc, scale = regime("tight", 24, 4, clusters=2)  # 2 x 2 blocks, one anchor per cluster
    terms = MixtureTerms(loc, scale, permute_points=True)
    assert terms.perm is not None
    eager_values, eager_grads = values_and_grads(both_kernels, (z, loc, scale))
    compiled_values, compiled_grads = values_and_grads(torch.compile(both_kernels), (z, loc, scale))
    for got, want in zip(compiled_values + compiled_grads, eager_values + eager_grads, strict=True):
        assert ((got - want).abs().max() / want.abs().max().clamp_min(1.0)) < 1e-6
    assert (compiled_values[0].double() - mixture_loop(z, loc, scale)).abs().max() < 1e-4
