r"""``rpm causal-ident``: what data augmentations and latent transformations keep, on a
procedural Causal3DIdent (von Kügelgen, Sharma, Gresele et al., 2021, Table 1; the table of
seed 001's slides).

Scenes (:mod:`rpm.data.scenes`): one of seven shapes (the class) at a position, turned, with an
object hue, under a spotlight of a position and a hue, on a background of a hue, the latents
linked by a causal graph (class -> object position -> spotlight position; spotlight and
background hues -> object hue), rendered with torch at ``--size`` pixels. Each row of the table
makes positive pairs its own way (:mod:`~rpm.experiments.causal_ident.rows`): data
augmentations of one image (SimCLR's colour distortion, small (8-100% of the area) or large
(80-100%) random resized crops with flips, two different quarter turns, and their
combinations; kornia) or latent transformations (the class kept, the hues, positions or
rotation redrawn, the scene rendered again). A small convolutional encoder is trained as the
recognition model of an RPM with the implicit prior (its ELBO is InfoNCE), and every factor
is read from its representation of fresh scenes: the class by a kernel classifier's held-out
accuracy, the others by the held-out kernel ridge :math:`R^2`.

Rows (``--rows``, comma-separated names, or ``all``): colour, change_hues, crop_large,
crop_small, change_positions, crop_large+colour, crop_small+colour, change_positions+hues,
rotation, change_rotations, rotation+colour, change_rotations+hues; default the three the
theory's sharpest claims rest on: colour (the hues are discarded), crop_small (only the
background hue is kept) and crop_large+colour (the class is kept).

Output folder (``--out``, the run-folder contract of :mod:`rpm.experiments.common`):
``config.json``, ``results.json`` (``rows``: per row ``views``, ``kind``, ``scores`` {factor:
value} for the factors class, position_object, position_spotlight, hue_object, hue_spotlight,
hue_background, rotation, ``published`` (the paper's values), ``untrained_linear``, the
trajectory and the losses; the configuration, the environment, the provenance),
``table.png`` (measured and published tables as heat maps), ``training.png`` (loss and
validation linear :math:`R^2` against the step), and one subfolder per row with its
``checkpoint.pt``, ``history.json`` and ``model.json`` (``rpm.load(out, model=ROW)``). Steps
and times of the defaults: ``benchmarks/README.md``.

References:
    J. von Kügelgen, Y. Sharma, L. Gresele, W. Brendel, B. Schölkopf, M. Besserve and
    F. Locatello, "Self-supervised learning with data augmentations provably isolates content
    from style", NeurIPS 2021.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rpm.experiments.causal_ident.rows import DEFAULT_ROWS, FACTORS, PUBLISHED, ROWS
from rpm.experiments.common import (
    ConfigurationError,
    Run,
    add_common_arguments,
    add_training_arguments,
    check_models_resumable,
    environment,
    open_run,
    positive_float,
    positive_int,
    probability,
    resolve_device,
    table_rows,
    torch_threads,
    write_json_atomic,
)

__all__ = ["ENERGIES", "POOLINGS", "add_parser", "run"]

#: The energies of the implicit prior (written out so that ``rpm --help`` imports no torch; a
#: test checks them against :data:`rpm.experiments.causal_ident.model.ENERGIES`).
ENERGIES = ("cosine", "rbf")
#: The encoder's poolings (written out for the same reason; checked against
#: :data:`rpm.experiments.causal_ident.model.POOLINGS`).
POOLINGS = ("flatten", "average")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``causal-ident`` sub-command."""
    parser = subparsers.add_parser(
        "causal-ident",
        help="what augmentations keep: a procedural Causal3DIdent (von Kügelgen et al.)",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/causal-ident", default_checkpoint_every=500,
                         grow_flag="--steps")
    data = parser.add_argument_group("data")
    data.add_argument("--rows", type=table_rows(ROWS), default=list(DEFAULT_ROWS), metavar="LIST",
                      help=f"rows of the table: 'all' or some of {', '.join(ROWS)} (default: "
                      f"{','.join(DEFAULT_ROWS)})")
    data.add_argument("--size", type=positive_int, default=32,
                      help="side of the images in pixels, a multiple of 8 (default: 32)")
    data.add_argument("--hue-shift", type=probability, default=0.5,
                      help="largest hue shift of the colour distortion, in turns, <= 0.5; 0.5 "
                      "shifts uniformly on the colour circle, SimCLR's 0.2 leaves each view's hue "
                      "within 72 degrees of the scene's (default: 0.5)")
    model = parser.add_argument_group("model")
    model.add_argument("--energy", choices=ENERGIES, default="cosine",
                       help="energy of the implicit prior: cosine (SimCLR's critic) or rbf "
                       "(default: cosine)")
    model.add_argument("--temperature", type=positive_float, default=0.1,
                       help="tau: the cosine energy is z.z'/tau, the rbf one -|z - z'|^2/tau "
                       "(default: 0.1)")
    model.add_argument("--rep-dims", type=positive_int, default=8,
                       help="dimension of the representation (default: 8)")
    model.add_argument("--width", type=positive_int, default=32,
                       help="channels of the encoder's first convolution (default: 32)")
    model.add_argument("--hidden", type=positive_int, default=256,
                       help="units of the encoder's hidden layer (default: 256)")
    model.add_argument("--pooling", choices=POOLINGS, default="flatten",
                       help="how the encoder pools its last feature map: flatten (every cell, "
                       "the features know where they are) or average (a ResNet's global average "
                       "pooling) (default: flatten)")
    add_training_arguments(
        parser, {"steps": 1500, "batch_size": 256, "lr": 1e-3, "warmup": 0.05, "eval_every": 250,
                 "eval_samples": 2000}, contrastive=True,
        descriptions={"steps": "optimiser steps per row; on --resume it may grow",
                      "eval_every": "evaluate the validation linear read-outs every STEPS steps; "
                      "0: at the end only",
                      "eval_samples": "fresh scenes of each held-out set, half to fit the "
                      "read-outs and half to score them"})
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    """Every check of the flags, before the run folder is created or written."""
    if args.size % 8 or args.size < 16:
        raise ConfigurationError(f"--size must be a multiple of 8 and at least 16 (the encoder "
                                 f"halves it three times), got {args.size}")
    if args.hue_shift > 0.5:
        raise ConfigurationError(f"--hue-shift must be <= 0.5 (half a turn: a shift uniform on "
                                 f"the whole colour circle), got {args.hue_shift}")
    if args.eval_samples < 60:
        raise ConfigurationError(f"--eval-samples {args.eval_samples} is too few for the "
                                 "cross-validated read-outs: use at least 60 (e.g. 2000)")


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    with torch_threads(args.threads):
        device = resolve_device(args.device)
        with open_run(args, may_change=("eval_every",), may_grow=("steps",),
                      validate=_validate) as run:
            return _train_and_report(args, run.path, device, run)


def _train_and_report(args: argparse.Namespace, out: Path, device, run: Run) -> int:
    import torch

    from rpm.data.scenes import CausalScenes, render_scenes
    from rpm.experiments.causal_ident.plots import plot_table, plot_training_curves
    from rpm.experiments.causal_ident.train import train_row
    from rpm.experiments.common import derived_seed

    if args.resume:
        check_models_resumable(out, args.rows)
    scenes = CausalScenes()
    held_out = {}
    for part in ("eval", "test"):
        generator = torch.Generator().manual_seed(derived_seed(args.seed, part))
        z = scenes.sample(args.eval_samples, generator)
        held_out[part] = (z, render_scenes(z, args.size))
    rows = [train_row(name, ROWS[name], PUBLISHED[name], args, scenes, held_out, out / name,
                      device) for name in args.rows]
    plot_table(out / "table.png", rows)
    plot_training_curves(out / "training.png", rows)
    summary = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "factors": list(FACTORS),
        "rows": rows,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", summary)
    print(_table(rows))
    print(f"results and figures in {out} ({run.elapsed():.0f} s)")
    return 0


def _table(rows: list) -> str:
    short = ("class", "pos.obj", "pos.spot", "hue.obj", "hue.spot", "hue.bg", "rot.")
    lines = ["held-out read-outs (class: accuracy, others: kernel ridge R^2), measured (published):",
             f"{'views':<22}" + "".join(f"{name:>13}" for name in short) + f"{'time':>7}"]
    for row in rows:
        cells = "".join(f"{row['scores'][f]:>6.2f} ({row['published'][f]:.2f})" for f in FACTORS)
        lines.append(f"{row['views']:<22}{cells}{row['train_seconds']:>6.0f}s")
    return "\n".join(lines)
