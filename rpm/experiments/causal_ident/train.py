r"""Views, training and scoring of one row of the ``rpm causal-ident`` table.

:func:`view_pair` makes a minibatch of positive pairs: scenes :math:`z \sim p(z)`
(:class:`~rpm.data.scenes.CausalScenes`) rendered to :math:`x`, then either two data
augmentations of the same image (:class:`~rpm.data.augment.ColourView`,
:func:`~rpm.data.augment.quarter_turn_pair`) or the image and the rendering of a latent
transformation :math:`\tilde z \sim p(\tilde z \mid z)`. Every draw comes from one CPU
generator seeded by ``(seed, step)``, so the minibatch of a step is a pure function of the two
(exact resumption without sampler state).

:func:`train_row` minimises the negative RPM ELBO per pair,
``RPMELBO().differentiable_loss(model, guide, x, x2) / N``, with Adam, a linear warm-up and a
cosine decay, through :class:`~rpm.training.trainer.Trainer`; :func:`factor_scores` then reads
every factor from the representation of fresh, unaugmented scenes: the class by the held-out
accuracy of an RBF support-vector classifier, the others by the held-out nonlinear :math:`R^2`
of :func:`rpm.metrics.block_r2` (the object's position as one block of two, each hue as the
block :math:`(\cos \pi h, \sin \pi h)`, its point on the colour circle).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pyro
import torch

import rpm
from rpm.data.augment import ColourView, quarter_turn_pair
from rpm.data.scenes import HUE_COLUMNS, LATENTS, CausalScenes, Scenes, render_scenes
from rpm.evaluation import linear_probe_accuracy
from rpm.experiments.causal_ident.model import model_from_arguments
from rpm.experiments.causal_ident.rows import FACTORS, ROWS, ViewSpec
from rpm.experiments.common import derived_seed, fit_with_cosine_schedule, seed_everything
from rpm.experiments.trained import write_model_record
from rpm.metrics import block_r2

__all__ = ["CLASSIFIER_C", "FACTOR_COLUMNS", "class_accuracy", "factor_scores", "factor_targets", "train_row",
           "view_pair"]

#: The latent columns of each continuous factor (:data:`rpm.data.scenes.LATENTS`).
FACTOR_COLUMNS = {
    "position_object": (LATENTS.index("x"), LATENTS.index("y")),
    "position_spotlight": (LATENTS.index("spotlight"),),
    "hue_object": (LATENTS.index("hue_object"),),
    "hue_spotlight": (LATENTS.index("hue_spotlight"),),
    "hue_background": (LATENTS.index("hue_background"),),
    "rotation": (LATENTS.index("rotation"),),
}


def factor_targets(z: Scenes) -> dict:
    r"""The regression target of each continuous factor: its latents, a hue :math:`h` (an
    angle, -1 and 1 the same colour) as :math:`(\cos \pi h, \sin \pi h)`.

    :param Scenes z: the latents.
    :returns: factor name -> tensor of shape (M, d).
    """
    targets = {}
    for name, columns in FACTOR_COLUMNS.items():
        values = z.latents[:, list(columns)]
        if columns[0] in HUE_COLUMNS:
            values = torch.cat([torch.cos(math.pi * values), torch.sin(math.pi * values)], 1)
        targets[name] = values
    return targets
#: Penalties C of the support-vector classifier of :func:`class_accuracy`.
CLASSIFIER_C = (1.0, 10.0, 100.0)


@torch.no_grad()
def view_pair(spec: ViewSpec, scenes: CausalScenes, num_pairs: int, size: int,
              generator: torch.Generator, hue_shift: float = 0.5
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_pairs`` positive pairs of the row ``spec`` (module docstring), on the CPU.

    :param ViewSpec spec: the row's views.
    :param CausalScenes scenes: the latent distribution (on the CPU).
    :param int num_pairs: N.
    :param int size: side of the images.
    :param torch.Generator generator: a CPU generator, the only source of randomness.
    :param float hue_shift: the colour distortion's largest hue shift, in turns.
    :returns: the two views. Shape: (N, 3, size, size) each.
    """
    z = scenes.sample(num_pairs, generator)
    x = render_scenes(z, size)
    if spec.change:
        return x, render_scenes(scenes.transform(z, spec.change, generator), size)
    first, second = quarter_turn_pair(x, generator) if spec.rotation else (x, x)
    if spec.crop_scale is None and not spec.colour:
        return first, second
    view = ColourView(spec.crop_scale, 1.0 if spec.colour else 0.0, hue_shift)
    return view(first, generator), view(second, generator)


def class_accuracy(labels: torch.Tensor, rep: torch.Tensor, num_train: int) -> float:
    r"""Held-out accuracy of the class read from the representation by a support-vector
    classifier with the RBF kernel :math:`k(u, v) = e^{-\gamma \lVert u - v \rVert^2}`
    (:math:`\gamma` = 1 / (m Var), scikit-learn's ``"scale"``, on the training split's
    standardised features), its penalty C in :data:`CLASSIFIER_C` by 3-fold cross-validation:
    fit on the first ``num_train`` samples, the fraction of the others classified right.

    :param torch.Tensor labels: classes, int. Shape: (M,).
    :param torch.Tensor rep: the representation. Shape: (M, m).
    :param int num_train: samples that fit.
    """
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    x = rep.detach().double().cpu()
    mean, std = x[:num_train].mean(0), x[:num_train].std(0).clamp_min(1e-12)
    x = ((x - mean) / std).numpy()
    y = labels.cpu().numpy()
    search = GridSearchCV(SVC(kernel="rbf", gamma="scale"), {"C": list(CLASSIFIER_C)}, cv=3)
    search.fit(x[:num_train], y[:num_train])
    return float((search.predict(x[num_train:]) == y[num_train:]).mean())


def factor_scores(z: Scenes, rep: torch.Tensor, nonlinear: bool = True) -> dict:
    r"""The score of every factor of :data:`~rpm.experiments.causal_ident.rows.FACTORS` from
    the representation, first half fitting, second half scoring: the class by
    :func:`class_accuracy` (with ``nonlinear``, else the linear probe of
    :func:`rpm.evaluation.linear_probe_accuracy`), each continuous factor's
    :func:`factor_targets` by :func:`rpm.metrics.block_r2` (kernel ridge with ``nonlinear``,
    else affine).

    :param Scenes z: the true latents of the held-out scenes.
    :param torch.Tensor rep: their representation. Shape: (M, m).
    :param bool nonlinear: the nonlinear read-outs (seconds) or the linear ones (the training
        curves).
    :returns: factor name -> score.
    """
    num_train = rep.shape[0] // 2
    if nonlinear:
        scores = {"class": class_accuracy(z.shape, rep, num_train)}
    else:
        scores = {"class": linear_probe_accuracy(rep[:num_train], z.shape[:num_train],
                                                 rep[num_train:], z.shape[num_train:])}
    for name, target in factor_targets(z).items():
        scores[name] = block_r2(target, rep, nonlinear=nonlinear, num_train=num_train)
    return {name: scores[name] for name in FACTORS if name in scores}


@torch.no_grad()
def _representation(model: rpm.RPM, x: torch.Tensor, device, batch: int = 1024) -> torch.Tensor:
    model.eval()
    return torch.cat([model.encode(x[i:i + batch].to(device)).cpu()
                      for i in range(0, x.shape[0], batch)])


def model_arguments(args: argparse.Namespace) -> dict:
    """The model record's arguments (:func:`~rpm.experiments.causal_ident.model.model_from_arguments`)
    from the flags."""
    return {"rep_dims": args.rep_dims, "size": args.size, "width": args.width,
            "hidden": args.hidden, "energy": args.energy, "temperature": args.temperature,
            "pooling": args.pooling}


def train_row(name: str, spec: ViewSpec, published: tuple, args: argparse.Namespace,
              scenes: CausalScenes, held_out: dict, out: Path, device) -> dict:
    """Trains (or resumes, or reloads) the encoder of one row in ``out`` and scores it.

    :param str name: the row's name (its folder, the progress label).
    :param ViewSpec spec: its views.
    :param tuple published: the published scores, in ``FACTORS`` order.
    :param argparse.Namespace args: the resolved flags.
    :param CausalScenes scenes: the latent distribution, on the CPU.
    :param dict held_out: ``{"eval": (Scenes, x), "test": (Scenes, x)}``, unaugmented.
    :param Path out: the row's folder.
    :param device: the training device.
    :return: the JSON-ready result (``views``, ``scores``, ``published``, the untrained
        encoder's scores, the trajectory, the losses, the time).
    """
    seed_everything(args.seed)  # the same encoder initialisation in every row
    arguments = model_arguments(args)
    model = model_from_arguments(arguments).to(device)
    write_model_record(out, "causal-ident", arguments, (3, args.size, args.size))
    z_eval, x_eval = held_out["eval"]
    z_test, x_test = held_out["test"]
    untrained = factor_scores(z_test, _representation(model, x_test, device), nonlinear=False)
    elbo = rpm.RPMELBO()
    row_seed = derived_seed(args.seed, "train", list(ROWS).index(name))  # whichever rows run

    def loss_fn(step: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(derived_seed(row_seed, "train", step))
        x, x2 = view_pair(spec, scenes, args.batch_size, args.size, generator, args.hue_shift)
        with pyro.validation_enabled(False):
            return elbo.differentiable_loss(model.model, model.guide, x.to(device),
                                            x2.to(device)) / args.batch_size

    def eval_fn(step: int) -> dict:
        scores = factor_scores(z_eval, _representation(model, x_eval, device), nonlinear=False)
        r2 = [value for name, value in scores.items() if name != "class"]
        scores["mean_r2_linear"] = sum(r2) / len(r2)
        return scores

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    history = fit_with_cosine_schedule(model, optimizer, loss_fn, args, out, name, eval_fn,
                                       log_every=min(50, args.steps))
    evaluations = history["evaluations"]
    scores = factor_scores(z_test, _representation(model, x_test, device))
    return {
        "views": name,
        "kind": "latent transformation" if spec.change else "data augmentation",
        "scores": scores,
        "published": dict(zip(FACTORS, published, strict=True)),
        "untrained_linear": untrained,
        "trajectory": {key: [e.get(key) for e in evaluations]
                       for key in ("step", "mean_r2_linear", *FACTORS, "wall_time")},
        "losses": history["losses"],
        "train_seconds": evaluations[-1]["wall_time"],
    }
