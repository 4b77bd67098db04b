"""On a CUDA device (``pytest -m cuda``; skipped without one): the minibatch-mixture marginal
and the InfoNCE normaliser in float32 with TF32 off against float64 on the CPU, written as
loops from their equations; the RPM ELBO of a model moved to the GPU against the same model in
float64 on the CPU; and a short training run of every ``rpm`` command on ``--device cuda``."""

import json
import math

import pyro
import pytest
import torch
from torch.distributions import Normal

import rpm
from rpm.cli import main
from rpm.ops import gaussian_mixture_log_prob, streaming_matmul_logsumexp
from rpm.ops._dispatch import ieee_float32_matmul
from rpm.ops._gaussian_mixture import dense_gaussian_mixture_log_prob
from rpm.ops._streaming import streaming_gaussian_mixture_log_prob
from rpm.priors import CosineEnergy, ImplicitPrior, LpEnergy, RBFEnergy

pytestmark = pytest.mark.cuda


def mixture_loop(z, loc, scale):
    """log Q(z_m) = log (1/N) sum_n N(z_m; mu_n, diag sigma_n^2), one point at a time."""
    rows = [torch.logsumexp(Normal(loc, scale).log_prob(z[m]).sum(-1), 0) for m in range(len(z))]
    return torch.stack(rows) - math.log(loc.shape[0])


def normaliser_loop(left, right):
    """log sum_j exp(<l_i, r_j>), one row at a time."""
    return torch.stack([torch.logsumexp(right @ left[i], 0) for i in range(len(left))])


def values_and_grads(fn, *tensors):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    values = fn(*leaves)
    values.sum().backward()
    return values.detach(), [leaf.grad for leaf in leaves]


def relative(got, want):
    return ((got.double().cpu() - want).abs().max() / want.abs().max()).item()


def mixture(num, dim, regime, generator):
    loc = torch.randn(num, dim, generator=generator, dtype=torch.float64)
    scale = 0.5 + torch.rand(num, dim, generator=generator, dtype=torch.float64)
    if regime == "separated":
        scale = 0.3 * scale
        z = loc + scale * torch.randn(num, dim, generator=generator, dtype=torch.float64)
    else:
        z = torch.randn(num, dim, generator=generator, dtype=torch.float64)
    return z, loc, scale


@pytest.mark.parametrize("regime", ["overlapping", "separated"])
@pytest.mark.parametrize("method", ["dispatch", "dense", "streaming"])
def test_mixture_marginal_float32_matches_float64_loop(method, regime):
    """Every path of the mixture log-density, float32 on CUDA (TF32 off) within 1e-4 in value
    and 1e-3 relative in every gradient of the float64 CPU loop."""
    fns = {"dispatch": gaussian_mixture_log_prob, "dense": dense_gaussian_mixture_log_prob,
           "streaming": lambda z, loc, scale: streaming_gaussian_mixture_log_prob(
               z, loc, scale, block_size=256)}
    generator = torch.Generator().manual_seed(1)
    z, loc, scale = mixture(1500, 16, regime, generator)
    want, want_grads = values_and_grads(mixture_loop, z, loc, scale)
    with ieee_float32_matmul():
        got, got_grads = values_and_grads(fns[method], *(t.float().cuda() for t in (z, loc, scale)))
    assert got.device.type == "cuda" and got.dtype == torch.float32
    assert (got.double().cpu() - want).abs().max().item() < 1e-4
    for g, w in zip(got_grads, want_grads, strict=True):
        assert relative(g, w) < 1e-3


def test_streaming_normaliser_matches_float64_loop():
    generator = torch.Generator().manual_seed(2)
    left = torch.randn(1100, 32, generator=generator, dtype=torch.float64) / 3
    right = torch.randn(900, 32, generator=generator, dtype=torch.float64) / 3
    want, want_grads = values_and_grads(normaliser_loop, left, right)
    with ieee_float32_matmul():
        got, got_grads = values_and_grads(
            lambda a, b: streaming_matmul_logsumexp(a, b, 256), left.float().cuda(),
            right.float().cuda())
    assert (got.double().cpu() - want).abs().max().item() < 1e-4
    for g, w in zip(got_grads, want_grads, strict=True):
        assert relative(g, w) < 1e-3


@pytest.mark.parametrize("energy", ["cosine", "rbf", "l1"])
def test_implicit_log_ratio_matches_float64_loop(energy):
    """f(z_i, z'_i) - log sum_j exp f(z_i, z'_j) + log N of the implicit prior on CUDA against a
    float64 loop over i (Eq. 24 of Aitchison & Ganev)."""
    energies = {
        "cosine": (lambda: CosineEnergy(kappa=5.0),
                   lambda a, b: 5.0 * (a / a.norm()) @ (b / b.norm(dim=-1, keepdim=True)).T),
        "rbf": (lambda: RBFEnergy(lengthscale=0.7, learn_lengthscale=False),
                lambda a, b: -((a - b) ** 2).sum(-1) / (2 * 0.7**2)),
        "l1": (lambda: LpEnergy(p=1.0, tau=0.2), lambda a, b: -(a - b).abs().sum(-1) / 0.2),
    }
    make, row_energy = energies[energy]
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(700, 10, generator=generator, dtype=torch.float64)
    z2 = z + 0.3 * torch.randn(700, 10, generator=generator, dtype=torch.float64)
    want = torch.stack([
        row_energy(z[i], z2)[i] - torch.logsumexp(row_energy(z[i], z2), 0) + math.log(len(z))
        for i in range(len(z))
    ])
    got = ImplicitPrior(make()).cuda().log_ratio(z.float().cuda(), z2.float().cuda())
    assert got.device.type == "cuda"
    assert (got.double().cpu() - want).abs().max().item() < 2e-4


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                        torch.nn.Linear(32, 6))

    def forward(self, x):
        loc, raw = self.body(x).chunk(2, dim=-1)
        return loc, torch.nn.functional.softplus(raw) + 0.1


@pytest.mark.parametrize("kind", ["delta-cosine", "gaussian-rbf"])
def test_elbo_of_a_model_on_cuda_matches_float64_cpu(kind):
    """The RPM ELBO of the same weights: float32 on CUDA against float64 on the CPU, and a few
    SVI steps on CUDA keep every parameter on the device and finite."""

    def build(name):
        torch.manual_seed(0)
        if kind == "delta-cosine":
            return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(8, 3)),
                           ImplicitPrior(CosineEnergy(kappa=4.0)), name=name)
        return rpm.RPM(rpm.GaussianRecognition(Encoder()), ImplicitPrior(RBFEnergy()), name=name)

    generator = torch.Generator().manual_seed(4)
    x = torch.randn(512, 8, generator=generator)
    x2 = x + 0.2 * torch.randn(512, 8, generator=generator)
    on_cpu = build("cpu_float64").double()
    on_gpu = build("cuda_float32").cuda()
    elbo = rpm.RPMELBO(num_particles=1)
    with torch.no_grad():
        pyro.set_rng_seed(5)
        want = elbo.loss(on_cpu.model, on_cpu.guide, x.double(), x2.double())
        pyro.set_rng_seed(5)
        with ieee_float32_matmul():
            got = elbo.loss(on_gpu.model, on_gpu.guide, x.cuda(), x2.cuda())
    if kind == "delta-cosine":  # deterministic: the two ELBOs are the same number
        assert got == pytest.approx(want, rel=1e-5, abs=1e-3)
    else:  # a sampled z differs between devices: compare at the recognition means instead
        assert math.isfinite(got)
    svi = pyro.infer.SVI(on_gpu.model, on_gpu.guide, pyro.optim.Adam({"lr": 1e-2}), elbo)
    losses = [svi.step(x.cuda(), x2.cuda()) for _ in range(5)]
    assert all(math.isfinite(loss) for loss in losses)
    for name, value in pyro.get_param_store().items():
        if name.startswith("cuda_float32"):
            assert value.device.type == "cuda", name
    for parameter in on_gpu.parameters():
        assert parameter.device.type == "cuda" and torch.isfinite(parameter).all()


COMMANDS = {
    "benchmark": ["--datasets", "digits", "--objectives", "raw,untrained,simclr,gaussian,vicreg",
                  "--seeds", "1", "--epochs", "1", "--batch-size", "80"],
    "causal-ident": ["--rows", "colour,change_hues", "--steps", "4", "--batch-size", "8",
                     "--size", "16", "--rep-dims", "3", "--width", "4", "--hidden", "8",
                     "--eval-samples", "140", "--eval-every", "2", "--checkpoint-every", "0"],
    "identifiability": ["--dim", "3", "--steps", "20", "--batch-size", "64", "--eval-every", "10",
                        "--eval-samples", "500"],
    "bouncing-balls": ["--frames", "48", "--test-frames", "16", "--epochs", "2", "--batch-size",
                       "15", "--image-size", "16", "--ball-diameter", "3", "--hidden-channels",
                       "4", "--eval-every", "0", "--checkpoint-every", "0",
                       "--state-space-steps", "4"],
    "digits": ["--steps", "6", "--batch-size", "32", "--width", "4", "--latent-dim", "8",
               "--draws", "2", "--eval-every", "3", "--checkpoint-every", "0"],
    "lds": ["--steps", "6", "--sequences", "12", "--test-sequences", "6", "--length", "20",
            "--batch-size", "4", "--window", "8", "--eval-every", "3", "--checkpoint-every", "0"],
    "mutual-information": ["--mi", "1,2", "--steps", "10", "--average-last", "5", "--dim", "4",
                           "--batch-size", "16", "--hidden", "8", "--joint-hidden", "8",
                           "--embed-dim", "4"],
    "peer-supervision": ["--views", "2,1", "--steps", "4", "--batch-size", "32", "--hidden", "8",
                         "--restarts", "2", "--eval-every", "2", "--checkpoint-every", "0"],
    "pendulum": ["--distractors", "--steps", "4", "--sequences", "6", "--test-sequences", "3",
                 "--length", "16", "--image-size", "16", "--batch-size", "3", "--window", "6",
                 "--channels", "4", "--hidden", "8", "--eval-every", "2", "--checkpoint-every",
                 "0", "--latent-dim", "3", "--state-dim", "5"],
    "rpm-hmm": ["--steps", "6", "--length", "200", "--test-length", "60", "--batch-size", "4",
                "--window", "10", "--hidden", "16", "--eval-every", "3"],
    "uncertainty": ["--steps", "4", "--mean-steps", "4", "--batch-size", "16", "--particles", "2",
                    "--eval-samples", "300", "--eval-every", "2", "--smoothing-steps", "20",
                    "--hidden", "16", "--digits-steps", "4", "--digits-batch-size", "16",
                    "--digits-particles", "2", "--digits-hidden", "16", "--mc-samples", "4",
                    "--checkpoint-every", "0"],
}


def finite_numbers(tree):
    """Every number in a JSON tree, recursively."""
    if isinstance(tree, dict):
        return [n for value in tree.values() for n in finite_numbers(value)]
    if isinstance(tree, list):
        return [n for value in tree for n in finite_numbers(value)]
    return [tree] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_trains_on_cuda(command, tmp_path):
    """A short run of each command on ``--device cuda``: exit status 0, results.json says it ran
    on the GPU, and every number it records is finite."""
    out = tmp_path / command
    status = main([command, "--out", str(out), "--no-progress", "--device", "cuda",
                   *COMMANDS[command]])
    assert status == 0
    results = json.loads((out / "results.json").read_text())
    environment = results.get("environment") or next(
        value["environment"] for value in results.values()
        if isinstance(value, dict) and "environment" in value)
    assert environment["device"].startswith("cuda")
    numbers = finite_numbers(results)
    assert numbers and all(math.isfinite(n) for n in numbers)
