r"""Train an RPM with PyTorch Lightning on one or several CPU processes (or GPUs).

.. code-block:: bash

    pip install 'rpm-pyro[lightning]'
    python examples/lightning_rpm.py --prior nt-xent gaussian --devices 2 --out runs/lightning

Two RPMs on synthetic pairs of views (x = A s + noise, each view with its own noise, s a 4-D
standard Gaussian content): one with a contrastive prior, SimCLR's NT-Xent
(:class:`rpm.priors.PooledImplicitPrior` with the cosine energy at temperature 0.5), and one
with an explicit Gaussian prior (:class:`rpm.priors.GaussianPairPrior`, learned correlation)
under the moment-matched Gaussian marginal (``marginal="gaussian"``), both with a
deterministic encoder. Each trains under ``Trainer(strategy="ddp", accelerator="cpu",
devices=W)`` with :class:`rpm.lightning.RPMLightningModule`: every process encodes its
``--batch-size`` pairs, the marginals and negatives run over the global batch of W times as
many, and the W processes take the steps of one process on the global batch. Process 0 writes
each model's ``state_dict`` to ``OUT/PRIOR.pt``. With ``--devices 1`` it is one process.

Lightning's DDP on the CPU starts the other processes by running this script again; nothing
is written outside ``--out`` (no logger, no checkpoints, no progress bar).
"""

from __future__ import annotations

import argparse
import datetime
import warnings
from pathlib import Path

import torch

import rpm
from rpm.priors import CosineEnergy, GaussianPairPrior, PooledImplicitPrior

PRIORS = ("nt-xent", "gaussian")
X_DIM, CONTENT_DIM, LATENT_DIM = 8, 4, 4


def make_data(num: int, seed: int = 0, dtype: torch.dtype = torch.float32):
    """``num`` pairs of views (x, x2), each (num, 8): x = A s + 0.3 noise, s ~ N(0, I_4)."""
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(CONTENT_DIM, X_DIM, generator=generator, dtype=torch.float64)
    content = torch.randn(num, CONTENT_DIM, generator=generator, dtype=torch.float64)
    views = [content @ mixing + 0.3 * torch.randn(num, X_DIM, generator=generator,
                                                  dtype=torch.float64) for _ in range(2)]
    return [view.to(dtype) for view in views]


def make_model(prior: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> rpm.RPM:
    """The RPM of ``prior`` ("nt-xent" or "gaussian") with a two-layer encoder, the same
    parameters for the same seed (in every process)."""
    if prior not in PRIORS:
        raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
    torch.manual_seed(seed)
    encoder = torch.nn.Sequential(torch.nn.Linear(X_DIM, 16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, LATENT_DIM))
    if prior == "nt-xent":
        model = rpm.RPM(rpm.DeltaRecognition(encoder),
                        PooledImplicitPrior(CosineEnergy(kappa=1 / 0.5)), name=prior)
    else:
        model = rpm.RPM(rpm.DeltaRecognition(encoder),
                        GaussianPairPrior(LATENT_DIM, correlation=0.5, learn_correlation=True),
                        marginal="gaussian", name=prior)
    return model.to(dtype)


def _arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prior", nargs="+", choices=PRIORS, default=list(PRIORS))
    parser.add_argument("--devices", type=int, default=2, help="processes (W)")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--steps", type=int, default=20, help="optimiser steps (one epoch)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per process and step")
    parser.add_argument("--optimiser", default="adam", choices=("adam", "sgd"))
    parser.add_argument("--lr", type=float, default=1e-2, help="the learning rate")
    parser.add_argument("--precision", default="32-true", choices=("32-true", "64-true"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a process waits for the others at a collective")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    from rpm.lightning import RPMLightningModule

    args = _arguments(argv)
    # a toy dataset in memory: worker processes would only add start-up time
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    dtype = torch.float64 if args.precision == "64-true" else torch.float32
    x, x2 = make_data(args.steps * args.batch_size * args.devices, args.seed, dtype)
    optimiser = torch.optim.Adam if args.optimiser == "adam" else torch.optim.SGD
    for prior in args.prior:
        module = RPMLightningModule(make_model(prior, args.seed, dtype),
                                    optimiser=lambda parameters: optimiser(parameters, lr=args.lr))
        strategy = (DDPStrategy(process_group_backend="gloo" if args.accelerator == "cpu" else None,
                                timeout=datetime.timedelta(seconds=args.timeout))
                    if args.devices > 1 else "auto")
        trainer = pl.Trainer(accelerator=args.accelerator, devices=args.devices, strategy=strategy,
                             max_steps=args.steps, precision=args.precision, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=args.out)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x2),
                                             batch_size=args.batch_size)
        trainer.fit(module, loader)
        if trainer.is_global_zero:
            args.out.mkdir(parents=True, exist_ok=True)
            torch.save(module.model.state_dict(), args.out / f"{prior}.pt")
            loss = float(trainer.callback_metrics["loss"])
            print(f"{prior}: loss {loss:.4f} (the global batch's negative ELBO per pair) after "
                  f"{trainer.global_step} steps on {trainer.world_size} process(es)")


if __name__ == "__main__":
    main()
