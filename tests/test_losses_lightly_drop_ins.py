"""rpm.losses' drop-ins for lightly's VICRegLoss, BarlowTwinsLoss, SIGReg and LeJEPALoss, DCLLoss
and DCLWLoss, HypersphereLoss: values and input gradients against float64 loops written element
by element from each paper's equation (always), against lightly 1.6.0 itself where it can be
imported (values to 1e-5 relative, input gradients to 1e-4), and their argument errors.

lightly is imported when installed, or from an unpacked lightly wheel whose directory (the one
holding ``lightly/``) is named by the environment variable ``RPM_LIGHTLY_PATH``
(``pip download lightly==1.6.0 --no-deps`` and unzip it). Its loss modules import only torch and
``lightly.utils``; ``lightly.loss``'s own ``__init__`` imports torchvision, so a module that
cannot be imported through the package is loaded from its file. Without lightly those tests
skip; the loops always run.
"""

import importlib
import importlib.util
import math
import os
import pathlib
import sys

import pytest
import torch

from rpm.losses import (
    BarlowTwinsLoss,
    DCLLoss,
    DCLWLoss,
    HypersphereLoss,
    LeJEPALoss,
    SIGReg,
    VICRegLoss,
)


def _lightly(module: str):
    """lightly.loss.<module>, or skip the test."""
    path = os.environ.get("RPM_LIGHTLY_PATH")
    if path and path not in sys.path:
        sys.path.append(path)
    if importlib.util.find_spec("lightly") is None:
        pytest.skip("lightly is not installed (or set RPM_LIGHTLY_PATH to an unpacked wheel)")
    try:
        return importlib.import_module(f"lightly.loss.{module}")
    except ImportError:  # lightly.loss's __init__ needs torchvision: load the module's file
        name = f"_lightly_loss_{module}"
        if name in sys.modules:
            return sys.modules[name]
        root = pathlib.Path(importlib.util.find_spec("lightly").origin).parent
        spec = importlib.util.spec_from_file_location(name, root / "loss" / f"{module}.py")
        loaded = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(loaded)
        except ImportError as error:
            pytest.skip(f"lightly.loss.{module} cannot be imported here: {error}")
        sys.modules[name] = loaded
        return loaded


def _pair(shape, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_()
            for _ in range(2)]


def _check_against(ours, theirs, inputs, call=None):
    """Values to 1e-5 relative and input gradients to 1e-4 (relative to the largest entry)."""
    call = call or (lambda loss, xs: loss(*xs))
    value = call(ours, inputs)
    grads = torch.autograd.grad(value, inputs)
    reference = call(theirs, inputs)
    reference_grads = torch.autograd.grad(reference, inputs)
    assert float(value.detach()) == pytest.approx(float(reference.detach()), rel=1e-5, abs=1e-7)
    for grad, ref in zip(grads, reference_grads, strict=True):
        scale = float(ref.abs().max()) + 1e-12
        assert float((grad - ref).abs().max()) <= 1e-4 * scale


def _check_against_loop(value, loop_value, inputs, tol=1e-10):
    """Value and input gradients of ``value`` against autograd through the float64 loop."""
    assert float(value.detach()) == pytest.approx(float(loop_value.detach()), rel=tol, abs=tol)
    grads = torch.autograd.grad(value, inputs, retain_graph=True)
    loop_grads = torch.autograd.grad(loop_value, inputs)
    for grad, ref in zip(grads, loop_grads, strict=True):
        torch.testing.assert_close(grad, ref, atol=tol, rtol=tol)


def _unit_rows(z):
    return [z[i] / torch.sqrt(sum(z[i, d] ** 2 for d in range(z.shape[1])))
            for i in range(z.shape[0])]


# ------------------------------------------------------------------------------ VICReg

def _vicreg_loop(z_a, z_b, lam, mu, nu, eps):
    """VICReg (Bardes et al. 2022, Eq. 1-6) element by element; a leading index after the batch
    (N, L, D) is a separate set of N latents, averaged over."""
    a3 = z_a if z_a.dim() == 3 else z_a[:, None]
    b3 = z_b if z_b.dim() == 3 else z_b[:, None]
    n, sets, d = a3.shape
    invariance = sum((a3[i, s, k] - b3[i, s, k]) ** 2 for i in range(n) for s in range(sets)
                     for k in range(d)) / (n * sets * d)

    def variance_and_covariance(z):
        v = c = 0.0
        for s in range(sets):
            means = [sum(z[i, s, k] for i in range(n)) / n for k in range(d)]
            cov = [[sum((z[i, s, k] - means[k]) * (z[i, s, e] - means[e]) for i in range(n))
                    / (n - 1) for e in range(d)] for k in range(d)]
            v = v + sum(torch.relu(1 - torch.sqrt(cov[k][k] + eps)) for k in range(d)) / d
            c = c + sum(cov[k][e] ** 2 for k in range(d) for e in range(d) if k != e) / d
        return v / sets, c / sets

    v_a, c_a = variance_and_covariance(a3)
    v_b, c_b = variance_and_covariance(b3)
    return lam * invariance + mu * (v_a + v_b) / 2 + nu * (c_a + c_b)


@pytest.mark.parametrize("shape,kwargs", [
    ((5, 3), {}),
    ((8, 4), {"lambda_param": 1.5, "mu_param": 0.5, "nu_param": 3.0, "eps": 1e-2}),
    ((4, 2, 3), {"gather_distributed": True}),
])
def test_vicreg_matches_the_loop(shape, kwargs):
    z_a, z_b = _pair(shape, seed=sum(shape))
    z_a.data *= 0.6  # some standard deviations below 1, so the hinge is active
    loop = _vicreg_loop(z_a, z_b, kwargs.get("lambda_param", 25.0), kwargs.get("mu_param", 25.0),
                        kwargs.get("nu_param", 1.0), kwargs.get("eps", 1e-4))
    _check_against_loop(VICRegLoss(**kwargs)(z_a, z_b), loop, [z_a, z_b])


@pytest.mark.parametrize("shape,kwargs", [
    ((6, 4), {}), ((16, 8), {"lambda_param": 2.0, "nu_param": 0.3, "eps": 1e-3}),
    ((5, 3, 4), {"gather_distributed": True})])
def test_vicreg_matches_lightly(shape, kwargs):
    lightly = _lightly("vicreg_loss")
    for dtype in (torch.float32, torch.float64):
        inputs = _pair(shape, seed=len(shape), dtype=dtype)
        _check_against(VICRegLoss(**kwargs), lightly.VICRegLoss(**kwargs), inputs)


# ------------------------------------------------------------------------------ Barlow Twins

def _barlow_loop(z_a, z_b, lam):
    """Barlow Twins (Zbontar et al. 2021, Eq. 1 and Algorithm 1) element by element."""
    n, d = z_a.shape

    def standardise(z):
        columns = []
        for k in range(d):
            mean = sum(z[i, k] for i in range(n)) / n
            var = sum((z[i, k] - mean) ** 2 for i in range(n)) / n
            columns.append([(z[i, k] - mean) / torch.sqrt(var + 1e-5) for i in range(n)])
        return columns

    a, b = standardise(z_a), standardise(z_b)
    cross = [[sum(a[k][i] * b[e][i] for i in range(n)) / n for e in range(d)] for k in range(d)]
    return sum((1 - cross[k][k]) ** 2 for k in range(d)) \
        + lam * sum(cross[k][e] ** 2 for k in range(d) for e in range(d) if k != e)


@pytest.mark.parametrize("shape,kwargs", [((5, 3), {}), ((7, 4), {"lambda_param": 0.3}),
                                          ((4, 2), {"gather_distributed": True})])
def test_barlow_twins_matches_the_loop(shape, kwargs):
    z_a, z_b = _pair(shape, seed=shape[0])
    loop = _barlow_loop(z_a, z_b, kwargs.get("lambda_param", 5e-3))
    _check_against_loop(BarlowTwinsLoss(**kwargs)(z_a, z_b), loop, [z_a, z_b])


@pytest.mark.parametrize("shape,kwargs", [((6, 4), {}), ((32, 16), {"lambda_param": 0.1}),
                                          ((3, 5), {"gather_distributed": True})])
def test_barlow_twins_matches_lightly(shape, kwargs):
    lightly = _lightly("barlow_twins_loss")
    for dtype in (torch.float32, torch.float64):
        inputs = _pair(shape, seed=shape[1], dtype=dtype)
        _check_against(BarlowTwinsLoss(**kwargs), lightly.BarlowTwinsLoss(**kwargs), inputs)


# ------------------------------------------------------------------------------ SIGReg, LeJEPA

def _sigreg_loop(proj, directions, knots, t_max):
    """The Epps-Pulley statistic of each slice (LeJEPA, Balestriero & LeCun 2025) against
    N(0, 1), the integral over [-t_max, t_max] as twice the trapezoidal rule on [0, t_max],
    averaged over the slices and the leading index of proj (V, N, D)."""
    views, n, d = proj.shape
    k_count = directions.shape[1]
    step = t_max / (knots - 1)
    total = 0.0
    for v in range(views):
        for k in range(k_count):
            norm = math.sqrt(sum(float(directions[e, k]) ** 2 for e in range(d)))
            x = [sum(proj[v, i, e] * float(directions[e, k]) / norm for e in range(d))
                 for i in range(n)]
            integral = 0.0
            for m in range(knots):
                t = m * step
                phi = math.exp(-t * t / 2)
                weight = step if m in (0, knots - 1) else 2 * step
                real = sum(torch.cos(t * xi) for xi in x) / n
                imag = sum(torch.sin(t * xi) for xi in x) / n
                integral = integral + weight * phi * ((real - phi) ** 2 + imag ** 2)
            total = total + n * integral
    return total / (views * k_count)


@pytest.mark.parametrize("shape,kwargs", [
    ((1, 6, 3), {"num_vectors": 4}),
    ((2, 5, 4), {"num_vectors": 3, "knots": 5, "t_max": 2.0}),
    ((1, 7, 2), {"num_vectors": 2, "knots": 2, "gather_distributed": True}),
])
def test_sigreg_matches_the_loop_with_the_same_random_directions(shape, kwargs):
    proj, _ = _pair(shape, seed=shape[1])
    torch.manual_seed(11)
    value = SIGReg(**kwargs)(proj if shape[0] > 1 else proj[0])
    torch.manual_seed(11)  # the directions lightly draws: torch.randn(D, K) in proj's dtype
    directions = torch.randn(shape[2], kwargs["num_vectors"], dtype=torch.float64)
    loop = _sigreg_loop(proj, directions, kwargs.get("knots", 17), kwargs.get("t_max", 3.0))
    _check_against_loop(value, loop, [proj])


def test_sigreg_has_its_expected_value_on_gaussian_outputs_and_grows_on_collapsed_ones():
    """For N(0, I) outputs every slice is N(0, 1), and N E[(mean cos - phi)^2 + mean sin^2] =
    1 - phi(t)^2 at every t, so E[SIGReg] = sum_m w_m phi_m (1 - phi_m^2) exactly (about 1.06).
    400 independent batches of 50: the mean's standard deviation is below 0.07; tolerance 0.3.
    Outputs collapsed to a point give N times the integral of phi (1 - phi)^2."""
    generator = torch.Generator().manual_seed(0)
    gaussian = torch.randn(400, 50, 2, generator=generator, dtype=torch.float64)
    t = torch.linspace(0, 3, 17, dtype=torch.float64)
    phi = torch.exp(-t ** 2 / 2)
    weights = torch.full((17,), 2 * 3 / 16, dtype=torch.float64)
    weights[[0, -1]] = 3 / 16
    expected = float((weights * phi * (1 - phi ** 2)).sum())
    torch.manual_seed(0)
    assert float(SIGReg(num_vectors=4)(gaussian)) == pytest.approx(expected, abs=0.3)
    torch.manual_seed(0)
    # collapsed to a point (to within 0.01), mean cos = 1 and mean sin = 0: N sum w phi (1 - phi)^2
    collapsed = 50 * float((weights * phi * (1 - phi) ** 2).sum())
    assert float(SIGReg(num_vectors=4)(0.01 * gaussian)) == pytest.approx(collapsed, rel=0.01)


def _lejepa_loop(local_proj, global_proj, lam, directions, knots, t_max):
    views = torch.cat([global_proj, local_proj])
    v, n, d = views.shape
    g = global_proj.shape[0]
    invariance = 0.0
    for i in range(n):
        for e in range(d):
            centre = sum(global_proj[j, i, e] for j in range(g)) / g
            invariance = invariance + sum((centre - views[w, i, e]) ** 2 for w in range(v))
    invariance = invariance / (v * n * d)
    return lam * _sigreg_loop(views, directions, knots, t_max) + (1 - lam) * invariance


@pytest.mark.parametrize("num_local,num_global,kwargs", [
    (1, 1, {"sigreg_num_vectors": 3}),
    (3, 2, {"lambda_param": 0.5, "sigreg_num_vectors": 2, "sigreg_knots": 4,
            "sigreg_t_max": 1.5, "gather_distributed": True}),
])
def test_lejepa_matches_the_loop(num_local, num_global, kwargs):
    generator = torch.Generator().manual_seed(num_local)
    local = torch.randn(num_local, 4, 3, generator=generator, dtype=torch.float64,
                        requires_grad=True)
    global_ = torch.randn(num_global, 4, 3, generator=generator, dtype=torch.float64,
                          requires_grad=True)
    torch.manual_seed(5)
    value = LeJEPALoss(**kwargs)(local_proj=local, global_proj=global_)
    torch.manual_seed(5)
    directions = torch.randn(3, kwargs["sigreg_num_vectors"], dtype=torch.float64)
    loop = _lejepa_loop(local, global_, kwargs.get("lambda_param", 0.05), directions,
                        kwargs.get("sigreg_knots", 17), kwargs.get("sigreg_t_max", 3.0))
    _check_against_loop(value, loop, [local, global_])


@pytest.mark.parametrize("shape,kwargs", [((5, 4), {}), ((3, 6, 2), {"num_vectors": 7}),
                                          ((9, 3), {"knots": 3, "t_max": 5.0,
                                                    "gather_distributed": True})])
def test_sigreg_matches_lightly_with_the_same_generator_state(shape, kwargs):
    lightly = _lightly("lejepa_loss")
    for dtype in (torch.float32, torch.float64):
        (proj, _) = _pair(shape, seed=shape[-1], dtype=dtype)

        def seeded(loss, xs):
            torch.manual_seed(3)
            return loss(*xs)
        _check_against(SIGReg(**kwargs), lightly.SIGReg(**kwargs), [proj], call=seeded)


@pytest.mark.parametrize("kwargs", [{}, {"lambda_param": 0.7, "sigreg_num_vectors": 16,
                                         "sigreg_knots": 9, "sigreg_t_max": 2.5}])
def test_lejepa_matches_lightly(kwargs):
    lightly = _lightly("lejepa_loss")
    generator = torch.Generator().manual_seed(1)
    local = torch.randn(4, 6, 5, generator=generator, requires_grad=True)
    global_ = torch.randn(2, 6, 5, generator=generator, requires_grad=True)

    def seeded(loss, xs):
        torch.manual_seed(4)
        return loss(local_proj=xs[0], global_proj=xs[1])
    ours, theirs = LeJEPALoss(**kwargs), lightly.LeJEPALoss(**kwargs)
    _check_against(ours, theirs, [local, global_], call=seeded)
    # a checkpoint of lightly's loss loads into ours: the same buffers (sigreg.t, .phi, .weights)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    for name, buffer in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], buffer.double())


# ------------------------------------------------------------------------------ DCL, DCLW

def _dcl_loop(out0, out1, tau, weight_fn=None):
    """DCL (Yeh et al. 2022, Eq. 6) anchor by anchor: positive the other view of the image,
    negatives both views of every other image; symmetric in the views."""
    n = out0.shape[0]
    u0, u1 = torch.stack(_unit_rows(out0)), torch.stack(_unit_rows(out1))

    def direction(a, b):
        weights = weight_fn(a, b) if weight_fn is not None else [1.0] * n
        total = 0.0
        for i in range(n):
            negatives = [a[i] @ c[j] / tau for c in (a, b) for j in range(n) if j != i]
            total = total - weights[i] * (a[i] @ b[i] / tau) + torch.logsumexp(
                torch.stack(negatives), 0)
        return total / n

    return 0.5 * (direction(u0, u1) + direction(u1, u0))


def _von_mises_fisher_weights_loop(sigma):
    def weights(a, b):
        similarities = [math.exp(float((a[i] @ b[i]).detach()) / sigma) for i in range(a.shape[0])]
        return [2 - a.shape[0] * s / sum(similarities) for s in similarities]
    return weights


@pytest.mark.parametrize("n,d,kwargs", [(2, 3, {}), (5, 4, {"temperature": 0.5}),
                                        (6, 2, {"temperature": 0.07, "gather_distributed": True})])
def test_dcl_matches_the_loop(n, d, kwargs):
    out0, out1 = _pair((n, d), seed=n)
    loop = _dcl_loop(out0, out1, kwargs.get("temperature", 0.1))
    _check_against_loop(DCLLoss(**kwargs)(out0, out1), loop, [out0, out1])


def test_dcl_with_a_weight_function_matches_the_loop():
    out0, out1 = _pair((5, 3), seed=2)

    def weight_fn(a, b):  # lightly's example: squared distances, with their gradient
        return ((a - b) ** 2).sum(1)
    loop = _dcl_loop(out0, out1, 0.2, weight_fn=weight_fn)
    _check_against_loop(DCLLoss(0.2, weight_fn=weight_fn)(out0, out1), loop, [out0, out1])


@pytest.mark.parametrize("n,kwargs", [(4, {}), (7, {"temperature": 0.3, "sigma": 0.2})])
def test_dclw_matches_the_loop(n, kwargs):
    out0, out1 = _pair((n, 3), seed=n)
    loop = _dcl_loop(out0, out1, kwargs.get("temperature", 0.1),
                     _von_mises_fisher_weights_loop(kwargs.get("sigma", 0.5)))
    _check_against_loop(DCLWLoss(**kwargs)(out0, out1), loop, [out0, out1])


def test_dcl_is_the_implicit_log_ratio_with_the_positive_out_of_the_candidates():
    """L = -(1/2N) sum_i (r_i + r'_i) + log(2N - 2), r_i = f(z_i, z'_i) - log of the mean of
    e^f over the 2N - 2 candidates of the other images."""
    n, tau = 6, 0.4
    out0, out1 = _pair((n, 3), seed=9)
    u = [_unit_rows(out0.detach()), _unit_rows(out1.detach())]
    ratios = 0.0
    for view in (0, 1):
        a, b = u[view], u[1 - view]
        for i in range(n):
            normaliser = sum(math.exp(float(a[i] @ c[j]) / tau) for c in (a, b)
                             for j in range(n) if j != i) / (2 * n - 2)
            ratios += float(a[i] @ b[i]) / tau - math.log(normaliser)
    expected = -ratios / (2 * n) + math.log(2 * n - 2)
    assert float(DCLLoss(tau)(out0, out1).detach()) == pytest.approx(expected, abs=1e-10)


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")  # lightly's DCLW weights
@pytest.mark.parametrize("n,d,kwargs", [(4, 3, {}), (16, 8, {"temperature": 0.5}),
                                        (3, 5, {"gather_distributed": True})])
def test_dcl_and_dclw_match_lightly(n, d, kwargs):
    lightly = _lightly("dcl_loss")
    for dtype in (torch.float32, torch.float64):
        inputs = _pair((n, d), seed=d, dtype=dtype)
        _check_against(DCLLoss(**kwargs), lightly.DCLLoss(**kwargs), inputs)
        _check_against(DCLWLoss(**kwargs, sigma=0.3), lightly.DCLWLoss(**kwargs, sigma=0.3),
                       inputs)

        def weight_fn(a, b):
            return ((a - b) ** 2).sum(1)
        _check_against(DCLLoss(**kwargs, weight_fn=weight_fn),
                       lightly.DCLLoss(**kwargs, weight_fn=weight_fn), inputs)


# ------------------------------------------------------------------------------ Hypersphere

def _hypersphere_loop(z_a, z_b, t, lam, alpha):
    """Alignment and uniformity (Wang & Isola 2020, Eq. 4-5) pair by pair."""
    n = z_a.shape[0]
    x, y = _unit_rows(z_a), _unit_rows(z_b)
    alignment = sum(torch.sqrt(((x[i] - y[i]) ** 2).sum()) ** alpha for i in range(n)) / n

    def uniformity(u):
        terms = [torch.exp(-t * ((u[i] - u[j]) ** 2).sum()) for i in range(n)
                 for j in range(i + 1, n)]
        return torch.log(sum(terms) / len(terms))

    return alignment + lam * (uniformity(x) + uniformity(y)) / 2


@pytest.mark.parametrize("n,d,kwargs", [(2, 3, {}), (6, 4, {"t": 3.0, "lam": 0.5, "alpha": 1.5}),
                                        (5, 2, {"t": 0.2, "alpha": 3.0})])
def test_hypersphere_matches_the_loop(n, d, kwargs):
    z_a, z_b = _pair((n, d), seed=n + d)
    loop = _hypersphere_loop(z_a, z_b, kwargs.get("t", 1.0), kwargs.get("lam", 1.0),
                             kwargs.get("alpha", 2.0))
    _check_against_loop(HypersphereLoss(**kwargs)(z_a, z_b), loop, [z_a, z_b])


def test_hypersphere_bounds_the_negative_rbf_implicit_log_ratio():
    """alpha = 2, lam = 1 / t: t L >= the mean over both directions of -f(x_i, y_i) + log Z(x_i),
    f = -t |u - v|^2, Z(x_i) the mean of e^f over the other latents of x_i's view (Jensen)."""
    n, t = 7, 2.0
    z_a, z_b = (z.detach() for z in _pair((n, 3), seed=4))
    x, y = _unit_rows(z_a), _unit_rows(z_b)
    negative_ratio = 0.0
    for a, b in ((x, y), (y, x)):
        for i in range(n):
            normaliser = sum(math.exp(-t * float(((a[i] - a[j]) ** 2).sum()))
                             for j in range(n) if j != i) / (n - 1)
            negative_ratio += t * float(((a[i] - b[i]) ** 2).sum()) + math.log(normaliser)
    bound = t * float(HypersphereLoss(t=t, lam=1 / t)(z_a, z_b))
    assert bound >= negative_ratio / (2 * n) - 1e-12
    assert bound - negative_ratio / (2 * n) < 1.0  # a bound, not a different scale


@pytest.mark.parametrize("n,d,kwargs", [(4, 3, {}), (12, 6, {"t": 2.0, "lam": 0.3, "alpha": 1.0})])
def test_hypersphere_matches_lightly(n, d, kwargs):
    lightly = _lightly("hypersphere_loss")
    for dtype in (torch.float32, torch.float64):
        inputs = _pair((n, d), seed=n, dtype=dtype)
        _check_against(HypersphereLoss(**kwargs), lightly.HypersphereLoss(**kwargs), inputs)


# ------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("make,call,error,match", [
    (VICRegLoss, lambda f: f(torch.randn(1, 3), torch.randn(1, 3)), ValueError,
     "at least 2 images"),
    (VICRegLoss, lambda f: f(torch.randn(4, 3), torch.randn(4, 2)), ValueError, "same shape"),
    (VICRegLoss, lambda f: f(torch.randn(4), torch.randn(4)), ValueError, r"\(N, \.\.\., D\)"),
    (lambda: VICRegLoss(mu_param=-1.0), None, ValueError, "mu_param must be >= 0"),
    (lambda: VICRegLoss(gather_distributed=1), None, TypeError, "gather_distributed"),
    (BarlowTwinsLoss, lambda f: f(torch.randn(1, 3), torch.randn(1, 3)), ValueError,
     "at least 2 images"),
    (BarlowTwinsLoss, lambda f: f(torch.randn(4, 2, 3), torch.randn(4, 2, 3)), ValueError,
     r"\(N, D\)"),
    (lambda: SIGReg(knots=1), None, ValueError, "knots must be an integer greater than one"),
    (lambda: SIGReg(t_max=0.0), None, ValueError, "t_max must be greater than zero"),
    (lambda: SIGReg(num_vectors=0), None, ValueError, "num_vectors must be a positive integer"),
    (SIGReg, lambda f: f(torch.randn(5)), ValueError, r"\(\.\.\., N, D\)"),
    (lambda: LeJEPALoss(lambda_param=1.5), None, ValueError, r"unit interval \[0, 1\]"),
    (LeJEPALoss, lambda f: f(local_proj=torch.randn(2, 4, 3), global_proj=torch.randn(1, 5, 3)),
     ValueError, "same batch and feature dimensions"),
    (LeJEPALoss, lambda f: f(local_proj=torch.randn(0, 4, 3), global_proj=torch.randn(1, 4, 3)),
     ValueError, "at least one view"),
    (lambda: DCLLoss(temperature=0.0), None, ValueError, "temperature must be a finite number > 0"),
    (lambda: DCLLoss(weight_fn=3), None, TypeError, "weight_fn"),
    (DCLLoss, lambda f: f(torch.randn(1, 3), torch.randn(1, 3)), ValueError, "at least 2 images"),
    (lambda: DCLLoss(weight_fn=lambda a, b: torch.ones(2)),
     lambda f: f(torch.randn(4, 3), torch.randn(4, 3)), ValueError, r"shape \(4,\)"),
    (lambda: DCLWLoss(sigma=-1.0), None, ValueError, "sigma must be > 0"),
    (lambda: HypersphereLoss(t=0.0), None, ValueError, "t must be > 0"),
    (HypersphereLoss, lambda f: f(torch.randn(1, 3), torch.randn(1, 3)), ValueError,
     "at least 2 images"),
    (HypersphereLoss, lambda f: f(torch.randn(3, 3), torch.randn(4, 3)), ValueError,
     "same shape"),
])
def test_bad_input_is_one_clear_error(make, call, error, match):
    with pytest.raises(error, match=match):
        loss = make()
        if call is not None:
            call(loss)
