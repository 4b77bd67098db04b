r"""``python -m rpm pendulum``: an RPM with a state-space prior learns a swinging pendulum from its video,
with or without moving textured backgrounds (RP-GSSM's pendulum tasks, Hromadka et al. 2025,
generated here: :mod:`rpm.data.pendulum`).

The data: ``--sequences`` (200) training and ``--test-sequences`` (50) held-out videos of
``--length`` (100) frames of ``--image-size`` (28) pixels, the frictionless pendulum started at a
random angle and velocity, pixel noise ``--noise`` (0.05); ``--distractors`` (or
``--distractors iid``) draws it over procedurally generated gratings and blobs redrawn at every
frame, ``--distractors moving`` over a grating that drifts and rotates and a blob that drifts,
with per-video speeds (:mod:`rpm.data.distractors`; no image data set).

The model: a convolutional Gaussian encoder (``--encoder``: ``keypoints``, the spatial
soft-argmax of ``--keypoints`` maps, :class:`~rpm.experiments.pendulum.model.GaussianKeypointEncoder`,
or ``flat``, :class:`~rpm.experiments.pendulum.model.GaussianConvEncoder`; D = ``--latent-dim``,
constant noise ``--recognition-noise``), a learned linear-Gaussian state-space prior over the
frames of a window (``--prior``, stationary by default; H = ``--state-dim``, 3D by default: a
frame shows the angle, the chain must carry the velocity) with the structured guide and the
marginals pooled over the batch's frames (``--marginal``;
:func:`~rpm.experiments.lds.model.build_sequence_model`), trained on ``--batch-size`` windows of
``--window`` frames (:mod:`rpm.experiments.lds.train`), each frame dropped with probability
``--drop-frames`` (0 by default; the ELBO of the observed frames). ``--data FILE.npz`` trains
on your own videos instead (arrays ``observations`` (N, T, H, W) or (N, T, C, H, W), optional
``states`` (N, T, K) and ``held_out`` (N,): :mod:`rpm.experiments.pendulum.fitting`, whose
:func:`fit <rpm.experiments.pendulum.fitting.fit>` does the same on arrays); without states the
scores are skipped (``"r2": null`` and ``scores_skipped`` in ``results.json``).

Results (:mod:`rpm.experiments.lds.evaluate`), in ``results.json``:

* ``r2``: the held-out linear :math:`R^2` of :math:`(\sin\theta, \cos\theta, \omega)` from the
  smoothed latents :math:`E[s_t|\mu_{1:T}]` (affine map fitted on the training videos' frames;
  mean over the three, each in ``r2_per_coordinate``); ``means_r2`` the same from the
  encoder's means;
* ``knn_r2`` (and ``knn_r2_per_coordinate``): the held-out :math:`R^2` of a 10-nearest-neighbour
  regression of the state on the same smoothed latents
  (:func:`~rpm.experiments.pendulum.readout.knn_heldout_r2`), what they carry without the cap
  that a linear read-out puts on :math:`\omega`;
* ``forecast_error``: the RMSE (over the three coordinates and the held-out frames) of the
  learned prior's 1- and 10-step forecasts :math:`A^k E[s_t|\mu_{1:t}]`, read out by the same
  affine map; ``var_forecast_error``: the same for a VAR(1) fitted to the encoder's means of
  the training videos; ``forecast_baseline``: the RMSE of predicting the state's mean;
* ``missing_frames`` (``--eval-drop-frames`` p > 0, 0.25 by default): the one-step forecast
  and imputation errors with each held-out frame dropped with probability p, against the same
  read-outs with every frame seen (:mod:`rpm.experiments.pendulum.missing_frames`);
* ``distractor_r2`` (``--distractors moving``; and ``distractor_r2_per_coordinate``): the
  held-out linear :math:`R^2` of the distractor's own state (its angles on circles,
  :attr:`~rpm.data.distractors.MovingDistractors.states`) from the same smoothed latents, read
  out as ``r2``: how much of the second dynamical system the latents carry;
* the learned A's eigenvalues, the untrained model's scores, the history;

``pendulum.png`` shows held-out frames and the state read out from the smoothed latents,
``training.png`` the loss and the held-out :math:`R^2` against the step. The model's folder
``rpm/`` holds its checkpoint, history and model record (``rpm.load(DIR)`` returns the trained
model, :mod:`rpm.experiments.trained`). The measured numbers, times and machine are in
``benchmarks/README.md``.

References:
    M. Hromadka et al., "Recognition-parametrised Gaussian state-space models" (RP-GSSM), 2025.
"""

from __future__ import annotations

import argparse
import json

from rpm.experiments.common import (
    GIVEN_FLAGS,
    ConfigurationError,
    add_common_arguments,
    at_least_two_frames,
    check_models_resumable,
    environment,
    fraction_of_frames,
    nonnegative_float,
    nonnegative_int,
    open_run,
    positive_int,
    resolve_device,
    torch_threads,
    write_json_atomic,
)
from rpm.experiments.data_file import add_data_file_argument, check_data_file
from rpm.experiments.lds.arguments import (
    add_state_space_model_arguments,
    add_window_training_arguments,
    check_window_batch_size,
)

__all__ = ["ARRAYS", "add_parser", "check_model_flags", "run"]

#: The arrays of ``rpm pendulum --data``: required, then optional (checked before torch is
#: imported: :func:`~rpm.experiments.data_file.check_data_file`).
ARRAYS = (("observations",), ("states", "held_out"))

#: The name of the model's folder in the run folder.
MODEL = "rpm"
#: The encoders of ``--encoder`` (:data:`rpm.experiments.pendulum.model.ENCODERS`; spelled out
#: here so that ``python -m rpm --help`` imports no torch).
ENCODERS = ("keypoints", "flat")
#: The kinds of ``--distractors`` (:data:`rpm.data.pendulum.DISTRACTORS`, spelled out here so
#: that ``python -m rpm --help`` imports no torch); the bare flag means ``iid``.
DISTRACTORS = ("none", "iid", "moving")
#: Names of the coordinates of the distractor's state read out (``--distractors moving``).
DISTRACTOR_NAMES = ("cos_column", "cos_row", "cos_phase", "cos_orientation",
                    "sin_column", "sin_row", "sin_phase", "sin_orientation")
#: Names of the coordinates of the state read out.
STATE_NAMES = ("sin_theta", "cos_theta", "omega")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``pendulum`` sub-command."""
    parser = subparsers.add_parser(
        "pendulum",
        help="learn a swinging pendulum from its video (optionally with moving backgrounds) "
        "with a state-space RPM",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/pendulum", default_checkpoint_every=200,
                         grow_flag="--steps")
    data = parser.add_argument_group(
        "data", "generated by default; --data FILE.npz trains on your own videos: arrays "
        "'observations' (N, T, H, W) or (N, T, C, H, W) (channels first, H and W >= 8; uint8 "
        "frames are divided by 255), optional 'states' (N, T, K) to score against and "
        "'held_out' (N,) boolean (the videos scored and not trained on; default: the last "
        "N // 5 with states, none without); without states the scores are skipped")
    add_data_file_argument(data, "generated videos; --distractors, --sequences, --test-sequences, "
                           "--length, --image-size and --noise then do not apply")
    data.add_argument("--distractors", nargs="?", choices=DISTRACTORS, const="iid",
                      default="none",
                      help="the background: none; iid, procedural textures redrawn at every "
                      "frame (the bare flag); moving, a grating that drifts and rotates and a "
                      "blob that drifts, with per-video speeds (default: none)")
    data.add_argument("--sequences", type=positive_int, default=200,
                      help="training videos (default: 200)")
    data.add_argument("--test-sequences", type=positive_int, default=50,
                      help="held-out videos (default: 50)")
    data.add_argument("--length", type=at_least_two_frames, default=100,
                      help="frames per video (default: 100)")
    data.add_argument("--image-size", type=positive_int, default=28,
                      help="side of the frames in pixels, >= 8 (default: 28)")
    data.add_argument("--noise", type=nonnegative_float, default=0.05,
                      help="standard deviation of the pixel noise (default: 0.05)")
    model = parser.add_argument_group("model")
    model.add_argument("--encoder", choices=ENCODERS, default="keypoints",
                       help="keypoints: the spatial soft-argmax of convolutional maps; flat: "
                       "strided convolutions and a hidden layer (default: keypoints)")
    model.add_argument("--latent-dim", type=positive_int, default=4,
                       help="dimension D of the latents (default: 4)")
    model.add_argument("--state-dim", type=positive_int, default=None,
                       help="dimension H of the prior's hidden state (default: 3D)")
    model.add_argument("--channels", type=positive_int, default=16,
                       help="maps of the encoder's convolutions (default: 16)")
    model.add_argument("--keypoints", type=positive_int, default=8,
                       help="maps (points) of the keypoint encoder (default: 8)")
    model.add_argument("--hidden", type=nonnegative_int, default=None,
                       help="units of the encoder's hidden layer: the MLP beside the keypoints' "
                       "affine map (0: none) or the flat encoder's layer (>= 1) (default: 0 for "
                       "keypoints, 64 for flat)")
    add_state_space_model_arguments(model, prior="stationary")
    add_window_training_arguments(parser, steps=300, batch_size=16, window=20, lr=1e-3,
                                  eval_every=100, held_out="videos")
    missing = parser.add_argument_group("missing frames")
    missing.add_argument("--drop-frames", type=fraction_of_frames, default=0.0,
                         help="train with each frame of a window dropped with this probability "
                         "(a mask over frames: the ELBO of the observed ones; default: 0)")
    missing.add_argument("--eval-drop-frames", type=fraction_of_frames, default=0.25,
                         help="after training, score forecasts and imputations with this "
                         "fraction of the held-out frames dropped (results.json "
                         "'missing_frames'; 0: skip; default: 0.25)")
    parser.set_defaults(func=run)


def check_model_flags(args: argparse.Namespace) -> None:
    """The model's flags that exclude each other (also for
    :func:`rpm.experiments.pendulum.fitting.fit`'s options)."""
    if args.encoder == "flat" and args.hidden == 0:
        raise ConfigurationError("--hidden 0: the flat encoder needs a hidden layer, use "
                                 "--hidden 1 or more (default 64)")


def _validate(args: argparse.Namespace) -> None:
    check_model_flags(args)
    if args.data is not None:
        from rpm.experiments.pendulum.fitting import GENERATION_FLAGS, load_data

        given = [flag for flag in GENERATION_FLAGS if flag in getattr(args, GIVEN_FLAGS, ())]
        if given:
            raise ConfigurationError(
                f"{', '.join('--' + flag.replace('_', '-') for flag in given)} describe(s) the "
                f"generated videos, but --data {args.data} gives them: drop it")
        try:
            data = load_data(args.data, args.window, args.latent_dim)
        except ValueError as err:
            raise ConfigurationError(f"--data {args.data}: {err}") from None
        check_window_batch_size(args.batch_size, data.num_train, data.observations.shape[1],
                                args.window)
        return
    if args.window > args.length:
        raise ConfigurationError(f"--window {args.window} is longer than the videos (--length "
                                 f"{args.length}): use --window {args.length} or less")
    if args.image_size < 8:
        raise ConfigurationError(f"--image-size {args.image_size} is too small to draw a "
                                 "pendulum: use 8 or more (default 28)")
    if args.sequences * args.length < args.latent_dim + 2:
        raise ConfigurationError("too few training frames for the affine R^2 fit: use more "
                                 "--sequences")
    check_window_batch_size(args.batch_size, args.sequences, args.length, args.window)


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    check_data_file(args, ARRAYS[0])  # before torch: a wrong file is refused at once
    with torch_threads(args.threads), open_run(args, may_change=("eval_every", "eval_drop_frames"),
                                               may_grow=("steps",), validate=_validate) as run:
        return _train_and_report(args, run, resolve_device(args.device))


def _train_and_report(args: argparse.Namespace, run, device) -> int:
    import numpy as np
    import torch

    from rpm.data.pendulum import generate_pendulum
    from rpm.experiments.common import derived_seed
    from rpm.experiments.figures import plot_training
    from rpm.experiments.lds.evaluate import decoded_states, heldout_r2
    from rpm.experiments.pendulum.fitting import check_arrays, load_data, train_and_score
    from rpm.experiments.pendulum.plots import plot_pendulum

    out = run.path
    if args.resume:
        check_models_resumable(out, [MODEL])
    distractor = None
    if args.data is not None:
        data = load_data(args.data, args.window, args.latent_dim)
        name, names = f"pendulum {args.data}", None
    else:
        videos = generate_pendulum(args.sequences + args.test_sequences, args.length,
                                   args.image_size, args.noise, args.distractors,
                                   seed=derived_seed(args.seed, "data"))
        distractor = videos.distractor
        held_out = np.arange(args.sequences + args.test_sequences) >= args.sequences
        data = check_arrays(videos.frames, videos.states, held_out, args.window, args.latent_dim)
        kind = {False: "none", True: "iid"}.get(args.distractors, args.distractors)  # old runs
        name = "pendulum" + {"none": "", "iid": " with distractors",
                             "moving": " with moving distractors"}[kind]
        names = STATE_NAMES
    fit = train_and_score(data, args, out / MODEL, device, names, description=name)
    scores, untrained, inference = fit.scores, fit.untrained, fit.inference
    num_train = data.num_train
    shown = data.observations[num_train if scores is not None else 0].cpu()  # (T, C, H, W)
    value_range = (0.0, 1.0) if args.data is None else None
    if scores is None:
        skipped = f"no states in {args.data}"
        scores = dict.fromkeys(("r2", "r2_per_coordinate", "means_r2", "knn_r2",
                                "knn_r2_per_coordinate", "forecast_error", "var_forecast_error",
                                "forecast_baseline"))
        plot_pendulum(out / "pendulum.png", shown, None, inference.smoothed[0], None,
                      value_range=value_range)
    else:
        skipped = None
        decoded = decoded_states(inference.smoothed, data.states, num_train)[num_train]  # (T, K)
        plot_pendulum(out / "pendulum.png", shown, data.states[num_train], decoded, scores["r2"],
                      names=names, value_range=value_range)
    plot_training(out / "training.png", {name: fit.history},
                  baselines=None if untrained is None else {name: untrained["r2"]},
                  baseline_label="untrained", loss_label="negative ELBO / frame")
    if distractor is not None and skipped is None:
        per_coordinate = heldout_r2(distractor.states, inference.smoothed.cpu(), num_train)
        scores["distractor_r2"] = per_coordinate.mean().item()
        scores["distractor_r2_per_coordinate"] = dict(zip(DISTRACTOR_NAMES,
                                                          per_coordinate.tolist(), strict=True))
    learned = torch.linalg.eigvals(inference.transition_matrix)
    missing = scores.pop("missing_frames", None)
    evaluations = fit.history["evaluations"]
    results = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        **scores,
        **({"scores_skipped": skipped} if skipped else {}),
        "data": {"file": args.data, "sequences": len(data.index),
                 "held_out": len(data.index) - num_train,
                 "frames": data.observations.shape[1],
                 "frame_shape": list(data.observations.shape[2:])},
        "eigenvalues": [[v.real, v.imag] for v in learned.tolist()],
        "untrained": untrained,
        **({"missing_frames": missing} if missing else {}),
        "floors": {"r2": 0.90 if distractor is not None else 0.93},
        "steps": args.steps,
        "train_seconds": evaluations[-1]["wall_time"],
        "history": fit.history,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", results)
    if skipped:
        print(f"{name}: trained on {num_train} videos; scores skipped: {skipped} (give "
              "'states' (N, T, K) in the file to score the latents)")
    else:
        forecasts, var = scores["forecast_error"], scores["var_forecast_error"]
        print(f"{name}: held-out R^2 {scores['r2']:.4f} (means {scores['means_r2']:.4f}; "
              f"untrained {untrained['r2']:.4f}; 10-nearest-neighbour read-out "
              f"{scores['knn_r2']:.4f}); forecast RMSE 1/10 steps {forecasts['1']:.3f}/"
              f"{forecasts['10']:.3f}, VAR on the means {var['1']:.3f}/{var['10']:.3f}, the mean "
              f"{scores['forecast_baseline']:.3f}")
        if "distractor_r2" in scores:
            print(f"the distractor's state from the same latents: held-out R^2 "
                  f"{scores['distractor_r2']:.4f}")
    if missing:
        print(f"{missing['dropped_frames']} held-out frames dropped: one-step forecast RMSE "
              f"{missing['forecast_error']:.3f} (all frames seen "
              f"{missing['full_forecast_error']:.3f}), imputation "
              f"{missing['imputation_error']:.3f} (seen {missing['observed_error']:.3f})")
    print(f"results and figures in {out} ({run.elapsed():.0f} s)")
    return 0
