"""The shared rule of the mixture kernels (anchors, refinement) in the three data regimes of
the benchmark: overlapping components, separated components, tight clusters far apart. Both
the dense and the streamed path, float32 values and gradients, against a float64 loop."""

import math

import pytest
import torch
from torch.distributions import Normal

from rpm.ops._gaussian_mixture import dense_gaussian_mixture_log_prob
from rpm.ops._mixture_terms import MixtureTerms, choose_anchors
from rpm.ops._streaming import streaming_gaussian_mixture_log_prob

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def mixture_loop(z, loc, scale):
    """log (1/N) sum_n N(z_m; mu_n, diag sigma_n^2), one point at a time, in float64."""
    z, loc, scale = z.double(), loc.double(), scale.double()
    rows = [torch.logsumexp(Normal(loc, scale).log_prob(point).sum(-1), 0) for point in z]
    return torch.stack(rows) - math.log(loc.shape[0])


def regime(name, num, dim, clusters=4):
    """The benchmark's regimes (benchmarks/marginal.py), at test size."""
    if name == "overlapping":
        loc, z = torch.randn(num, dim), torch.randn(num, dim)
        scale = 0.5 + torch.rand(num, dim)
    elif name == "separated":
        loc = torch.randn(num, dim)
        scale = 0.3 * (0.5 + torch.rand(num, dim))
        z = loc + scale * torch.randn(num, dim)
    else:  # tight clusters of radius ~1e-2 at distance 1e3 from the origin
        centres = torch.randn(clusters, dim)
        centres = 1e3 * centres / centres.norm(dim=1, keepdim=True)
        loc = centres[torch.arange(num) % clusters] + 1e-2 * torch.randn(num, dim)
        scale = 1e-2 * (0.5 + torch.rand(num, dim))
        z = loc + scale * torch.randn(num, dim)
    return z, loc, scale


def values_and_grads(fn, z, loc, scale, weights):
    leaves = [t.detach().clone().requires_grad_() for t in (z, loc, scale)]
    out = fn(*leaves)
    (out * weights.to(out.dtype)).sum().backward()
    return out.detach().double(), [leaf.grad.double() for leaf in leaves]


@pytest.mark.parametrize("name", ["overlapping", "separated", "tight"])
@pytest.mark.parametrize("path", ["dense", "streamed"])
def test_float32_matches_float64_loop_in_every_regime(name, path):
    z, loc, scale = regime(name, 96, 8)
    weights = torch.rand(96, dtype=torch.float64)
    fn = (dense_gaussian_mixture_log_prob if path == "dense" else
          lambda *args: streaming_gaussian_mixture_log_prob(*args, block_size=40))
    got, got_grads = values_and_grads(fn, z, loc, scale, weights)
    want, want_grads = values_and_grads(mixture_loop, z, loc, scale, weights)
    assert (got - want).abs().max() < 1e-4
    for g, w in zip(got_grads, want_grads, strict=True):
        assert ((g - w).abs().max() / w.abs().max()) < 1e-4


@pytest.mark.parametrize("path", ["dense", "streamed"])
def test_exclude_self_in_far_clusters_with_permuted_components(path):
    """Anchors permute the components (and the points with them); pair (m, m) must still be
    the one left out."""
    z, loc, scale = regime("tight", 48, 4)
    assert MixtureTerms(loc, scale, permute_points=True).perm is not None
    fn = (dense_gaussian_mixture_log_prob if path == "dense" else
          lambda *a, **k: streaming_gaussian_mixture_log_prob(*a, block_size=16, **k))
    got = fn(z, loc, scale, exclude_self=True).double()
    want = []
    for m in range(48):
        keep = torch.arange(48) != m
        want.append(mixture_loop(z[m:m + 1], loc[keep], scale[keep])[0])
    assert (got - torch.stack(want)).abs().max() < 1e-4


def test_anchors_one_per_far_cluster_and_one_for_overlapping_components():
    z, loc, scale = regime("tight", 256, 16, clusters=8)
    anchors, assignment = choose_anchors(loc, scale.reciprocal().square())
    # every cluster gets its own anchor, shared by all its components
    cluster = torch.arange(256) % 8
    for k in range(8):
        assert assignment[cluster == k].unique().numel() == 1
    assert assignment.unique().numel() == 8
    z, loc, scale = regime("overlapping", 256, 16)
    anchors, assignment = choose_anchors(loc, scale.reciprocal().square())
    assert anchors.shape[0] == 1
    torch.testing.assert_close(anchors[0], loc.mean(0))


def refinement_of(z, loc, scale):
    terms = MixtureTerms(loc, scale, permute_points=True)
    values, products = terms.block(terms.permute_rows(z), 0, loc.shape[0])
    threshold = terms.row_bounds(values, products, 0)[1] - 30.0
    near = int((values >= threshold[:, None]).sum())
    return terms, values, threshold, near, terms.refinement(values, products, 0, threshold)


def test_overlapping_components_recompute_few_of_their_near_pairs():
    """Most pairs are near their row maximum, but the expansion does not cancel there (its
    magnitude is about q): only a few per cent of them are recomputed."""
    z, loc, scale = regime("overlapping", 128, 16)
    _, _, _, near, (rows, _) = refinement_of(z, loc, scale)
    assert near > 0.5 * 128 * 128
    assert rows.numel() < 0.1 * near


def test_far_clusters_recompute_only_pairs_within_a_cluster():
    z, loc, scale = regime("tight", 128, 16)
    terms, _, _, _, (rows, cols) = refinement_of(z, loc, scale)
    cluster = (torch.arange(128) % 4)[terms.perm]  # kernel order of points and components
    assert rows.numel() < 0.1 * 128 * 128
    assert (cluster[rows] == cluster[cols]).all()


def test_separated_components_recompute_only_near_pairs():
    z, loc, scale = regime("separated", 128, 16)
    _, values, threshold, _, (rows, cols) = refinement_of(z, loc, scale)
    assert 128 <= rows.numel() < 128 * 4  # each point's own component, and few others
    assert (values[rows, cols] >= threshold[rows] - 1.0).all()


@pytest.mark.parametrize("path", ["dense", "streamed"])
def test_no_points_give_an_empty_result(path):
    fn = dense_gaussian_mixture_log_prob if path == "dense" else streaming_gaussian_mixture_log_prob
    loc, scale = torch.randn(5, 3), 0.5 + torch.rand(5, 3)
    assert fn(torch.zeros(0, 3), loc, scale).shape == (0,)
