# %% [markdown]
# # Self-supervised learning on digits: a plain torch loop and the Pyro route
#
# This tutorial trains a small CNN without labels on real images, the 8 x 8 handwritten digits
# that scikit-learn ships (nothing is downloaded), and asks how few labels a classifier on the
# learned representation then needs. It does it twice, from the same initialisation on the same
# batches:
#
# 1. **a plain PyTorch loop** with `rpm.losses.NTXentLoss`, a drop-in for lightly's loss of the
#    same name (SimCLR's NT-Xent, mean over the batch, in nats);
# 2. **the Pyro route**: `rpm.RPM` with the pooled implicit prior, trained on `rpm.RPMELBO`.
#
# They are the same objective: the loss is the negative ELBO per pair plus a constant,
# $\text{NT-Xent} = -\mathcal{L}/N + \log(2N - 1)$ (docs/theory.md, "NT-Xent"). You will
#
# 1. make augmented views of a batch with `rpm.data.augment` (kornia, on the batch's device);
# 2. check the identity on a batch, then train both routes and compare their losses step by step;
# 3. score the frozen representations with a linear probe and kNN at 1, 5, 10 labels per class
#    and with all labels (`rpm.evaluation.label_efficiency`), against the raw pixels;
# 4. train a prior over J = 4 views, which a pair loss cannot express.
#
# The command `python -m rpm digits` runs the full experiment (more methods, longer training, several
# label draws); its measured numbers are in benchmarks/README.md.

# %%
import warnings

# `import pyro` loads Pyro's MCMC progress logger, which imports tqdm.auto; inside Jupyter that
# warns when ipywidgets is not installed. Nothing in this notebook uses a widget bar.
warnings.filterwarnings("ignore", message="IProgress not found")

import copy
import math
import os

import matplotlib.pyplot as plt
import pyro
import torch

import rpm
from rpm.data.augment import MultiViewTransform, RandomView
from rpm.data.digits import load_digits_split
from rpm.evaluation import label_efficiency, representations
from rpm.experiments.digits.model import DigitsEncoder
from rpm.losses import NTXentLoss
from rpm.priors import CosineEnergy, PooledImplicitPrior, StarImplicitPrior

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"  # the test suite runs a reduced version
STEPS = 20 if SMOKE_TEST else 400
BATCH = 64 if SMOKE_TEST else 256
DRAWS = 2 if SMOKE_TEST else 5
TEMPERATURE = 1.0  # the temperature rpm digits uses (benchmarks/README.md: how it was chosen)
_ = torch.manual_seed(0)
pyro.set_rng_seed(0)

# %%
# One CPU thread: for models this small, torch's default (a thread per core) spends longer
# coordinating its threads than computing, and far longer on a busy machine (README: Threads).
torch.set_num_threads(1)

# %% [markdown]
# ## 1. The data and the views
#
# `load_digits_split` returns a fixed stratified split (1347 training and 450 test images,
# intensities in [0, 1]). A view is a random affine map (rotation, shear, shift, zoom) plus
# pixel noise, drawn per image; no flips, which would turn some digits into others.

# %%
data = load_digits_split()
print("training images", tuple(data.train.images.shape), " test images", tuple(data.test.images.shape))
two_views = MultiViewTransform([RandomView(), RandomView()])
x1, x2 = two_views(data.train.images[:6], torch.Generator().manual_seed(0))

fig, axes = plt.subplots(3, 6, figsize=(7, 3.6))
for col in range(6):
    for row, (images, label) in enumerate(((data.train.images, "image"), (x1, "view 1"), (x2, "view 2"))):
        axes[row, col].imshow(images[col, 0], cmap="gray_r", vmin=0, vmax=1)
        axes[row, col].set_xticks([]), axes[row, col].set_yticks([])
        if col == 0:
            axes[row, col].set_ylabel(label)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2. One objective, two routes
#
# The encoder is the CNN of `rpm digits`: a backbone $g$ (three convolutions with batch
# normalisation) whose output $h$ is the representation we evaluate, and a projection head
# whose output $z$ the objective sees. Both routes start from a copy of the same network.
#
# **Plain torch.** `NTXentLoss(temperature)` takes the two views' outputs, as lightly's does.
#
# **Pyro.** `rpm.RPM(rpm.DeltaRecognition(encoder), PooledImplicitPrior(CosineEnergy(kappa=1/tau)))`
# is the RPM whose ELBO is NT-Xent: `rpm.RPMELBO` returns its negative, summed over the batch.
# On one batch the two numbers are the loss and $-\mathcal{L}/N + \log(2N - 1)$:

# %%
encoder_torch = DigitsEncoder()
encoder_pyro = copy.deepcopy(encoder_torch)  # the same initialisation
untrained = copy.deepcopy(encoder_torch)  # kept as it is, a baseline
loss_module = NTXentLoss(temperature=TEMPERATURE)
model = rpm.RPM(rpm.DeltaRecognition(encoder_pyro), PooledImplicitPrior(CosineEnergy(kappa=1 / TEMPERATURE)))
elbo = rpm.RPMELBO()

x1, x2 = two_views(data.train.images[:BATCH], torch.Generator().manual_seed(1))
with torch.no_grad():
    loss_value = loss_module(encoder_torch(x1), encoder_torch(x2))
    negative_elbo = elbo.loss(model.model, model.guide, x1, x2) / BATCH
print(f"NTXentLoss:                  {float(loss_value):.6f}")
print(f"-ELBO/N + log(2N - 1), Pyro: {negative_elbo + math.log(2 * BATCH - 1):.6f}")

# %% [markdown]
# Now train both, each with Adam, on the same images and views at every step (the views of
# step $s$ come from a generator seeded with $s$).

# %%
def views_of_step(step, transform=two_views):
    generator = torch.Generator().manual_seed(step)
    rows = torch.randperm(data.train.images.shape[0], generator=generator)[:BATCH]
    return transform(data.train.images[rows], generator)


optimizer_torch = torch.optim.Adam(encoder_torch.parameters(), lr=2e-3)
optimizer_pyro = torch.optim.Adam(model.parameters(), lr=2e-3)
losses = {"plain torch (NTXentLoss)": [], "Pyro (RPM, RPMELBO)": []}
for step in range(STEPS):
    x1, x2 = views_of_step(step)
    loss = loss_module(encoder_torch(x1), encoder_torch(x2))  # a plain PyTorch step
    optimizer_torch.zero_grad()
    loss.backward()
    optimizer_torch.step()
    losses["plain torch (NTXentLoss)"].append(loss.item())

    with pyro.validation_enabled(False):  # the Pyro route: the negative ELBO per pair
        negative_elbo = elbo.differentiable_loss(model.model, model.guide, x1, x2) / BATCH
    optimizer_pyro.zero_grad()
    negative_elbo.backward()
    optimizer_pyro.step()
    losses["Pyro (RPM, RPMELBO)"].append(negative_elbo.item() + math.log(2 * BATCH - 1))

gap = max(abs(a - b) for a, b in zip(*losses.values()))
print(f"largest difference between the two routes' losses over {STEPS} steps: {gap:.2e} nats")
fig, ax = plt.subplots(figsize=(5, 3))
for label, values in losses.items():
    ax.plot(values, label=label, lw=1)
ax.set_xlabel("step")
ax.set_ylabel("NT-Xent (nats)")
ax.legend()
plt.show()

# %% [markdown]
# The two curves lie on top of each other. They are not equal to the last digit: the two routes
# round differently in float32 (the first batch above agrees to about 1e-6), and training
# carries such differences forward from step to step, which is the difference printed above:
# small against the fall of the loss itself.
#
# ## 3. How many labels does the representation need?
#
# `rpm.evaluation.representations` runs the frozen backbone in evaluation mode (batch
# normalisation with its running statistics). `label_efficiency` draws $k$ labelled training
# images per class (the same images for every representation), fits a linear probe
# (standardised logistic regression) and a kNN classifier on them, and scores the 450 test
# images; the mean over the draws is reported. As a reference, the same classifiers on the raw
# pixels.

# %%
def curve(train_features, test_features):
    return label_efficiency(train_features, data.train.labels, test_features, data.test.labels,
                            labels_per_class=(1, 5, 10, None), num_draws=DRAWS, seed=0)


curves = {
    "raw pixels": curve(data.train.images.flatten(1), data.test.images.flatten(1)),
    "untrained encoder": curve(representations(untrained.backbone, data.train.images),
                               representations(untrained.backbone, data.test.images)),
    "plain torch (NTXentLoss)": curve(representations(encoder_torch.backbone, data.train.images),
                                      representations(encoder_torch.backbone, data.test.images)),
    "Pyro (RPM, RPMELBO)": curve(representations(encoder_pyro.backbone, data.train.images),
                                 representations(encoder_pyro.backbone, data.test.images)),
}
keys = ["1", "5", "10", "all"]
print(f"{'test accuracy (%)':<26}" + "".join(f"{'probe ' + k:>10}" for k in keys)
      + "".join(f"{'kNN ' + k:>9}" for k in keys))
for name, result in curves.items():
    print(f"{name:<26}" + "".join(f"{100 * result.linear_probe[k].mean:>10.1f}" for k in keys)
          + "".join(f"{100 * result.knn[k].mean:>9.1f}" for k in keys))

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
for ax, classifier in zip(axes, ("linear_probe", "knn")):
    for name, result in curves.items():
        scores = getattr(result, classifier)
        ax.plot(keys, [100 * scores[k].mean for k in keys], marker="o", label=name,
                ls="--" if name in ("raw pixels", "untrained encoder") else "-")
    ax.set_title("linear probe" if classifier == "linear_probe" else "kNN")
    ax.set_xlabel("labelled images per class")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("test accuracy (%)")
axes[1].legend(fontsize=8)
plt.show()

# %% [markdown]
# Read the table against the raw pixels: where the trained backbone's accuracy is higher, the
# views taught the encoder what a digit is without a single label. The two routes score alike
# because they trained the same network on the same objective; they can differ a little
# through the float rounding seen above. The full-size run of `rpm digits` (800 steps, and its
# latent $z$ beside $h$) is in benchmarks/README.md.
#
# ## 4. More than two views
#
# A pair loss sees two views of an image. An RPM takes a prior over all J of them: the **star
# prior** (`StarImplicitPrior`, SupCon's $L_\text{out}$ with the views of an image as its
# positives) draws each view's latent from an implicit conditional around a centre view, and
# averages over the centres. `rpm.RPM` takes the J views as a list; with J = 4:

# %%
four_views = MultiViewTransform([RandomView() for _ in range(4)])
encoder_star = copy.deepcopy(untrained)  # the same initialisation as the pair routes
star = rpm.RPM(rpm.DeltaRecognition(encoder_star), StarImplicitPrior(CosineEnergy(kappa=1 / TEMPERATURE)))
optimizer_star = torch.optim.Adam(star.parameters(), lr=2e-3)
star_losses = []
for step in range(STEPS):
    views = views_of_step(step, four_views)  # 4 tensors (BATCH, 1, 8, 8)
    with pyro.validation_enabled(False):
        negative_elbo = elbo.differentiable_loss(star.model, star.guide, views) / BATCH
    optimizer_star.zero_grad()
    negative_elbo.backward()
    optimizer_star.step()
    star_losses.append(negative_elbo.item())
star_curve = curve(representations(encoder_star.backbone, data.train.images),
                   representations(encoder_star.backbone, data.test.images))
for name, result in (("pairs (NTXentLoss)", curves["plain torch (NTXentLoss)"]),
                     ("star prior, J = 4", star_curve)):
    print(f"{name:<20} linear probe " + " ".join(f"{k}: {100 * result.linear_probe[k].mean:.1f}" for k in keys))

# %% [markdown]
# Each step of the star prior encodes twice as many images as a pair step, so compare at equal
# steps with that cost in mind. `python -m rpm digits --methods all` trains the star and
# mixture-of-partners priors, multi-crop and a queue of earlier latents beside the pair
# priors; benchmarks/README.md has their scores.
