r"""``python -m rpm benchmark``: a table you can rerun, every objective on MNIST-1D and
scikit-learn's digits, one row per (dataset, objective, seed), scored by kNN on the latent and
a linear probe on the frozen backbone.

Data (:mod:`rpm.experiments.benchmark.data`): ``mnist1d``, MNIST-1D's 4,000 training and 1,000
test sequences, generated offline by the ``mnist1d`` package (the optional extra: ``pip install
'rpm-pyro[benchmark]'``), with the MNIST-1D self-supervised notebook's augmentations (shift,
offset, slope); ``digits``, scikit-learn's 8 x 8 digits (1,347 training and 450 test images) with
the augmentations of ``rpm digits``. ``--datasets`` chooses them.

Objectives (:mod:`rpm.experiments.benchmark.model`, ``--objectives``): the baselines ``raw``
(the inputs themselves) and ``untrained`` (the encoder at its initialisation), and the
objectives ``simclr``, ``ntxent``, ``vmf``, ``rbf``, ``aninfonce``, ``gaussian``, ``vicreg``,
``barlow`` and ``dcl``, and over J = 4 views (2 global and 2 local) ``star``, ``lejepa`` and
``gaussian_star``, the discrete RPM ``discrete`` and MC-InfoNCE's von Mises-Fisher encoder
``mcinfonce``, each the prior of an RPM (or the lightly-style surrogate of one), with the same
encoder, augmentations, epochs and optimiser (Adam, ``--lr``, ``--batch-size``, ``--epochs``)
within a dataset. ``--seeds K`` trains every row from the seeds ``--seed`` to ``--seed`` + K - 1.

Budget: by default (``--epochs`` not given) each dataset trains its :data:`DEFAULT_EPOCHS`, so
that the default table (every objective, both datasets, 5 seeds) runs in at most 25 minutes on
one thread of a busy 2-core CPU (``--threads 1``, the default: a second thread of these small
networks, or of the probe's BLAS, waits for a core); ``--epochs N`` trains every row N epochs.

Scores (:mod:`rpm.experiments.benchmark.train`), after the last epoch on the fixed test split:
``knn``, kNN (10 neighbours, cosine) on the latent z with every training label, and
``linear``, a logistic-regression probe on the backbone's h fitted to convergence (tolerance
1e-6) on the training split.

Output folder (``--out``, the run-folder contract of :mod:`rpm.experiments.common`):
``config.json``; ``rows.json`` with the finished rows, each written atomically as it
finishes, so that ``--resume`` recomputes no finished row (an interrupted row continues from
its checkpoint); ``results.json`` with ``rows`` (each with ``dataset``, ``objective``,
``seed``, ``knn``, ``linear`` in [0, 1], the probe's ``linear_iterations`` and
``linear_converged``, ``seconds``, ``steps``, for a trained objective ``final_loss`` and
``train_seconds``, and ``commit``, the git commit the row was computed at or ``unknown``),
``summary`` (mean and s.d. over seeds in percent, per objective and dataset), ``epochs``
(each dataset's), the configuration, the environment and the provenance; ``table.md`` (the markdown table) and
``table.png`` (its figure); ``DATASET/OBJECTIVE/seedS/`` with each trained row's
``checkpoint.pt`` and ``history.json``.

References:
    S. Greydanus and D. Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024.
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition parameterised
    model".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rpm.experiments.common import (
    ConfigurationError,
    Run,
    add_common_arguments,
    add_training_arguments,
    check_batch_size,
    environment,
    open_run,
    positive_float,
    positive_int,
    resolve_device,
    torch_threads,
    write_json_atomic,
)

__all__ = ["DATASETS", "DEFAULT_EPOCHS", "OBJECTIVES", "ROWS_NAME", "add_parser", "run"]

# Written out so that the parser is built without importing torch; a test checks them against
# rpm.experiments.benchmark.data.DATASETS and rpm.experiments.benchmark.model.OBJECTIVES.
DATASETS = ("mnist1d", "digits")
OBJECTIVES = ("raw", "untrained", "simclr", "ntxent", "vmf", "rbf", "aninfonce", "gaussian",
              "vicreg", "barlow", "dcl",
              "star", "lejepa", "gaussian_star", "discrete", "mcinfonce")
#: Epochs of every trained row of each dataset when ``--epochs`` is not given (module
#: docstring, the budget).
DEFAULT_EPOCHS = {"mnist1d": 20, "digits": 10}
#: The file of the finished rows, rewritten atomically after each.
ROWS_NAME = "rows.json"
#: The training inputs of each dataset's split.
_TRAIN_SIZES = {"mnist1d": 4000, "digits": 1347}
#: The latent dimension of each dataset's encoder (rpm.experiments.benchmark.model).
_LATENT_DIMS = {"mnist1d": 16, "digits": 64}


def _names(known: tuple[str, ...], what: str, example: str):
    def parse(text: str) -> list[str]:
        if text.strip() == "all":
            return list(known)
        names = [part.strip() for part in text.split(",")]
        if any(name not in known for name in names) or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(
                f"expected 'all' or distinct {what} from {', '.join(known)} separated by commas "
                f"(e.g. {example}), got {text!r}")
        return [name for name in known if name in names]

    parse.__name__ = what  # argparse names the type in its messages
    return parse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``benchmark`` sub-command."""
    parser = subparsers.add_parser(
        "benchmark",
        help="every objective on MNIST-1D and digits: kNN and linear-probe accuracy, a table "
        "you can rerun",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/benchmark", default_checkpoint_every=0)
    table = parser.add_argument_group("table")
    table.add_argument("--datasets", type=_names(DATASETS, "datasets", "mnist1d"),
                       default=list(DATASETS), metavar="LIST",
                       help=f"datasets separated by commas, from {','.join(DATASETS)}; all: "
                       "every one (default: all)")
    table.add_argument("--objectives", type=_names(OBJECTIVES, "objectives", "raw,simclr"),
                       default=list(OBJECTIVES), metavar="LIST",
                       help=f"objectives separated by commas, from {','.join(OBJECTIVES)}; all: "
                       "every one (default: all)")
    table.add_argument("--seeds", type=positive_int, default=5,
                       help="seeds per row: SEED, SEED+1, ..., SEED+K-1 (default: 5)")
    model = parser.add_argument_group("model")
    model.add_argument("--temperature", type=positive_float, default=0.5,
                       help="temperature tau of the cosine energy of simclr, ntxent and dcl, the "
                       "initial 1/kappa of vmf (default: 0.5)")
    train = add_training_arguments(
        parser, {"batch_size": 100, "lr": 1e-2}, contrastive=True,
        descriptions={"batch_size": "inputs per minibatch, two views each, >= 2, at most the "
                      "training inputs of every dataset (1347 digits)",
                      "lr": "learning rate of Adam, constant"})
    train.add_argument("--epochs", type=positive_int, default=None,
                       help="epochs of every trained row (default: "
                       + ", ".join(f"{n} on {d}" for d, n in DEFAULT_EPOCHS.items()) + ")")
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    """Every check of the flags, before the run folder is created or written."""
    from rpm.experiments.benchmark.data import EXTRA, missing_packages

    missing = missing_packages(args.datasets)
    if missing:
        raise ConfigurationError(
            f"--datasets {','.join(args.datasets)} needs {', '.join(missing)}, not installed: "
            f"install the benchmark extra ({EXTRA}) or leave the dataset out of --datasets")
    for dataset in args.datasets:
        check_batch_size(args.batch_size, _TRAIN_SIZES[dataset], "inputs",
                         what=f"the training split of {dataset}")
    gaussians = [o for o in ("gaussian", "gaussian_star") if o in args.objectives]
    if gaussians:
        dim = max(_LATENT_DIMS[d] for d in args.datasets)
        if args.batch_size <= dim:
            raise ConfigurationError(
                f"--batch-size {args.batch_size}: the moment-matched marginals of "
                f"{' and '.join(gaussians)} need more inputs than latent dimensions ({dim}): "
                f"use at least {dim + 1}, or leave {' and '.join(gaussians)} out of "
                "--objectives")


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    with torch_threads(args.threads), open_run(args, validate=_validate) as run:
        device = resolve_device(args.device)
        return _train_and_report(args, run.path, device, run)


def _key(row: dict) -> tuple[str, str, int]:
    return row["dataset"], row["objective"], int(row["seed"])


def _finished_rows(out: Path, resume: bool) -> list[dict]:
    """The rows ``rows.json`` holds (on ``--resume``; none on a fresh run)."""
    path = out / ROWS_NAME
    if not resume or not path.exists():
        return []
    try:
        return list(json.loads(path.read_text())["rows"])
    except (ValueError, KeyError, TypeError):
        raise ConfigurationError(f"--resume: {path} is damaged (not the rows this command "
                                 "writes): delete it to recompute every row, or start afresh "
                                 "with --overwrite") from None


def _train_and_report(args: argparse.Namespace, out: Path, device, run: Run) -> int:
    from rpm.experiments.benchmark.data import load_dataset
    from rpm.experiments.benchmark.table import markdown_table, plot_table, summarise
    from rpm.experiments.benchmark.train import train_row

    seeds = [args.seed + k for k in range(args.seeds)]
    planned = [(d, o, s) for d in args.datasets for s in seeds for o in args.objectives]
    rows = [r for r in _finished_rows(out, args.resume) if _key(r) in set(planned)]
    done = {_key(r) for r in rows}
    commit = environment(device)["git_commit"] or "unknown"
    epochs = {d: args.epochs or DEFAULT_EPOCHS[d] for d in args.datasets}
    for dataset in args.datasets:
        todo = [(d, o, s) for d, o, s in planned if d == dataset and (d, o, s) not in done]
        if not todo:
            continue
        data = load_dataset(dataset)
        row_args = argparse.Namespace(**{**vars(args), "epochs": epochs[dataset]})
        for _, objective, seed in todo:
            row = train_row(dataset, objective, seed, row_args, data, device,
                            out / dataset / objective / f"seed{seed}")
            rows.append({**row, "commit": commit})
            write_json_atomic(out / ROWS_NAME, {"rows": rows})
            print(f"{dataset} {objective} seed {seed}: kNN {100 * row['knn']:.1f}%, linear "
                  f"{100 * row['linear']:.1f}% ({row['seconds']:.1f} s)", flush=True)
    order = {key: i for i, key in enumerate(planned)}
    rows.sort(key=lambda r: order[_key(r)])
    summary = summarise(rows, args.objectives, args.datasets)
    title = (f"rpm benchmark: {' and '.join(f'{n} epochs on {d}' for d, n in epochs.items())}, "
             f"{len(seeds)} seed(s)")
    (out / "table.md").write_text(markdown_table(summary, args.datasets, title))
    plot_table(out / "table.png", summary, args.datasets, title)
    results = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "commit": commit,
        "evaluation": {"knn": "kNN accuracy on the test split of the latent z, 10 neighbours, "
                       "cosine distance, every training label",
                       "linear": "test accuracy of a logistic-regression probe (standardised, "
                       "C = 1, L-BFGS to tolerance 1e-6) on the backbone's h, fitted on the "
                       "training split after the last epoch",
                       "accuracy": "in [0, 1]; summary in percent"},
        "seeds": seeds,
        "epochs": epochs,
        "rows": rows,
        "summary": summary,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", results)
    print((out / "table.md").read_text())
    print(f"results and figures in {out} ({run.elapsed():.0f} s)")
    return 0
