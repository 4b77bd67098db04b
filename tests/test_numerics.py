"""Float32 at the extremes: the energies, the mixture marginal and the RPM ELBO stay finite, with
finite gradients, and close to a float64 computation written from the formulas.

Extremes (the "Reliability" issue): latents up to |z| = 1e3 (spread out, offset far from the
origin, or in tight clusters 2e3 apart), recognition scales down to 1e-3, kappa and
concentrations up to 1e3, lengthscales and temperatures down to 1e-3, latents exactly at zero and
positive pairs that coincide.

Accuracy is judged per pair of the InfoNCE loss :math:`\\ell_i = \\operatorname{LSE}_j F_{ij} -
F_{ii}`: a float32 logit of magnitude |F| cannot be better than about 1e-7 |F|, so the tolerance
is 1e-3 plus 1e-5 times the magnitude of the logits that decide :math:`\\ell_i` (the positive and
the row maximum). Before squared distances were expanded in float64, two clusters 2e3 apart
with lengthscale 1e-3 gave float32 errors of ~1e4 nats where the logits were of order 1.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

import rpm
from rpm.marginals import MixtureMarginal
from rpm.ops import gaussian_mixture_log_prob
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    GaussianRandomWalkPrior,
    ImplicitPrior,
    LinearDynamicsPrior,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
)

N, D = 8, 4


# ----------------------------------------------------------------------------- latents
def latents(layout: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs (z, z2) in float32, shape (N, D) each, at the extremes of scale."""
    def noise(scale):
        return scale * torch.randn(N, D, generator=generator, dtype=torch.float64)

    if layout == "spread":  # |z| ~ 1e3, positives 1e-3 apart
        z = noise(1e3)
        z2 = z + noise(1e-3)
    elif layout == "independent":  # |z| ~ 1e3, unrelated views
        z, z2 = noise(1e3), noise(1e3)
    elif layout == "offset":  # everything within 1e-3 of a point at distance 2e3 from 0
        z = 1e3 + noise(1e-3)
        z2 = z + noise(1e-3)
    elif layout == "clusters":  # two tight clusters at +-1e3, positives 1e-3 apart
        centre = torch.zeros(N, D, dtype=torch.float64)
        centre[: N // 2, 0], centre[N // 2:, 0] = 1e3, -1e3
        z = centre + noise(1e-3)
        z2 = z + noise(1e-3)
    elif layout == "zeros":  # exact zeros, coinciding positives and coordinates
        z = noise(1.0)
        z[:2] = 0.0
        z2 = z.clone()
        z2[4:, 1:] += 1.0
    elif layout == "tiny":
        z = noise(1e-3)
        z2 = z + noise(1e-4)
    else:
        raise AssertionError(layout)
    return z.float(), z2.float()


LAYOUTS = ["spread", "independent", "offset", "clusters", "zeros", "tiny"]


# ----------------------------------------------------------------------------- energies
def _unit(z):
    norm = z.norm(dim=-1, keepdim=True)
    return z / norm.clamp_min(1e-12)  # torch.nn.functional.normalize's convention at 0


def formula(energy, z, z2):
    """F_ij = f(z_i, z2_j) in float64, from the difference z_i - z2_j (no expansion)."""
    z, z2 = z.double(), z2.double()
    if isinstance(energy, BilinearEnergy):
        return z @ energy.weight.detach().double() @ z2.T
    if isinstance(energy, CosineEnergy):
        return energy.kappa.detach().double() * (_unit(z)[:, None] * _unit(z2)[None]).sum(-1)
    if isinstance(energy, RBFEnergy):
        diff = z[:, None] - z2[None]  # (N, M, D)
        return -0.5 * diff.square().sum(-1) / energy.lengthscale.detach().double() ** 2
    if isinstance(energy, AnisotropicEnergy):
        if energy.normalize:
            z, z2 = _unit(z), _unit(z2)
        diff = z[:, None] - z2[None]
        return -0.5 * (diff.square() * energy.concentration.detach().double()).sum(-1)
    if isinstance(energy, LpEnergy):
        diff = (z[:, None] - z2[None]).abs()
        return -diff.pow(energy.p).sum(-1) / energy.tau.detach().double()
    raise AssertionError(type(energy))


ENERGIES = {
    "bilinear": lambda: BilinearEnergy(D),
    "cosine-kappa1e3": lambda: CosineEnergy(kappa=1e3, learn_kappa=True),
    "rbf-l1e-3": lambda: RBFEnergy(lengthscale=1e-3),
    "rbf-l1": lambda: RBFEnergy(lengthscale=1.0),
    "anisotropic-1e3": lambda: AnisotropicEnergy(D, init=1e3),
    "anisotropic-raw-1e3": lambda: AnisotropicEnergy(D, normalize=False, init=1e3),
    "laplace-tau1e-3": lambda: LpEnergy(p=1.0, tau=1e-3, learn_tau=True),
    "l2-tau1e-3": lambda: LpEnergy(p=2.0, tau=1e-3),
    "l3-tau1e-3": lambda: LpEnergy(p=3.0, tau=1e-3),
    "l0.5": lambda: LpEnergy(p=0.5, tau=1.0),
    "neural": lambda: NeuralEnergy(D, hidden=8),
}


def per_pair_loss(logits):
    """InfoNCE per pair, LSE_j F_ij - F_ii, shape (N,)."""
    return torch.logsumexp(logits, -1) - torch.diagonal(logits)


def input_rounding(fn, *inputs):
    r"""How much each output of ``fn`` moves when its float32 inputs move by their rounding:
    :math:`\epsilon_{32} \sum_k |\partial y / \partial x_k| |x_k|`, computed in float64.

    A float32 result cannot be asked to be closer to the exact value than this (it is the
    error already present when the inputs came out of a float32 network). Where the exact
    gradient is undefined (|d|^p at d = 0 for p < 1) the zero subgradient is used.
    """
    inputs = [x.detach().double().requires_grad_(True) for x in inputs]
    outputs = fn(*inputs).flatten()
    eps = torch.finfo(torch.float32).eps
    bounds = []
    for output in outputs:
        grads = torch.autograd.grad(output, inputs, retain_graph=True, allow_unused=True)
        bounds.append(sum((g.nan_to_num(nan=0.0) * x).abs().sum()
                          for g, x in zip(grads, inputs, strict=True) if g is not None))
    return eps * torch.stack(bounds).detach()


def assert_pairs_close(loss32, energy, z, z2):
    """Per-pair InfoNCE in float32 vs float64: within 1e-3, 1e-5 of the deciding logits and
    4 times the effect of rounding the inputs to float32."""
    logits64 = formula(energy, z, z2)
    loss64 = per_pair_loss(logits64)
    scale = torch.diagonal(logits64).abs() + logits64.max(-1).values.abs()
    conditioning = input_rounding(lambda a, b: per_pair_loss(formula(energy, a, b)), z, z2)
    tolerance = 1e-3 + 1e-5 * scale + 4 * conditioning
    error = (loss32.detach().double() - loss64).abs()
    assert (error <= tolerance).all(), f"float32 error {error.tolist()} > {tolerance.tolist()}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(ENERGIES))
def test_energy_infonce_is_finite_with_finite_gradients_and_accurate(name, layout):
    energy = ENERGIES[name]()
    z, z2 = latents(layout, torch.Generator().manual_seed(len(name) + 7 * len(layout)))
    z.requires_grad_(True)
    z2.requires_grad_(True)
    logits = energy(z, z2)  # (N, N), float32
    assert logits.dtype == torch.float32
    loss = per_pair_loss(logits)
    assert torch.isfinite(logits).all() and torch.isfinite(loss).all()
    # the paired (diagonal) form agrees with the matrix
    paired = energy.paired(z, z2)
    if name != "neural":
        conditioning = input_rounding(lambda a, b: torch.diagonal(formula(energy, a, b)), z, z2)
        error = (paired - torch.diagonal(logits)).abs().detach().double()
        assert (error <= 1e-3 + 1e-5 * paired.detach().abs() + 4 * conditioning).all()
    params = [p for p in energy.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss.sum() - paired.sum(), [z, z2, *params])
    for grad in grads:
        assert torch.isfinite(grad).all()
    if name != "neural":
        assert_pairs_close(loss, energy, z, z2)


@pytest.mark.parametrize("layout", ["spread", "offset", "clusters"])
@pytest.mark.parametrize("name", ["rbf-l1e-3", "anisotropic-raw-1e3", "l2-tau1e-3"])
def test_squared_distances_stay_nonnegative_and_exact_for_coinciding_points(name, layout):
    energy = ENERGIES[name]()
    z, _ = latents(layout, torch.Generator().manual_seed(3))
    logits = energy(z, z)  # (N, N): f(z_i, z_i) = 0 exactly, the others < 0
    assert (logits <= 0).all()
    assert torch.diagonal(logits).abs().max() < 1e-3


# ----------------------------------------------------------------------------- mixture
def mixture_loop(z, loc, scale, exclude_self=False):
    """log (1/N) sum_n N(z_m; loc_n, diag scale_n^2) in float64, one point at a time."""
    z, loc, scale = z.double(), loc.double(), scale.double()
    values = []
    for m in range(z.shape[0]):
        terms = dist.Normal(loc, scale).log_prob(z[m]).sum(-1)  # (N,)
        if exclude_self:
            terms = torch.cat([terms[:m], terms[m + 1:]])
        values.append(torch.logsumexp(terms, 0) - math.log(terms.shape[0]))
    return torch.stack(values)


@pytest.mark.parametrize("block_size", [None, 3], ids=["dense", "streamed"])
@pytest.mark.parametrize("exclude_self", [False, True])
@pytest.mark.parametrize("scale_value", [1e-3, 1.0, "mixed"])
@pytest.mark.parametrize("layout", ["spread", "independent", "offset", "clusters"])
def test_mixture_marginal_is_finite_with_finite_gradients_and_accurate(
    layout, scale_value, exclude_self, block_size
):
    generator = torch.Generator().manual_seed(11)
    loc, z = latents(layout, generator)
    if scale_value == "mixed":  # log-uniform in [1e-3, 1e3]
        scale = 10 ** (6 * torch.rand(N, D, generator=generator) - 3)
    else:
        scale = torch.full((N, D), scale_value)
    loc.requires_grad_(True)
    z.requires_grad_(True)
    scale.requires_grad_(True)
    value = gaussian_mixture_log_prob(z, loc, scale, exclude_self, block_size)  # (N,)
    assert value.dtype == torch.float32 and torch.isfinite(value).all()
    for grad in torch.autograd.grad(value.sum(), [z, loc, scale]):
        assert torch.isfinite(grad).all()
    expected = mixture_loop(z.detach(), loc.detach(), scale.detach(), exclude_self)
    tolerance = 2e-4 + 1e-6 * expected.abs()
    assert ((value.detach().double() - expected).abs() <= tolerance).all()


@pytest.mark.parametrize("layout", ["spread", "offset", "clusters"])
def test_points_drawn_from_a_sharp_mixture_are_accurate_in_float32(layout):
    # z_m ~ N(loc_m, 1e-3^2): the log-densities are of order +D log(1e3) and decided by a few
    # components; float32 stays within 1e-4 of float64
    generator = torch.Generator().manual_seed(5)
    loc, _ = latents(layout, generator)
    scale = torch.full((N, D), 1e-3)
    z = loc + scale * torch.randn(N, D, generator=generator)
    value = MixtureMarginal(dist.Normal(loc, scale).to_event(1)).log_prob(z)
    expected = mixture_loop(z, loc, scale)
    torch.testing.assert_close(value.double(), expected, rtol=0, atol=1e-4)


# ----------------------------------------------------------------------------- the ELBO
class Encoder(torch.nn.Module):
    """x -> a latent of magnitude ``magnitude`` around ``offset`` (and a fixed scale)."""

    def __init__(self, magnitude: float, offset: float, scale: float | None):
        super().__init__()
        self.linear = torch.nn.Linear(6, D)
        self.magnitude, self.offset, self.scale = magnitude, offset, scale

    def forward(self, x):
        loc = self.magnitude * self.linear(x) + self.offset  # (N, D)
        if self.scale is None:
            return loc
        # a scale that depends on the network (so it has a gradient), close to self.scale
        return loc, self.scale * (1.0 + 0.1 * torch.sigmoid(self.linear(x)))


PRIORS = {
    "cosine-kappa1e3": lambda: ImplicitPrior(CosineEnergy(1e3, learn_kappa=True)),
    "rbf-l1e-3": lambda: ImplicitPrior(RBFEnergy(1e-3)),
    "laplace-tau1e-3": lambda: ImplicitPrior(LpEnergy(1.0, 1e-3, learn_tau=True)),
    "anisotropic-1e3": lambda: ImplicitPrior(AnisotropicEnergy(D, normalize=False, init=1e3)),
    "random-walk": lambda: GaussianRandomWalkPrior(D, scale=1e3, step=1e-3),
    "linear-dynamics": lambda: LinearDynamicsPrior(D, scale=1e-3, noise=1e-3),
}
EXPLICIT = {"random-walk", "linear-dynamics"}
ENCODINGS = [(1e3, 0.0), (1e-3, 1e3), (1.0, 0.0)]  # (magnitude, offset)


# Delta recognition with an explicit prior is refused with a clear error (tests/test_bad_input.py)
COMBINATIONS = [(prior, recognition) for prior in PRIORS
                for recognition in ("delta", "delta-eps", "gaussian")
                if not (recognition == "delta" and prior in EXPLICIT)]


@pytest.mark.parametrize("magnitude, offset", ENCODINGS, ids=["spread", "offset", "unit"])
@pytest.mark.parametrize("prior_name, recognition", COMBINATIONS)
def test_rpm_elbo_is_finite_with_finite_gradients(prior_name, recognition, magnitude, offset):
    if recognition == "gaussian":
        module = rpm.GaussianRecognition(Encoder(magnitude, offset, 1e-3))
    else:
        module = rpm.DeltaRecognition(
            Encoder(magnitude, offset, None), noise_scale=1e-3 if recognition == "delta-eps" else 0.0
        )
    model = rpm.RPM(module, PRIORS[prior_name]())
    x = torch.randn(N, 6)
    x2 = x + 1e-3 * torch.randn(N, 6)
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    for (name, _), grad in zip(named, grads, strict=True):
        assert grad is not None and torch.isfinite(grad).all(), name


@pytest.mark.parametrize("prior_name", ["rbf-l1e-3", "cosine-kappa1e3", "laplace-tau1e-3"])
def test_rpm_elbo_of_clustered_delta_latents_matches_float64_infonce(prior_name):
    # Delta encoders giving two tight clusters at +-1e3: RPMELBO / N = -InfoNCE + log N, and the
    # float32 value matches the float64 formula within the per-pair tolerance
    z, z2 = latents("clusters", torch.Generator().manual_seed(2))
    table = torch.nn.Embedding.from_pretrained(torch.cat([z, z2]))
    model = rpm.RPM(rpm.DeltaRecognition(table), PRIORS[prior_name]())
    index = torch.arange(N)
    with pyro.validation_enabled(True):
        loss = rpm.RPMELBO().loss(model.model, model.guide, index, index + N)
    logits64 = formula(model.prior.energy, z, z2)
    expected = (per_pair_loss(logits64) - math.log(N)).sum().item()
    scale = (torch.diagonal(logits64).abs() + logits64.max(-1).values.abs()).sum().item()
    assert abs(loss - expected) <= N * 1e-3 + 1e-5 * scale
