r"""The bounds of rpm.mi against closed forms on the correlated Gaussian pair.

Critic :math:`f = c \log r + b` of a pair of D correlated standard normals. Under
:math:`p(x)p(y)`, :math:`E[r^c] = \prod_d (1-\rho^2)^{-c/2} ((1 + k\rho)^2 - k^2)^{-1/2}` with
:math:`k = c\rho / (1 - \rho^2)` (a Gaussian integral of :math:`e^{-v^\top A v / 2}`,
:math:`A = k [[\rho, -1], [-1, \rho]]`), and :math:`E_p[\log r] = I`; so every bound's
population value is a closed form. Monte Carlo: B independent batches of N pairs in float64,
the mean over batches within 4 standard errors (plus the stated allowance for a known bias) of
the closed form.
"""

import functools
import math

import pytest
import torch

from rpm.mi import (
    MINE,
    CorrelatedGaussian,
    barber_agakov,
    dv,
    info_nce_bound,
    interpolated,
    js,
    nwj,
    smile,
    tuba,
)

DIM, MI = 2, 1.0
C, B = 0.8, 0.3  # a critic off the optimum, so the tests see more than I


def ratio_moment(c, rho, dim):
    """E_{p(x)p(y)}[r^c] in closed form (module docstring)."""
    k = c * rho / (1 - rho**2)
    per_dim = (1 - rho**2) ** (-c / 2) * ((1 + k * rho) ** 2 - k**2) ** -0.5
    return per_dim**dim


@functools.lru_cache(maxsize=8)
def score_batches(mi, dim, n, count, c, b):
    """``count`` independent score matrices of ``n`` pairs, F = c log r + b (float64)."""
    pair = CorrelatedGaussian.with_mi(mi, dim)
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        x, y = pair.sample(n, gen, dtype=torch.float64)
        out.append(c * pair.log_ratio(x[:, None], y[None]) + b)
    return torch.stack(out)


def batches(fn, pair, n=256, count=48, c=C, b=B):
    """The mean over batches of a bound and its standard error."""
    values = fn(score_batches(pair.mutual_information, pair.dim, n, count, c, b))
    return values.mean().item(), values.std().item() / math.sqrt(count)


@pytest.fixture
def pair():
    return CorrelatedGaussian.with_mi(MI, DIM)


def test_ratio_moment_of_one_is_one(pair):
    assert ratio_moment(1.0, pair.rho, DIM) == pytest.approx(1.0, abs=1e-12)


def test_nwj_tuba_js_dv_match_their_closed_forms(pair):
    m = ratio_moment(C, pair.rho, DIM)
    closed = {
        "nwj": C * MI + B - math.exp(B - 1) * m,
        "tuba": 1 + C * MI + B - 0.5 - math.exp(B) * m / math.exp(0.5),
        "js": 1 + C * MI + B - math.exp(B) * m,
        "dv": C * MI - math.log(m),
    }
    estimators = {"nwj": nwj, "tuba": lambda s: tuba(s, 0.5), "js": js, "dv": dv}
    for name, fn in estimators.items():
        mean, se = batches(fn, pair)
        # dv: the log of a mean of 65280 negatives, biased upward by about Var/(2 n E^2)
        allowance = 0.005 if name == "dv" else 0.0
        assert abs(mean - closed[name]) < 4 * se + allowance, (name, mean, closed[name], se)


def test_optimal_critics_give_the_mutual_information(pair):
    """NWJ at 1 + log r, JS and TUBA (a = 1) at log r, DV at log r + 7: all equal I."""
    for fn, c, b in [(nwj, 1.0, 1.0), (js, 1.0, 0.0), (lambda s: tuba(s, 0.0), 1.0, 0.0),
                     (dv, 1.0, 7.0)]:
        mean, se = batches(fn, pair, c=c, b=b)
        assert abs(mean - MI) < 4 * se + 0.005


def test_info_nce_is_bracketed_by_its_closed_form_bounds(pair):
    r"""At f = log r: :math:`I - (E_q[r^2] - 1)/N \le E[I_\text{NCE}] \le I` (Jensen over the
    negatives, then :math:`\log(1+u) \le u`)."""
    n = 64
    mean, se = batches(info_nce_bound, pair, n=n, count=64, c=1.0, b=0.0)
    lower = MI - (ratio_moment(2.0, pair.rho, DIM) - 1) / n
    assert lower - 4 * se <= mean <= MI + 4 * se
    assert lower < MI - 0.01  # the bracket is not trivial at this N


def test_info_nce_never_exceeds_log_n():
    big = CorrelatedGaussian.with_mi(10.0, 20)
    x, y = big.sample(32, torch.Generator().manual_seed(0), dtype=torch.float64)
    scores = big.log_ratio(x[:, None], y[None])
    assert info_nce_bound(scores).item() <= math.log(32)
    assert info_nce_bound(scores).item() > math.log(32) - 0.1  # saturated: I = 10 >> log 32
    adversarial = torch.full((8, 8), -1e4, dtype=torch.float64).fill_diagonal_(1e4)
    assert info_nce_bound(adversarial).item() == pytest.approx(math.log(8), abs=1e-12)


def test_info_nce_is_log_n_minus_the_cross_entropy():
    scores = torch.randn(3, 10, 10, dtype=torch.float64)
    ce = torch.stack([torch.nn.functional.cross_entropy(s, torch.arange(10)) for s in scores])
    torch.testing.assert_close(info_nce_bound(scores), math.log(10) - ce)


def gauss_clip_expectation(rho, tau, grid=2401, half_width=10.0):
    """E_{p(x)p(y)}[clip(r, e^-tau, e^tau)] for one pair, by the trapezoidal rule on a grid."""
    t = torch.linspace(-half_width, half_width, grid, dtype=torch.float64)
    x, y = torch.meshgrid(t, t, indexing="ij")
    log_r = (-0.5 * math.log(1 - rho**2) - (y - rho * x) ** 2 / (2 * (1 - rho**2)) + y**2 / 2)
    density = torch.exp(-(x**2 + y**2) / 2) / (2 * math.pi)
    integrand = log_r.clamp(-tau, tau).exp() * density
    return torch.trapezoid(torch.trapezoid(integrand, t, dim=1), t).item()


def test_smile_matches_its_clipped_closed_form():
    pair = CorrelatedGaussian.with_mi(0.8, 1)
    tau = 0.5
    expected = 0.8 - math.log(gauss_clip_expectation(pair.rho, tau))
    mean, se = batches(lambda s: smile(s, tau), pair, c=1.0, b=0.0)
    assert abs(mean - expected) < 4 * se + 0.003
    assert abs(expected - 0.8) > 0.015  # the clip matters at this tau (by 0.022 nats)


def test_smile_with_a_large_clip_is_dv():
    scores = torch.randn(12, 12, dtype=torch.float64)
    torch.testing.assert_close(smile(scores, 50.0), dv(scores))


def test_barber_agakov_is_mi_minus_the_expected_kl(pair):
    r"""q(y|x) = N(s x, v I) against p(y|x) = N(rho x, (1 - rho^2) I):
    E_x KL = D [ log sqrt(v / w) + (w + (rho - s)^2) / (2 v) - 1/2 ], w = 1 - rho^2."""
    s, v = 0.5, 0.6
    w = 1 - pair.rho**2
    kl = DIM * (0.5 * math.log(v / w) + (w + (pair.rho - s) ** 2) / (2 * v) - 0.5)
    gen = torch.Generator().manual_seed(2)
    values = []
    for _ in range(32):
        x, y = pair.sample(512, gen, dtype=torch.float64)
        cond = torch.distributions.Normal(s * x, math.sqrt(v)).log_prob(y).sum(-1)
        marg = torch.distributions.Normal(0.0, 1.0).log_prob(y).sum(-1)
        values.append(barber_agakov(cond, marg).item())
    values = torch.tensor(values)
    se = values.std().item() / math.sqrt(len(values))
    assert abs(values.mean().item() - (MI - kl)) < 4 * se


def interpolated_loop(scores, log_a, alpha):
    """I_alpha written from its definition with explicit loops (float64)."""
    n = scores.shape[0]
    e = scores.exp()

    def baseline(i, left_out):
        m = sum(e[i, k] for k in range(n) if k != left_out) / (n - 1)
        return alpha * m + (1 - alpha) * math.exp(log_a[i])

    joint = sum(scores[i, i] - math.log(baseline(i, l)) for i in range(n) for l in range(n)
                if l != i) / (n * (n - 1))
    marginal = sum(e[i, j] / baseline(i, j) for i in range(n) for j in range(n)
                   if j != i) / (n * (n - 1))
    return 1 + joint - marginal


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.5, 1.0])
def test_interpolated_against_a_loop(alpha):
    scores = torch.randn(6, 6, dtype=torch.float64) * 2
    log_a = torch.randn(6, dtype=torch.float64)
    expected = interpolated_loop(scores, log_a.tolist(), alpha)
    assert interpolated(scores, log_a, alpha).item() == pytest.approx(float(expected), abs=1e-12)


def test_interpolated_at_alpha_zero_is_tuba_and_respects_its_ceiling():
    scores = torch.randn(2, 9, 9, dtype=torch.float64)
    log_a = torch.randn(2, 9, dtype=torch.float64)
    torch.testing.assert_close(interpolated(scores, log_a, 0.0), tuba(scores, log_a))
    adversarial = torch.full((16, 16), -50.0, dtype=torch.float64).fill_diagonal_(50.0)
    for alpha in (0.01, 0.1, 1.0):
        value = interpolated(adversarial, 0.0, alpha).item()
        assert value <= 1 + math.log(15 / alpha) + 1e-9
        assert value > 1 + math.log(15 / alpha) - 1e-6  # the ceiling is reached


def test_interpolated_is_below_the_mutual_information(pair):
    mean, se = batches(lambda s: interpolated(s, 0.0, 0.3), pair, n=64, count=32, c=1.0, b=0.0)
    assert mean <= MI + 4 * se


def test_mine_value_is_dv_and_its_gradient_uses_the_moving_average():
    n, beta = 5, 0.9
    mine = MINE(momentum=beta)
    first = torch.randn(n, n, dtype=torch.float64)
    second = torch.randn(n, n, dtype=torch.float64, requires_grad=True)
    mine(first)
    value = mine(second)
    torch.testing.assert_close(value, dv(second))
    value.backward()
    off = ~torch.eye(n, dtype=torch.bool)
    e = second.detach().exp()
    moving = beta * first.exp()[off].mean() + (1 - beta) * e[off].mean()
    expected = torch.where(off, -e / (n * (n - 1)) / moving, torch.full_like(e, 1.0 / n))
    torch.testing.assert_close(second.grad, expected)
    torch.testing.assert_close(mine.running_mean, moving)


def test_js_value_is_nwj_at_one_plus_f_and_its_gradient_the_fgan_objective():
    n = 6
    scores = torch.randn(n, n, dtype=torch.float64, requires_grad=True)
    value = js(scores)
    torch.testing.assert_close(value, nwj(scores.detach() + 1))
    value.backward()
    off = ~torch.eye(n, dtype=torch.bool)
    s = scores.detach()
    expected = torch.where(off, -torch.sigmoid(s) / (n * (n - 1)), torch.sigmoid(-s) / n)
    torch.testing.assert_close(scores.grad, expected)


def test_batched_scores_give_one_value_per_matrix():
    scores = torch.randn(3, 7, 7, dtype=torch.float64)
    for fn in (nwj, dv, js, info_nce_bound, smile, lambda s: interpolated(s, 0.0, 0.1)):
        batched = fn(scores)
        assert batched.shape == (3,)
        torch.testing.assert_close(batched, torch.stack([fn(s) for s in scores]))


@pytest.mark.parametrize("call, message", [
    (lambda: nwj(torch.zeros(3, 4)), "square"),
    (lambda: dv(torch.zeros(1, 1)), "N >= 2"),
    (lambda: info_nce_bound(torch.zeros(3, 3, dtype=torch.long)), "floating-point"),
    (lambda: interpolated(torch.zeros(3, 3), 0.0, 1.5), "alpha"),
    (lambda: smile(torch.zeros(3, 3), 0.0), "tau"),
    (lambda: MINE(momentum=1.0), "momentum"),
    (lambda: barber_agakov(torch.zeros(3), torch.zeros(4)), "same shape"),
])
def test_bad_input_is_refused_in_one_line(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
