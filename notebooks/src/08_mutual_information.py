# %% [markdown]
# # Estimating mutual information: the variational bounds and the RPM ELBO
#
# Contrastive learning is often explained as maximising a lower bound on the mutual information
# (MI) between two views. This tutorial measures what the bounds actually estimate, on data
# whose MI is known, with `rpm.mi`:
#
# 1. **Why InfoNCE saturates**: even with the *optimal* critic, the InfoNCE estimate of a batch
#    of N pairs never exceeds $\log N$; NWJ does not saturate, but its variance grows with the MI.
# 2. **A small staircase** (Poole et al. 2019): critics trained while the true MI steps up.
# 3. **The RPM ELBO's gap is a KL**: with an explicit prior, ELBO $= I_Q(z; z') -
#    \mathrm{KL}(Q(z, z') \| P(z, z'))$ (Eq. 17-18 of Aitchison & Ganev), measured as it trains.
#
# The full benchmark is `python -m rpm mutual-information`; the theory is in `docs/theory.md`
# (section *Mutual information*).

# %%
import warnings

# `import pyro` loads Pyro's MCMC progress logger, which imports tqdm.auto; inside Jupyter that
# warns when ipywidgets is not installed. Nothing in this notebook uses a widget bar.
warnings.filterwarnings("ignore", message="IProgress not found")

import math
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

from rpm.mi import CorrelatedGaussian, RPMEstimator, info_nce_bound, nwj

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
_ = torch.manual_seed(0)

# %%
# One CPU thread: for models this small, torch's default (a thread per core) spends longer
# coordinating its threads than computing, and far longer on a busy machine (README: Threads).
torch.set_num_threads(1)

# %% [markdown]
# ## 1. The optimal critic, and InfoNCE's ceiling
#
# For $x, y \in \mathbb{R}^{20}$ jointly Gaussian with correlation $\rho$ per dimension, the
# log density ratio $\log r(x, y) = \log p(y|x) - \log p(y)$ is a closed form
# (`CorrelatedGaussian.log_ratio`), so we can score a batch with the best possible critic and see
# what each bound makes of it. Scores are a matrix $F_{ij} = f(x_i, y_j)$ with the positive
# pairs on the diagonal.

# %%
batch = 64
mis = [1, 2, 4, 6, 8, 10, 12]
repeats = 5 if SMOKE_TEST else 50
rows = []
for mi in mis:
    pair = CorrelatedGaussian.with_mi(mi, 20)
    nce, nwj_values = [], []
    for _ in range(repeats):
        x, y = pair.sample(batch)
        scores = pair.log_ratio(x[:, None], y[None])            # (N, N), log r of every pair
        nce.append(info_nce_bound(scores).item())
        nwj_values.append(nwj(scores + 1).item())               # NWJ's optimum is 1 + log r
    rows.append((mi, np.mean(nce), np.mean(nwj_values), np.std(nwj_values)))
for mi, nce, nwj_mean, nwj_std in rows:
    print(f"true MI {mi:>4}: InfoNCE {nce:5.2f} (log N = {math.log(batch):.2f}), "
          f"NWJ {nwj_mean:8.2f} +- {nwj_std:.2f}")

# %% [markdown]
# InfoNCE follows the MI while it is well below $\log 64 = 4.16$ and then flattens under it:
# each term is a log-softmax over the batch plus $\log N$. NWJ is unbiased at the optimal critic,
# but its partition term $\mathbb{E}_{p(x)p(y)}[e^{f}]$ is a mean of ratios whose variance grows
# like $e^{I}$: its spread over batches explodes with the MI.

# %%
fig, ax = plt.subplots(figsize=(5, 3.2))
table = np.array(rows)
ax.plot(table[:, 0], table[:, 0], "k-", label="true MI")
ax.plot(table[:, 0], table[:, 1], "o-", label="InfoNCE")
ax.errorbar(table[:, 0], table[:, 2], yerr=table[:, 3], fmt="s-", label="NWJ (+- sd)")
ax.axhline(math.log(batch), color="gray", ls="--", label="log N")
ax.set_xlabel("true MI (nats)")
ax.set_ylabel("estimate with the optimal critic")
ax.set_ylim(-2, 16)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 2. A small staircase
#
# Now the critics are learned. The staircase of Poole et al. raises the true MI every few
# hundred steps while six estimators train, each with its own separable critic
# $f(x, y) = g(x)^\top h(y)$ (`rpm.experiments.mutual_information.staircase`). At this size it
# runs in seconds; the full benchmark (4000 steps per stage, joint critics too) is the command.

# %%
from rpm.experiments.mutual_information.plots import plot_staircase
from rpm.experiments.mutual_information.staircase import (
    CRITIC_ESTIMATORS,
    StaircaseConfig,
    train_critics,
    train_rpm,
)

config = StaircaseConfig(
    mis=[2.0, 4.0, 6.0], steps=30 if SMOKE_TEST else 800, batch_size=64, dim=20, lr=1e-3,
    prior_lr=1e-3, hidden=64, joint_hidden=32, layers=1, embed_dim=16, tau=5.0, alpha=0.01,
    momentum=0.99, rpm_hidden=0, seed=0)
values = train_critics("separable", "gaussian", config)            # (stages, steps, 6)
elbo = train_rpm("gaussian", config)                               # (stages, steps)
traces = {"gaussian": {**{name: values[..., k] for k, name in enumerate(CRITIC_ESTIMATORS)},
                       "rpm_elbo": elbo}}
ceilings = {"infonce": math.log(64), "interpolated": 1 + math.log(63 / 0.01)}
fig = plot_staircase("staircase.png", "separable", traces, config.mis, ceilings)
fig

# %% [markdown]
# InfoNCE climbs to $\log 64$ and stays under it; NWJ and MINE follow higher MIs with growing
# noise; SMILE's clip tames the noise at the price of a bias; $I_\alpha$ sits between InfoNCE and
# NWJ. The RPM ELBO (last panel) has no critic and no partition function: its prior over
# $(z, z')$ and the Gaussian estimate of the encoders' marginals replace them.

# %% [markdown]
# ## 3. The RPM ELBO's gap is the KL to the prior
#
# With affine encoders of Gaussian data everything is Gaussian, so both $I_Q(z; z')$ and
# $\mathrm{KL}(Q(z, z') \| P(z, z'))$ are closed forms. We train `RPMEstimator` at 4 nats and
# record the ELBO next to $I_Q - \mathrm{KL}$.

# %%
pair = CorrelatedGaussian.with_mi(4.0, 20)
est = RPMEstimator(20, 20, 20)
prior_params = list(est.prior.parameters())
optimizer = torch.optim.Adam([
    {"params": [p for p in est.parameters() if all(p is not q for q in prior_params)],
     "lr": 5e-4},
    {"params": prior_params, "lr": 1e-3}])


def closed_forms():
    """I_Q(z; z') and KL(Q(z, z') || P(z, z')) of the current encoders and prior."""
    with torch.no_grad():
        a, b = (e.affine.weight for e in est.encoders)
        s, s2 = est.log_noise.exp()
        eye = torch.eye(20)
        cov = torch.cat([torch.cat([a @ a.T + s**2 * eye, pair.rho * a @ b.T], 1),
                         torch.cat([pair.rho * b @ a.T, b @ b.T + s2**2 * eye], 1)])
        loc = torch.cat([e.affine.bias for e in est.encoders])
        mi_q = 0.5 * (torch.logdet(cov[:20, :20]) + torch.logdet(cov[20:, 20:])
                      - torch.logdet(cov))
        q = torch.distributions.MultivariateNormal(loc, cov)
        p = torch.distributions.MultivariateNormal(est.prior.loc, scale_tril=est.prior.scale_tril)
        return mi_q.item(), torch.distributions.kl_divergence(q, p).item()


steps = 40 if SMOKE_TEST else 1500
history = []
for step in range(steps):
    x, y = pair.sample(64)
    loss = -est(x, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        history.append((step, -loss.item(), *closed_forms()))
history = np.array(history)

fig, ax = plt.subplots(figsize=(5, 3.2))
ax.plot(history[:, 0], history[:, 1], alpha=0.4, label="ELBO per pair (one batch)")
ax.plot(history[:, 0], history[:, 2] - history[:, 3], label=r"$I_Q - \mathrm{KL}$ (closed form)")
ax.plot(history[:, 0], history[:, 2], "--", label=r"$I_Q(z; z')$")
ax.axhline(4.0, color="black", lw=0.8, label="true MI")
ax.set_xlabel("step")
ax.set_ylabel("nats")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The batch ELBOs scatter around $I_Q - \mathrm{KL}$: the identity holds at every step, and the
# estimate approaches the true MI as the prior learns the cross-covariance (the KL shrinks) and
# the encoders' noise shrinks ($I_Q \to I$, data processing). Unlike InfoNCE nothing caps it at
# $\log N$; unlike NWJ there is no exponential partition term. Its assumption is the marginal:
# the Gaussian estimate of $Q(z)$ is exact here, and biased upward when $Q(z)$ is not Gaussian
# (try the cubic variant of `python -m rpm mutual-information --cubic`).
