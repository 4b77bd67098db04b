r"""``rpm content-style``: contrastive learning with a content-invariant prior recovers the
content and discards the style (von Kügelgen, Sharma, Gresele et al., 2021, section 5.1 and
Appendix D; the table of Sharma's slides).

Latents :math:`z = (c, s)`, :math:`n_c = n_s = 5`, and positive pairs that keep the content and
change each style coordinate with probability ``p_change``
(:class:`~rpm.data.synthetic.ContentStyleProcess`) are mixed by a random invertible 3-layer
leaky-ReLU MLP g (:class:`~rpm.data.synthetic.InvertibleMLP`, slope 0.2) into
:math:`x = g(z)`. An MLP encoder
(:class:`~rpm.experiments.identifiability.encoder.MLPEncoder`) to ``--content-dims``
outputs is the recognition model of an RPM whose prior keeps the content, in one of two forms
(``--prior``, :mod:`~rpm.experiments.content_style.model`): the implicit prior with an RBF
energy (InfoNCE, the paper's loss) or the explicit Gaussian transition (AlignMaxEnt).

The four rows of the table (``--rows``, default all; a row's data are the same whichever rows
run with it):

===============  =========  =============  ==========  ==================================
row              p_change   statistical    causal      published R^2 content / style
===============  =========  =============  ==========  ==================================
``independent``  1.0        no             no          1.00 / 0.07 (nonlinear)
``partial``      0.75       no             no          1.00 / 0.06
``statistical``  0.75       yes            no          0.98 / 0.37
``causal``       0.75       yes            yes         0.99 / 0.80
===============  =========  =============  ==========  ==================================

*Statistical*: the covariances of c, of s given c and of the style change are draws from a
Wishart distribution instead of I; *causal*: s depends on c, :math:`s \sim \mathcal N(a + B c,
\Sigma_s)` with standard normal a, B. These parameters are drawn **once** per row from the seed
(the paper's description); ``--redraw-every-batch`` draws them afresh for every minibatch (the
released code, whose negatives are moreover fresh marginal draws; here they are the batch's
other pairs) and for each held-out set.

Score: the held-out block :math:`R^2` (:func:`rpm.metrics.block_r2`) of the true content and of
the true style regressed on the learned :math:`\hat c`, linearly and by kernel ridge regression
(RBF kernel, alpha and gamma by 3-fold cross-validation), on ``--eval-samples`` fresh samples
(the first half fits, the second scores). Theory: the content is recovered (high content
:math:`R^2`); the style only as far as it is predictable from the content (causal row) or
nearly invariant (statistical row, a Wishart change covariance with a small eigenvalue).

Output folder (``--out``, the run-folder contract of :mod:`rpm.experiments.common`):
``config.json``, ``results.json`` (``rows``: per row ``p_change``, ``statistical``, ``causal``,
``content_r2_nonlinear``, ``style_r2_nonlinear``, ``content_r2_linear``, ``style_r2_linear``, the
untrained encoder's linear scores, ``style_r2_linear_true_content`` (the style :math:`R^2` of the
true content: what a perfect content encoder scores, which depends on the row's draw of a, B and
the covariances) and the trajectory; the configuration, the environment and
the provenance), ``table.png`` (the table as a heat map), ``training.png`` (loss and validation
linear content :math:`R^2` against the step), and one subfolder per row with its
``checkpoint.pt`` and ``history.json``. Steps and times of the defaults: ``benchmarks/README.md``.

References:
    J. von Kügelgen, Y. Sharma, L. Gresele, W. Brendel, B. Schölkopf, M. Besserve and
    F. Locatello, "Self-supervised learning with data augmentations provably isolates content
    from style", NeurIPS 2021.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rpm.experiments.common import (
    GIVEN_FLAGS,
    ConfigurationError,
    Run,
    add_common_arguments,
    add_training_arguments,
    check_models_resumable,
    environment,
    open_run,
    positive_float,
    positive_int,
    resolve_device,
    table_rows,
    torch_threads,
    write_json_atomic,
)

__all__ = ["PRIORS", "ROWS", "add_parser", "run"]

#: The rows of the table: name -> (p_change, statistical, causal).
ROWS = {
    "independent": (1.0, False, False),
    "partial": (0.75, False, False),
    "statistical": (0.75, True, False),
    "causal": (0.75, True, True),
}
#: The forms of the content prior (written out so that ``rpm --help`` imports no torch; a test
#: checks them against :data:`rpm.experiments.content_style.model.PRIORS`).
PRIORS = ("rbf", "gaussian")
#: Latent block sizes n_c = n_s of the paper.
CONTENT_DIM = STYLE_DIM = 5


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``content-style`` sub-command."""
    parser = subparsers.add_parser(
        "content-style",
        help="content kept, style discarded: the content-invariant prior (von Kügelgen et al.)",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/content-style", default_checkpoint_every=1000,
                         grow_flag="--steps")
    data = parser.add_argument_group("data")
    data.add_argument("--rows", type=table_rows(ROWS), default=list(ROWS), metavar="LIST",
                      help=f"rows of the table: 'all' or some of {', '.join(ROWS)} "
                      "(default: all)")
    data.add_argument("--redraw-every-batch", action="store_true",
                      help="draw the Wishart covariances and a, B afresh for every minibatch "
                      "(the released code) instead of once per row (the paper)")
    model = parser.add_argument_group("model")
    model.add_argument("--prior", choices=PRIORS, default="rbf",
                       help="content prior: rbf (implicit, InfoNCE) or gaussian (explicit "
                       "transition, AlignMaxEnt) (default: rbf)")
    model.add_argument("--content-dims", type=positive_int, default=CONTENT_DIM,
                       help=f"dimension of the learned c-hat, 1..{CONTENT_DIM + STYLE_DIM} "
                       f"(default: {CONTENT_DIM}, n_c)")
    model.add_argument("--lengthscale", type=positive_float, default=math.sqrt(0.5),
                       help="l of the RBF energy, or the initial l of the Gaussian transition "
                       "(default: sqrt(1/2), the paper's f = -|c - c'|^2)")
    model.add_argument("--noise-scale", type=positive_float, default=0.05,
                       help="recognition noise epsilon of the gaussian prior (default: 0.05)")
    model.add_argument("--hidden", type=positive_int, default=128,
                       help="width of the encoder's hidden layers (default: 128)")
    model.add_argument("--depth", type=positive_int, default=3,
                       help="number of hidden layers of the encoder (default: 3)")
    add_training_arguments(
        parser, {"steps": 6000, "batch_size": 1024, "lr": 1e-3, "warmup": 0.05, "eval_every": 500,
                 "eval_samples": 4000, "chunk_steps": 16}, contrastive=True,
        descriptions={"steps": "optimiser steps per row; on --resume it may grow",
                      "eval_every": "evaluate the validation linear R^2 every STEPS steps; 0: at "
                      "the end only",
                      "eval_samples": "fresh samples of each held-out set, half to fit the "
                      "read-outs and half to score them"})
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    """Every check of the flags, before the run folder is created or written."""
    if not 1 <= args.content_dims <= CONTENT_DIM + STYLE_DIM:
        raise ConfigurationError(f"--content-dims must lie in 1..{CONTENT_DIM + STYLE_DIM} (the "
                                 f"encoder's input dimension), got {args.content_dims}")
    if args.eval_samples < 40:
        raise ConfigurationError(f"--eval-samples {args.eval_samples} is too few for the "
                                 "cross-validated kernel ridge read-out: use at least 40 "
                                 "(e.g. 4000)")
    if args.prior == "rbf" and "noise_scale" in getattr(args, GIVEN_FLAGS, ()):
        raise ConfigurationError("--noise-scale is the recognition noise of --prior gaussian; "
                                 "drop it or use --prior gaussian")


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    with torch_threads(args.threads):
        device = resolve_device(args.device)
        with open_run(args, may_change=("eval_every",), may_grow=("steps",),
                      validate=_validate) as run:
            return _train_and_report(args, run.path, device, run)


def _train_and_report(args: argparse.Namespace, out: Path, device, run: Run) -> int:
    import torch

    from rpm.data.synthetic import ContentStyleProcess, InvertibleMLP
    from rpm.experiments.common import derived_seed
    from rpm.experiments.content_style.plots import plot_table, plot_training_curves
    from rpm.experiments.content_style.train import train_row
    from rpm.experiments.identifiability.data import held_out_set

    if args.resume:
        check_models_resumable(out, args.rows)
    mixing = InvertibleMLP(CONTENT_DIM + STYLE_DIM, seed=derived_seed(args.seed, "mixing"))
    mixing = mixing.to(device)
    rows = []
    for name in args.rows:
        index = list(ROWS).index(name)  # a row's draws do not depend on the other rows run
        p_change, statistical, causal = ROWS[name]
        process = ContentStyleProcess(
            CONTENT_DIM, STYLE_DIM, p_change, statistical, causal,
            redraw_every_batch=args.redraw_every_batch,
            seed=derived_seed(args.seed, "data", index), device=device, dtype=torch.float32)
        held_out = {part: held_out_set(process, mixing, args.eval_samples,
                                       derived_seed(args.seed, part, index))
                    for part in ("eval", "test")}
        rows.append(train_row(name, args, process, mixing, held_out, out / name))
    plot_table(out / "table.png", rows)
    plot_training_curves(out / "training.png", rows)
    summary = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "parameters": "redrawn for every minibatch and held-out set" if args.redraw_every_batch
        else "drawn once per row from the seed",
        "rows": rows,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", summary)
    print(_table(rows))
    print(f"results and figures in {out} ({run.elapsed():.0f} s)")
    return 0


def _table(rows: list) -> str:
    lines = ["held-out block R^2 (nonlinear / linear; style|c: the style R^2 of the true content):",
             f"{'row':<12} {'p_chg':>5} {'stat':>5} {'caus':>5} {'content':>13} {'style':>13} "
             f"{'style|c':>8} {'time':>7}"]
    for row in rows:
        lines.append(
            f"{row['row']:<12} {row['p_change']:>5.2f} {'yes' if row['statistical'] else 'no':>5} "
            f"{'yes' if row['causal'] else 'no':>5} "
            f"{row['content_r2_nonlinear']:>6.3f}/{row['content_r2_linear']:<6.3f} "
            f"{row['style_r2_nonlinear']:>6.3f}/{row['style_r2_linear']:<6.3f} "
            f"{row['style_r2_linear_true_content']:>8.3f} {row['train_seconds']:>6.0f}s")
    return "\n".join(lines)
