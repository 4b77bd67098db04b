"""Property-based checks (hypothesis) of the two identities the package rests on, over random
batch sizes N in [2, 40], latent dimensions D in [1, 8] and scales log-uniform in [1e-2, 1e2]:

* the RPM ELBO under the implicit prior with deterministic encoders is InfoNCE (Eq. 23-25 of
  Aitchison & Ganev): RPMELBO / N = -InfoNCE + log N, for every energy, in float64 to 1e-9
  (relative to the largest logit), with InfoNCE computed by a loop over the rows;
* the minibatch-mixture marginal (Eq. 11) equals a float64 loop over points, components and
  dimensions to 1e-8, and in float32 stays within 1e-4 of float64 for points drawn from the
  mixture (dense and streamed kernels).

Tensors are drawn from a seeded torch generator whose seed hypothesis chooses, so a failing
example is reproducible from the printed draws.
"""

import math

import pyro
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rpm
from rpm.ops import gaussian_mixture_log_prob
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    ImplicitPrior,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
)

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

sizes = st.integers(2, 40)
dims = st.integers(1, 8)
log_scales = st.floats(-2.0, 2.0)  # log10 of a scale in [1e-2, 1e2]
seeds = st.integers(0, 2**31 - 1)

ENERGY_KINDS = [
    "bilinear", "cosine", "rbf", "anisotropic", "anisotropic-raw", "lp1", "lp2", "lp3", "neural",
]


def build_energy(kind: str, dim: int, parameter: float, generator: torch.Generator):
    """An energy of the given kind whose hyperparameter (kappa, lengthscale, concentration,
    temperature, or the scale of W) is ``parameter``, in float64."""
    if kind == "bilinear":
        energy = BilinearEnergy(dim)
        with torch.no_grad():
            energy.weight.copy_(parameter * torch.randn(dim, dim, generator=generator) / dim**0.5)
    elif kind == "cosine":
        energy = CosineEnergy(kappa=parameter, learn_kappa=True)
    elif kind == "rbf":
        energy = RBFEnergy(lengthscale=parameter)
    elif kind in ("anisotropic", "anisotropic-raw"):
        energy = AnisotropicEnergy(dim, normalize=kind == "anisotropic", init=parameter)
    elif kind.startswith("lp"):
        energy = LpEnergy(p=float(kind[2:]), tau=parameter)
    elif kind == "neural":
        energy = NeuralEnergy(dim, hidden=5)
    else:
        raise AssertionError(kind)
    return energy.double()


def energy_matrix(energy, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """F_ij = f(z_i, z2_j) from the table of docs/theory.md#energies, pair by pair through
    broadcasting over (N, M, D) (never the expanded squared distance the package uses)."""
    a, b = z[:, None, :], z2[None, :, :]  # (N, 1, D), (1, M, D)
    if isinstance(energy, BilinearEnergy):
        return ((a @ energy.weight) * b).sum(-1)
    if isinstance(energy, CosineEnergy):
        unit_a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        unit_b = b / b.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return energy.kappa * (unit_a * unit_b).sum(-1)
    if isinstance(energy, RBFEnergy):
        return -((a - b) ** 2).sum(-1) / (2 * energy.lengthscale**2)
    if isinstance(energy, AnisotropicEnergy):
        if energy.normalize:
            a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            b = b / b.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return -0.5 * ((a - b) ** 2 * energy.concentration).sum(-1)
    if isinstance(energy, LpEnergy):
        return -((a - b).abs() ** energy.p).sum(-1) / energy.tau
    if isinstance(energy, NeuralEnergy):
        hidden = torch.nn.functional.softplus(
            a @ energy.first.weight.T + energy.first.bias + b @ energy.second.weight.T
        )  # (N, M, H)
        return (hidden @ energy.out.weight.T).squeeze(-1) + energy.out.bias
    raise AssertionError(type(energy))


def info_nce_loop(logits: list[list[float]]) -> float:
    r"""InfoNCE = (1/N) sum_i -log( exp F_ii / sum_j exp F_ij ), one row at a time."""
    total = []
    for i, row in enumerate(logits):
        top = max(row)
        log_normaliser = top + math.log(math.fsum(math.exp(value - top) for value in row))
        total.append(log_normaliser - row[i])
    return math.fsum(total) / len(logits)


@SETTINGS
@given(
    num_pairs=sizes, dim=dims, kind=st.sampled_from(ENERGY_KINDS), log_parameter=log_scales,
    log_spread=log_scales, log_noise=log_scales, seed=seeds,
)
def test_rpm_elbo_per_pair_is_minus_infonce_plus_log_n(
    num_pairs, dim, kind, log_parameter, log_spread, log_noise, seed
):
    # a fresh param store per example: PyroParams of an earlier example's energy would
    # otherwise shadow this one's initial values (Pyro's global store)
    pyro.clear_param_store()
    generator = torch.Generator().manual_seed(seed)
    energy = build_energy(kind, dim, 10**log_parameter, generator)
    z = 10**log_spread * torch.randn(num_pairs, dim, generator=generator, dtype=torch.float64)
    z2 = z + 10**log_noise * torch.randn(num_pairs, dim, generator=generator, dtype=torch.float64)
    # Delta encoders that look the latents up: x = i gives z_i, x2 = N + i gives z2_i
    table = torch.nn.Embedding.from_pretrained(torch.cat([z, z2]))
    model = rpm.RPM(rpm.DeltaRecognition(table), ImplicitPrior(energy))
    index = torch.arange(num_pairs)
    elbo = -rpm.RPMELBO().loss(model.model, model.guide, index, index + num_pairs)

    with torch.no_grad():
        logits = energy_matrix(energy, z, z2)  # (N, N)
    expected = -info_nce_loop(logits.tolist()) + math.log(num_pairs)
    scale = max(1.0, logits.abs().max().item())
    assert abs(elbo / num_pairs - expected) <= 1e-9 * scale, (elbo / num_pairs, expected)
    if kind not in ("bilinear", "neural"):  # the drawn hyperparameter is the one used
        name = {"cosine": "kappa", "rbf": "lengthscale"}.get(kind, "tau" if "lp" in kind else None)
        value = energy.concentration[0] if name is None else getattr(energy, name)
        assert math.isclose(value.item(), 10**log_parameter, rel_tol=1e-6)  # set in float32


def mixture_loop(z, loc, scale, exclude_self=False) -> list[float]:
    r"""log (1/K) sum_n prod_d N(z_md; loc_nd, scale_nd^2), point by point, with math only."""
    z, loc, scale = z.tolist(), loc.tolist(), scale.tolist()
    values = []
    for m, point in enumerate(z):
        terms = []
        for n, (mean, std) in enumerate(zip(loc, scale, strict=True)):
            if exclude_self and n == m:
                continue
            terms.append(math.fsum(
                -0.5 * ((x - mu) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)
                for x, mu, s in zip(point, mean, std, strict=True)
            ))
        top = max(terms)
        values.append(top + math.log(math.fsum(math.exp(t - top) for t in terms))
                      - math.log(len(terms)))
    return values


def random_mixture(num_components, dim, log_spread, log_offset, generator, dtype):
    """Component means spread over 10**log_spread around an offset of 10**log_offset, and
    per-component, per-dimension scales log-uniform in [1e-2, 1e2]."""
    offset = 10**log_offset * torch.randn(1, dim, generator=generator, dtype=torch.float64)
    loc = offset + 10**log_spread * torch.randn(
        num_components, dim, generator=generator, dtype=torch.float64
    )
    scale = 10 ** (4 * torch.rand(num_components, dim, generator=generator, dtype=torch.float64) - 2)
    return loc.to(dtype), scale.to(dtype)


def drawn_from(loc, scale, num_points, generator):
    """Points z_m ~ (1/N) sum_n N(loc_n, diag scale_n^2)."""
    component = torch.randint(loc.shape[0], (num_points,), generator=generator)
    noise = torch.randn(num_points, loc.shape[1], generator=generator, dtype=loc.dtype)
    return loc[component] + scale[component] * noise


@pytest.mark.slow
@SETTINGS
@given(
    num_components=sizes, num_points=st.integers(1, 40), dim=dims, log_spread=log_scales,
    log_offset=log_scales, from_mixture=st.booleans(), exclude_self=st.booleans(),
    block_size=st.sampled_from([None, 1, 3, 16]), seed=seeds,
)
def test_mixture_marginal_matches_a_float64_loop(
    num_components, num_points, dim, log_spread, log_offset, from_mixture, exclude_self,
    block_size, seed,
):
    generator = torch.Generator().manual_seed(seed)
    loc, scale = random_mixture(num_components, dim, log_spread, log_offset, generator,
                                torch.float64)
    if exclude_self:
        num_points = num_components
    if from_mixture:
        z = drawn_from(loc, scale, num_points, generator)
    else:  # anywhere in the region of the components, or far outside it
        z = loc.mean(0) + 10**log_spread * 3 * torch.randn(
            num_points, dim, generator=generator, dtype=torch.float64
        )
    value = gaussian_mixture_log_prob(z, loc, scale, exclude_self, block_size)
    expected = torch.tensor(mixture_loop(z, loc, scale, exclude_self), dtype=torch.float64)
    tolerance = 1e-8 * expected.abs().clamp_min(1.0)
    assert ((value - expected).abs() <= tolerance).all(), (value - expected).abs().max()


@pytest.mark.slow
@SETTINGS
@given(
    num_components=sizes, num_points=st.integers(1, 40), dim=dims, log_spread=log_scales,
    log_offset=log_scales, exclude_self=st.booleans(), block_size=st.sampled_from([None, 1, 7]),
    seed=seeds,
)
def test_float32_mixture_is_within_1e_4_of_float64_for_points_from_the_mixture(
    num_components, num_points, dim, log_spread, log_offset, exclude_self, block_size, seed,
):
    generator = torch.Generator().manual_seed(seed)
    loc, scale = random_mixture(num_components, dim, log_spread, log_offset, generator,
                                torch.float32)
    if exclude_self:
        # point m drawn from component m: the leave-one-out estimate used for z_m ~ Q(z|x_m)
        noise = torch.randn(num_components, dim, generator=generator)
        z = loc + scale * noise
    else:
        z = drawn_from(loc, scale, num_points, generator)
    value = gaussian_mixture_log_prob(z, loc, scale, exclude_self, block_size)
    assert value.dtype == torch.float32
    exact = gaussian_mixture_log_prob(z.double(), loc.double(), scale.double(), exclude_self)
    # leave-one-out: z_m need not be near any other component, so |log Q| may be large and
    # float32 can only promise a relative accuracy there
    tolerance = 1e-4 + (2e-6 * exact.abs() if exclude_self else 0.0)
    assert ((value.double() - exact).abs() <= tolerance).all(), (value.double() - exact).abs().max()
