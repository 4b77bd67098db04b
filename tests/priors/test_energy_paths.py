"""The fast paths of the implicit priors compute what the energy's ``forward`` computes
(rpm.priors._energy_paths): subclasses that override ``forward`` only, the factorisation only,
or both, at N = 2 (dense), 513 (streamed by size), 4096 (streamed) and with a block size, under
ImplicitPrior, PooledImplicitPrior and MarkovImplicitPrior, each against a float64 loop over
``forward`` written from Eq. 23-25 of Aitchison & Ganev (and NT-Xent for the pooled prior),
values and gradients."""

import math

import pyro.distributions as dist
import pytest
import torch

import rpm
import rpm.ops._logsumexp as logsumexp
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal
from rpm.priors import ImplicitPrior, MarkovImplicitPrior, PooledImplicitPrior, RBFEnergy
from rpm.priors._base import Energy
from rpm.priors._energy_paths import energy_hook_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D = 2
CHUNK = 512  # rows of forward per call of the reference loops


class ScaledRBF(RBFEnergy):
    """Overrides forward only: the parent's paired and logit_factors describe another energy."""

    def forward(self, z, z2):
        return 3 * super().forward(z, z2)


class ScaledRBFWithHooks(RBFEnergy):
    """Overrides forward and, in the same class, the factorisation hooks."""

    def forward(self, z, z2):
        return 3 * super().forward(z, z2)

    def paired(self, z, z2):
        return 3 * super().paired(z, z2)

    def logit_factors(self, z, z2):
        factors = super().logit_factors(z, z2)
        if factors is None:
            return None
        left, right, offset = factors
        return 3 * left, right, 3 * offset


class UncentredRBF(RBFEnergy):
    """Overrides the factorisation only, correctly: an uncentred expansion of the parent's
    forward (checked against it once, then used)."""

    def paired(self, z, z2):
        return -0.5 * (z - z2).square().sum(-1) / self.lengthscale.to(z.dtype).square()

    def logit_factors(self, z, z2):
        weight = self.lengthscale.to(z.dtype).square().reciprocal()
        left = torch.cat([weight * z, torch.ones_like(z[:, :1])], dim=1)
        right = torch.cat([z2, -0.5 * weight * z2.square().sum(-1, keepdim=True)], dim=1)
        return left, right, -0.5 * weight * z.square().sum(-1)


class OffsetlessRBF(RBFEnergy):
    """Overrides the factorisation only, wrongly: the row offset c_i is dropped."""

    def logit_factors(self, z, z2):
        factors = super().logit_factors(z, z2)
        return None if factors is None else (factors[0], factors[1], None)


class HalfPairedRBF(RBFEnergy):
    """Overrides paired only, wrongly: half the positives."""

    def paired(self, z, z2):
        return 0.5 * super().paired(z, z2)


ENERGIES = {"forward-only": ScaledRBF, "both": ScaledRBFWithHooks,
            "factors-only": UncentredRBF}
# (energy, N, block_size): dense, streamed by size (CPU threshold 2**18 pairs), blocks, and
# N = 4096 for the generic streamed path of the case reported (forward overridden only).
CASES = [(name, n, block_size) for name in ENERGIES
         for n, block_size in [(2, None), (513, None), (40, 7)]] + [("forward-only", 4096, None)]


@pytest.fixture
def streamed_calls(monkeypatch):
    """Counts the calls of the factorised (matrix-product) streaming kernel."""
    calls = []
    original = logsumexp._StreamingMatmulLogsumexp.apply

    def counting(left, right, block_size):
        calls.append((left.shape[0], right.shape[0]))
        return original(left, right, block_size)

    monkeypatch.setattr(logsumexp._StreamingMatmulLogsumexp, "apply", counting)
    return calls


def implicit_loop(energy, z, z2):
    """f(z_i, z'_i) - log sum_j e^{f(z_i, z'_j)} + log N: rows of forward, float64."""
    n = z.shape[0]
    out = []
    for r0 in range(0, n, CHUNK):
        logits = energy(z[r0:r0 + CHUNK], z2)                                # (rows, N)
        rows = torch.arange(logits.shape[0])
        out.append(logits[rows, r0 + rows] - torch.logsumexp(logits, -1) + math.log(n))
    return torch.cat(out)


def pooled_loop(energy, z, z2):
    """1/2 (r^{1->2} + r^{2->1}) of NT-Xent: anchor u_k, positive u_{p(k)}, the 2N - 1 others
    as candidates, from rows of forward, float64."""
    n = z.shape[0]
    u = torch.cat([z, z2])
    out = []
    for r0 in range(0, 2 * n, CHUNK):
        logits = energy(u[r0:r0 + CHUNK], u)                                 # (rows, 2N)
        rows = torch.arange(logits.shape[0])
        anchor = r0 + rows
        positive = logits[rows, (anchor + n) % (2 * n)]
        masked = logits.masked_fill(anchor[:, None] == torch.arange(2 * n)[None, :], -math.inf)
        out.append(positive - torch.logsumexp(masked, -1) + math.log(2 * n - 1))
    ratios = torch.cat(out)
    return 0.5 * (ratios[:n] + ratios[n:])


def markov_loop(energy, z):
    """Sum over t of the InfoNCE terms of views (t, t + 1), z of shape (N, T, D)."""
    return sum(implicit_loop(energy, z[:, t], z[:, t + 1]) for t in range(z.shape[1] - 1))


def ratio_and_loop(kind, energy, n, block_size):
    """(latents, the prior's log_ratio, the loop) for one prior kind, float64."""
    if kind == "markov":
        views = 2 if n > 1000 else 3
        z = torch.randn(n, views, D, dtype=torch.float64, requires_grad=True)
        q = dist.Delta(z.detach(), event_dim=1)
        marginal = SequenceMixtureMarginal(q, block_size=block_size)
        return [z], MarkovImplicitPrior(energy).sequence_log_ratio(z, q, marginal), markov_loop(energy, z)
    z = torch.randn(n, D, dtype=torch.float64, requires_grad=True)
    z2 = (z.detach() + 0.5 * torch.randn(n, D, dtype=torch.float64)).requires_grad_()
    prior = ImplicitPrior(energy) if kind == "implicit" else PooledImplicitPrior(energy)
    loop = implicit_loop if kind == "implicit" else pooled_loop
    return [z, z2], prior.log_ratio(z, z2, block_size=block_size), loop(energy, z, z2)


@pytest.mark.parametrize("kind", ["implicit", "pooled", "markov"])
@pytest.mark.parametrize(("name", "n", "block_size"), CASES)
def test_every_path_computes_the_users_forward(name, n, block_size, kind, streamed_calls):
    if kind == "pooled" and n == 4096:
        n = 2048  # the pool of both views holds 4096 latents: the same (4096, 4096) normaliser
    energy = ENERGIES[name](lengthscale=0.8).double()
    latents, got, want = ratio_and_loop(kind, energy, n, block_size)
    inputs = latents + list(energy.parameters())
    weights = torch.randn(n, dtype=torch.float64)
    got_grads = torch.autograd.grad((got * weights).sum(), inputs)
    want_grads = torch.autograd.grad((want * weights).sum(), inputs)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-9)
    streamed = block_size is not None or n > 512
    # The factorised kernel runs exactly where the hooks describe the forward.
    assert bool(streamed_calls) == (streamed and name != "forward-only")


@pytest.mark.parametrize(("n", "block_size"), [(513, None), (128, 64)])
def test_rpmelbo_follows_a_subclass_forward_at_the_reported_sizes(n, block_size):
    """The reported case: RPMELBO/N of a ScaledRBF at N = 513 (streamed by size) and at N = 128
    with block_size=64 equals the loop over its forward, not the parent's factorisation; the
    same under the pooled prior (NT-Xent) and, with block_size, the Markov implicit prior of a
    sequence RPM."""
    def energy():
        return ScaledRBF(lengthscale=1.0, learn_lengthscale=False).double()

    elbo = rpm.RPMELBO(block_size=block_size)
    z = torch.randn(n, D, dtype=torch.float64)
    z2 = z + 0.3 * torch.randn(n, D, dtype=torch.float64)
    for prior_cls, loop in [(ImplicitPrior, implicit_loop), (PooledImplicitPrior, pooled_loop)]:
        f = energy()
        model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), prior_cls(f))
        loss = elbo.loss(model.model, model.guide, z, z2)
        assert -loss / n == pytest.approx(loop(f, z, z2).mean().item(), rel=1e-10)
    if block_size is not None:
        x = torch.randn(n, 3, D, dtype=torch.float64)
        f = energy()
        model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), MarkovImplicitPrior(f),
                        encoder_calls="concat")
        loss = elbo.loss(model.model, model.guide, x)
        assert -loss / n == pytest.approx(markov_loop(f, x).mean().item(), rel=1e-10)


def test_hook_policy_follows_the_class_that_defines_forward():
    assert energy_hook_policy(RBFEnergy, "logit_factors") == "trusted"
    assert energy_hook_policy(ScaledRBF, "logit_factors") == "generic"
    assert energy_hook_policy(ScaledRBF, "paired") == "generic"
    assert energy_hook_policy(ScaledRBFWithHooks, "paired") == "trusted"
    assert energy_hook_policy(UncentredRBF, "logit_factors") == "checked"

    class Dot(Energy):
        def forward(self, z, z2):
            return z @ z2.T

    # Energy's defaults are built from forward; a plain module has no hooks.
    assert energy_hook_policy(Dot, "paired") == "generic"
    assert energy_hook_policy(Dot, "logit_factors") == "generic"
    assert energy_hook_policy(torch.nn.Bilinear, "paired") == "generic"
    with pytest.raises(ValueError, match="hook must be one of"):
        energy_hook_policy(RBFEnergy, "forward")


@pytest.mark.parametrize("kind", ["implicit", "pooled"])
def test_a_wrong_factorisation_is_refused_where_it_would_be_used(kind):
    """A subclass whose factors disagree with its (inherited) forward: the dense path never
    uses them and is right; the streamed path checks them and raises, naming the fix."""
    energy = OffsetlessRBF(lengthscale=0.8).double()
    z = torch.randn(12, D, dtype=torch.float64)
    z2 = z + 0.5 * torch.randn(12, D, dtype=torch.float64)
    prior = ImplicitPrior(energy) if kind == "implicit" else PooledImplicitPrior(energy)
    loop = implicit_loop if kind == "implicit" else pooled_loop
    torch.testing.assert_close(prior.log_ratio(z, z2), loop(energy, z, z2), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="OffsetlessRBF.logit_factors disagrees with .*forward"):
        prior.log_ratio(z, z2, block_size=5)


def test_a_wrong_paired_is_refused():
    energy = HalfPairedRBF(lengthscale=0.8).double()
    z = torch.randn(12, D, dtype=torch.float64)
    z2 = z + 0.5 * torch.randn(12, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="HalfPairedRBF.paired disagrees"):
        ImplicitPrior(energy).log_ratio(z, z2, block_size=5)


def test_generic_path_of_an_energy_without_factors_is_blocked(monkeypatch):
    """An energy without hooks, streamed: forward only ever sees tiles of block_size rows and
    columns (never the (N, N) matrix) and the result is the loop's."""
    shapes = []

    class L1(Energy):
        def forward(self, z, z2):
            shapes.append((z.shape[0], z2.shape[0]))
            return -torch.cdist(z, z2, p=1.0)

    energy = L1()
    z = torch.randn(30, D, dtype=torch.float64, requires_grad=True)
    z2 = torch.randn(30, D, dtype=torch.float64, requires_grad=True)
    for prior, loop in [(ImplicitPrior(energy), implicit_loop),
                        (PooledImplicitPrior(energy), pooled_loop)]:
        shapes.clear()
        got = prior.log_ratio(z, z2, block_size=8)
        assert max(max(shape) for shape in shapes) <= 8
        grads = torch.autograd.grad(got.sum(), [z, z2])
        want = loop(energy, z, z2)
        want_grads = torch.autograd.grad(want.sum(), [z, z2])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for g, w in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
