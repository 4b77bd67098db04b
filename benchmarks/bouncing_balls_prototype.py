"""Plain-PyTorch InfoNCE on the bouncing-balls video: RBF versus bilinear energy.

A sanity benchmark for :mod:`rpm.data.bouncing_balls` and :mod:`rpm.experiments.bouncing_balls.encoders`
that does not use the Pyro machinery. Consecutive frames ``(x_t, x_{t+1})`` of the first
``--train-frames`` frames are the positive pairs, the other pairs' second frames the negatives;
the loss is the InfoNCE cross-entropy with logits ``f(z_i, z'_j)`` (Eq. 23-25 of Aitchison &
Ganev), with

* RBF (Eq. 27):      f(z, z') = -|z - z'|^2 / (2 l^2), lengthscale l learned (log-parameterised);
* bilinear (Eq. 8):  f(z, z') = z^T W z', W learned (initialised to the identity).

Evaluation: a least-squares affine decoder from the encoder's outputs (eval mode) to the true
centres, fitted on the training frames and scored by R^2 (mean over the 2K coordinates) on the
held-out tail of the video.

Example::

    python benchmarks/bouncing_balls_prototype.py --energies rbf bilinear --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

from rpm.data.bouncing_balls import generate_bouncing_balls
from rpm.experiments.bouncing_balls.encoders import BallEncoder


class RBFEnergy(nn.Module):
    """f(z, z') = -|z - z'|^2 / (2 l^2) for every pair: (N, D), (M, D) -> (N, M)."""

    def __init__(self, lengthscale: float) -> None:
        super().__init__()
        self.log_lengthscale = nn.Parameter(torch.tensor(float(lengthscale)).log())

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        sq = torch.cdist(z, z2).pow(2)  # (N, M)
        return -0.5 * sq * torch.exp(-2.0 * self.log_lengthscale)


class BilinearEnergy(nn.Module):
    """f(z, z') = z^T W z' for every pair: (N, D), (M, D) -> (N, M)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(dim))

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return z @ self.weight @ z2.T  # (N, M)


def r2_score(z: torch.Tensor, target: torch.Tensor, num_train: int) -> float:
    """Held-out R^2 (mean over target dimensions) of an affine least-squares decoder."""
    features = torch.cat([z, torch.ones(len(z), 1, dtype=z.dtype)], dim=1).double()  # (T, D+1)
    target = target.double()
    coef = torch.linalg.lstsq(features[:num_train], target[:num_train]).solution
    pred, truth = features[num_train:] @ coef, target[num_train:]
    ss_res = (truth - pred).pow(2).sum(0)
    ss_tot = (truth - truth.mean(0)).pow(2).sum(0)
    return float((1.0 - ss_res / ss_tot).mean())


def encode_all(encoder: nn.Module, frames: torch.Tensor) -> torch.Tensor:
    encoder.eval()
    with torch.no_grad():
        return encoder(frames)


def run(args: argparse.Namespace, energy_name: str, seed: int) -> dict:
    torch.manual_seed(seed)
    video = generate_bouncing_balls(
        num_frames=args.num_frames, image_size=args.image_size,
        ball_diameter=args.ball_diameter, angle_noise=args.angle_noise, seed=seed,
    )
    frames, target = video.frames, video.centres.flatten(1)  # (T, C, H, W), (T, 2K)
    encoder = BallEncoder(in_channels=frames.shape[1], hidden_channels=args.hidden_channels,
                          kernel_size=args.kernel_size, normalized=args.normalized)
    untrained_r2 = r2_score(encode_all(encoder, frames), target, args.train_frames)
    if energy_name == "rbf":
        energy: nn.Module = RBFEnergy(args.lengthscale)
    else:
        energy = BilinearEnergy(encoder.output_dim)
    optimizer = torch.optim.Adam([*encoder.parameters(), *energy.parameters()], lr=args.lr)
    first, second = frames[: args.train_frames - 1], frames[1: args.train_frames]
    curve = {}
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        encoder.train()
        for idx in torch.randperm(len(first)).split(args.batch_size):
            if args.separate_views:  # as rpm.RPM does: batch-norm statistics per view
                z1, z2 = encoder(first[idx]), encoder(second[idx])  # (B, 2K) each
            else:  # one call: both views share the batch-norm statistics
                z = encoder(torch.cat([first[idx], second[idx]]))  # (2B, 2K)
                z1, z2 = z[: len(idx)], z[len(idx):]  # (B, 2K) each
            logits = energy(z1, z2)  # (B, B)
            loss = F.cross_entropy(logits, torch.arange(len(idx)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if args.eval_every and epoch % args.eval_every == 0:
            curve[epoch] = r2_score(encode_all(encoder, frames), target, args.train_frames)
    seconds = time.perf_counter() - start
    result = {
        "energy": energy_name, "seed": seed, "normalized": args.normalized,
        "separate_views": args.separate_views, "epochs": args.epochs, "lr": args.lr,
        "untrained_r2": untrained_r2,
        "r2": r2_score(encode_all(encoder, frames), target, args.train_frames),
        "final_loss": loss.item(), "seconds": seconds,
    }
    if curve:
        result["r2_by_epoch"] = curve
    if energy_name == "rbf":
        result["lengthscale"] = energy.log_lengthscale.exp().item()
    return result


def main(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(args.threads)
    results = []
    for energy_name in args.energies:
        for seed in args.seeds:
            result = run(args, energy_name, seed)
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.output:
        with open(args.output, "w") as file:
            json.dump({"args": vars(args), "results": results}, file, indent=2)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--energies", nargs="+", default=["rbf", "bilinear"],
                        choices=["rbf", "bilinear"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--num-frames", type=int, default=900)
    parser.add_argument("--train-frames", type=int, default=700)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--ball-diameter", type=float, default=5.0)
    parser.add_argument("--angle-noise", type=float, default=0.7853981633974483)
    parser.add_argument("--hidden-channels", type=int, default=16)
    parser.add_argument("--kernel-size", type=int, default=5)
    parser.add_argument("--normalized", action="store_true")
    parser.add_argument("--separate-views", action="store_true",
                        help="encode the two views in separate calls (separate BN statistics)")
    parser.add_argument("--lengthscale", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=0,
                        help="also record the held-out R^2 every this many epochs (0: never)")
    parser.add_argument("--output", default="", help="write the results to this JSON file")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
