r"""Does a Gaussian encoder's learned scale carry information? Issue 19 item 7: the scale
:math:`\sigma(x)` against the strength of a corruption of the input, under an implicit prior
(where ``docs/theory.md#stochastic-encoders`` says it falls towards its floor) and under an
explicit prior (whose ELBO keeps the marginal entropy, which rewards noise).

Data: scikit-learn's digits (:func:`rpm.data.digits.load_digits_split`). Every training image
draws a corruption strength :math:`c \sim U[0, 1]`, and both of its views (the augmentations
of ``rpm digits``) are blended with uniform pixel noise, :math:`(1 - c)\,t(x) + c\,u`,
:math:`u \sim U[0, 1]^{64}` drawn per view: at :math:`c = 1` a view says nothing about its
image. The encoder is ``rpm digits``' CNN with a Gaussian head
(:class:`rpm.experiments.digits.model.DigitsEncoder`, ``gaussian=True``, scale softplus + 1e-3);
the priors are the implicit prior with the cosine energy (:math:`\tau = 1`), the implicit prior
with the RBF energy (lengthscale 1) and the explicit Gaussian random walk
(:class:`rpm.priors.GaussianRandomWalkPrior`, learned scale and step). After training, every
test image is corrupted at each of ``--levels`` strengths in [0, 1] (one noise draw each) and
the encoder's mean scale over the D dimensions is read; printed: the median scale per strength,
Spearman's rank correlation between the strength and the scale over all (image, strength)
pairs, and the fraction of scales within 10% of the floor.

Usage: ``python benchmarks/scale_information.py --steps 600 --seeds 0,1``.
"""

from __future__ import annotations

import argparse
import json
import time

import pyro
import torch
from scipy.stats import spearmanr

import rpm
from rpm.data.augment import MultiViewTransform, RandomView
from rpm.data.digits import load_digits_split
from rpm.experiments.digits.model import MIN_SCALE, DigitsEncoder
from rpm.priors import CosineEnergy, GaussianRandomWalkPrior, ImplicitPrior, RBFEnergy

PRIORS = ("implicit_cosine", "implicit_rbf", "explicit_random_walk")


def corrupt(images: torch.Tensor, strength: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """:math:`(1 - c)\\,x + c\\,u`, one strength c per image. Shapes: (N, 1, 8, 8), (N,)."""
    noise = torch.rand(images.shape, generator=generator)
    c = strength.view(-1, 1, 1, 1)
    return (1 - c) * images + c * noise


def build(prior: str, latent_dim: int) -> tuple[rpm.RPM, DigitsEncoder]:
    encoder = DigitsEncoder(16, latent_dim, gaussian=True)
    recognition = rpm.GaussianRecognition(encoder, validate=False)
    if prior == "implicit_cosine":
        return rpm.RPM(recognition, ImplicitPrior(CosineEnergy(kappa=1.0))), encoder
    if prior == "implicit_rbf":
        return rpm.RPM(recognition, ImplicitPrior(RBFEnergy(lengthscale=1.0))), encoder
    return rpm.RPM(recognition, GaussianRandomWalkPrior(latent_dim)), encoder


def study(prior: str, args: argparse.Namespace, seed: int) -> dict:
    data = load_digits_split()
    torch.manual_seed(seed)
    model, encoder = build(prior, args.latent_dim)
    transform = MultiViewTransform([RandomView(), RandomView()])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    elbo = rpm.RPMELBO()
    images = data.train.images
    start = time.process_time()
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * seed + step)
        rows = torch.randperm(images.shape[0], generator=g)[:args.batch_size]
        strength = torch.rand(args.batch_size, generator=g)
        x1, x2 = transform(images[rows], g)
        x1, x2 = corrupt(x1, strength, g), corrupt(x2, strength, g)
        with pyro.validation_enabled(False):
            loss = elbo.differentiable_loss(model.model, model.guide, x1, x2) / args.batch_size
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.process_time() - start
    encoder.eval()
    g = torch.Generator().manual_seed(10_000 + seed)
    levels = torch.linspace(0, 1, args.levels)
    scales = []
    with torch.no_grad():
        for c in levels:
            x = corrupt(data.test.images, torch.full((data.test.images.shape[0],), float(c)), g)
            scales.append(encoder(x)[1])  # (M, D)
    scales = torch.stack(scales)  # (levels, M, D)
    per_image = scales.mean(-1)  # (levels, M)
    strengths = levels.view(-1, 1).expand_as(per_image)
    rho = spearmanr(strengths.flatten().numpy(), per_image.flatten().numpy()).statistic
    return {"prior": prior, "seed": seed, "final_loss": float(loss.detach()), "cpu_seconds": seconds,
            "median_scale_by_strength": {f"{float(c):.2f}": float(per_image[i].median())
                                         for i, c in enumerate(levels)},
            "spearman": float(rho),
            "at_floor": float((scales <= 1.1 * MIN_SCALE).float().mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--latent-dim", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--levels", type=int, default=6)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--priors", default=",".join(PRIORS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{args.steps} steps of batch {args.batch_size}, D = {args.latent_dim}; median scale of the "
          f"test images by corruption strength; Spearman rho(strength, scale); share at the floor")
    for prior in args.priors.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = study(prior, args, seed)
            rows.append(row)
            medians = " ".join(f"{v:.4f}" for v in row["median_scale_by_strength"].values())
            print(f"{prior:<22} seed {seed}: {medians}  rho {row['spearman']:+.3f}  "
                  f"floor {row['at_floor']:.2f}  ({row['cpu_seconds']:.0f} s CPU)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
