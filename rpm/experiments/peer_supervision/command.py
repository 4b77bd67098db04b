r"""``python -m rpm peer-supervision``: clustering scikit-learn's digits with the discrete-latent
RPM (Walker et al., 2023) from J different images of the same digit, scored on held-out images
after the best matching of clusters to digits.

Data: :func:`rpm.data.digits.load_digits_split` (1797 8 x 8 images, nothing downloaded; a fixed
stratified split, 1347 training and 450 held-out images that no training step sees). An
instance is J *different* training images of one digit (``--views J``, J >= 2: an anchor and
J - 1 partners of its digit, drawn anew at every step; the labels only decide which images go
together, the model never sees them) or, with ``--views 1``, two random augmentations of one
image (``rpm digits``' views: the self-supervised clustering setting)
(:mod:`rpm.experiments.peer_supervision.views`). ``--views 2,3,5,1`` (the default) trains each
setting in turn.

Model (:mod:`rpm.experiments.peer_supervision.model`): a :class:`rpm.DiscreteRPM` with
``--clusters`` K values of the latent Z, a learned prior :math:`p(Z)` and one
:class:`rpm.CategoricalRecognition` on a small MLP shared by the views, trained by exact
maximum likelihood (``TraceEnum_ELBO`` sums Z out; the normaliser over the minibatch) with Adam,
a linear warm-up and a cosine decay. Like EM, it stops at local optima that merge two digits,
so every setting trains ``--restarts`` initialisations on the same minibatches and keeps the
one of the highest log-likelihood on the training instances (no labels, no held-out image:
:mod:`rpm.experiments.peer_supervision.train`).

Evaluation: a held-out image's cluster is the mode of its one-view posterior
:math:`q(Z|x) \propto p(Z) f(Z|x) / F(Z)`; the accuracy is the fraction of held-out images in
the cluster matched to their digit by the best one-to-one matching
(:func:`rpm.evaluation.match_clusters`, the Hungarian algorithm). Baselines on the same
held-out images, each the best of 10 k-means starts fitted to the training images
(:func:`rpm.evaluation.kmeans_clusters`): k-means on the raw pixels and on the outputs of the
untrained network (restart 0's initialisation). The default run (all four settings, 8 restarts
each) stays within 10 minutes of one CPU thread; J = 2 must reach :data:`FLOOR`.

Output folder (``--out``, the run-folder contract of :mod:`rpm.experiments.common`):
``config.json``; ``results.json`` with ``accuracy`` (held-out, at the smallest J >= 2 run, J = 2
by default; ``accuracy_views`` names it), ``accuracy_per_views`` (J -> accuracy, for J >= 2),
``accuracy_augmentations`` (``--views 1``; null when not run), ``kmeans_raw`` and
``kmeans_untrained``, per setting under ``runs`` the selected restart, its confusion matrix
(counts of digit c in cluster k), matched digits, prior, losses and every restart's
log-likelihood and accuracy, the floor check, the configuration, the environment and the
provenance; ``confusion.png`` (the held-out confusion matrices, clusters ordered by their
matched digit) and ``training.png`` (loss and training-image accuracy of each selected restart
against the step); one folder per setting (``views2``, ..., ``augmentations``) with a folder per
restart holding its ``checkpoint.pt``, ``history.json`` and ``model.json``
(``rpm.load(DIR, model="views2/restart3")``). ``--resume`` continues (``--steps`` may grow).

References:
    W. I. Walker, H. Soulat, C. Yu and M. Sahani, "Unsupervised representation learning with
    recognition-parametrised probabilistic models", AISTATS 2023.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rpm.experiments.common import (
    ConfigurationError,
    Run,
    add_common_arguments,
    add_training_arguments,
    check_models_resumable,
    derived_seed,
    environment,
    open_run,
    positive_int,
    resolve_device,
    torch_threads,
    write_json_atomic,
)

__all__ = ["DEFAULT_VIEWS", "FLOOR", "add_parser", "run"]

#: The settings of the default run: J = 2, 3 and 5 images of a digit, then two augmentations
#: of one image (1).
DEFAULT_VIEWS = (2, 3, 5, 1)
#: Held-out accuracy that J = 2 must reach with the defaults.
FLOOR = 0.95
#: The training images of the bundled digits' split (``rpm.data.digits``).
_TRAIN_IMAGES = 1347
#: Starts of each k-means baseline.
_KMEANS_STARTS = 10


def _view_counts(text: str) -> list[int]:
    """``--views``: distinct integers >= 1 separated by commas, in the order given."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(
            f"expected distinct view counts >= 1 separated by commas (J >= 2 images of a digit, "
            f"1 for two augmentations of one image; e.g. 2,3,5,1), got {text!r}")
    return counts


def _cluster_count(text: str) -> int:
    """``--clusters``: an integer K >= 2."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected K >= 2 clusters (the values of the discrete "
                                         f"latent; 10 for the digits), got {text!r}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``peer-supervision`` sub-command."""
    parser = subparsers.add_parser(
        "peer-supervision",
        help="cluster scikit-learn's digits with the discrete RPM from J images of one digit",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/peer-supervision",
                         default_checkpoint_every=100, grow_flag="--steps")
    model = parser.add_argument_group("model")
    model.add_argument("--views", type=_view_counts, default=list(DEFAULT_VIEWS), metavar="LIST",
                       help="the settings, view counts separated by commas: J >= 2 different "
                       "images of one digit per instance, 1 for two augmentations of one image "
                       f"(default: {','.join(map(str, DEFAULT_VIEWS))})")
    model.add_argument("--clusters", type=_cluster_count, default=10,
                       help="K, the values of the discrete latent (default: 10)")
    model.add_argument("--hidden", type=positive_int, default=128,
                       help="width of the MLP's hidden layer (default: 128)")
    model.add_argument("--restarts", type=positive_int, default=8,
                       help="initialisations trained per setting; the one of the highest "
                       "training log-likelihood is kept (default: 8)")
    add_training_arguments(
        parser, {"steps": 300, "batch_size": 256, "lr": 3e-3, "warmup": 0.05, "eval_every": 100},
        contrastive=True,
        descriptions={"batch_size": "instances per minibatch, >= 2 (the normaliser F averages "
                      f"the factors over them), at most the {_TRAIN_IMAGES} training images",
                      "eval_every": "log-likelihood and training-image accuracy every STEPS "
                      "steps; 0: at the end only"})
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    """Every check of the flags, before the run folder is created or written."""
    if args.batch_size > _TRAIN_IMAGES:
        raise ConfigurationError(f"--batch-size {args.batch_size} is more than the "
                                 f"{_TRAIN_IMAGES} training images: use at most {_TRAIN_IMAGES} "
                                 "(default 256)")
    from rpm.data.digits import load_digits_split

    smallest = int(load_digits_split().train.labels.bincount().min())
    if max(args.views) > smallest:
        raise ConfigurationError(f"--views {max(args.views)}: an instance needs that many "
                                 f"different images of one digit, but the rarest digit has "
                                 f"{smallest} training images: use at most {smallest} views")


def _model_folders(args: argparse.Namespace) -> list[str]:
    from rpm.experiments.peer_supervision.model import setting_name

    return [f"{setting_name(views)}/restart{r}" for views in args.views
            for r in range(args.restarts)]


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    with torch_threads(args.threads), open_run(args, may_change=("eval_every",),
                                               may_grow=("steps",), validate=_validate) as run:
        device = resolve_device(args.device)
        if args.resume:
            check_models_resumable(run.path, _model_folders(args))
        return _train_and_report(args, run.path, device, run)


def _headline(per_views: dict, augmentations: float | None) -> tuple[float | None, int | None]:
    """``accuracy`` and the view count it is of: the smallest J >= 2 run, else ``--views 1``."""
    if per_views:
        views = min(int(j) for j in per_views)
        return per_views[str(views)], views
    return augmentations, (1 if augmentations is not None else None)


def _baselines(args: argparse.Namespace, data) -> dict:
    from rpm.evaluation import kmeans_clusters, match_clusters, representations
    from rpm.experiments.peer_supervision.train import initial_model

    seed = derived_seed(args.seed, "eval", 1) % 2**32
    untrained, _ = initial_model(args, 2, int(data.train.images[0].numel()), 0)
    features = {
        "kmeans_raw": (data.train.images.flatten(1), data.test.images.flatten(1)),
        "kmeans_untrained": (representations(untrained.recognition.net, data.train.images),
                             representations(untrained.recognition.net, data.test.images)),
    }
    baselines = {}
    for name, (train, test) in features.items():
        clusters = kmeans_clusters(train, test, args.clusters, seed, n_init=_KMEANS_STARTS)
        match = match_clusters(clusters, data.test.labels, args.clusters)
        baselines[name] = {"accuracy": match.accuracy, "confusion": match.counts.tolist(),
                           "label_of_cluster": match.label_of_cluster.tolist(),
                           "features": "the 64 pixels" if name == "kmeans_raw" else
                           f"the untrained network's {args.clusters} outputs"}
    return baselines


def _table(runs: dict, baselines: dict) -> str:
    lines = ["held-out accuracy (%), clusters matched to digits; restarts: the range over the "
             "initialisations, the selected one by training log-likelihood",
             f"{'setting':<22} {'accuracy':>8} {'restarts':>13} {'time':>7}"]
    for name, result in runs.items():
        scores = [100 * r["accuracy"] for r in result["restarts"]]
        lines.append(f"{name:<22} {100 * result['accuracy']:>8.1f} "
                     f"{min(scores):>6.1f}-{max(scores):<6.1f} {result['train_seconds']:>6.0f}s")
    for name, result in baselines.items():
        lines.append(f"{name.replace('_', ' '):<22} {100 * result['accuracy']:>8.1f}")
    return "\n".join(lines)


def _train_and_report(args: argparse.Namespace, out: Path, device, run: Run) -> int:
    from rpm.data.digits import load_digits_split
    from rpm.experiments.figures import plot_training
    from rpm.experiments.peer_supervision.model import setting_name
    from rpm.experiments.peer_supervision.plots import plot_confusion
    from rpm.experiments.peer_supervision.train import train_setting

    data = load_digits_split()
    runs = {setting_name(views): train_setting(views, args, data, device,
                                               out / setting_name(views))
            for views in args.views}
    baselines = _baselines(args, data)
    per_views = {str(r["views"]): r["accuracy"] for r in runs.values() if r["views"] >= 2}
    augmentations = runs["augmentations"]["accuracy"] if "augmentations" in runs else None
    accuracy, accuracy_views = _headline(per_views, augmentations)
    checks = {}
    if "2" in per_views:
        checks["floor"] = {"views": 2, "floor": FLOOR, "accuracy": per_views["2"],
                           "passed": per_views["2"] >= FLOOR}
    titles = {name: (f"J = {r['views']} images of a digit" if r["views"] >= 2 else
                     "two augmentations of one image") for name, r in runs.items()}
    plot_confusion(out / "confusion.png",
                   {**{titles[name]: r for name, r in runs.items()},
                    "k-means, raw pixels": baselines["kmeans_raw"]},
                   title="rpm peer-supervision: held-out digits against their clusters")
    plot_training(out / "training.png",
                  {name: {"losses": r["losses"], "evaluations": r["evaluations"]}
                   for name, r in runs.items()},
                  score="train_accuracy", score_label="training-image accuracy (matched)",
                  loss_label="-log P / N",
                  baselines={name: baselines["kmeans_raw"]["accuracy"] for name in runs},
                  baseline_label="k-means, raw pixels (held-out)")
    summary = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "evaluation": {"accuracy": "held-out accuracy in [0, 1] after the best one-to-one "
                       "matching of clusters to digits (Hungarian algorithm)",
                       "cluster": "the mode of the one-view posterior p(Z) f(Z|x) / F(Z), F over "
                       "the training images",
                       "selection": "per setting, the restart of the highest log-likelihood per "
                       "instance on the training instances",
                       "train_images": int(data.train.images.shape[0]),
                       "test_images": int(data.test.images.shape[0])},
        "accuracy": accuracy,
        "accuracy_views": accuracy_views,
        "accuracy_per_views": per_views,
        "accuracy_augmentations": augmentations,
        "kmeans_raw": baselines["kmeans_raw"]["accuracy"],
        "kmeans_untrained": baselines["kmeans_untrained"]["accuracy"],
        "runs": runs,
        "baselines": baselines,
        "checks": checks,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", summary)
    print(_table(runs, baselines))
    floor = checks.get("floor")
    if floor and not floor["passed"]:
        print(f"warning: J = 2 reaches {100 * floor['accuracy']:.1f}% held-out accuracy, below "
              f"the floor {100 * FLOOR:.0f}% of the default run (more --restarts or --steps)",
              file=sys.stderr)
    print(f"results and figures in {out} ({run.elapsed():.0f} s"
          + (f"; {summary['wall_time']:.0f} s over {len(summary['segments'])} segments)"
             if len(summary["segments"]) > 1 else ")"))
    return 0
