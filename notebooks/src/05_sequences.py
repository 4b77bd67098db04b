# %% [markdown]
# # Sequences: a prior over the whole video
#
# An RPM over a pair $(x, x')$ has a prior $P(z, z')$ over two latents. But a pair of frames
# shows no velocity: whatever the prior, it cannot say that a ball *keeps moving*. The RPM
# framework does not stop at pairs. With $T$ views $x_{1:T}$ (frames of a video window,
# augmentations of an image), one latent per view and a prior $P(z_{1:T})$ over all of them,
# the likelihood is the RPM's per view, $P(x_t \mid z_t) = Q(z_t \mid x_t) P_\text{true}(x_t) / Q_t(z_t)$,
# and the ELBO is
#
# $$\mathcal{L} = \mathbb{E}_{Q(z_{1:T} \mid x_{1:T})}\Big[\log P(z_{1:T}) + \sum_t \big(\log Q(z_t \mid x_t) - \log Q_t(z_t)\big) - \log Q(z_{1:T} \mid x_{1:T})\Big] + \text{const}$$
#
# ([docs/theory.md](../docs/theory.md#sequences)). This notebook
#
# 1. checks that a sequence model with $T = 2$ *is* the pair model,
# 2. writes a custom sequence prior in a few lines of Pyro,
# 3. trains the linear-Gaussian **state-space prior** on the bouncing balls, stationary and free,
#    and follows its velocities and forecasts along training.

# %%
import warnings

# `import pyro` loads Pyro's MCMC progress logger, which imports tqdm.auto; inside Jupyter that
# warns when ipywidgets is not installed. Nothing in this notebook uses a widget bar.
warnings.filterwarnings("ignore", message="IProgress not found")

import argparse
import os
import tempfile
import time

import matplotlib.pyplot as plt
import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroParam
from torch.distributions import constraints

import rpm
from rpm.priors import ImplicitPrior, MarkovImplicitPrior, RBFEnergy, SequencePrior

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
_ = torch.manual_seed(0)

# %%
# One CPU thread: for models this small, torch's default (a thread per core) spends longer
# coordinating its threads than computing, and far longer on a busy machine (README: Threads).
torch.set_num_threads(1)

# %% [markdown]
# ## 1. From pairs to sequences
#
# `rpm.RPM` with a prior over T views takes a batch `x` of shape (N, T, ...): N sequences of T
# views. It is the one model over J views, with a prior over the T views: ordered views
# (frames) and unordered ones (augmentations, crops of different sizes, `rpm.RPM(recognition,
# prior)` called with a list `[x_1, ..., x_J]`) differ only in the prior. Its Pyro model has one
# plate over the sequences, a prior site `"z"` with event shape (T, D) and the likelihood factor
# $\sum_t [\log Q(z_t \mid x_t) - \log Q_t(z_t)]$; the recognition model is shared over the
# views (or one per view) and evaluated once on all frames.
#
# The **Markov implicit prior** chains the pair's implicit conditionals,
# $P(z_{t+1} \mid z_t) \propto Q_{t+1}(z_{t+1})\, e^{f(z_t, z_{t+1})}$: its ELBO is the sum of the
# InfoNCE terms of consecutive views. With $T = 2$ it is the pair model, to the last digit:

# %%
torch.set_default_dtype(torch.float64)
net = torch.nn.Linear(5, 2)
energy = RBFEnergy(lengthscale=0.7)
x = torch.randn(16, 2, 5)  # 16 sequences of T = 2 views

sequence_model = rpm.RPM(rpm.DeltaRecognition(net), MarkovImplicitPrior(energy))
pair_model = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(energy))
elbo = rpm.RPMELBO()
print("sequence model, T = 2:", elbo.loss(sequence_model.model, sequence_model.guide, x))
print("pair model:           ", elbo.loss(pair_model.model, pair_model.guide, x[:, 0], x[:, 1]))
torch.set_default_dtype(torch.float32)

# %% [markdown]
# Any pair prior becomes a sequence prior the same way, applied along the chain:
# `MarkovPrior(pair_prior)` uses the pair prior's $P(z)$ for the first view and its
# $P(z' \mid z)$ for every step, with no new code.
#
# ## 2. A custom sequence prior in a few lines of Pyro
#
# A sequence prior is a `SequencePrior` (the protocol of priors over J views; a pair prior is a
# `Prior`, with `forward(q, q2)`) whose `forward(q, marginal)` declares the site `"z"` with event
# shape (T, D). A prior whose ELBO terms $\log P(z_{1:T}) - \sum_t \log Q_t(z_t)$ have a closed
# form may also return them from `sequence_log_ratio(z, q, marginal)`; without it, as here, the
# ELBO traces `forward`. Here, a Gaussian random walk with a learned step length, written
# with Pyro's own `GaussianHMM` (its hidden state is the latent itself, observed with a tiny
# noise):

# %%
class RandomWalkPrior(SequencePrior):
    def __init__(self, dim, step=1.0):
        super().__init__()
        self.dim = dim
        self.step = PyroParam(torch.tensor(step), constraints.positive)

    def forward(self, q, marginal):
        num_views, eye = q.batch_shape[-1], torch.eye(self.dim)
        walk = dist.GaussianHMM(
            dist.MultivariateNormal(torch.zeros(self.dim), 100.0 * eye),  # broad start
            eye, dist.MultivariateNormal(torch.zeros(self.dim), self.step ** 2 * eye),  # steps
            eye, dist.MultivariateNormal(torch.zeros(self.dim), 1e-4 * eye),  # z_t = state + tiny noise
            duration=num_views)
        return pyro.sample("z", walk)

# %% [markdown]
# It is an explicit density, so it needs stochastic recognition (Appendix B). Any guide is
# allowed; `Trace_ELBO` and `RPMELBO` agree on it:

# %%
class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(5, 4)

    def forward(self, x):
        loc, raw = self.linear(x).chunk(2, dim=-1)
        return loc, torch.nn.functional.softplus(raw) + 0.1


walk_model = rpm.RPM(rpm.GaussianRecognition(Head()), RandomWalkPrior(dim=2))
x = torch.randn(16, 6, 5)  # 16 sequences of 6 views
pyro.set_rng_seed(0)
print("RPMELBO:   ", rpm.RPMELBO().loss(walk_model.model, walk_model.guide, x))
pyro.set_rng_seed(0)
print("Trace_ELBO:", pyro.infer.Trace_ELBO().loss(walk_model.model, walk_model.guide, x))

# %% [markdown]
# ## 3. The state-space prior on bouncing balls
#
# The bouncing-balls video of [tutorial 3](03_bouncing_balls.ipynb): three balls, each moving one
# diameter per frame. A **state-space prior** models the encoder's six numbers as the noisy
# read-out of a hidden state of positions and velocities,
#
# $$s_{t+1} = A s_t + w_t, \qquad z_t = C s_t + b + v_t.$$
#
# Its log-density is a Kalman filter (`rpm.ops.kalman_filter`, square-root form in float64); its
# smoother gives the hidden states, hence velocities; propagating the filtered state gives
# forecasts. Two versions of it:
#
# * the **stationary** prior (`rpm.priors.StationaryStateSpacePrior`, the default of
#   `rpm bouncing-balls`): $s_t \sim \mathcal{N}(0, I)$ at every frame, $w_t \sim
#   \mathcal{N}(0, I - A A^\top)$ with the singular values of $A$ kept below 1, so the scale of
#   the latents lives in $C$, $b$ and $R$ and cannot be traded against the dynamics $A$. It
#   starts as a damped constant velocity in pixels, whitened (`from_dynamics`). As in
#   `rpm bouncing-balls`, its emission is *pinned* ($C$ the whitened pixel read-out and $R$ at
#   0.05 px stay at their start, `emission="pinned"`) and only $A$ and $b$ are learned, at a
#   learning rate of 3e-4 that halves every 100 steps;
# * the **free** prior (`rpm.priors.StateSpacePrior`): $s_1 \sim \mathcal{N}(m_1, S_1)$ and all of
#   $A$, $Q$, $C$, $R$ free, started at constant velocity (position += velocity), all learned at
#   a constant 1e-3.
#
# Both train on windows of 8 consecutive frames with the **structured** guide: the chain
# conditioned on the recognition means as Gaussian pseudo-observations,
# $Q(z_{1:T}) \propto P(z_{1:T}) \prod_t \mathcal{N}(\mu_t; z_t, \sigma^2)$, drawn by forward
# filtering and backward sampling, which shares the prior's dynamics. With it the ELBO is exactly
# $\log P_{R+\Sigma}(\mu_{1:T}) - \mathbb{E}[\sum_t \log Q_t(z_t)]$: the Kalman likelihood of the
# recognition means minus the cross-entropy under the mixture marginals
# ([docs/theory.md](../docs/theory.md#structured-guide), which also says why the free chain
# drifts). We train each for 600 steps (four times the 150 of the pair priors) and score them
# every 50: a prior meeting its floors at one training length is not enough, its dynamics should
# *hold*.

# %%
from rpm.data.bouncing_balls import generate_bouncing_balls
from rpm.experiments.bouncing_balls.command import HalvingRate, epoch_permutation
from rpm.experiments.bouncing_balls.evaluate import evaluate
from rpm.experiments.bouncing_balls.plots import plot_forecasts
from rpm.experiments.bouncing_balls.state_space import (
    build_state_space_model,
    evaluate_dynamics,
    window_batch,
)

num_frames = 150 if SMOKE_TEST else 900
num_test = 30 if SMOKE_TEST else 200
num_steps, eval_every = (4, 2) if SMOKE_TEST else (600, 50)
window, windows_per_step = 8, 16  # 128 frames per step
video = generate_bouncing_balls(num_frames=num_frames, seed=0)
frames, centres = video.frames, video.centres
num_train = num_frames - num_test
settings = argparse.Namespace(hidden_channels=16, state_space_noise=0.15, ball_diameter=5.0,
                              image_size=32, state_space_emission_noise=0.05)


def scores_of(model):
    positions = evaluate(model.recognition.net.encoder, frames, centres, num_train)
    dynamics = evaluate_dynamics(model, frames, centres, num_train)
    return {"position R^2": positions.r2, "velocity R^2": dynamics.velocity_r2,
            "forecast / last position": dynamics.forecast_error_px
            / dynamics.baseline_forecast_error_px}


def train(kind):
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    stationary = kind == "stationary"
    model = build_state_space_model(settings, in_channels=3, num_balls=3, kind=kind,
                                    emission="pinned" if stationary else "learned")
    optimizer = torch.optim.Adam([
        {"params": model.recognition.parameters(), "lr": 1e-2},
        {"params": model.prior.parameters(), "lr": 3e-4 if stationary else 1e-3},  # slowly
    ])
    # the stationary prior's learning rate halves every 100 steps; the free prior's is constant
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, [lambda step: 1.0, HalvingRate(100) if stationary else (lambda step: 1.0)])
    elbo, starts = rpm.RPMELBO(), num_train - window + 1
    per_epoch = starts // windows_per_step
    history, began = [], time.perf_counter()
    for step in range(1, num_steps + 1):
        epoch, position = divmod(step - 1, per_epoch)
        batch = epoch_permutation(0, epoch, starts)[position * windows_per_step:][:windows_per_step]
        model.recognition.net.train()
        loss = elbo.differentiable_loss(model.model, model.guide, window_batch(frames, batch, window))
        optimizer.zero_grad()
        (loss / (len(batch) * window)).backward()
        optimizer.step()
        schedule.step()
        if step % eval_every == 0:
            history.append((step, scores_of(model)))
    print(f"{kind} prior: {num_steps} steps in {time.perf_counter() - began:.0f} s")
    return model, history


runs = {kind: train(kind) for kind in ("stationary", "free")}

# %% [markdown]
# ## 4. Positions, velocities and forecasts along training
#
# Three read-outs, all on the held-out frames:
#
# * **positions**: the linear decoder of the other tutorials, from the encoder's six numbers;
# * **velocities** $v_t = c_t - c_{t-1}$: a linear decoder from the *smoothed hidden states*
#   $E[s_t \mid \mu_{1:T}]$ (the prior's posterior given every frame's recognition factor);
# * **one-step forecasts**: $C A\, E[s_{t-1} \mid \mu_{1:t-1}] + b$, the learned dynamics applied to
#   the filtered state, no refit, decoded to positions, as a fraction of the error of the last
#   true position as the forecast (one diameter, 5 px). Below 1: the prior knows the balls move.

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3))
for kind, (model, history) in runs.items():
    steps = [step for step, _ in history]
    for ax, name in zip(axes, history[0][1]):
        ax.plot(steps, [scores[name] for _, scores in history], marker="o", label=kind)
        ax.set_title(name)
        ax.set_xlabel("training step")
axes[0].legend()
plt.tight_layout()
plt.show()
for kind, (model, history) in runs.items():
    step, scores = history[-1]
    print(f"{kind:>10} prior at step {step}: " + ", ".join(
        f"{name} {value:.3f}" for name, value in scores.items()))

# %% [markdown]
# What to read in the figure (the full-size run, seed 0): the free chain's velocity $R^2$ and
# forecasts degrade after about 150 steps while its ELBO keeps rising (its $A$ and $C$ absorb the
# latents' scale): its positions are mostly still read well (position $R^2$ near 0.99, with
# dips), but its velocity $R^2$ swings far below zero and its forecasts are 2 to 6 times worse
# than the last position. Where exactly it lands at a given step changes from run to run (two
# runs of this notebook at step 600: velocity $R^2$ -1.9 and -6.1, forecasts 2.3 and 4.8 times
# the last position's error: floating-point rounding, e.g. the number of threads, moves a chain
# that has lost its dynamics).
# The stationary chain with its pinned emission *holds*: from step 150 to 600 its position $R^2$
# stays at 0.990-0.991, its velocity $R^2$ at 0.92-0.93 and its forecast at 0.68 of the
# last-position error (at step 600: 0.990, 0.919, 0.684). With its emission fixed, the encoder
# does not move with the prior, and the transition, whose learned direction would forget the
# velocity (docs/theory.md, stationary state-space prior), moves little under its halving
# learning rate. The same setting over three seeds and 1500 steps, what was tried on the way,
# and why the forecast stays above the 0.67 of issue 20 (a linear 2-lag predictor on the true
# positions does no better than 0.69) are in benchmarks/README.md. The recognition guide (each
# frame's latent drawn on its own) is an ablation measured there too: fitted to independently
# drawn noisy latents, the prior's dynamics are worthless (velocity $R^2$ near 0, forecasts
# worse than the last position).
#
# The smoothed velocities of the stationary model at the end of training against the truth:

# %%
model = runs["stationary"][0]
dynamics = evaluate_dynamics(model, frames, centres, num_train)
true_velocity = (centres[num_train:] - centres[num_train - 1:-1]).numpy()
shown = min(40, num_test)
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8), sharey=True)
for column, (ax, name) in enumerate(zip(axes, "xy")):
    for ball, colour in enumerate(("tab:red", "tab:green", "tab:blue")):
        ax.plot(true_velocity[:shown, ball, column], color=colour, lw=1.2)
        ax.plot(dynamics.velocity[:shown, ball, column].numpy(), color=colour, lw=1.2, ls="--")
    ax.set_title(f"velocity {name}: true (solid), from the smoothed states (dashed)")
    ax.set_xlabel("held-out frame")
axes[0].set_ylabel("pixels per frame")
plt.tight_layout()
plt.show()

# %% [markdown]
# And its one-step forecasts (crosses) against the true paths of the first held-out frames:

# %%
path = os.path.join(tempfile.mkdtemp(), "forecast.png")  # the experiment's figure
plot_forecasts(path, centres[num_train:], dynamics.forecast)
plt.figure(figsize=(4.6, 4.8))
plt.imshow(plt.imread(path))
plt.axis("off")
plt.show()
