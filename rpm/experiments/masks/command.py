r"""``rpm masks``: do sparse transitions identify the factors of moving masks? (Zimmermann et
al. 2021, Table 3, KITTI Masks; Klindt et al. 2021.)

Data (:mod:`rpm.data.masks`): ``--videos`` videos of ``--frames`` binary frames of
``--objects`` moving masks, ``--image-size`` pixels a side (32 by default, for the CPU; 64 as
KITTI Masks with ``--image-size 64``), whose 4 factors per object (x, y, area, aspect ratio)
move by box-truncated generalized-normal steps of shape ``--shape`` and scale
``--step-scale``. Training pairs are frames ``--delta-t`` apart in the same video (pairs as
Zimmermann et al.); the test set is ``--test-videos`` fresh videos. With ``--window T`` > 2 the
instances are windows of T frames, ``--delta-t`` apart, under the Markov chain of the implicit
conditionals (the sequence form; its ELBO sums the consecutive frames' terms).

Model (:mod:`rpm.experiments.masks.model`): a convolutional encoder, Delta recognition and the
implicit prior :math:`P(z'|z) \propto Q(z') \prod_d p(z'_d - z_d)` (Eq. 21-22 of Aitchison &
Ganev) whose energy is a random walk's step density p: normal (``normal``), Laplace
(``laplace``) or a generalized normal whose shape is learned (``learned``, held at 1 for the first
``--shape-warmup`` steps), each
with a learned scale (:class:`~rpm.priors.RandomWalkEnergy`). Each prior is trained on the same
pairs from the same encoder initialisation, minimising the negative ELBO per pair (Eq. 15;
InfoNCE with the critic :math:`\log p` minus :math:`\log N`, Eq. 23-25) with Adam.

Evaluation: the MCC (:func:`rpm.metrics.mcc`) between the true factors and the encoder's
outputs on the test videos, every ``--eval-every`` steps and at the end. A rotation of the
latents leaves the normal walk's density unchanged, so it identifies the factors only up to a
rotation, while sparse steps single out the factors' axes: the normal prior's MCC is expected
below the others'. The learned shape is compared with the generator's.

Output folder (``--out``, the run-folder contract of :mod:`rpm.experiments.common`):
``config.json``; ``results.json`` with ``priors`` (per prior its test ``mcc``, per-factor
correlations, learned parameters, trajectory and time), ``delta_t``, ``true_shape`` (the
generator's), ``fitted_shape`` (a gennorm fit of the training factors' steps ``--delta-t``
apart: the shape the data show at that spacing), ``learned_shape`` and the environment;
``masks.png`` (MCC per prior, MCC against the step, example frames); ``training.png`` (each
prior's loss and test MCC against the step); one subfolder per prior
with its ``checkpoint.pt`` and ``history.json``.
"""

from __future__ import annotations

import argparse
import json

from rpm.experiments.common import (
    ConfigurationError,
    add_common_arguments,
    add_training_arguments,
    check_batch_size,
    check_models_resumable,
    environment,
    nonnegative_int,
    open_run,
    positive_float,
    positive_int,
    resolve_device,
    torch_threads,
    write_json_atomic,
)

__all__ = ["PRIORS", "add_parser", "run"]

# Written out so that the parser is built without importing torch; a test checks it against
# rpm.experiments.masks.model.PRIORS.
PRIORS = ("normal", "laplace", "learned")


def _prior_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if not names or any(name not in PRIORS for name in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct priors from {', '.join(PRIORS)} separated by commas, got {text!r}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``masks`` sub-command."""
    parser = subparsers.add_parser(
        "masks", help="identify the factors of moving masks with sparse-transition priors "
        "(Zimmermann et al., KITTI Masks)",
        description=__doc__.split("\n\n")[0].replace("``", ""))
    add_common_arguments(parser, default_out="runs/masks", default_checkpoint_every=1000,
                         grow_flag="--steps")
    data = parser.add_argument_group("data")
    data.add_argument("--objects", type=positive_int, default=1,
                      help="masks per frame, 1-3 (default: 1)")
    data.add_argument("--shape", type=positive_float, default=0.5,
                      help="shape beta of the factors' generalized-normal steps (default: 0.5)")
    data.add_argument("--step-scale", type=positive_float, default=0.02,
                      help="scale alpha of the steps; the factors live in [-1, 1] "
                      "(default: 0.02)")
    data.add_argument("--image-size", type=positive_int, default=32,
                      help="pixels per side, a power of 2 >= 8 (default: 32)")
    data.add_argument("--videos", type=positive_int, default=200,
                      help="training videos (default: 200)")
    data.add_argument("--frames", type=positive_int, default=100,
                      help="frames per video (default: 100)")
    data.add_argument("--test-videos", type=positive_int, default=20,
                      help="fresh videos of the test set (default: 20)")
    data.add_argument("--delta-t", type=positive_int, default=1,
                      help="frames between the two views of a pair (default: 1)")
    data.add_argument("--window", type=positive_int, default=2,
                      help="views per training instance: 2, pairs (as Zimmermann et al.); "
                      "more, windows of that many frames --delta-t apart under the Markov "
                      "chain of the implicit conditionals (default: 2)")
    model = parser.add_argument_group("model")
    model.add_argument("--priors", type=_prior_list, default=list(PRIORS), metavar="LIST",
                       help=f"the priors to train, from {','.join(PRIORS)} "
                       "(default: all three)")
    model.add_argument("--channels", type=positive_int, default=16,
                       help="channels of the encoder's convolutions (default: 16)")
    model.add_argument("--hidden", type=positive_int, default=128,
                       help="width of the encoder's hidden layer (default: 128)")
    train = add_training_arguments(
        parser, {"steps": 2000, "batch_size": 256, "lr": 1e-3, "prior_lr": 1e-2, "eval_every": 250},
        contrastive=True,
        descriptions={"steps": "optimiser steps per prior; on --resume it may grow",
                      "lr": "learning rate of the encoder (Adam)",
                      "prior_lr": "learning rate of the walk's step scale and shape",
                      "eval_every": "evaluate the test MCC every STEPS steps; 0: at the end only"})
    train.add_argument("--shape-warmup", type=nonnegative_int, default=1000,
                       help="steps during which the learned prior's shape stays at 1 (the "
                       "Laplace walk) before it is learned (default: 1000)")
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    """The checks of the flags that argparse's types cannot make, before the folder is touched."""
    if not 1 <= args.objects <= 3:
        raise ConfigurationError(f"--objects must be 1 to 3, got {args.objects}")
    size = args.image_size
    if size < 8 or size & (size - 1):
        raise ConfigurationError(f"--image-size must be a power of 2 >= 8 (8, 16, 32, 64), "
                                 f"got {size}")
    if args.window < 2:
        raise ConfigurationError(f"--window must be >= 2 (pairs), got {args.window}")
    if args.frames <= (args.window - 1) * args.delta_t:
        raise ConfigurationError(f"--window {args.window} frames --delta-t {args.delta_t} apart "
                                 f"need videos of more than {(args.window - 1) * args.delta_t} "
                                 f"frames, got --frames {args.frames}")
    if args.test_videos * args.frames < 4 * args.objects + 2:
        raise ConfigurationError("the test set (--test-videos x --frames) is too small for the "
                                 "MCC; use more frames")
    starts = args.frames - (args.window - 1) * args.delta_t  # of a window in each video
    check_batch_size(args.batch_size, args.videos * starts, "windows" if args.window > 2 else "pairs",
                     what=f"--videos {args.videos} x {starts} starts of a window of --window "
                     f"{args.window} frames --delta-t {args.delta_t} apart in --frames "
                     f"{args.frames}")


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    with torch_threads(args.threads):
        device = resolve_device(args.device)
        with open_run(args, may_change=("eval_every",), may_grow=("steps",),
                      validate=_validate) as run_folder:
            return _train_and_report(args, run_folder, device)


def _train_and_report(args: argparse.Namespace, run_folder, device) -> int:
    from scipy import stats

    from rpm.data.masks import MaskVideo
    from rpm.experiments.common import derived_seed
    from rpm.experiments.figures import plot_training
    from rpm.experiments.masks.plots import plot_masks
    from rpm.experiments.masks.train import train_prior

    out = run_folder.path
    if args.resume:
        check_models_resumable(out, args.priors)
    common = {"num_frames": args.frames, "num_objects": args.objects, "shape": args.shape,
              "scale": args.step_scale, "image_size": args.image_size}
    video = MaskVideo(num_videos=args.videos, seed=derived_seed(args.seed, "data"), **common)
    test = MaskVideo(num_videos=args.test_videos, seed=derived_seed(args.seed, "test"), **common)
    priors = {name: train_prior(name, args, video, test, device, out / name)
              for name in args.priors}
    steps = (video.factors[:, args.delta_t:] - video.factors[:, :-args.delta_t])
    steps = steps.reshape(-1, video.dim).numpy()
    fitted = [float(stats.gennorm.fit(steps[:, d], floc=0)[0]) for d in range(video.dim)]
    learned = priors.get("learned", {}).get("prior_parameters", {}).get("shape")
    summary = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "delta_t": args.delta_t,
        "priors": priors,
        "true_shape": args.shape,
        "fitted_shape": sum(fitted) / len(fitted),
        "fitted_shape_per_factor": fitted,
        "learned_shape": learned,
        "learned_shape_error": None if learned is None else abs(learned / args.shape - 1.0),
        **run_folder.provenance(),
    }
    write_json_atomic(out / "results.json", summary)
    plot_masks(out / "masks.png", priors, test.frames[0, :8].float(), args.shape, learned)
    plot_training(out / "training.png", {
        name: {"losses": result["losses"],
               "evaluations": [{"step": step, "mcc": value} for step, value in
                               zip(result["trajectory"]["step"], result["trajectory"]["mcc"],
                                   strict=True)]}
        for name, result in priors.items()
    }, score="mcc", score_label="test MCC", loss_label="negative ELBO / instance")
    print(f"{'prior':<9} {'MCC':>7} {'step scale':>10} {'shape':>7} {'time':>8}")
    for name, result in priors.items():
        params = result["prior_parameters"]
        shape = {"normal": 2.0, "laplace": 1.0}.get(name, params.get("shape"))
        print(f"{name:<9} {result['mcc']:>7.4f} {params['step_scale']:>10.4f} {shape:>7.3f} "
              f"{result['train_seconds']:>7.1f}s")
    print(f"shape of the steps {args.delta_t} frame(s) apart: generator {args.shape}, fitted "
          f"{summary['fitted_shape']:.3f}" + ("" if learned is None else f", learned {learned:.3f}"))
    print(f"results and figures in {out} ({run_folder.elapsed():.0f} s)")
    return 0
