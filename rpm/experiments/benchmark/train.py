r"""One row of ``rpm benchmark``: train an objective on a dataset from a seed, then score it.

**Training** (trained objectives): Adam at the constant learning rate ``--lr`` for ``--epochs``
epochs of ``--batch-size`` inputs (the last incomplete batch of an epoch dropped), through a
:class:`rpm.training.trainer.Trainer` writing the row's folder (checkpoints every
``--checkpoint-every`` steps and at the end; an interrupted row continues from its checkpoint
on ``--resume``). Step :math:`s` of an epoch of :math:`B` steps takes the inputs of batch
:math:`s \bmod B` of epoch :math:`\lfloor s/B \rfloor`'s permutation
(``derived_seed(seed, "epoch", epoch)``) and draws their views (the pair, or with the local
views of :data:`~rpm.experiments.benchmark.model.LOCAL_VIEWS`) from a generator seeded with
``derived_seed(seed, "train", s)``, then a seed for torch's global generator (the vMF
particles, SIGReg's directions) from it: a pure function of the seed and the step. The
encoder's initialisation is the seed's (:func:`~rpm.experiments.common.seed_everything`), the
same for every objective of a seed (``discrete``'s head, of K outputs, aside).

**Scores** (on the fixed test split, the frozen encoder in evaluation mode, after the last
epoch, never the best over epochs):

* ``knn``: :func:`rpm.evaluation.knn_accuracy` of the latent :math:`z` (``raw``: the inputs),
  :data:`KNN_NEIGHBOURS` = 10 neighbours under the cosine distance, all training labels;
* ``linear``: the linear probe of :func:`rpm.evaluation.fit_linear_probe` on the backbone's
  :math:`h` (``raw``: the inputs), standardised, multinomial logistic regression with
  :math:`C = 1`, fitted by L-BFGS to the tolerance :data:`PROBE_TOLERANCE` (at most
  :data:`PROBE_MAX_ITER` iterations; ``linear_iterations`` and ``linear_converged`` record
  whether it converged) on every training input, scored on the test inputs.

Both run with as many BLAS and OpenMP threads as torch has (``--threads``;
``threadpoolctl``), so that a scoring thread never waits for a second one on a busy core.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import cast

import torch

from rpm._random import global_rng_from
from rpm.evaluation import fit_linear_probe, knn_accuracy, representations
from rpm.experiments.benchmark.data import BenchmarkData, multi_views
from rpm.experiments.benchmark.model import (
    LOCAL_VIEWS,
    BenchmarkObjective,
    build_encoder,
    encoder_latent_dim,
)
from rpm.experiments.common import derived_seed, fit_or_resume, seed_everything

__all__ = ["KNN_NEIGHBOURS", "PROBE_MAX_ITER", "PROBE_TOLERANCE", "score_features", "train_row"]

#: kNN's neighbours (the MNIST-1D notebook's k).
KNN_NEIGHBOURS = 10
#: The linear probe's L-BFGS tolerance: tight, so that the probe is fitted to convergence.
PROBE_TOLERANCE = 1e-6
#: The linear probe's iterations at most.
PROBE_MAX_ITER = 10_000


def score_features(latent_train: torch.Tensor, latent_test: torch.Tensor,
                   probe_train: torch.Tensor, probe_test: torch.Tensor,
                   data: BenchmarkData) -> dict:
    """``knn`` of the latents and ``linear`` of the probe's features (module docstring), with
    the probe's ``linear_iterations`` and ``linear_converged``.

    :param latent_train: the training inputs' latents (N, D); ``latent_test`` the test ones.
    :param probe_train: the training inputs' backbone features (N, F); ``probe_test`` the test
        ones.
    """
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # scikit-learn's

    # NumPy's BLAS and scikit-learn's OpenMP take torch's threads (``--threads``), not every
    # core: on a busy machine two BLAS threads that wait for each other slow the probe's
    # L-BFGS some forty-fold
    with threadpool_limits(torch.get_num_threads()):
        knn = knn_accuracy(latent_train, data.train_y, latent_test, data.test_y,
                           k=KNN_NEIGHBOURS)
        probe = fit_linear_probe(probe_train, data.train_y, max_iter=PROBE_MAX_ITER,
                                 tol=PROBE_TOLERANCE)
        predicted = probe.predict(probe_test.detach().cpu().double().flatten(1).numpy())
    linear = float((torch.as_tensor(predicted) == data.test_y.cpu()).double().mean())
    iterations = int(probe.named_steps["probe"].n_iter_.max())
    return {"knn": knn, "linear": linear, "linear_iterations": iterations,
            "linear_converged": iterations < PROBE_MAX_ITER}


def _score_encoder(encoder: torch.nn.Module, data: BenchmarkData,
                   latent: torch.nn.Module | None = None) -> dict:
    """The scores of an encoder: kNN on the output of ``latent`` (None: the encoder's z), the
    probe on its backbone's h."""
    latent = encoder if latent is None else latent
    train_z, test_z = representations(latent, data.train_x), representations(latent, data.test_x)
    backbone = cast(torch.nn.Module, encoder.backbone)
    train_h, test_h = representations(backbone, data.train_x), representations(backbone, data.test_x)
    return score_features(train_z, test_z, train_h, test_h, data)


def train_row(dataset: str, objective: str, seed: int, args: argparse.Namespace,
              data: BenchmarkData, device: torch.device, out: Path) -> dict:
    """Trains (a baseline: builds) and scores one row; returns it, JSON-ready: ``dataset``,
    ``objective``, ``seed``, ``knn``, ``linear``, ``linear_iterations``,
    ``linear_converged``, ``seconds`` (the row's wall time, training and scoring), ``steps``
    and, for a trained objective, ``final_loss`` (the mean loss of the last epoch) and
    ``train_seconds`` (the training's part of ``seconds``; of this process only, when the row
    was resumed from a checkpoint).

    :param str dataset: ``mnist1d`` or ``digits``.
    :param str objective: one of :data:`~rpm.experiments.benchmark.model.OBJECTIVES`.
    :param int seed: the row's seed.
    :param argparse.Namespace args: ``epochs``, ``batch_size``, ``lr``, ``temperature``,
        ``checkpoint_every``, ``progress``, ``resume``.
    :param BenchmarkData data: the dataset's split, on the CPU.
    :param torch.device device: the training device.
    :param Path out: the row's folder (checkpoint and history of a trained objective).
    """
    from rpm.training.trainer import Trainer

    start = time.perf_counter()
    row = {"dataset": dataset, "objective": objective, "seed": seed}
    if objective == "raw":
        flat_train, flat_test = data.train_x.flatten(1), data.test_x.flatten(1)
        scores = score_features(flat_train, flat_test, flat_train, flat_test, data)
        return {**row, **scores, "steps": 0, "seconds": time.perf_counter() - start}
    dim = encoder_latent_dim(dataset, objective)  # the head's width is the objective's
    seed_everything(seed)  # the same initialisation for every objective of a seed
    encoder = build_encoder(dataset, int(data.train_x.shape[-1]), dim).to(device)
    if objective == "untrained":
        scores = _score_encoder(encoder, data)
        return {**row, **scores, "steps": 0, "seconds": time.perf_counter() - start}
    module = BenchmarkObjective(objective, encoder, dim, args.temperature).to(device)
    num_local = LOCAL_VIEWS.get(objective, 0)
    inputs = data.train_x.to(device)
    per_epoch = inputs.shape[0] // args.batch_size
    steps = args.epochs * per_epoch

    def loss_fn(step: int) -> torch.Tensor:
        epoch, batch = divmod(step, per_epoch)
        order = torch.randperm(inputs.shape[0], generator=torch.Generator().manual_seed(
            derived_seed(seed, "epoch", epoch)))
        rows = order[batch * args.batch_size:(batch + 1) * args.batch_size].to(device)
        generator = torch.Generator().manual_seed(derived_seed(seed, "train", step))
        views = multi_views(dataset, inputs[rows], generator, num_local)
        # the draws from torch's global generator (vMF particles, SIGReg's directions) are a
        # function of the seed and the step too (seeded from the step's generator, after the
        # views), so that a resumed row draws the same
        with global_rng_from(generator, [device] if device.type == "cuda" else []):
            return module.loss(views)

    optimizer = torch.optim.Adam(module.parameters(), lr=args.lr)
    trainer = Trainer(module, optimizer, loss_fn, out_dir=out, num_steps=steps,
                      checkpoint_every=args.checkpoint_every, log_every=1,
                      progress=args.progress, description=f"{dataset} {objective} seed {seed}")
    history = fit_or_resume(trainer, args.resume, f"{dataset} {objective} seed {seed}")
    trained = time.perf_counter() - start
    last = [value for step, value in history["losses"] if step > steps - per_epoch]
    module.eval()
    scores = _score_encoder(encoder, data, module.latent())
    return {**row, **scores, "steps": steps, "final_loss": sum(last) / max(len(last), 1),
            "train_seconds": trained, "seconds": time.perf_counter() - start}
