"""Each energy's pairwise matrix against a double loop written from its formula (float64)."""

import pytest
import torch

from rpm.ops import squared_distances
from rpm.priors import AnisotropicEnergy, BilinearEnergy, CosineEnergy, LpEnergy, NeuralEnergy, RBFEnergy

D = 4


def unit(v):
    return v / v.norm()


def formula(energy, a, b):
    """f(a, b) for one pair, straight from the table of energies in ``docs/theory.md#energies``."""
    if isinstance(energy, BilinearEnergy):
        return a @ energy.weight @ b
    if isinstance(energy, CosineEnergy):
        return energy.kappa * unit(a) @ unit(b)
    if isinstance(energy, RBFEnergy):
        return -((a - b) ** 2).sum() / (2 * energy.lengthscale**2)
    if isinstance(energy, AnisotropicEnergy):
        diff = unit(a) - unit(b) if energy.normalize else a - b
        return -0.5 * (diff * energy.concentration * diff).sum()
    if isinstance(energy, LpEnergy):
        return -((a - b).abs() ** energy.p).sum() / energy.tau
    if isinstance(energy, NeuralEnergy):
        hidden = torch.nn.functional.softplus(
            energy.first.weight @ a + energy.first.bias + energy.second.weight @ b
        )
        return energy.out.weight[0] @ hidden + energy.out.bias[0]
    raise AssertionError(type(energy))


def make_energies():
    bilinear = BilinearEnergy(D)
    with torch.no_grad():
        bilinear.weight.copy_(torch.randn(D, D))
    anisotropic = AnisotropicEnergy(D, normalize=True)
    anisotropic_raw = AnisotropicEnergy(D, normalize=False, init=0.5)
    return [
        bilinear,
        CosineEnergy(kappa=3.0),
        CosineEnergy(kappa=2.0, learn_kappa=True),
        RBFEnergy(lengthscale=0.7),
        anisotropic,
        anisotropic_raw,
        LpEnergy(p=1.0, tau=0.5),
        LpEnergy(p=3.0, tau=2.0),
        LpEnergy(p=2.0, tau=1.5),
        NeuralEnergy(D, hidden=8),
    ]


@pytest.mark.parametrize("index", range(10))
def test_pairwise_matrix_matches_loop(index):
    torch.set_default_dtype(torch.float64)
    energy = make_energies()[index]
    z = torch.randn(5, D)
    z2 = torch.randn(6, D)
    matrix = energy(z, z2)
    assert matrix.shape == (5, 6)
    with torch.no_grad():
        loop = torch.stack([torch.stack([formula(energy, a, b) for b in z2]) for a in z])
    torch.testing.assert_close(matrix, loop, rtol=1e-10, atol=1e-10)
    paired = energy.paired(z, z2[:5])
    torch.testing.assert_close(paired, torch.diagonal(energy(z, z2[:5])), rtol=1e-10, atol=1e-10)


def test_squared_distances_are_accurate_in_float32_far_from_origin():
    a = 1000.0 + torch.randn(20, 3, dtype=torch.float64)
    b = a + 1e-2 * torch.randn(20, 3, dtype=torch.float64)
    exact = ((a[:, None] - b[None]) ** 2).sum(-1)
    approx = squared_distances(a.float(), b.float()).double()
    assert (approx - exact).abs().max() < 1e-3 * exact.max()


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: CosineEnergy(kappa=0.0), "kappa"),
        (lambda: CosineEnergy(kappa=-1.0), "kappa"),
        (lambda: RBFEnergy(lengthscale=-2.0), "lengthscale"),
        (lambda: RBFEnergy(lengthscale=float("nan")), "lengthscale"),
        (lambda: LpEnergy(p=0.0), "p must"),
        (lambda: LpEnergy(tau=0.0), "tau"),
        (lambda: AnisotropicEnergy(0), "dim"),
        (lambda: AnisotropicEnergy(3, init=0.0), "init"),
        (lambda: NeuralEnergy(3, hidden=0), "hidden"),
    ],
)
def test_bad_hyperparameters_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_dimension_that_is_not_an_integer_is_a_type_error():
    with pytest.raises(TypeError, match="dim must be an int, got float 2.5"):
        BilinearEnergy(2.5)


def test_dimension_mismatch_names_the_fix():
    with pytest.raises(ValueError, match="dim=5"):
        BilinearEnergy(3)(torch.randn(4, 5), torch.randn(4, 5))


def test_learned_parameters_are_constrained_pyro_params():
    from pyro.nn import PyroModule

    energies = [RBFEnergy(), AnisotropicEnergy(3), CosineEnergy(learn_kappa=True)]
    for energy in energies:
        assert isinstance(energy, PyroModule)
    names = {name for name, _ in RBFEnergy().named_parameters()}
    assert names == {"lengthscale_unconstrained"}
    anis = AnisotropicEnergy(3)
    with torch.no_grad():
        anis.concentration_unconstrained.fill_(-50.0)
    assert (anis.concentration > 0).all()


EXACT = 1 / 0.07  # 14.285714285714286, not representable in float32


@pytest.mark.parametrize("build, read", [
    (lambda v: CosineEnergy(kappa=v), lambda e: e.kappa),
    (lambda v: CosineEnergy(kappa=v, learn_kappa=True), lambda e: e.kappa),
    (lambda v: RBFEnergy(lengthscale=v), lambda e: e.lengthscale),
    (lambda v: RBFEnergy(lengthscale=v, learn_lengthscale=False), lambda e: e.lengthscale),
    (lambda v: AnisotropicEnergy(D, init=v), lambda e: e.concentration),
    (lambda v: LpEnergy(p=1.0, tau=v), lambda e: e.tau),
    (lambda v: LpEnergy(p=3.0, tau=v, learn_tau=True), lambda e: e.tau),
    (lambda v: BilinearEnergy(D, init_scale=v), lambda e: torch.diagonal(e.weight)),
], ids=["cosine", "cosine-learned", "rbf", "rbf-fixed", "anisotropic", "lp", "lp-learned",
        "bilinear"])
def test_python_float_hyperparameters_keep_their_value_after_double(build, read):
    """Built under the float32 default dtype, then .double(): the value is the Python float
    (to the 1-ulp round trip of a learned parameter's constraint transform, e.g. exp(log x);
    the float32 rounding would be 7e-8 off)."""
    torch.set_default_dtype(torch.float32)
    energy = build(EXACT).double()
    value = read(energy).detach()
    assert value.dtype == torch.float64
    torch.testing.assert_close(value, torch.full_like(value, EXACT), rtol=4e-16, atol=0)
    z = torch.randn(4, D)
    assert energy(z, z).dtype == torch.float32  # cast to the latents' dtype at use
    assert energy(z.double(), z.double()).dtype == torch.float64


def test_fixed_hyperparameters_are_exact_after_double():
    torch.set_default_dtype(torch.float32)
    assert CosineEnergy(kappa=1 / 0.07).double().kappa.item() == 1 / 0.07  # 14.285714285714285
    assert CosineEnergy(kappa=100 / 7).double().kappa.item() == 14.285714285714286
    assert RBFEnergy(0.1, learn_lengthscale=False).double().lengthscale.item() == 0.1
    assert LpEnergy(p=1.0, tau=0.3).double().tau.item() == 0.3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_unit_vectors_at_every_norm(dtype):
    """The cosine energy's unit vectors z / |z| (rpm.priors._energies.unit_vectors) against float64
    for rows of norm 1e-30 ... 1e30 (float32 and bfloat16: norms accumulated in float64;
    float64: rows divided by their largest coordinate), values and gradients."""
    from rpm.priors._energies import unit_vectors

    exponents = [-30, -20, -5, 0, 5, 20, 30] if dtype != torch.float64 else [-300, -30, 0, 30, 300]
    directions = torch.randn(len(exponents), 6, dtype=torch.float64)
    z64 = directions * torch.tensor([10.0 ** e for e in exponents], dtype=torch.float64)[:, None]
    z = z64.to(dtype).requires_grad_()
    exact = z.detach().double().requires_grad_()
    weights = torch.randn(z.shape, dtype=torch.float64)
    # the norm of rows scaled to a largest coordinate of 1 (the squares of 1e300 overflow)
    top = exact.detach().abs().amax(-1, keepdim=True)
    expected = exact / (top * torch.linalg.vector_norm(exact / top, dim=-1, keepdim=True))
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), exact)
    actual = unit_vectors(z)
    (grad,) = torch.autograd.grad((actual * weights.to(dtype)).sum(), z)
    eps = torch.finfo(dtype).eps
    assert ((actual.double() - expected.detach()).abs().max() < 4 * eps)
    # the gradient scales as 1/|z|: compare each row relative to its largest entry
    error = (grad.double() - expected_grad).abs().amax(-1) / expected_grad.abs().amax(-1)
    assert error.max() < 16 * eps


def test_unit_vectors_of_zero_rows_follow_normalize():
    """Zero rows stay zero with F.normalize's gradient (the incoming gradient / 1e-12)."""
    from rpm.priors._energies import unit_vectors

    for dtype in (torch.float32, torch.float64):
        z = torch.zeros(2, 3, dtype=dtype, requires_grad=True)
        reference = torch.zeros(2, 3, dtype=dtype, requires_grad=True)
        weights = torch.randn(2, 3, dtype=dtype)
        (grad,) = torch.autograd.grad((unit_vectors(z) * weights).sum(), z)
        (expected,) = torch.autograd.grad(
            (torch.nn.functional.normalize(reference, dim=-1) * weights).sum(), reference)
        assert (unit_vectors(z) == 0).all()
        torch.testing.assert_close(grad, expected)
