# %% [markdown]
# # Bouncing balls: where a Bayesian prior beats plain InfoNCE
#
# The experiment of Aitchison & Ganev (Section 5, Appendix D): a video of three balls bouncing in
# a box. An encoder sees one frame at a time and must output the balls' positions, learning only
# from the fact that **consecutive frames are related**. No labels are used until the very end,
# when a linear decoder checks what the encoder's six numbers say about the true positions.
#
# The RPM view makes the choice of objective a choice of prior:
#
# * the **bilinear** critic of CPC, $f(z, z') = z^\top W z'$ (Eq. 8), is a nonsensical prior for
#   positions: it rewards $z'$ for a large dot product with $z$, not for being *near* it;
# * the **RBF** energy $f(z, z') = -\lVert z - z' \rVert^2 / 2l^2$ (Eq. 27) says "the next frame's
#   positions are close to this frame's", with a learned lengthscale $l$;
# * an explicit **dynamics** prior can say more: every ball moves by a fixed step in some
#   direction.
#
# This notebook runs all three at small size. The full experiment is one command,
# `rpm bouncing-balls` (about 5 minutes on two CPU cores).

# %%
import warnings

# `import pyro` loads Pyro's MCMC progress logger, which imports tqdm.auto; inside Jupyter that
# warns when ipywidgets is not installed. Nothing in this notebook uses a widget bar.
warnings.filterwarnings("ignore", message="IProgress not found")

import os

import matplotlib.pyplot as plt
import pyro
import torch

import rpm
from rpm.data.bouncing_balls import generate_bouncing_balls
from rpm.priors import BallDynamicsPrior
from rpm.models.bouncing_balls import BallEncoder
from rpm.priors import BilinearEnergy, ImplicitPrior, RBFEnergy

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. The data
#
# One continuous video. Each ball moves one full diameter per frame, in a direction that is the
# previous one plus uniform angular noise, resampled on collisions. Each ball has its own colour
# channel, so "which ball is ball 1" is defined and a linear decoder can be scored.

# %%
num_frames = 150 if SMOKE_TEST else 900
num_test = 30 if SMOKE_TEST else 200
video = generate_bouncing_balls(num_frames=num_frames, image_size=32, ball_diameter=5.0, seed=0)
frames, centres = video.frames, video.centres  # (T, 3, 32, 32), (T, 3, 2)
print("frames", tuple(frames.shape), "centres", tuple(centres.shape))

fig, axes = plt.subplots(1, 6, figsize=(12, 2.2))
for ax, t in zip(axes, range(0, 6)):
    ax.imshow(frames[t].permute(1, 2, 0).numpy())  # the three channels shown as RGB
    ax.set_title(f"frame {t}")
    ax.axis("off")
plt.show()

# %% [markdown]
# ## 2. The encoder and the three priors
#
# The paper's encoder: two batch-normalised convolutions (ReLU, then sigmoid) produce three
# feature maps; the centre of mass of each map gives an $(x, y)$, six numbers in pixel units.
# It is wrapped as a deterministic recognition model. The dynamics prior is an explicit density,
# so its recognition model gets a little noise (Appendix B; see [docs/theory.md](../docs/theory.md#deterministic-encoders)).

# %%
def make_model(prior_name):
    encoder = BallEncoder(in_channels=3, hidden_channels=16, kernel_size=5, num_maps=3)
    if prior_name == "bilinear":
        return rpm.RPM(rpm.DeltaRecognition(encoder), ImplicitPrior(BilinearEnergy(6)))
    if prior_name == "rbf":
        return rpm.RPM(rpm.DeltaRecognition(encoder), ImplicitPrior(RBFEnergy(lengthscale=1.0)))
    prior = BallDynamicsPrior(3, centre=16.0, spread=8.0, step_length=0.3, noise=0.3)
    return rpm.RPM(rpm.DeltaRecognition(encoder, noise_scale=0.3), prior)


# %% [markdown]
# ## 3. Training
#
# Positive pairs are consecutive frames $(t, t+1)$ from the training part of the video; the other
# pairs of the minibatch are the negatives (for the implicit priors, through the minibatch
# mixture). We minimise the negative RPM ELBO per pair with Adam.

# %%
num_train = num_frames - num_test
epochs = 2 if SMOKE_TEST else 30
batch_size = 128


def train(prior_name):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = make_model(prior_name)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    elbo = rpm.RPMELBO()
    first, second = frames[: num_train - 1], frames[1:num_train]  # pairs (t, t + 1)
    for epoch in range(epochs):
        for batch in torch.randperm(len(first)).split(batch_size):
            if len(batch) < 2:
                continue
            loss = elbo.differentiable_loss(model.model, model.guide, first[batch], second[batch])
            optimizer.zero_grad()
            (loss / len(batch)).backward()
            optimizer.step()
    return model


models = {name: train(name) for name in ("bilinear", "rbf", "dynamics")}
print("learned RBF lengthscale (pixels):", round(models["rbf"].prior.energy.lengthscale.item(), 3))
print("learned step length per ball (pixels):", models["dynamics"].prior.step_length.detach().numpy().round(2))

# %% [markdown]
# ## 4. What did each encoder learn?
#
# A linear decoder (least squares, with a bias) maps the six outputs to the six true
# coordinates. It is fitted on the training frames and scored on the held-out frames at the end
# of the video, by $R^2$ averaged over the coordinates.

# %%
def decode(model):
    encoder = model.recognition.net.eval()
    with torch.no_grad():
        features = encoder(frames).double()  # (T, 6)
    design = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], dim=1)
    targets = centres.flatten(1).double()  # (T, 6)
    coef = torch.linalg.lstsq(design[:num_train], targets[:num_train]).solution
    prediction = design @ coef
    residual = (targets[num_train:] - prediction[num_train:]).square().sum(0)
    total = (targets[num_train:] - targets[num_train:].mean(0)).square().sum(0)
    return prediction, (1 - residual / total).mean().item()


results = {name: decode(model) for name, model in models.items()}
for name, (_, r2) in results.items():
    print(f"{name:9s} held-out R^2 = {r2:.3f}")

# %%
test = torch.arange(num_train, num_frames)
fig, axes = plt.subplots(1, 3, figsize=(13, 3), sharey=True)
for ax, (name, (prediction, r2)) in zip(axes, results.items()):
    ax.plot(test, centres[num_train:, 0, 0], "k", lw=1.5, label="true x of ball 1")
    ax.plot(test, prediction[num_train:, 0], "C1", lw=1, label="decoded")
    ax.set_title(f"{name}: R$^2$ = {r2:.2f}")
    ax.set_xlabel("frame")
axes[0].set_ylabel("x (pixels)")
axes[0].legend()
plt.show()

# %% [markdown]
# The RBF prior, which encodes "nearby frames have nearby latents", tracks the balls; the
# bilinear critic of plain InfoNCE does not (at small sizes its decoded trajectory wanders, and
# often ends below the *untrained* encoder). The dynamics prior, which knows that each ball
# moves by a fixed step, does at least as well as RBF. Its feature maps show what the encoder
# attends to:

# %%
encoder = models["rbf"].recognition.net.eval()
with torch.no_grad():
    maps = encoder.feature_maps(frames[:4])  # (4, 3, 32, 32)
fig, axes = plt.subplots(4, 4, figsize=(7, 7))
for row in range(4):
    axes[row, 0].imshow(frames[row].permute(1, 2, 0).numpy())
    for k in range(3):
        axes[row, k + 1].imshow(maps[row, k].numpy(), cmap="magma")
for ax in axes.flat:
    ax.axis("off")
axes[0, 0].set_title("frame")
for k in range(3):
    axes[0, k + 1].set_title(f"map {k + 1}")
plt.show()

# %% [markdown]
# Each map lights up on one ball: the centre of mass of the map *is* that ball's position.
#
# **Next.** `rpm bouncing-balls --prior all --out runs/balls` runs the full comparison over every
# prior (with checkpoints, `--resume`, figures and a JSON of the results).
