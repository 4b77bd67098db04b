# %% [markdown]
# # Identifiability: contrastive learning inverts the data-generating process
#
# Zimmermann et al. (2021) showed that when the data come from latents $z$ through an invertible
# map $x = g(z)$, and positive pairs have latents related by a von Mises-Fisher conditional, an
# encoder trained with vMF-InfoNCE recovers $z$ up to a rotation. Rusak et al. showed what goes
# wrong when the positive pairs vary *differently along different dimensions*, and fixed it with
# a learned diagonal, AnInfoNCE.
#
# In the RPM view both are the same model with different priors: the implicit prior with a
# cosine energy (vMF-InfoNCE) or with an anisotropic energy with learned $\Lambda$ (AnInfoNCE).
# This tutorial
#
# 1. generates latents on the sphere, mixes them with an invertible MLP, and trains a
#    vMF-InfoNCE RPM that recovers them (measured by $R^2$ and MCC);
# 2. gives the positive pairs two groups of dimensions with concentrations 5 and 25, and shows
#    that the cosine energy loses the low-variation dimensions while the anisotropic energy
#    recovers all of them and learns $\Lambda$.
#
# Everything trains in the cells below, at small size (3 and 4 latents, a few thousand steps,
# about 3 minutes on one CPU core). The full-size experiments (n = 10 latents, as in the papers)
# are the command `python -m rpm identifiability`.

# %%
import warnings

# `import pyro` loads Pyro's MCMC progress logger, which imports tqdm.auto; inside Jupyter that
# warns when ipywidgets is not installed. Nothing in this notebook uses a widget bar.
warnings.filterwarnings("ignore", message="IProgress not found")

import math
import os

import matplotlib.pyplot as plt
import pyro
import torch

import rpm
from rpm.data.synthetic import InvertibleMLP, LatentProcess
from rpm.experiments.identifiability.encoder import MLPEncoder
from rpm.metrics import mcc, mcc_per_dimension, r2, r2_per_dimension
from rpm.priors import AnisotropicEnergy, CosineEnergy, ImplicitPrior

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"
_ = torch.manual_seed(0)

# %%
# One CPU thread: for models this small, torch's default (a thread per core) spends longer
# coordinating its threads than computing, and far longer on a busy machine (README: Threads).
torch.set_num_threads(1)

# %% [markdown]
# ## 1. The data-generating process
#
# Latents uniform on the unit sphere in $\mathbb{R}^n$; the positive latent $z'$ is drawn from
# a vMF distribution centred on $z$ with concentration $\kappa = 1$ (the setting of Zimmermann et
# al.: a weak contrastive signal); the observation is $x = g(z)$ with $g$ a frozen invertible
# 3-layer leaky-ReLU MLP with well-conditioned weights.
#
# How hard the problem is depends on the draw of $g$. With `seed=1` the short run below recovers
# the latents; with `seed=0` (layer condition numbers up to 3.4) the same training stayed below
# the identity map's $R^2$ at every evaluation of a 2000-step run when we tried. The command
# `rpm identifiability` draws $g$ from its `--seed`.

# %%
dim = 3
process = LatentProcess(dim=dim, space="sphere", marginal="uniform", conditional="vmf",
                        conditional_param=1.0)
mixing = InvertibleMLP(dim, seed=1)
z, z_pos = process.sample_pairs(2000)
print("latents on the sphere:", z.norm(dim=1)[:3], " mean cosine of positive pairs:",
      round((z * z_pos).sum(1).mean().item(), 3))
print("condition numbers of the mixing layers:", [round(c, 2) for c in mixing.condition_numbers()])

# %% [markdown]
# ## 2. vMF-InfoNCE as an RPM
#
# The RPM is a deterministic recognition model (an MLP whose output is projected onto the
# sphere; its linear path starts at the identity, which keeps the affine information of $x$)
# and the implicit prior with the cosine energy $f(z, z') = \kappa \hat z^\top \hat z'$, with
# $\kappa = 1$ matching the data (the model is then well specified). Its negative ELBO per pair
# is the vMF-InfoNCE loss minus $\log N$.
#
# The training loop is short: draw a fresh batch of positive pairs, take an Adam step on the
# negative ELBO per pair, and every few hundred steps score the encoder on a fixed held-out set.
# The learning rate warms up briefly and then decays on a cosine, which helps a lot with the weak
# contrastive signal at $\kappa = 1$. The energy's own parameters (if it has any) get their own
# learning rate.

# %%
steps = 40 if SMOKE_TEST else 1500
batch_size = 128 if SMOKE_TEST else 512
eval_every = 20 if SMOKE_TEST else 250


def held_out_set(process, mixing, n=1000 if SMOKE_TEST else 5000):
    z, _ = process.sample_pairs(n)
    with torch.no_grad():
        return z, mixing(z)


def train(model, process, mixing, held_out, lr=1e-3, energy_lr=0.1, warmup=0.05):
    """Adam on the negative ELBO per pair; returns the loss of every step and the held-out R^2."""
    energy = list(model.prior.energy.parameters())
    others = [p for p in model.parameters() if all(p is not q for q in energy)]
    groups = [{"params": others, "lr": lr}] + ([{"params": energy, "lr": energy_lr}] if energy else [])
    optimizer = torch.optim.Adam(groups)
    warm = math.ceil(warmup * steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(
        (s + 1) / warm, 0.5 * (1 + math.cos(math.pi * max(0, s - warm) / (steps - warm)))))
    elbo = rpm.RPMELBO()
    z_test, x_test = held_out
    history = {"loss": [], "eval_step": [], "r2": []}
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            model.eval()
            with torch.no_grad():
                history["eval_step"].append(step)
                history["r2"].append(r2(z_test, model.encode(x_test)))
            model.train()
        if step == steps:
            break
        z, z_pos = process.sample_pairs(batch_size)
        with torch.no_grad():
            x, x_pos = mixing(z), mixing(z_pos)
        loss = elbo.differentiable_loss(model.model, model.guide, x, x_pos) / batch_size
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        history["loss"].append(loss.item())
    return history


pyro.clear_param_store()
_ = torch.manual_seed(1)
model = rpm.RPM(rpm.DeltaRecognition(MLPEncoder(dim, hidden=128, depth=3)),
                ImplicitPrior(CosineEnergy(kappa=1.0)))
held_out = held_out_set(process, mixing)
vmf_history = train(model, process, mixing, held_out)
z_test, x_test = held_out
with torch.no_grad():
    h_test = model.eval().encode(x_test)
vmf = {"r2": r2(z_test, h_test), "mcc": mcc(z_test, h_test), "identity_r2": r2(z_test, x_test),
       "untrained_r2": vmf_history["r2"][0]}
print(f"after {steps} steps of {batch_size} pairs: held-out R^2 = {vmf['r2']:.3f}, MCC = {vmf['mcc']:.3f}")
print(f"baselines: untrained encoder R^2 = {vmf['untrained_r2']:.3f}, "
      f"identity map (the raw observations) R^2 = {vmf['identity_r2']:.3f}")

# %%
def plot_history(histories, baselines=None):
    """Loss per step (left) and held-out R^2 at the evaluation steps (right)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
    for i, (name, history) in enumerate(histories.items()):
        left.plot(history["loss"], lw=0.5, color=f"C{i}", label=name)
        right.plot(history["eval_step"], history["r2"], "o-", ms=3, color=f"C{i}", label=name)
    for name, value in (baselines or {}).items():
        right.axhline(value, color="0.5", ls="--", lw=1)
        right.annotate(name, (0, value), xytext=(2, 3), textcoords="offset points", color="0.4")
    left.set_xlabel("step")
    left.set_ylabel("negative ELBO / N")
    right.set_xlabel("step")
    right.set_ylabel("held-out $R^2$")
    left.legend()
    plt.tight_layout()
    plt.show()


plot_history({"cosine (vMF-InfoNCE)": vmf_history}, {"identity map": vmf["identity_r2"]})

# %% [markdown]
# $R^2$ is the fit of an affine map from the recovered to the true latents on fresh held-out
# samples: close to 1 means the encoder inverted $g$ up to a linear transformation (here, a
# rotation). The identity map (the raw observations) is the baseline to beat; the untrained
# encoder starts close to it, because its linear path is the identity. The MCC asks for more,
# the latents up to a permutation and a scaling of each dimension. A rotation-invariant prior on
# the sphere identifies them only up to a rotation, so the MCC depends on which rotation the
# encoder happens to end in; here it stays far below the $R^2$.
#
# ## 3. Anisotropic positive pairs: InfoNCE versus AnInfoNCE
#
# Now the positive pairs are drawn from an anisotropic normal (renormalised onto the sphere)
# with concentration $\Lambda = 5$ on the first half of the dimensions and $\Lambda = 25$ on the
# second: the second group varies little between views ("style"), the first a lot. A single
# cosine temperature cannot fit both; the anisotropic energy
# $f(z, z') = -\tfrac12 (\hat z - \hat z')^\top \operatorname{diag}(\lambda) (\hat z - \hat z')$
# learns one $\lambda_d$ per dimension. Both train on the same data, from the same initial encoder.

# %%
aniso_dim = 4
aniso_process = LatentProcess(dim=aniso_dim, space="sphere", conditional="anisotropic",
                              concentrations="5,25")
aniso_mixing = InvertibleMLP(aniso_dim, seed=0)
aniso_held_out = held_out_set(aniso_process, aniso_mixing)
energies = {"cosine": CosineEnergy(kappa=1.0),
            "anisotropic": AnisotropicEnergy(aniso_dim, normalize=True, init=1.0)}
aniso_models, aniso_histories = {}, {}
for name, energy in energies.items():
    pyro.clear_param_store()
    _ = torch.manual_seed(1)
    aniso_models[name] = rpm.RPM(rpm.DeltaRecognition(MLPEncoder(aniso_dim, hidden=128, depth=3)),
                                 ImplicitPrior(energy))
    aniso_histories[name] = train(aniso_models[name], aniso_process, aniso_mixing, aniso_held_out)

z_test, x_test = aniso_held_out
per_dimension = {}
for name, model in aniso_models.items():
    with torch.no_grad():
        h_test = model.eval().encode(x_test)
    per_dimension[name] = r2_per_dimension(z_test, h_test).tolist()
    print(f"{name:12s} R^2 per true dimension: {[round(v, 3) for v in per_dimension[name]]}")
plot_history(aniso_histories, {"identity map": r2(z_test, x_test)})

# %% [markdown]
# The encoder may permute and rescale the latents, so the learned $\lambda$ is read through the
# MCC's one-to-one assignment of recovered to true dimensions, and compared by group: the ratio of
# the mean $\lambda$ of the second half to that of the first, 5 in the data. The noise is added
# before the projection onto the sphere, so even the best anisotropic energy for this data does
# not reach 5: the **oracle** below fits the same energy to the true latent pairs (the encoder
# replaced by the identity on $z$), the best ratio the energy family can reach.

# %%
with torch.no_grad():
    h_test = aniso_models["anisotropic"].encode(x_test)
matched = mcc_per_dimension(z_test, h_test).index  # recovered dimension of each true dimension
learned = aniso_models["anisotropic"].prior.energy.concentration.detach()[matched]


def group_ratio(values):
    return (values[aniso_dim // 2:].mean() / values[: aniso_dim // 2].mean()).item()


pyro.clear_param_store()
oracle = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()),
                 ImplicitPrior(AnisotropicEnergy(aniso_dim, normalize=True, init=1.0)))
oracle_optimizer = torch.optim.Adam(oracle.parameters(), lr=0.1)
for step in range(steps):
    z, z_pos = aniso_process.sample_pairs(1024)
    loss = rpm.RPMELBO().differentiable_loss(oracle.model, oracle.guide, z, z_pos) / 1024
    oracle_optimizer.zero_grad()
    loss.backward()
    oracle_optimizer.step()
oracle_lambda = oracle.prior.energy.concentration.detach()

print("learned Lambda, matched to the true dimensions:", [round(v, 2) for v in learned.tolist()])
print("oracle Lambda:                                 ", [round(v, 2) for v in oracle_lambda.tolist()])
print(f"group ratio Lambda(second half) / Lambda(first half): learned {group_ratio(learned):.2f}, "
      f"oracle {group_ratio(oracle_lambda):.2f}, truth {group_ratio(aniso_process.concentrations):.2f}")

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
width = 0.38
dims = list(range(aniso_dim))
for i, (name, values) in enumerate(per_dimension.items()):
    left.bar([d + (i - 0.5) * width for d in dims], values, width, color=f"C{i}", label=name)
left.set_ylim(min(min(v) for v in per_dimension.values()) - 0.05, 1.0)
left.set_xticks(dims, [f"{d + 1} ($\\Lambda$={aniso_process.concentrations[d].item():g})" for d in dims])
left.set_xlabel("true dimension")
left.set_ylabel("held-out $R^2$")
left.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
right.bar([d - width / 2 for d in dims], learned.numpy(), width, color="C1", label="learned (matched)")
right.bar([d + width / 2 for d in dims], oracle_lambda.numpy(), width, color="0.6", label="oracle")
right.set_xticks(dims, [str(d + 1) for d in dims])
right.set_xlabel("true dimension")
right.set_ylabel(r"$\lambda$ of the anisotropic energy")
right.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The anisotropic energy recovers every dimension and its $\lambda$ splits into the two groups,
# towards the oracle's ratio; the cosine energy, with one temperature for all dimensions, loses
# most on the dimensions that vary most between views (the first group). The numbers of this run:

# %%
print(f"vMF-InfoNCE on the sphere (n = {dim}): R^2 {vmf['r2']:.3f} against the identity map's "
      f"{vmf['identity_r2']:.3f}")
for name, values in per_dimension.items():
    print(f"{name:12s} (n = {aniso_dim}): smallest per-dimension R^2 {min(values):.3f}, "
          f"first group {sum(values[:2]) / 2:.3f}, second group {sum(values[2:]) / 2:.3f}")
print(f"learned group ratio {group_ratio(learned):.2f} (oracle {group_ratio(oracle_lambda):.2f}, "
      f"truth {group_ratio(aniso_process.concentrations):.2f})")

# %% [markdown]
# In the full experiment (n = 10 latents, 10 000 steps, 3 seeds; see `benchmarks/README.md`) the
# anisotropic energy recovers every dimension (smallest per-dimension $R^2$ 0.986 +- 0.004) and
# learns a group ratio of 4.24 +- 0.05 (oracle 4.59, truth 5), while the cosine energy loses the
# high-variation half (per-dimension $R^2$ 0.63 against 0.93). It is one command, which adds
# checkpoints, exact resumption, periodic evaluation and figures:
#
# ```bash
# python -m rpm identifiability --conditional anisotropic --concentrations 5,25 --steps 10000 \
#     --eval-every 1000 --compare-energies cosine,anisotropic --energy-lr 0.1 --out runs/aninfonce
# ```
