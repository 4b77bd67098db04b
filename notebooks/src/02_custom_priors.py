# %% [markdown]
# # Writing your own priors
#
# In an RPM the prior $P(z, z')$ over the latents of a pair *is* the modelling choice: it says
# what you believe about how the two views' latents relate. `rpm` ships the usual ones, but the
# point of the RPM view is that you can write your own, in a few lines of ordinary Pyro.
#
# The contract is short. **A prior is any callable `prior(q, q2)` that, inside the model's plate
# over the N pairs, declares the sample sites `"z"` and `"z2"` and returns them.** `q` and `q2`
# are the batch's recognition distributions (the implicit prior needs them; explicit priors
# ignore them).
#
# This tutorial writes
#
# 1. a new **energy** for the implicit prior (a Student-t energy with a learned scale),
# 2. a new **explicit prior** (learned linear dynamics), and recovers a rotation from data,
# 3. and shows the **optimal-prior view**: when the prior can match the recognition joint, the
#    ELBO approaches the mutual information $I_Q(z; z')$ (Eq. 19-20).

# %%
import warnings

# `import pyro` loads Pyro's MCMC progress logger, which imports tqdm.auto; inside Jupyter that
# warns when ipywidgets is not installed. Nothing in this notebook uses a widget bar.
warnings.filterwarnings("ignore", message="IProgress not found")

import math
import os

import matplotlib.pyplot as plt
import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroParam

import rpm
from rpm.ops import squared_distances
from rpm.priors import Energy, ImplicitPrior, LinearDynamicsPrior

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
_ = torch.manual_seed(0)
pyro.set_rng_seed(0)

# %%
# One CPU thread: for models this small, torch's default (a thread per core) spends longer
# coordinating its threads than computing, and far longer on a busy machine (README: Threads).
torch.set_num_threads(1)

# %% [markdown]
# ## 1. A custom energy: Student-t
#
# Under the implicit prior, $P(z'|z) \propto Q(z')\, e^{f(z, z')}$. The RBF energy makes the
# conditional Gaussian; if positive pairs are occasionally far apart, a heavy-tailed conditional
# is a better belief. A Student-t energy with $\nu$ degrees of freedom and learned scale $s$:
#
# $$f(z, z') = -\frac{\nu + D}{2} \log\left(1 + \frac{\lVert z - z'\rVert^2}{\nu s^2}\right).$$
#
# An energy is a `PyroModule` returning the full $(N, M)$ matrix $f(z_i, z'_j)$. Learnable
# quantities are constrained `PyroParam`s.

# %%
class StudentTEnergy(Energy):
    """f(z, z') = -(nu + D)/2 log(1 + |z - z'|^2 / (nu s^2)), with the scale s learned."""

    def __init__(self, nu=3.0, scale=1.0):
        super().__init__()
        self.nu = nu
        self.scale = PyroParam(torch.tensor(scale), dist.constraints.positive)

    def forward(self, z, z2):
        distances = squared_distances(z, z2)  # (N, M)
        return -0.5 * (self.nu + z.shape[-1]) * torch.log1p(distances / (self.nu * self.scale**2))


# %% [markdown]
# Data: a 2-d latent in a box, seen through a fixed nonlinear map in 10 dimensions; the
# second view's latent jumps by Student-t noise (mostly small moves, sometimes large).

# %%
mixing = torch.nn.Sequential(torch.nn.Linear(2, 10), torch.nn.Tanh(), torch.nn.Linear(10, 10))
for parameter in mixing.parameters():
    parameter.requires_grad_(False)


def heavy_tailed_pairs(n):
    s = 2 * torch.rand(n, 2) - 1
    s2 = s + dist.StudentT(2.0, 0.0, 0.03).sample((n, 2))
    return mixing(s), mixing(s2)


def make_encoder(out=2):
    return torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, out))


num_steps = 30 if SMOKE_TEST else 800
model = rpm.RPM(rpm.DeltaRecognition(make_encoder()), ImplicitPrior(StudentTEnergy(scale=1.0)))
svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 3e-3}), rpm.RPMELBO())
scales, spreads = [], []
for step in range(num_steps):
    x, x2 = heavy_tailed_pairs(128 if SMOKE_TEST else 256)
    svi.step(x, x2)
    with torch.no_grad():
        scales.append(model.prior.energy.scale.item())
        spreads.append(model.encode(x).std(0).mean().item())

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot([s / p for s, p in zip(scales, spreads)])
ax.set_yscale("log")
ax.set_xlabel("step")
ax.set_ylabel("learned scale / latent spread")
plt.show()

# %% [markdown]
# The learned scale, measured against the spread of the latents, shrinks far below 1: the
# model learns that positive pairs are much closer than random pairs, with a tail it need not
# fight (the Student-t energy penalises the occasional large jump only logarithmically).
#
# ## 2. A custom explicit prior: learned linear dynamics
#
# An explicit prior is a normalised density. Here, the second view's latent is a linear map of
# the first plus Gaussian noise, with the map $A$ and the noise level learned:
#
# $$P(z) = \mathcal{N}(0, I), \qquad P(z'|z) = \mathcal{N}(A z, \sigma^2 I).$$
#
# Four lines of Pyro inside `forward`:

# %%
class LinearTransitionPrior(PyroModule):
    """P(z) = N(0, I), P(z'|z) = N(A z, sigma^2 I) with A and sigma learned."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.transition = torch.nn.Parameter(torch.eye(dim))
        self.noise = PyroParam(torch.tensor(0.5), dist.constraints.positive)

    def forward(self, q, q2):
        z = pyro.sample("z", dist.Normal(torch.zeros(self.dim), 1.0).to_event(1))
        z2 = pyro.sample("z2", dist.Normal(z @ self.transition.T, self.noise).to_event(1))
        return z, z2


# %% [markdown]
# For an explicit prior the recognition marginal $Q(z)$ must have a density, so the encoder is
# stochastic (`GaussianRecognition`; `rpm.RPM` refuses a deterministic encoder with a continuous
# explicit prior, with an error that explains why). The data: the second view's latent is the
# first **rotated by 0.4 rad**. The encoder may learn any linear transform $B$ of the latent,
# so the learned $A$ is $B R B^{-1}$: not a rotation matrix itself, but with the same
# eigenvalues $e^{\pm 0.4 i}$. We track the angle of $A$'s eigenvalues.

# %%
TRUE_ANGLE = 0.4
rotation = torch.tensor([[math.cos(TRUE_ANGLE), -math.sin(TRUE_ANGLE)],
                         [math.sin(TRUE_ANGLE), math.cos(TRUE_ANGLE)]])


def rotated_pairs(n):
    s = torch.randn(n, 2)
    return mixing(s), mixing(s @ rotation.T + 0.05 * torch.randn(n, 2))


class GaussianEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = make_encoder(out=4)

    def forward(self, x):
        loc, raw = self.body(x).chunk(2, dim=-1)
        return loc, torch.nn.functional.softplus(raw) + 1e-2


pyro.clear_param_store()
model = rpm.RPM(rpm.GaussianRecognition(GaussianEncoder()), LinearTransitionPrior(2))
svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 3e-3}), rpm.RPMELBO())
angles, noises = [], []
for step in range(30 if SMOKE_TEST else 800):
    svi.step(*rotated_pairs(128 if SMOKE_TEST else 256))
    eigenvalues = torch.linalg.eigvals(model.prior.transition.detach())
    angles.append(eigenvalues.angle().abs().max().item())
    noises.append(model.prior.noise.item())

fig, axes = plt.subplots(1, 2, figsize=(9, 3))
axes[0].plot(angles, label="learned")
axes[0].axhline(TRUE_ANGLE, color="k", ls="--", label="true rotation")
axes[0].set_ylabel("eigen-angle of A (rad)")
axes[0].legend()
axes[1].plot(noises)
axes[1].set_ylabel(r"learned $\sigma$")
for ax in axes:
    ax.set_xlabel("step")
plt.tight_layout()
plt.show()

# %% [markdown]
# Starting from $A = I$ (angle 0), the prior's dynamics pick up the rotation between the views:
# the prior is a *model* of how the latents move, and its parameters are interpretable.
#
# ## 3. The optimal prior: the ELBO approaches the mutual information
#
# Averaged over data, the RPM ELBO decomposes (Eq. 17-18) as
#
# $$\mathcal{L} = I_Q(z; z') - \mathrm{KL}\big(Q(z, z')\,\|\,P(z, z')\big) + \text{const}.$$
#
# So the best prior is the recognition joint itself, and then the ELBO is the mutual
# information. We check this on a problem where $I_Q$ is known: $x \sim \mathcal{N}(0, 1)$,
# $x' = \rho x + \sqrt{1-\rho^2}\,\epsilon$, and fixed encoders $Q(z|x) = \mathcal{N}(x, s^2)$.
# Then $(z, z')$ is bivariate normal with correlation $r = \rho / (1 + s^2)$ and
# $I_Q = -\tfrac12 \log(1 - r^2)$. Only the prior (`LinearDynamicsPrior`, with learned $A$, $S$,
# $\Sigma$) is trained; the encoders have no parameters.

# %%
RHO, S = 0.9, 0.3
r = RHO / (1 + S**2)
mutual_information = -0.5 * math.log(1 - r**2)


class FixedEncoder(torch.nn.Module):
    def forward(self, x):
        return x, torch.full_like(x, S)


def correlated_pairs(n):
    x = torch.randn(n, 1)
    return x, RHO * x + math.sqrt(1 - RHO**2) * torch.randn(n, 1)


pyro.clear_param_store()
model = rpm.RPM(rpm.GaussianRecognition(FixedEncoder()), LinearDynamicsPrior(1, scale=0.5, noise=1.0))
svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 2e-2}), rpm.RPMELBO())
batch_size = 128 if SMOKE_TEST else 512
elbo = [-svi.step(*correlated_pairs(batch_size)) / batch_size for _ in range(30 if SMOKE_TEST else 600)]

window = 20
smoothed = [sum(elbo[max(0, i - window):i + 1]) / len(elbo[max(0, i - window):i + 1]) for i in range(len(elbo))]
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(elbo, lw=0.5, alpha=0.5, label="ELBO / N")
ax.plot(smoothed, label="running mean")
ax.axhline(mutual_information, color="k", ls="--", label=f"$I_Q(z; z')$ = {mutual_information:.3f} nats")
ax.set_xlabel("step")
ax.set_ylabel("ELBO / N (nats)")
ax.legend()
plt.show()
print(f"final ELBO/N (mean of the last 100 steps): {sum(elbo[-100:]) / len(elbo[-100:]):.3f} nats, "
      f"I_Q = {mutual_information:.3f} nats")
print(f"learned A = {model.prior.transition.item():.3f} (optimum: r = {r:.3f})")

# %% [markdown]
# As the prior learns the recognition joint, the KL term vanishes and the ELBO rises to the
# mutual information (the small remaining gap is the minibatch estimate of $Q(z)$). This is the
# sense in which the RPM ELBO *with the optimal prior* is a mutual-information objective, while
# with a restricted prior (the implicit prior with a fixed energy) it is InfoNCE.
#
# **Summary.** Energies are `Energy` subclasses returning an $(N, M)$ matrix; explicit priors are
# `PyroModule`s that declare `"z"` and `"z2"`. Both train with the same `SVI` + `RPMELBO`, and
# their parameters say what the model learned about the relation between the views.
