"""The generic blocked mixture log-density: against float64 loops written from Eq. 11, block
sizes that do not divide N, gradients, and the size of what each block evaluates."""

import math

import pytest
import torch
from pyro.distributions import Normal, ProjectedNormal, StudentT

from rpm.ops import distribution_mixture_log_prob
from rpm.ops._distribution_mixture import distribution_mixture_block_rows
from rpm.ops._gaussian_mixture import gaussian_mixture_log_prob

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def student_t_log_density(z, df, loc, scale):
    """log of the product over d of the Student-t density, written from its formula (scalars)."""
    total = 0.0
    for zd, ld, sd in zip(z, loc, scale, strict=True):
        u = (zd - ld) / sd
        total += (math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                  - math.log(sd) - (df + 1) / 2 * math.log1p(u * u / df))
    return total


def logsumexp_loop(values):
    finite = [v for v in values if v != -math.inf]
    top = max(finite)
    return top + math.log(sum(math.exp(v - top) for v in finite))


def student_t_mixture_loop(z, df, loc, scale, exclude_self=False):
    """Eq. 11 one row at a time in float64: logsumexp_n log Q(z_m | x_n) - log N."""
    n = loc.shape[0]
    rows = []
    for m in range(z.shape[0]):
        terms = [student_t_log_density(z[m].tolist(), df, loc[j].tolist(), scale[j].tolist())
                 if not (exclude_self and j == m) else -math.inf for j in range(n)]
        rows.append(logsumexp_loop(terms) - math.log(n - 1 if exclude_self else n))
    return torch.tensor(rows, dtype=torch.float64)


def student_t(n=7, d=3, df=3.5):
    loc = torch.randn(n, d, dtype=torch.float64)
    scale = torch.rand(n, d, dtype=torch.float64) + 0.3
    return StudentT(df, loc, scale).to_event(1), loc, scale


@pytest.mark.parametrize("block_size", [None, 1, 2, 3, 5, 7, 11])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_student_t_mixture_matches_the_loop(block_size, exclude_self):
    """N = 7 components; blocks of 2, 3, 5 rows do not divide N (nor M = 7 rows)."""
    q, loc, scale = student_t()
    z = loc + 0.8 * torch.randn_like(loc)
    result = distribution_mixture_log_prob(q, z, exclude_self, block_size)
    expected = student_t_mixture_loop(z, 3.5, loc, scale, exclude_self)
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("block_size", [None, 2, 4])
def test_projected_normal_mixture_on_the_sphere_matches_the_loop(block_size):
    """Components on the sphere S^2: the loop evaluates each component at each point alone."""
    n = 6
    concentration = 3.0 * torch.randn(n, 3, dtype=torch.float64)
    q = ProjectedNormal(concentration)
    z = q.sample((2,)).reshape(-1, 3)[:9]  # 9 points on the sphere, not a multiple of 2 or 4
    result = distribution_mixture_log_prob(q, z, block_size=block_size)
    expected = torch.tensor([
        logsumexp_loop([ProjectedNormal(concentration[j]).log_prob(z[m]).item() for j in range(n)])
        - math.log(n) for m in range(z.shape[0])], dtype=torch.float64)
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-12)


def test_projected_normal_mixture_integrates_to_one_on_the_sphere():
    """Monte Carlo over the uniform distribution on S^2 (area 4 pi): the mean of Q(z) 4 pi is
    1 within 5 standard errors (200k points)."""
    q = ProjectedNormal(torch.randn(5, 3, dtype=torch.float64))
    points = torch.nn.functional.normalize(torch.randn(200_000, 3, dtype=torch.float64), dim=-1)
    density = distribution_mixture_log_prob(q, points).exp() * 4 * math.pi
    standard_error = density.std() / math.sqrt(points.shape[0])
    assert abs(density.mean().item() - 1.0) < 5 * standard_error.item()


def test_gaussian_components_agree_with_the_gaussian_kernel():
    """The generic path on Normal(loc, scale).to_event(1) equals the fast Gaussian kernel."""
    loc = torch.randn(9, 4, dtype=torch.float64)
    scale = torch.rand(9, 4, dtype=torch.float64) + 0.2
    z = torch.randn(13, 4, dtype=torch.float64)
    generic = distribution_mixture_log_prob(Normal(loc, scale).to_event(1), z, block_size=4)
    torch.testing.assert_close(generic, gaussian_mixture_log_prob(z, loc, scale),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("exclude_self", [False, True])
def test_gradients_of_the_blocked_path_match_the_unblocked_and_the_loop(exclude_self):
    """Blocks of 3 rows (checkpointed, recomputed in the backward pass) against one block and
    against autograd through the float64 loop, for the latents, locations, scales and df."""
    n, d = 7, 2
    base_loc = torch.randn(n, d, dtype=torch.float64)
    base_scale = torch.rand(n, d, dtype=torch.float64) + 0.4
    base_z = base_loc + torch.randn(n, d, dtype=torch.float64)
    weights = torch.randn(n, dtype=torch.float64)  # a generic linear functional of the output

    def grads(compute):
        loc, scale, z = (t.clone().requires_grad_() for t in (base_loc, base_scale, base_z))
        df = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
        (compute(z, df, loc, scale) * weights).sum().backward()
        return [t.grad for t in (z, df, loc, scale)]

    def blocked(size):
        return lambda z, df, loc, scale: distribution_mixture_log_prob(
            StudentT(df, loc, scale).to_event(1), z, exclude_self, block_size=size)

    def loop(z, df, loc, scale):  # Eq. 11 with torch scalars, one (m, j) pair at a time
        rows = []
        for m in range(n):
            terms = torch.stack([StudentT(df, loc[j], scale[j]).log_prob(z[m]).sum()
                                 for j in range(n) if not (exclude_self and j == m)])
            rows.append(torch.logsumexp(terms, 0) - math.log(terms.numel()))
        return torch.stack(rows)

    expected = grads(loop)
    for size in (3, None):
        for got, want in zip(grads(blocked(size)), expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_gradcheck_through_checkpointed_blocks():
    loc = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    z = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    scale = torch.rand(5, 2, dtype=torch.float64) + 0.5

    def function(z, loc):
        return distribution_mixture_log_prob(StudentT(3.0, loc, scale).to_event(1), z,
                                             block_size=2)

    assert torch.autograd.gradcheck(function, (z, loc))


class _RecordingStudentT(StudentT):
    """A Student-t that records the shape of every value its log_prob is asked for."""

    shapes: list = []

    def log_prob(self, value):
        _RecordingStudentT.shapes.append(tuple(value.shape))
        return super().log_prob(value)


def test_each_block_evaluates_at_most_block_rows_against_the_components():
    """Never the M x N x D broadcast: each log_prob call sees (B, 1, D) with B <= the block,
    in the forward pass and in the backward pass's recomputation."""
    n, d, rows = 10, 3, 4
    loc = torch.randn(n, d, requires_grad=True)
    q = _RecordingStudentT(5.0, loc, torch.ones(n, d)).to_event(1)
    _RecordingStudentT.shapes = []
    distribution_mixture_log_prob(q, torch.randn(n, d), block_size=rows).sum().backward()
    assert _RecordingStudentT.shapes  # the forward pass and the recomputation
    assert len(_RecordingStudentT.shapes) == 2 * math.ceil(n / rows)
    assert all(shape[0] <= rows and shape[1:] == (1, d) for shape in _RecordingStudentT.shapes)
    assert loc.grad is not None and torch.isfinite(loc.grad).all()


def test_default_block_keeps_the_broadcast_under_two_to_the_22_elements():
    assert distribution_mixture_block_rows(1000, 64) * 1000 * 64 <= 1 << 22
    assert distribution_mixture_block_rows(1 << 23, 1) == 1  # at least one row
    q = _RecordingStudentT(5.0, torch.zeros(4096, 8), torch.ones(4096, 8)).to_event(1)
    _RecordingStudentT.shapes = []
    with torch.no_grad():
        distribution_mixture_log_prob(q, torch.randn(300, 8))
    assert all(shape[0] * 4096 * 8 <= 1 << 22 for shape in _RecordingStudentT.shapes)
    assert len(_RecordingStudentT.shapes) == math.ceil(300 / 128)


def test_bad_arguments_get_one_line_errors():
    q, loc, _ = student_t()
    with pytest.raises(ValueError, match=r"shape \(M, 3\)"):
        distribution_mixture_log_prob(q, torch.zeros(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="to_event"):
        distribution_mixture_log_prob(StudentT(3.0, loc, 1.0), loc)
    with pytest.raises(ValueError, match="as many points as components"):
        distribution_mixture_log_prob(q, loc[:3], exclude_self=True)
    with pytest.raises(ValueError, match="block_size"):
        distribution_mixture_log_prob(q, loc, block_size=0)
