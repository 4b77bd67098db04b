r"""Training and scoring of one setting of the ``rpm peer-supervision`` experiment.

:func:`train_setting` trains ``--restarts`` models of one setting (J images of a digit, or two
augmentations of one image) from different initialisations on the same minibatches, each by
minimising the exact negative log-likelihood per instance of the discrete RPM (D6 of
``docs/theory.md#discrete-latents``, the normaliser :math:`F_j` over the minibatch),

.. math::

    \ell_s = -\frac1B \sum_{n=1}^B \log \sum_Z p(Z) \prod_{j=1}^J
    \frac{f(Z|x_j^n)}{F_j(Z)},

``pyro.infer.TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss`` of the
:class:`rpm.DiscreteRPM`'s model and empty guide (Z summed out), with Adam, a linear warm-up
and a cosine decay, through :class:`~rpm.training.trainer.Trainer` (checkpoints, exact
resumption, progress). Gradient ascent on this likelihood, like EM, stops at local optima that
merge two digits into one cluster and split another; so, as k-means keeps the best of several
starts by its inertia, the setting keeps the restart of the highest log-likelihood per
instance (D6 with :math:`F_j` over all of them) on the *training* instances of
:func:`~rpm.experiments.peer_supervision.views.selection_views`: no label and no held-out image
takes part in the choice.

**Scores.** A held-out image's cluster is the mode of its one-view posterior
(:func:`~rpm.experiments.peer_supervision.model.one_view_log_posterior`, :math:`F` over the
training images); the accuracy is :func:`rpm.evaluation.match_clusters`'s after the best
matching of clusters to digits. The validation score during training (the progress display,
``training.png``) is the same accuracy on the training images, with the log-likelihood per
instance of the selection instances.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyro
import torch

import rpm
from rpm.evaluation import match_clusters
from rpm.experiments.common import derived_seed, fit_with_cosine_schedule, seed_everything
from rpm.experiments.peer_supervision.model import (
    model_from_arguments,
    one_view_log_posterior,
    setting_name,
)
from rpm.experiments.peer_supervision.views import selection_views, step_views
from rpm.experiments.trained import write_model_record

__all__ = ["initial_model", "restart_seed", "train_setting"]


def restart_seed(seed: int, restart: int) -> int:
    """The seed of restart ``restart``'s initialisation: ``derived_seed(seed, "restart",
    restart)`` reduced to the range of :func:`~rpm.experiments.common.seed_everything` (the
    same for every setting, so restart r of every view count starts from the same weights)."""
    return derived_seed(seed, "restart", restart) % 2**32


def _arguments(args: argparse.Namespace, views: int, in_features: int) -> dict:
    return {"in_features": in_features, "hidden": args.hidden, "num_classes": args.clusters,
            "num_views": max(views, 2)}


def initial_model(args: argparse.Namespace, views: int, in_features: int,
                  restart: int) -> tuple[rpm.DiscreteRPM, dict]:
    """Restart ``restart``'s untrained model of the setting with ``views`` images per instance,
    and its model record's arguments."""
    arguments = _arguments(args, views, in_features)
    seed_everything(restart_seed(args.seed, restart))
    return model_from_arguments(arguments), arguments


def _clusters(model: rpm.DiscreteRPM, images: torch.Tensor, reference: torch.Tensor):
    return one_view_log_posterior(model, images, reference).argmax(-1).cpu()


def _log_likelihood(model: rpm.DiscreteRPM, views: list[torch.Tensor]) -> float:
    """(D6) per instance over the given instances (their own normaliser), without the
    constant :math:`-J \\log N`."""
    with torch.no_grad(), pyro.validation_enabled(False):
        return float(model.log_marginal(*views)) / views[0].shape[0]


def _train_restart(args: argparse.Namespace, views: int, data, device, out: Path,
                   restart: int, selection: list[torch.Tensor]) -> tuple[rpm.DiscreteRPM, dict]:
    images = data.train.images.to(device)
    in_features = int(images[0].numel())
    model, arguments = initial_model(args, views, in_features, restart)
    model = model.to(device)
    write_model_record(out, "peer-supervision", arguments, images.shape[1:])  # what rpm.load rebuilds it from
    elbo = pyro.infer.TraceEnum_ELBO(max_plate_nesting=1)
    labels = data.train.labels

    def loss_fn(step: int) -> torch.Tensor:
        batch = step_views(images, labels, views, args.batch_size, args.seed, step)
        with pyro.validation_enabled(False):  # our own tensors: no per-step checks
            return elbo.differentiable_loss(model.model, model.guide, *batch) / args.batch_size

    def eval_fn(step: int) -> dict:
        accuracy = match_clusters(_clusters(model, images, images), labels,
                                  args.clusters).accuracy
        return {"log_likelihood": _log_likelihood(model, selection), "train_accuracy": accuracy}

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    name = f"{setting_name(views)}/restart{restart}"
    history = fit_with_cosine_schedule(model, optimizer, loss_fn, args, out, name, eval_fn,
                                       log_every=min(50, args.steps))
    model.eval()
    return model, history


def train_setting(views: int, args: argparse.Namespace, data, device, out: Path) -> dict:
    """Trains (or resumes, or reloads) the ``args.restarts`` restarts of one setting in
    ``out/restart{r}`` and scores the one of the highest training log-likelihood (module
    docstring).

    :param int views: J >= 2 images of one digit per instance, or 1 (two augmentations).
    :param argparse.Namespace args: the flags (``restarts``, ``hidden``, ``clusters``,
        ``steps``, ``batch_size``, ``lr``, ``seed``, ...).
    :param data: the :class:`~rpm.data.digits.DigitsSplit`, on the CPU.
    :param torch.device device: the training device.
    :param Path out: the setting's folder.
    :returns: the JSON-ready result: the selected restart's held-out ``accuracy``, its
        ``confusion`` (counts of digit c in cluster k), ``label_of_cluster``, ``prior``,
        ``log_likelihood``, ``losses`` and ``evaluations``; every restart's log-likelihood and
        held-out accuracy under ``restarts``; ``train_seconds`` (all restarts).
    """
    images = data.train.images.to(device)
    test = data.test.images.to(device)
    selection = selection_views(images, data.train.labels, views, args.seed)
    models, matches, likelihoods, histories = [], [], [], []
    seconds = 0.0
    for restart in range(args.restarts):
        model, history = _train_restart(args, views, data, device, out / f"restart{restart}",
                                        restart, selection)
        models.append(model)
        matches.append(match_clusters(_clusters(model, test, images), data.test.labels,
                                      args.clusters))
        likelihoods.append(_log_likelihood(model, selection))
        histories.append(history)
        seconds += history["evaluations"][-1]["wall_time"]
    best = max(range(args.restarts), key=likelihoods.__getitem__)
    match, history = matches[best], histories[best]
    return {
        "views": views,
        "model_views": max(views, 2),
        "selected_restart": best,
        "model": f"{out.name}/restart{best}",
        "accuracy": match.accuracy,
        "log_likelihood": likelihoods[best],
        "confusion": match.counts.tolist(),
        "label_of_cluster": match.label_of_cluster.tolist(),
        "prior": models[best].prior_probs.detach().cpu().tolist(),
        "restarts": [{"log_likelihood": likelihood, "accuracy": m.accuracy}
                     for likelihood, m in zip(likelihoods, matches, strict=True)],
        "losses": history["losses"],
        "evaluations": history["evaluations"],
        "train_seconds": seconds,
        "steps": args.steps,
    }
