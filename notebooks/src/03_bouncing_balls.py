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
# This notebook runs all three at small size: a video of 400 frames instead of the experiment's
# 900, and 60 short epochs (a few minutes on one CPU core). The full experiment, with every
# prior, checkpoints and figures, is one command, `python -m rpm bouncing-balls` (about 5 minutes).

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
from rpm.experiments.bouncing_balls.circular_step import BallDynamicsPrior
from rpm.experiments.bouncing_balls.encoders import BallEncoder
from rpm.priors import BilinearEnergy, ImplicitPrior, RBFEnergy

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
_ = torch.manual_seed(0)

# %%
# One CPU thread: for models this small, torch's default (a thread per core) spends longer
# coordinating its threads than computing, and far longer on a busy machine (README: Threads).
torch.set_num_threads(1)

# %% [markdown]
# ## 1. The data
#
# One continuous video. Each ball moves one full diameter per frame, in a direction that is the
# previous one plus uniform angular noise, resampled on collisions. Each ball has its own colour
# channel, so "which ball is ball 1" is defined and a linear decoder can be scored.

# %%
num_frames = 150 if SMOKE_TEST else 400  # `rpm bouncing-balls` uses 900
num_test = 30 if SMOKE_TEST else 100  # the last frames, held out for scoring
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
# mixture). We minimise the negative RPM ELBO per pair with Adam and keep the loss of every step.

# %%
num_train = num_frames - num_test
epochs = 2 if SMOKE_TEST else 60
batch_size = 128


def train(prior_name):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = make_model(prior_name)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    elbo = rpm.RPMELBO()
    first, second = frames[: num_train - 1], frames[1:num_train]  # pairs (t, t + 1)
    losses = []
    for epoch in range(epochs):
        for batch in torch.randperm(len(first)).split(batch_size):
            if len(batch) < 2:
                continue
            loss = elbo.differentiable_loss(model.model, model.guide, first[batch], second[batch])
            optimizer.zero_grad()
            (loss / len(batch)).backward()
            optimizer.step()
            losses.append(loss.item() / len(batch))
    return model, losses


trained = {name: train(name) for name in ("bilinear", "rbf", "dynamics")}
models = {name: model for name, (model, _) in trained.items()}

fig, axes = plt.subplots(1, 3, figsize=(12, 2.8))
for ax, (name, (_, losses)) in zip(axes, trained.items()):
    ax.plot(losses, lw=0.8)
    ax.set_title(name)
    ax.set_xlabel("step")
axes[0].set_ylabel("negative ELBO / N")
plt.tight_layout()
plt.show()

# %% [markdown]
# The losses of different priors are not comparable with each other (each prior is a different
# model). The implicit priors' losses flatten out; the dynamics prior's is still falling. Most of
# that fall is its marginal $P(z) = \mathcal{N}(m, \operatorname{diag} s^2)$ catching up with the
# encoder: its spread $s$ starts at 8 (a quarter of the frame, in pixels), but the encoder's
# outputs spread much less (both printed below), and Adam shrinks $s$ by about the learning rate
# per step on a log scale. The encoder is not what is still changing: its held-out $R^2$ (next
# section) is already as high as the RBF prior's. The learned parameters are in the
# units of the encoder's output, the centre of mass of a feature map:

# %%
print(f"learned RBF lengthscale: {models['rbf'].prior.energy.lengthscale.item():.3f}")
print("dynamics prior: spread s of P(z) per coordinate (started at 8):",
      [round(v, 2) for v in models["dynamics"].prior.spread.detach().tolist()])
with torch.no_grad():
    outputs = models["dynamics"].recognition.net.eval()(frames[:num_train])
print("spread of the encoder's outputs over the training frames:",
      [round(v, 2) for v in outputs.std(0).tolist()])

# %% [markdown]
# ## 4. What did each encoder learn?
#
# A linear decoder (least squares, with a bias) maps the six outputs to the six true
# coordinates. It is fitted on the training frames and scored on the held-out frames at the end
# of the video, by $R^2$ averaged over the coordinates. The baseline is the **untrained**
# encoder: the centres of mass of random feature maps of frames with one colour channel per ball
# already say something about where the balls are.

# %%
def decode(model):
    encoder = model.recognition.net.eval()
    with torch.no_grad():
        features = encoder(frames).double()  # (T, 6)
    design = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], dim=1)
    targets = centres.flatten(1).double()  # (T, 6)
    coef = torch.linalg.lstsq(design[:num_train], targets[:num_train]).solution  # (7, 6)
    prediction = design @ coef
    residual = (targets[num_train:] - prediction[num_train:]).square().sum(0)
    total = (targets[num_train:] - targets[num_train:].mean(0)).square().sum(0)
    return prediction, (1 - residual / total).mean().item(), coef


torch.manual_seed(0)
untrained = make_model("rbf")  # the same initialisation as every trained encoder
results = {"untrained": decode(untrained), **{name: decode(model) for name, model in models.items()}}
for name, (_, r2, _) in results.items():
    print(f"{name:9s} held-out R^2 = {r2:.3f}")

# %% [markdown]
# The first ball's horizontal position over the held-out frames, true and decoded:

# %%
test = torch.arange(num_train, num_frames)
fig, axes = plt.subplots(1, 4, figsize=(15, 3), sharey=True)
for ax, (name, (prediction, r2, _)) in zip(axes, results.items()):
    ax.plot(test, centres[num_train:, 0, 0], "k", lw=1.5, label="true x of ball 1")
    ax.plot(test, prediction[num_train:, 0], "C1", lw=1, label="decoded")
    ax.set_title(f"{name}: R$^2$ = {r2:.2f}")
    ax.set_xlabel("frame")
axes[0].set_ylabel("x (pixels)")
axes[0].legend()
plt.show()

# %% [markdown]
# The RBF prior, which encodes "nearby frames have nearby latents", tracks the balls; the
# bilinear critic of plain InfoNCE does not: its decoded trajectory wanders, and how far it gets
# above the untrained encoder depends on the seed and the size of the run (over seeds of the full
# experiment it lands close to the untrained encoder; see `benchmarks/README.md`). The dynamics
# prior, which knows that each ball moves by a fixed step, does at least as well as RBF.
#
# What did the dynamics prior learn about the step? Its step lengths $r_k$ are in the units of the
# encoder's read-out, which is not the image's pixel grid: a feature map's faint background pulls
# its centre of mass towards the middle of the frame, so the read-out moves less than the ball.
# The decoder undoes that shrinkage: multiplying $r_k$ by the decoder's gain from read-out $k$ to
# pixels (the root-mean-square singular value of its $6 \times 2$ block) gives the step in pixels,
# to compare with the truth, one diameter (5 pixels) per frame.

# %%
dynamics = models["dynamics"].prior
coef = results["dynamics"][2][:-1]  # (6, 6): read-out coordinates -> true coordinates
step_readout = dynamics.step_length.detach().double()  # (3,)
gain = torch.stack([torch.linalg.svdvals(coef[2 * k:2 * k + 2]).square().mean().sqrt() for k in range(3)])
print("learned step per map, read-out units:", [round(v, 2) for v in step_readout.tolist()])
print("decoder gain, pixels per read-out unit:", [round(v, 2) for v in gain.tolist()])
print("learned step per map in pixels:       ", [round(v, 2) for v in (step_readout * gain).tolist()],
      "(truth: 5.0)")

# %% [markdown]
# The feature maps of the **RBF** prior's encoder show what it attends to (rows: four held-out
# frames; columns: the frame and the three maps, on one colour scale):

# %%
encoder = models["rbf"].recognition.net.eval()
shown = frames[num_train:num_train + 4]
with torch.no_grad():
    maps = encoder.feature_maps(shown)  # (4, 3, 32, 32)
fig, axes = plt.subplots(4, 4, figsize=(6.4, 6), gridspec_kw={"wspace": 0.05, "hspace": 0.05})
for row in range(4):
    axes[row, 0].imshow(shown[row].permute(1, 2, 0).numpy())
    for k in range(3):
        image = axes[row, k + 1].imshow(maps[row, k].numpy(), cmap="magma", vmin=0, vmax=1)
for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
axes[0, 0].set_title("frame")
for k in range(3):
    axes[0, k + 1].set_title(f"map {k + 1}")
fig.colorbar(image, ax=axes, shrink=0.6, label="map value")
plt.show()

# %% [markdown]
# Each map is brightest on one ball, and some respond weakly to a second one. The background is
# not zero, which is why the centre of mass of a map sits between its ball and the middle of the
# frame: the read-out is an affine, shrunk copy of the ball's position, and the linear decoder
# (the gain in pixels per read-out unit printed above) maps it back.
#
# **Next.** `python -m rpm bouncing-balls --out runs/balls` runs the full comparison over every prior (the
# cosine energy too), with checkpoints, `--resume`, figures and a JSON of the results.
