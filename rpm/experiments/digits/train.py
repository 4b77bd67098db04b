r"""Training and scoring of one method of the ``rpm digits`` experiment.

:func:`train_method` minimises, over ``--steps`` minibatches of ``--batch-size`` training
images, the method's loss on the augmented views of each image (two, or the J views of
:data:`~rpm.experiments.digits.model.VIEWS`): the negative RPM ELBO per image (Eq. 15 of
Aitchison & Ganev; for the implicit pair priors InfoNCE minus :math:`\log N`, Eq. 23-25, and
NT-Xent minus :math:`\log(2N - 1)`; for the priors over J views the identities of
``rpm.priors._multiview``) or, for ``torch_ntxent``, the plain-torch NT-Xent of
:func:`~rpm.experiments.digits.model.torch_ntxent_loss` on the same scale. Adam with a linear
warm-up and a cosine decay, through :class:`~rpm.training.trainer.Trainer` (checkpoints, exact
resumption, the queue's latents included, the progress bar).

**The queue** (``queue``): the loss of a step reads the queue as the earlier steps left it; the
training loop pushes the second views' latents of the step's forward after its optimiser step
(the trainer's ``after_step``; :func:`rpm_step_loss` returns them), as no evaluation of the
prior pushes (the state rule of :mod:`rpm.marginals._candidates`).

**The loss reported** (the progress lines, ``training.png``, ``reported_losses``) is the one a
contrastive-learning user reads, :func:`reported_loss`: for the pair methods with an implicit
prior the cross-entropy, :math:`-\mathcal{L}/N` plus a constant (NT-Xent, as lightly's
``NTXentLoss`` gives it, for ``ntxent`` and ``torch_ntxent``; InfoNCE for ``infonce`` and
``rbf``), for the others :math:`-\mathcal{L}/N` itself. The constant changes no gradient;
``losses`` keeps :math:`-\mathcal{L}/N`.

**Same batches for every method.** Step :math:`s` draws its images (a uniformly random subset
of the training part, without replacement) and the views from one CPU generator seeded with
``derived_seed(seed, "train", s)``: every method sees the same images at every step, and the
first two views of every method are the same (the views are drawn in order from that
generator), so a resumed run needs no sampler state. Every method starts from the same
initialisation (``seed_everything(seed)`` before each is built).

**More than one process** (``torchrun``): every process draws the same global minibatch,
encodes its slice of 1/W of the images (:func:`rpm.distributed.local_slice`) and evaluates its
share of the ELBO with the normalisers and marginals over the global batch
(``RPMELBO(global_batch=True)``; ``torch_ntxent``: its anchors against the gathered latents,
:func:`rpm.distributed.all_gather_with_grad`); the trainer sums the gradients over the
processes. Batch normalisation normalises each process's slice (as SimCLR does without its
global batch norm; ``torch.nn.SyncBatchNorm`` needs GPUs), so W processes train a slightly
different model from one process on the same batches.

**Validation during training** (the progress display, ``training.png``): kNN accuracy
(:func:`rpm.evaluation.knn_accuracy`, 5 neighbours, all labels) of a fixed stratified 20% of
the *training* images, classified by the other 80%, on the backbone's representation. The test
images are only used at the end (:func:`score_features`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, cast

import pyro
import torch
import torch.nn.functional as F

import rpm
from rpm import distributed
from rpm.data.augment import MultiViewTransform, RandomView, multi_crop_views
from rpm.evaluation import knn_accuracy, label_efficiency, representations
from rpm.experiments.common import derived_seed, fit_with_cosine_schedule, seed_everything
from rpm.experiments.digits.model import (
    MIN_SCALE,
    VIEWS,
    DigitsEncoder,
    method_from_arguments,
    torch_ntxent_loss,
)
from rpm.experiments.trained import write_model_record
from rpm.inference import Candidates
from rpm.training.schedule import cosine_schedule

__all__ = ["LABELS_PER_CLASS", "batch_views", "cosine_schedule", "distributed_ntxent_share",
           "method_views", "reported_loss", "rpm_step_loss", "score_encoder", "score_features",
           "train_method", "validation_rows"]

#: The label counts of the label-efficiency curve (``None``: all labels).
LABELS_PER_CLASS = (1, 5, 10, None)


def method_views(name: str) -> MultiViewTransform:
    """The views of method ``name`` (:data:`~rpm.experiments.digits.model.VIEWS`): J random
    views of the whole image (:class:`~rpm.data.augment.RandomView`'s defaults), or 2 of them
    and local crops (:func:`~rpm.data.augment.multi_crop_views`, 4 x 4, a fifth to a half of
    the area)."""
    num_global, num_local = VIEWS[name]
    if num_local:
        return multi_crop_views(num_global, num_local)
    return MultiViewTransform([RandomView() for _ in range(num_global)])


def batch_views(images: torch.Tensor, transform, batch_size: int, seed: int, step: int):
    """The views of the images of step ``step`` (module docstring: a pure function of the seed
    and the step).

    :param torch.Tensor images: the training images, on the training device. Shape: (M, 1, 8, 8).
    :param transform: a :class:`rpm.data.augment.MultiViewTransform` of J views.
    :returns: the J views. Shape: (batch_size, 1, s_j, s_j) each.
    """
    generator = torch.Generator().manual_seed(derived_seed(seed, "train", step))
    rows = torch.randperm(images.shape[0], generator=generator)[:batch_size].to(images.device)
    return transform(images[rows], generator)


def score_features(train_features: torch.Tensor, train_labels: torch.Tensor,
                   test_features: torch.Tensor, test_labels: torch.Tensor, num_draws: int,
                   seed: int) -> dict:
    """The label-efficiency scores of one set of features, JSON-ready: ``linear_probe`` and
    ``knn`` keyed ``"1"``, ``"5"``, ``"10"``, ``"all"`` (the mean over draws), the same with
    ``_std`` (standard deviation over draws) and ``_draws`` (every draw). The draws come from
    ``derived_seed(seed, "eval")``, the same labelled images for every method."""
    curve = label_efficiency(train_features, train_labels, test_features, test_labels,
                             labels_per_class=LABELS_PER_CLASS, num_draws=num_draws,
                             seed=derived_seed(seed, "eval"))
    result = {}
    for name, scores in (("linear_probe", curve.linear_probe), ("knn", curve.knn)):
        result[name] = {k: s.mean for k, s in scores.items()}
        result[f"{name}_std"] = {k: s.std for k, s in scores.items()}
        result[f"{name}_draws"] = {k: list(s.draws) for k, s in scores.items()}
    return result


def validation_rows(labels: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed stratified split of the training images into 80% references and 20% queries
    for the kNN accuracy shown during training."""
    from sklearn.model_selection import train_test_split

    rows = torch.arange(labels.shape[0]).numpy()
    ref, query = train_test_split(rows, test_size=0.2, stratify=labels.numpy(),
                                  random_state=derived_seed(seed, "eval", 1) % 2**32)
    return torch.as_tensor(ref), torch.as_tensor(query)


def distributed_ntxent_share(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    r"""This process's share of :func:`~rpm.experiments.digits.model.torch_ntxent_loss` of the
    global batch under ``torch.distributed``: the cross-entropy terms of its own 2n anchors
    against the 2N gathered latents, divided by 2N, minus :math:`\log(2N - 1) / W`. Summed over
    the W processes (as the trainer sums the gradients) it is the loss of the global batch.
    Without ``torch.distributed`` it is :func:`torch_ntxent_loss` itself.

    :param torch.Tensor z1: this process's first views' latents. Shape: (n, D).
    :param torch.Tensor z2: its second views' latents. Shape: (n, D).
    :param float temperature: :math:`\tau`.
    """
    if not distributed.is_distributed():
        return torch_ntxent_loss(z1, z2, temperature)
    n, world = z1.shape[0], distributed.global_world_size()
    g1, g2 = distributed.all_gather_with_grad(z1), distributed.all_gather_with_grad(z2)  # (N, D)
    total = g1.shape[0]
    start = distributed.global_rank() * n  # equal slices (local_slice)
    columns = F.normalize(torch.cat([g1, g2]), dim=1)  # (2N, D): all first views, then all second
    anchors = F.normalize(torch.cat([z1, z2]), dim=1)  # (2n, D)
    own = torch.cat([torch.arange(start, start + n), torch.arange(total + start, total + start + n)])
    partner = torch.cat([own[n:], own[:n]]).to(z1.device)  # (2n,) column of each anchor's positive
    logits = anchors @ columns.T / temperature  # (2n, 2N)
    logits[torch.arange(2 * n, device=z1.device), own.to(z1.device)] = float("-inf")  # no self-pairs
    return (F.cross_entropy(logits, partner, reduction="sum") / (2 * total)
            - math.log(2 * total - 1) / world)


def rpm_step_loss(module: rpm.RPM, views: list[torch.Tensor], global_batch: bool = False,
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""The negative RPM ELBO of one step of an RPM method, summed over this process's images,
    and the latents the training loop pushes after the optimiser step (None for a prior without
    a queue).

    Without a queue: ``RPMELBO(global_batch).differentiable_loss`` on the views (a pair, or a
    list of J views). With one (the ``queue`` method): the views' latents
    :math:`z` (N, J, D) of :meth:`rpm.RPM.encode_views` (the Delta recognition's points, the
    samples ``RPMELBO`` would draw) and :math:`-\mathcal{L}` of
    :func:`rpm.inference.rpm_elbo` on them, which reads the queue and leaves it as it is; the
    loop then pushes ``module.prior.push(z, Candidates(global_batch=...))``, the latents of
    this step's forward, every process's.

    :param module: the method's :class:`rpm.RPM`.
    :param views: this process's views, each (n, ...).
    :param bool global_batch: the normalisers (and the pushed latents) over every process.
    """
    if getattr(module.prior, "queue", None) is None:
        inputs = views if len(views) == 2 else (views,)  # a pair, or a list of J views
        loss = rpm.RPMELBO(global_batch=global_batch).differentiable_loss(
            module.model, module.guide, *inputs)
        return loss, None
    z = module.encode_views(views)                                            # (n, J, D)
    loss = -rpm.inference.rpm_elbo(module.prior, z, candidates=Candidates(global_batch=global_batch))
    return loss, z


def reported_loss(name: str, batch_size: int) -> tuple[str, float]:
    r"""The name and the offset :math:`c` of the loss method ``name`` reports,
    :math:`-\mathcal{L}/N + c` for a global batch of N images: ``("NT-Xent", log(2N - 1))`` for
    ``ntxent`` and ``torch_ntxent`` (the pooled implicit prior, :math:`\mathcal{L}/N =
    -\text{NT-Xent} + \log(2N - 1)`), ``("InfoNCE", log N)`` for ``infonce`` and ``rbf`` (the
    implicit prior, Eq. 23-25 of Aitchison & Ganev), ``("-ELBO/N + log N", log N)`` for
    ``gaussian`` (the same prior under a Gaussian encoder, whose ELBO is not InfoNCE) and
    ``("-ELBO/N", 0)`` for the priors over J views and the queue.

    :param str name: one of :data:`~rpm.experiments.digits.model.METHODS`.
    :param int batch_size: N, the global batch.
    """
    if name in ("ntxent", "torch_ntxent"):
        return "NT-Xent", math.log(2 * batch_size - 1)
    if name in ("infonce", "rbf"):
        return "InfoNCE", math.log(batch_size)
    if name == "gaussian":
        return "-ELBO/N + log N", math.log(batch_size)
    return "-ELBO/N", 0.0


def train_method(name: str, args: argparse.Namespace, data, device, out: Path,
                 seed: int) -> tuple[dict | None, DigitsEncoder]:
    """Trains (or resumes, or reloads) method ``name`` in ``out`` and scores its backbone.

    :param str name: one of :data:`~rpm.experiments.digits.model.METHODS`.
    :param argparse.Namespace args: the flags.
    :param data: the :class:`~rpm.data.digits.DigitsSplit`, on the CPU; with labels None
        (images without labels) nothing is scored: the validation records the time only and
        the result has no scores.
    :param torch.device device: the training device.
    :param Path out: the method's folder (checkpoint, history).
    :param int seed: the seed of the initialisation, the batches and the label draws.
    :returns: the JSON-ready result (scores, losses, time) and the trained encoder, in
        evaluation mode; under ``torch.distributed``, the processes other than 0 return None
        for the result.
    """
    seed_everything(seed)  # the same initialisation for every method
    images = data.train.images.to(device)
    arguments = {"method": name, "width": args.width, "latent_dim": args.latent_dim,
                 "temperature": args.temperature, "in_channels": int(images.shape[1])}
    module, encoder = method_from_arguments(arguments)
    module = module.to(device)
    if distributed.is_main_process():  # what rpm.load rebuilds the module from
        write_model_record(out, "digits", arguments, images.shape[1:])
    transform = method_views(name)
    labelled = data.train.labels is not None
    if labelled:
        ref, query = validation_rows(data.train.labels, seed)
    parallel = distributed.is_distributed()
    rows = distributed.local_slice(args.batch_size)  # all rows in one process
    prior: Any = getattr(module, "prior", None)  # None for torch_ntxent, the encoder itself
    pending: list[torch.Tensor] = []  # the queue's latents of the step, pushed after it
    loss_name, offset = reported_loss(name, args.batch_size)
    # each process adds its share of the offset: the trainer sums the logged losses
    share = offset / (distributed.global_world_size() if parallel else 1)

    def loss_fn(step: int) -> torch.Tensor:
        views = [v[rows] for v in batch_views(images, transform, args.batch_size, seed, step)]
        if name == "torch_ntxent":
            loss = distributed_ntxent_share(encoder(views[0]), encoder(views[1]), args.temperature)
            return loss + share
        with pyro.validation_enabled(False):  # our own tensors: no per-step device syncs
            loss, latents = rpm_step_loss(cast(rpm.RPM, module), views, global_batch=parallel)
        if latents is not None:
            pending[:] = [latents]
        return loss / args.batch_size + share

    def after_step(step: int) -> None:  # the queue takes the step's latents after its update
        prior.push(pending.pop(), Candidates(global_batch=parallel))

    def eval_fn(step: int) -> dict:
        if not labelled:
            return {}  # nothing to score: the evaluation records the time only
        features = representations(encoder.backbone, images)
        return {"knn": knn_accuracy(features[ref], data.train.labels[ref], features[query],
                                    data.train.labels[query], k=5)}

    optimizer = torch.optim.Adam(module.parameters(), lr=args.lr)
    history = fit_with_cosine_schedule(module, optimizer, loss_fn, args, out, name, eval_fn,
                                       log_every=min(50, args.steps), distributed=parallel,
                                       after_step=after_step if getattr(prior, "queue", None)
                                       is not None else None)
    encoder.eval()
    if not distributed.is_main_process():
        return None, encoder
    result = {
        "kind": "plain torch" if name == "torch_ntxent" else "rpm",
        "views": list(VIEWS[name]),
        **(score_encoder(encoder, data, device, args.draws, seed) if labelled else {}),
        "losses": [[step, value - offset] for step, value in history["losses"]],  # -ELBO/N
        "reported_losses": history["losses"],
        "loss_name": loss_name,
        "loss_offset": offset,
        "evaluations": history["evaluations"],
        "train_seconds": history["evaluations"][-1]["wall_time"],
        "steps": args.steps,
    }
    if name == "gaussian":  # the encoder's standard deviations on the training images
        scale = representations(_Output(encoder, scale=True), data.train.images.to(device))
        result["mean_scale"] = float(scale.mean())
        result["min_scale_floor"] = MIN_SCALE
        # rpm.ScaleFloorWarning (docs/theory.md#stochastic-encoders), issued during training?
        result["scale_floor_warning"] = bool(module.recognition.floor_warned)
    return result, encoder


class _Output(torch.nn.Module):
    """One output of the encoder as a module (for :func:`representations`): the latent z (the
    mean for a Gaussian encoder) or the Gaussian encoder's standard deviations."""

    def __init__(self, encoder: DigitsEncoder, scale: bool = False) -> None:
        super().__init__()
        self.encoder = encoder
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.encoder(x)
        if not self.encoder.gaussian:
            return out
        return out[1] if self.scale else out[0]


def score_encoder(encoder: DigitsEncoder, data, device, num_draws: int, seed: int) -> dict:
    """:func:`score_features` of the backbone's representation h (the top-level keys) and of
    the latent z, the projection head's output (the mean for a Gaussian encoder), under
    ``"latent"``; both in eval mode (:func:`rpm.evaluation.representations`)."""
    train, test = data.train.images.to(device), data.test.images.to(device)
    scores = {}
    for key, module in (("backbone", encoder.backbone), ("latent", _Output(encoder))):
        scores[key] = score_features(representations(module, train), data.train.labels,
                                     representations(module, test), data.test.labels, num_draws, seed)
    return {**scores["backbone"], "latent": scores["latent"]}
