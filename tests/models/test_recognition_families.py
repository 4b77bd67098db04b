"""RPMs whose recognition is neither Normal nor Delta: a Student-t on R^D and a ProjectedNormal
on the sphere, under an explicit prior, the implicit prior and the pooled (NT-Xent) prior. The
recognition marginals take the generic blocked path (rpm.ops.distribution_mixture_log_prob);
RPMELBO must equal Pyro's Trace_ELBO in values and gradients, and a few SVI steps must lower
the loss."""

import math

import pyro
import pytest
import torch
from pyro.distributions import ProjectedNormal, StudentT
from pyro.infer import SVI, Trace_ELBO

import rpm
from rpm.priors import (
    CosineEnergy,
    GaussianRandomWalkPrior,
    ImplicitPrior,
    PooledImplicitPrior,
    RBFEnergy,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, X_DIM, D = 10, 4, 3


class StudentTHead(torch.nn.Module):
    """Q(z|x) = prod_d StudentT(df; mu_d(x), sigma_d(x)): batch_shape (N,), event_shape (D,)."""

    def __init__(self, df: float = 4.0):
        super().__init__()
        self.linear = torch.nn.Linear(X_DIM, 2 * D)
        self.df = df

    def forward(self, x):
        loc, raw = self.linear(x).chunk(2, dim=-1)
        return StudentT(self.df, loc, torch.nn.functional.softplus(raw) + 0.05).to_event(1)


class SphereHead(torch.nn.Module):
    """Q(z|x) = ProjectedNormal(c(x)) on the unit sphere S^{D-1}: batch_shape (N,), event (D,)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(X_DIM, D)

    def forward(self, x):
        return ProjectedNormal(2.0 * self.linear(x))


class SphereWalk(pyro.nn.PyroModule):
    """An explicit prior on the sphere: z uniform on S^{D-1} (ProjectedNormal with zero
    concentration), z' ~ ProjectedNormal(kappa z)."""

    def __init__(self, kappa: float = 4.0):
        super().__init__()
        self.kappa = kappa

    def forward(self, q, q2):
        z = pyro.sample("z", ProjectedNormal(torch.zeros(N, D, dtype=q.mean.dtype)))
        z2 = pyro.sample("z2", ProjectedNormal(self.kappa * z))
        return z, z2


FAMILIES = {"student_t": StudentTHead, "sphere": SphereHead}
PRIORS = {
    ("student_t", "explicit"): lambda: GaussianRandomWalkPrior(D, scale=1.3, step=0.5),
    ("student_t", "implicit"): lambda: ImplicitPrior(RBFEnergy(lengthscale=0.8)),
    ("sphere", "explicit"): lambda: SphereWalk(),
    ("sphere", "implicit"): lambda: ImplicitPrior(CosineEnergy(kappa=4.0)),
    ("student_t", "pooled"): lambda: PooledImplicitPrior(RBFEnergy(lengthscale=0.8)),
    ("sphere", "pooled"): lambda: PooledImplicitPrior(CosineEnergy(kappa=4.0)),
}
CASES = sorted(PRIORS)


def make_batch():
    x = torch.randn(N, X_DIM)
    return x, x + 0.2 * torch.randn(N, X_DIM)


@pytest.mark.parametrize("family,prior", CASES)
def test_rpmelbo_equals_trace_elbo(family, prior):
    torch.set_default_dtype(torch.float64)
    model = rpm.RPM(FAMILIES[family](), PRIORS[(family, prior)]())
    batch = make_batch()
    pyro.set_rng_seed(7)
    trace_loss = Trace_ELBO().differentiable_loss(model.model, model.guide, *batch)
    pyro.set_rng_seed(7)
    rpm_loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, *batch)
    assert torch.isfinite(trace_loss)
    assert abs(trace_loss.item() - rpm_loss.item()) <= 1e-9 * abs(trace_loss.item())
    params = [p for p in model.parameters() if p.requires_grad]
    for a, b in zip(torch.autograd.grad(trace_loss, params),
                    torch.autograd.grad(rpm_loss, params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_explicit_prior_elbo_is_eq15_with_the_mixture_marginal_loop(family):
    """-RPMELBO at fixed draws equals sum_i log P(z_i, z'_i) - log Q(z_i) - log Q(z'_i) (Eq. 15),
    log Q from a loop over the components (Eq. 11), log P from the prior's own distributions."""
    torch.set_default_dtype(torch.float64)
    model = rpm.RPM(FAMILIES[family](), PRIORS[(family, "explicit")]())
    x, x2 = make_batch()
    q, q2 = model.recognition(x), model.recognition(x2)
    pyro.set_rng_seed(3)
    loss = rpm.RPMELBO().loss(model.model, model.guide, x, x2)
    pyro.set_rng_seed(3)
    z, z2 = q.sample(), q2.sample()

    def log_marginal(dist, value):
        return sum(
            torch.logsumexp(torch.stack([dist.log_prob(value[m])[j] for j in range(N)]), 0).item()
            - math.log(N) for m in range(N))

    trace = pyro.poutine.trace(pyro.poutine.condition(model.prior, {"z": z, "z2": z2}))
    with pyro.plate("pairs", N):
        log_prior = trace.get_trace(q, q2).log_prob_sum().item()
    expected = log_prior - log_marginal(q, z) - log_marginal(q2, z2)
    assert abs(-loss - expected) <= 1e-9 * abs(expected)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_blocked_marginals_give_the_same_elbo(family):
    """RPMELBO(block_size=3) (blocks of 3 rows of 10, checkpointed) equals the one-block ELBO in
    value and gradients."""
    torch.set_default_dtype(torch.float64)
    model = rpm.RPM(FAMILIES[family](), PRIORS[(family, "explicit")]())
    batch = make_batch()
    losses = []
    for block_size in (None, 3):
        pyro.set_rng_seed(5)
        losses.append(rpm.RPMELBO(block_size=block_size).differentiable_loss(
            model.model, model.guide, *batch))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=0)
    params = list(model.parameters())
    for a, b in zip(*(torch.autograd.grad(loss, params) for loss in losses), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family,prior", CASES)
def test_a_few_svi_steps_lower_the_loss(family, prior):
    """40 Adam steps on one fixed batch of 10 pairs: the loss stays finite and the mean of the
    last 10 losses is below the mean of the first 10 (each an ELBO estimate from one draw)."""
    model = rpm.RPM(FAMILIES[family](), PRIORS[(family, prior)]())
    batch = make_batch()
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.05}), rpm.RPMELBO())
    losses = [svi.step(*batch) for _ in range(40)]
    assert all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-10:]) < sum(losses[:10])


def test_sphere_encoder_means_and_samples_stay_on_the_sphere():
    model = rpm.RPM(SphereHead(), ImplicitPrior(CosineEnergy(kappa=4.0)))
    x, x2 = make_batch()
    z = pyro.infer.Predictive(model.model, guide=model.guide, num_samples=1)(x, x2)["z"]
    assert torch.allclose(z.norm(dim=-1), torch.ones(()))
    assert torch.allclose(model.encode(x).norm(dim=-1), torch.ones(N))


def test_a_global_batch_refuses_a_family_it_cannot_gather():
    model = rpm.RPM(StudentTHead(), GaussianRandomWalkPrior(D))
    x, x2 = make_batch()
    q, q2 = model.recognise(x, x2)
    with pytest.raises(ValueError, match="StudentT recognition has no such gather"):
        rpm.inference.rpm_elbo(model.prior, [q.sample(), q2.sample()], [q, q2],
                               candidates=model.candidates(global_batch=True))
