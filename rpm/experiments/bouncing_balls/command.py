r"""``python -m rpm bouncing-balls``: which prior recovers the positions of bouncing balls (Section 5 and
Appendix D of Aitchison & Ganev; ``docs/theory.md``, *Bouncing balls*).

One continuous video (:func:`~rpm.data.bouncing_balls.generate_bouncing_balls`) shows three
balls, each in its own colour channel. An RPM with the encoder
:class:`~rpm.experiments.bouncing_balls.encoders.BallEncoder` (two batch-normalised convolutions and the soft
centre of mass of 3 feature maps: 6 numbers) is trained on the pairs of consecutive frames of
the first ``--frames - --test-frames`` frames, the other pairs of the minibatch serving as
negatives through the minibatch-mixture marginal. The loss is the negative RPM ELBO per pair
(Eq. 15), ``RPMELBO().differentiable_loss(model, guide, x_t, x_{t+1}) / N``, minimised with Adam
(default) or SGD. The priors compared (``--prior``):

===========  ================================================================================
rbf          implicit prior, :math:`f(z,z') = -\lVert z-z'\rVert^2 / (2l^2)`, l learned (Eq. 27)
bilinear     implicit prior, :math:`f(z,z') = z^\top W z'`, W learned from I: CPC's plain InfoNCE
             critic (Eq. 8)
cosine       implicit prior, :math:`f(z,z') = \kappa \hat z^\top \hat z'`, :math:`\kappa` learned
             from 10 (SimCLR / vMF-InfoNCE)
dynamics     explicit prior :class:`~rpm.experiments.bouncing_balls.circular_step.BallDynamicsPrior`:
             each ball moves by a learned step length in a uniformly random direction (the
             velocity, invisible in a pair of frames, marginalised out), with a recognition
             model :math:`\mathcal{N}(\mu(x), \epsilon^2 I)`, :math:`\epsilon` = ``--noise-scale``
             (Appendix B)
state-space  a prior over windows of ``--window`` frames (:class:`~rpm.RPM`): a learned
             linear-Gaussian state space of positions and velocities, stationary and
             scale-pinned by default (``--state-space-prior``), started at a damped constant
             velocity, with its structured guide (``--state-space-guide``), trained until it
             converges (at most ``--state-space-steps``);
             :mod:`rpm.experiments.bouncing_balls.state_space` describes it and its extra scores
             (``velocity_r2``, ``forecast_error_px``, ``baseline_forecast_error_px``)
===========  ================================================================================

Evaluation (Section 5): the trained encoder (evaluation mode) maps every frame to its 6
numbers :math:`\hat z_t`; a least-squares affine decoder :math:`c_t \approx A \hat z_t + b` to
the 6 true coordinates is fitted on the training frames and scored on the held-out last
``--test-frames`` frames by :math:`R^2` (mean over the 6 coordinates) and by the mean distance
in pixels between decoded and true centres. The same numbers for the untrained encoder are the
baseline.

Defaults: 32 x 32 frames, ball diameter 5 px, 16 hidden channels, 5 x 5 kernels, batch 128
(the sizes of ``benchmarks/bouncing_balls_prototype.py``), 700 training and 200 held-out
frames, and Adam at 1e-2 for 30 epochs (150 steps), which trains the RBF prior about as far as
the prototype's 60 epochs at 3e-3 in fewer steps (``benchmarks/README.md``). The dynamics
prior's recognition noise is 0.3 px. Training
runs on one CPU thread (``--threads``): on a busy 2-core machine two threads spend most of
their time waiting for each other, and the results do not depend on the thread count.

What the defaults give: the bilinear critic of plain InfoNCE does not learn the positions
(Fig. 1BC of the paper), the RBF prior and the explicit dynamics prior do, and the state-space
prior over windows of 8 frames (recognition noise 0.15 px, its emission pinned, its transition
learned at a halving rate) recovers the positions, reads the velocities from its smoothed states
and forecasts one step ahead at 0.68-0.72 of the last position's error, and these hold from 150
to 1500 steps of training (three seeds); its run stops when the training loss has stopped
moving, after a few hundred steps (``benchmarks/README.md``, pinned emission). The summary
table reports the bilinear critic's failure as the expected result it is
(``EXPECTED_FAILURES``), not as a warning. The measured scores over seeds, and the run
times, are in ``benchmarks/README.md``.

Output folder (``--out``, default ``runs/bouncing-balls``; the run-folder contract of
:mod:`rpm.experiments.common`): ``config.json``, ``results.json`` (with the environment),
``comparison.png``, ``trajectories.png``, ``feature_maps.png``, ``training.png`` (loss and
held-out R^2 against the step), ``forecast.png`` (the state-space prior's one-step forecasts
against the true paths), and one subfolder per prior with
its checkpoint and training history; ``--resume --out DIR`` (no other flag needed) skips the
priors that finished and continues the one that did not, and ``--epochs`` may grow to train
further. The progress bar and the summary table both score the held-out last frames.
``torchrun --nproc_per_node=K -m rpm bouncing-balls ...`` splits every minibatch over K
processes (``_train_prior``). The figure of the README is regenerated by::

    python -m rpm bouncing-balls --out runs/bouncing-balls --overwrite
    cp runs/bouncing-balls/comparison.png docs/bouncing_balls.png

References:
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition
    parameterised model", Section 5, Appendix B and D, Fig. 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

from rpm.experiments.common import (
    GIVEN_FLAGS,
    ConfigurationError,
    Run,
    add_common_arguments,
    add_training_arguments,
    at_least_two_frames,
    check_batch_size,
    check_models_resumable,
    derived_seed,
    environment,
    fraction_of_frames,
    momentum,
    nonnegative_float,
    open_run,
    positive_float,
    positive_int,
    read_run_config,
    resolve_device,
    seed_everything,
    torch_threads,
    write_json_atomic,
)

__all__ = ["MODEL_FLAGS", "PRIORS", "add_parser", "build_model", "converged", "epoch_permutation",
           "model_arguments", "model_from_arguments", "prior_parameters", "run"]

#: The priors of ``--prior``, in the order ``--prior all`` runs them.
PRIORS = ("rbf", "bilinear", "cosine", "dynamics", "state-space")
#: Recognition noise of the state-space prior (the default of ``--state-space-noise``; the
#: reasons in :mod:`rpm.experiments.bouncing_balls.state_space`).
STATE_SPACE_NOISE = 0.15
#: Frames per training window of the state-space prior (the default of ``--window``; the
#: reasons in :mod:`rpm.experiments.bouncing_balls.state_space`).
WINDOW = 8
#: Emission of the stationary state-space prior (``--state-space-emission``): C and R learned
#: or pinned at their start.
STATE_SPACE_EMISSION = "pinned"
#: Emission noise of the stationary state-space prior (``--state-space-emission-noise``, the
#: standard deviation of R in pixels).
STATE_SPACE_EMISSION_NOISE = 0.05
#: Learning rate of the state-space prior's parameters (``--prior-lr``).
PRIOR_LR = 3e-4
#: Half-life in steps of the state-space prior's learning rate (``--prior-lr-halflife``; 0:
#: constant).
PRIOR_LR_HALFLIFE = 100.0
#: Most training steps of the state-space prior (``--state-space-steps``).
STATE_SPACE_STEPS = 1500
#: The convergence rule of the state-space prior (``--stop-tolerance``, ``--stop-window``;
#: :func:`converged`): the mean training loss over the last STOP_WINDOW steps moved by less
#: than STOP_TOLERANCE nats per frame from the STOP_WINDOW steps before.
STOP_TOLERANCE = 0.01
STOP_WINDOW = 100
NUM_BALLS = 3
#: Number of held-out frames shown in the feature-map figure.
_SHOWN_FRAMES = 4


# --------------------------------------------------------------------------- command line

def _is_state_space(model) -> bool:
    """Whether ``model`` is the ``state-space`` prior's RPM (a linear-Gaussian prior over the
    frames of a window) rather than a pair prior's."""
    from rpm.priors import LinearGaussianPrior

    return isinstance(model.prior, LinearGaussianPrior)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``bouncing-balls`` sub-command."""
    parser = subparsers.add_parser(
        "bouncing-balls",
        help="RBF vs bilinear vs cosine vs dynamics vs state-space priors on the bouncing-balls "
        "video",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/bouncing-balls", default_checkpoint_every=100,
                         grow_flag="--epochs")
    group = parser.add_argument_group("experiment")
    group.add_argument("--prior", choices=(*PRIORS, "all"), default="all",
                       help="the prior to train, or all of them (default: all)")
    group.add_argument("--frames", type=positive_int, default=900,
                       help="length of the video (default: 900)")
    group.add_argument("--test-frames", type=positive_int, default=200,
                       help="last frames held out to score the decoder (default: 200)")
    group.add_argument("--image-size", type=positive_int, default=32,
                       help="side of the frames in pixels (default: 32)")
    group.add_argument("--ball-diameter", type=positive_float, default=5.0,
                       help="ball diameter and step per frame in pixels (default: 5)")
    group.add_argument("--hidden-channels", type=positive_int, default=16,
                       help="channels of the encoder's hidden layer (default: 16)")
    group.add_argument("--noise-scale", type=positive_float, default=0.3,
                       help="recognition noise eps (pixels) of the dynamics prior (default: 0.3)")
    group.add_argument("--state-space-noise", type=positive_float, default=STATE_SPACE_NOISE,
                       help="recognition noise of the state-space prior, also the start of its "
                       f"observation noise R and position noise (default: {STATE_SPACE_NOISE})")
    group.add_argument("--window", type=at_least_two_frames, default=WINDOW,
                       help=f"frames per training window of the state-space prior, >= 2 "
                       f"(default: {WINDOW})")
    group.add_argument("--state-space-guide", choices=("structured", "recognition"),
                       default="structured",
                       help="guide of the state-space prior: the structured posterior (Kalman "
                       "smoother of the recognition factors) or the recognition models "
                       "(default: structured)")
    group.add_argument("--state-space-prior", choices=("stationary", "free"),
                       default="stationary",
                       help="the state-space prior: stationary and scale-pinned (s_t ~ N(0, I), "
                       "Q = I - A A^T) or the free chain of the first version (default: "
                       "stationary)")
    group.add_argument("--state-space-emission", choices=("learned", "pinned"),
                       default=STATE_SPACE_EMISSION,
                       help="emission of the stationary state-space prior: C and R learned at "
                       "--prior-lr, or pinned at their start (C the whitened pixel read-out, R "
                       "at --state-space-emission-noise; buffers), so that only the transition "
                       f"and the offset b are learned (default: {STATE_SPACE_EMISSION})")
    group.add_argument("--state-space-emission-noise", type=positive_float,
                       default=STATE_SPACE_EMISSION_NOISE,
                       help="standard deviation (pixels) of the stationary state-space prior's "
                       "emission noise R at the start (its value throughout with "
                       f"--state-space-emission pinned) (default: {STATE_SPACE_EMISSION_NOISE})")
    group.add_argument("--state-space-objective", choices=("rpm", "rp-gssm"), default="rpm",
                       help="objective of the stationary state-space prior: the RPM ELBO with "
                       "the structured guide, or RP-GSSM's (each frame's own marginal "
                       "likelihood of the factors subtracted, rpm.experiments.bouncing_balls.rp_gssm) "
                       "(default: rpm)")
    group.add_argument("--state-space-steps", type=positive_int, default=STATE_SPACE_STEPS,
                       help="most training steps of the state-space prior (its run stops earlier "
                       "when converged, --stop-tolerance); on --resume it may grow (default: "
                       f"{STATE_SPACE_STEPS})")
    group.add_argument("--stop-tolerance", type=nonnegative_float, default=STOP_TOLERANCE,
                       help="the state-space prior's run stops when its mean training loss (nats "
                       "per frame) over the last --stop-window steps has moved by less than this "
                       f"from the --stop-window steps before; 0: never (default: {STOP_TOLERANCE})")
    group.add_argument("--stop-window", type=positive_int, default=STOP_WINDOW,
                       help="steps over which the convergence rule averages the training loss "
                       f"(default: {STOP_WINDOW})")
    group.add_argument("--prior-lr-halflife", type=nonnegative_float, default=PRIOR_LR_HALFLIFE,
                       help="the state-space prior's learning rate halves every this many steps "
                       "(--prior-lr * 0.5 ** (step / HALFLIFE); the encoder's stays at --lr); 0: "
                       f"constant (default: {PRIOR_LR_HALFLIFE:g})")
    group.add_argument("--learn-recognition-noise", action="store_true",
                       help="learn the state-space prior's recognition noise instead of "
                       "fixing it at --state-space-noise")
    group.add_argument("--drop-frames", type=fraction_of_frames, default=0.0,
                       help="train the state-space prior with each frame of a window dropped "
                       "with this probability (a mask over frames: the ELBO of the observed "
                       "ones; default: 0)")
    group.add_argument("--eval-drop-frames", type=fraction_of_frames, default=0.25,
                       help="after training, score the state-space prior's forecasts and "
                       "imputations with this fraction of the held-out frames dropped "
                       "(results.json 'missing_frames'; 0: skip; default: 0.25)")
    train = add_training_arguments(
        parser, {"batch_size": 128, "lr": 1e-2, "prior_lr": PRIOR_LR, "eval_every": 50},
        contrastive=True,
        descriptions={"batch_size": "pairs per minibatch, >= 2; with torchrun the global batch, "
                      "split over the processes",
                      "lr": "learning rate of --optimizer (of the encoder alone under the "
                      "state-space prior, whose parameters take --prior-lr)",
                      "prior_lr": "learning rate of the state-space prior's parameters at the "
                      "start (--prior-lr-halflife)",
                      "eval_every": "evaluate the held-out R^2 every STEPS steps; 0: at the end "
                      "only"})
    train.add_argument("--epochs", type=positive_int, default=30,
                       help="passes over the training pairs; on --resume it may grow to extend a "
                       "run (default: 30)")
    train.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                       help="optimiser (default: adam)")
    train.add_argument("--momentum", type=momentum, default=0.9,
                       help="momentum of --optimizer sgd, in [0, 1) (default: 0.9)")
    parser.set_defaults(func=run)


def _check_arguments(args: argparse.Namespace) -> int:
    """Checks the flags that depend on each other; returns the number of training frames."""
    num_train = args.frames - args.test_frames
    minimum = 2 * NUM_BALLS + 2  # an affine decoder of 2K regressors needs 2K + 2 frames
    if num_train < minimum:
        raise ConfigurationError(
            f"--test-frames {args.test_frames} leaves {num_train} of the --frames {args.frames} "
            f"for training; the linear decoder needs at least {minimum} (e.g. --test-frames "
            f"{max(2, args.frames // 4)})"
        )
    if args.test_frames < 2:
        raise ConfigurationError(
            f"--test-frames {args.test_frames}: R^2 needs at least 2 held-out frames"
        )
    if getattr(args, "state_space_objective", "rpm") == "rp-gssm" and (
            getattr(args, "state_space_prior", "free") != "stationary"
            or args.state_space_guide != "structured"):
        raise ConfigurationError(
            "--state-space-objective rp-gssm folds the stationary prior's marginal into the "
            "recognition and uses the structured guide: use it with --state-space-prior "
            "stationary and --state-space-guide structured")
    given = getattr(args, GIVEN_FLAGS, None) or ()
    for flag in ("state_space_emission", "state_space_emission_noise"):
        if flag in given and getattr(args, "state_space_prior", "free") != "stationary":
            raise ConfigurationError(
                f"--{flag.replace('_', '-')} sets the stationary prior's emission (its chain "
                "has unit scale, the emission holds the latents' scale); the free prior starts "
                "its observation noise at --state-space-noise and learns it: use it with "
                "--state-space-prior stationary or drop it")
    if getattr(args, "state_space_objective", "rpm") == "rp-gssm" and getattr(
            args, "drop_frames", 0) > 0:
        raise ConfigurationError(
            "--state-space-objective rp-gssm has no masks over frames: drop --drop-frames or use "
            "--state-space-objective rpm")
    windows = _windows_per_batch(args)
    if args.prior in ("state-space", "all") and num_train - args.window + 1 < windows:
        raise ConfigurationError(
            f"the state-space prior trains on {windows} windows of --window {args.window} "
            f"frames per step, but the {num_train} training frames hold only "
            f"{max(0, num_train - args.window + 1)} windows; use a smaller --window or more "
            "--frames"
        )
    check_batch_size(args.batch_size, num_train - 1, "pairs",
                     what=f"of consecutive frames among the {num_train} training frames of "
                     f"--frames {args.frames}")
    if args.ball_diameter >= args.image_size / 2:
        raise ConfigurationError(
            f"--ball-diameter {args.ball_diameter} is too large for --image-size "
            f"{args.image_size}: three balls need room to move (use at most "
            f"{args.image_size / 4:g})"
        )
    return num_train


#: Flags that act on one prior only (or on one optimiser): written for another, they would do
#: nothing, so they are refused.
_ONLY_FOR = {
    "noise_scale": ("dynamics", "the recognition noise of the dynamics prior"),
    "state_space_noise": ("state-space", "the recognition noise of the state-space prior"),
    "window": ("state-space", "the training window of the state-space prior"),
    "state_space_guide": ("state-space", "the guide of the state-space prior"),
    "state_space_prior": ("state-space", "the kind of state-space prior"),
    "state_space_objective": ("state-space", "the objective of the state-space prior"),
    "state_space_emission": ("state-space", "the emission of the state-space prior"),
    "state_space_emission_noise": ("state-space", "the emission noise of the state-space prior"),
    "prior_lr": ("state-space", "the learning rate of the state-space prior's parameters"),
    "prior_lr_halflife": ("state-space", "the learning-rate schedule of the state-space prior"),
    "state_space_steps": ("state-space", "the training length of the state-space prior"),
    "stop_tolerance": ("state-space", "the convergence rule of the state-space prior"),
    "stop_window": ("state-space", "the convergence rule of the state-space prior"),
    "learn_recognition_noise": ("state-space", "the state-space prior's recognition noise"),
    "drop_frames": ("state-space", "the frames the state-space prior trains without"),
    "eval_drop_frames": ("state-space", "the state-space prior's evaluation with missing frames"),
}


def _check_flags_apply(args: argparse.Namespace) -> None:
    """Refuses a written flag that would do nothing with the chosen prior or optimiser."""
    given = getattr(args, GIVEN_FLAGS, None)
    if given is None:
        return
    if "momentum" in given and args.optimizer != "sgd":
        raise ConfigurationError(
            f"--momentum is the momentum of --optimizer sgd, but the optimiser is "
            f"{args.optimizer}: drop --momentum or add --optimizer sgd")
    if "epochs" in given and args.prior == "state-space":
        raise ConfigurationError(
            "--epochs sets the training length of the pair priors; the state-space prior trains "
            "for at most --state-space-steps (and stops when converged): drop --epochs")
    for key, (prior, what) in _ONLY_FOR.items():
        if key in given and args.prior not in (prior, "all"):
            flag = "--" + key.replace("_", "-")
            raise ConfigurationError(
                f"{flag} sets {what}, but --prior is {args.prior}: drop {flag} or use "
                f"--prior {prior} (or all)")


def _validate(args: argparse.Namespace) -> None:
    """Every check of the flags, before the run folder is created or written."""
    from rpm import distributed

    _check_flags_apply(args)
    _check_arguments(args)
    world = distributed.global_world_size()
    if args.batch_size % world:
        raise ConfigurationError(
            f"--batch-size {args.batch_size} is the global batch of the {world} processes: "
            f"make it a multiple of {world}")


def _windows_per_batch(args: argparse.Namespace) -> int:
    """Windows per step of the state-space prior: about --batch-size frames, at least 2."""
    return max(2, args.batch_size // args.window)


# --------------------------------------------------------------------------- model
#: The flags the models are built from (:func:`model_arguments`); the last three are absent
#: from the configurations of runs older than them.
MODEL_FLAGS = ("hidden_channels", "image_size", "ball_diameter", "noise_scale",
               "state_space_noise", "state_space_guide", "learn_recognition_noise",
               "state_space_prior", "state_space_emission", "state_space_emission_noise")


def model_arguments(name: str, args: argparse.Namespace, in_channels: int) -> dict:
    """The model record of prior ``name`` (:mod:`rpm.experiments.trained`): ``prior``,
    ``in_channels`` and ``flags``, the values of :data:`MODEL_FLAGS` in ``args``, from which
    :func:`model_from_arguments` builds the model (the run builds it from them too, so that
    every flag the model reads is recorded)."""
    return {"prior": name, "in_channels": int(in_channels),
            "flags": {flag: getattr(args, flag) for flag in MODEL_FLAGS if hasattr(args, flag)}}


def build_model(name: str, args: argparse.Namespace, in_channels: int):
    """The RPM of prior ``name`` with a fresh :class:`~rpm.experiments.bouncing_balls.encoders.BallEncoder`
    (6 outputs, pixel units); for ``"state-space"`` the :class:`~rpm.RPM` of
    :func:`~rpm.experiments.bouncing_balls.state_space.build_state_space_model`:
    :func:`model_from_arguments` of :func:`model_arguments`.

    :param str name: one of :data:`PRIORS`.
    :param argparse.Namespace args: the parsed flags (those of :data:`MODEL_FLAGS`).
    :param int in_channels: colour channels of the frames.
    :rtype: rpm.RPM
    """
    return model_from_arguments(model_arguments(name, args, in_channels))


def model_from_arguments(arguments: dict):
    """The untrained model of a model record of ``rpm bouncing-balls`` (:func:`model_arguments`).

    :param dict arguments: ``prior`` (one of :data:`PRIORS`), ``in_channels``, ``flags``.
    :rtype: rpm.RPM
    """
    import rpm
    from rpm.experiments.bouncing_balls.circular_step import BallDynamicsPrior
    from rpm.experiments.bouncing_balls.encoders import BallEncoder
    from rpm.priors import BilinearEnergy, CosineEnergy, ImplicitPrior, RBFEnergy

    name, in_channels = arguments["prior"], arguments["in_channels"]
    args = argparse.Namespace(**arguments["flags"])
    if name == "state-space":
        from rpm.experiments.bouncing_balls.state_space import build_state_space_model

        kind = getattr(args, "state_space_prior", "free")  # configs older than the flags: free
        emission = getattr(args, "state_space_emission", "learned") if kind == "stationary" else "learned"
        return build_state_space_model(args, in_channels, NUM_BALLS,
                                       guide=args.state_space_guide,
                                       learn_noise=args.learn_recognition_noise,
                                       kind=kind, emission=emission)
    encoder = BallEncoder(in_channels=in_channels, hidden_channels=args.hidden_channels,
                          kernel_size=5, num_maps=NUM_BALLS)
    if name == "dynamics":
        prior = BallDynamicsPrior(NUM_BALLS, centre=args.image_size / 2,
                                  spread=args.image_size / 4, step_length=args.noise_scale,
                                  noise=args.noise_scale)
        return rpm.RPM(rpm.DeltaRecognition(encoder, noise_scale=args.noise_scale), prior)
    if name == "rbf":
        energy = RBFEnergy(lengthscale=1.0)
    elif name == "bilinear":
        energy = BilinearEnergy(2 * NUM_BALLS)
    elif name == "cosine":
        energy = CosineEnergy(kappa=10.0, learn_kappa=True)
    else:
        raise ValueError(f"unknown prior {name!r}; expected one of {PRIORS}")
    return rpm.RPM(rpm.DeltaRecognition(encoder), ImplicitPrior(energy))


def prior_parameters(name: str, model, args: argparse.Namespace | None = None) -> dict:
    """The learned parameters of the prior of the :class:`rpm.RPM` (or, for
    ``"state-space"``, :class:`~rpm.RPM`) ``model``, as JSON-ready numbers and lists."""
    import torch

    import rpm

    prior = model.prior
    with torch.no_grad():
        if name == "rbf":
            return {"lengthscale": prior.energy.lengthscale.item()}
        if name == "bilinear":
            return {"weight": prior.energy.weight.cpu().tolist()}
        if name == "cosine":
            return {"kappa": prior.energy.kappa.item()}
        if name == "state-space":
            return {
                "transition_matrix": prior.transition_matrix.cpu().tolist(),
                "transition_scale_tril": prior.transition_scale_tril.cpu().tolist(),
                "observation_matrix": prior.observation_matrix.cpu().tolist(),
                "observation_scale_tril": prior.observation_scale_tril.cpu().tolist(),
                "recognition_noise": model.recognition.net.log_scale.exp().cpu().tolist(),
                "guide": model.guide_kind,
                "window": None if args is None else args.window,
                "kind": "stationary" if isinstance(
                    prior, rpm.priors.StationaryStateSpacePrior) else "free",
                "transition_eigenvalues_abs": torch.linalg.eigvals(
                    prior.transition_matrix).abs().sort().values.cpu().tolist(),
            }
        return {
            "centre": prior.loc.cpu().tolist(),
            "spread": prior.spread.cpu().tolist(),
            "step_length": prior.step_length.cpu().tolist(),
            "step_noise": prior.noise.cpu().tolist(),
            "recognition_noise": model.recognition.noise_scale,
        }


# --------------------------------------------------------------------------- data
def epoch_permutation(seed: int, epoch: int, num_pairs: int):
    """The order of the training pairs in epoch ``epoch``: a permutation drawn from a
    generator seeded by ``derived_seed(seed, "epoch", epoch)`` alone
    (:func:`~rpm.experiments.common.derived_seed`), so that any step's minibatch can be
    recomputed after a restart (exact resumption needs no sampler state).

    :return: a permutation of ``range(num_pairs)``. Shape: (num_pairs,).
    :rtype: torch.Tensor
    """
    import torch

    generator = torch.Generator().manual_seed(derived_seed(seed, "epoch", epoch))
    return torch.randperm(num_pairs, generator=generator)


# --------------------------------------------------------------------------- training
def _optimizer(args: argparse.Namespace, model):
    import torch

    groups = [{"params": list(model.parameters())}]
    if _is_state_space(model):  # the state-space prior at --prior-lr
        groups = [{"params": list(model.recognition.parameters())},
                  {"params": list(model.prior.parameters()), "lr": args.prior_lr}]
    if args.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum)
    return torch.optim.Adam(groups, lr=args.lr)


class HalvingRate:
    r"""The factor :math:`2^{-s / h}` of a learning rate at step s (``torch.optim.lr_scheduler.
    LambdaLR``): it halves every h steps, so a parameter moves at most about
    :math:`\eta h / \ln 2` in all (Adam's steps are about the learning rate :math:`\eta`).

    :param float halflife: h, steps (> 0).
    """

    def __init__(self, halflife: float):
        if not halflife > 0:
            raise ValueError(f"halflife must be a positive number of steps, got {halflife!r}")
        self.halflife = float(halflife)

    def __call__(self, step: int) -> float:
        return 0.5 ** (step / self.halflife)


def _constant_rate(step: int) -> float:
    return 1.0


def _scheduler(args: argparse.Namespace, optimizer, model):
    """The state-space prior's schedule (:class:`HalvingRate` on its group, the encoder's rate
    constant), or None: the pair priors, or ``--prior-lr-halflife 0`` (and configs older than
    the flag)."""
    import torch

    halflife = getattr(args, "prior_lr_halflife", 0.0)
    if not _is_state_space(model) or not halflife:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, [_constant_rate, HalvingRate(halflife)])


def _train_prior(name: str, args: argparse.Namespace, frames, centres, num_train: int,
                 out: Path) -> dict:
    """Trains (or resumes, or reloads) one prior in ``out`` and evaluates it.

    Under ``torchrun`` every process takes the same global minibatch and encodes its own slice
    of it (:func:`rpm.distributed.local_slice`), with the marginals and the normaliser over the
    global batch (``RPMELBO(global_batch=True)``) and the gradients summed over the processes.
    The encoder's batch normalisation uses each process's slice (as ``DistributedDataParallel``
    without ``SyncBatchNorm``), so K processes follow one process closely but not exactly.
    """
    import torch

    import rpm
    from rpm import distributed
    from rpm.data.missing import drop_frames
    from rpm.experiments.bouncing_balls.evaluate import evaluate
    from rpm.experiments.bouncing_balls.missing_frames import evaluate_missing_frames
    from rpm.experiments.bouncing_balls.rp_gssm import rp_gssm_elbo
    from rpm.experiments.bouncing_balls.state_space import evaluate_dynamics, window_batch
    from rpm.experiments.trained import write_model_record
    from rpm.training.trainer import Trainer

    seed_everything(args.seed)  # each prior's run is the same whichever others run with it
    arguments = model_arguments(name, args, frames.shape[1])
    model = model_from_arguments(arguments).to(frames.device)
    if distributed.is_main_process():  # what rpm.load rebuilds the model from
        write_model_record(out, "bouncing-balls", arguments, frames.shape[1:])
    sequence = _is_state_space(model)
    rp_gssm = sequence and getattr(args, "state_space_objective", "rpm") == "rp-gssm"
    # the network of the 6 position numbers (of the state-space prior's Gaussian encoder: the means)
    encoder = model.recognition.net.encoder if sequence else model.recognition.net
    untrained = evaluate(encoder, frames, centres, num_train)
    num_pairs = num_train - 1
    steps_per_epoch = num_pairs // args.batch_size  # full batches only
    num_steps = args.state_space_steps if sequence else args.epochs * steps_per_epoch
    parallel = distributed.is_distributed()
    if sequence and parallel:
        raise ConfigurationError(
            "the state-space prior trains in one process (its marginals are over the local "
            "batch); run --prior state-space without torchrun")
    rows = distributed.local_slice(args.batch_size)  # all rows in one process
    elbo = rpm.RPMELBO(global_batch=parallel)
    # The state-space prior sees about as many frames per step in windows (--batch-size //
    # --window of them, at least 2), drawn from permutations of the window starts; it takes
    # as many steps as the pair priors.
    num_windows = num_train - args.window + 1
    windows_per_batch = _windows_per_batch(args)
    window_steps = num_windows // windows_per_batch
    permutations: dict[int, torch.Tensor] = {}

    def batch_indices(step: int, count: int, per_batch: int, per_epoch: int) -> torch.Tensor:
        epoch, position = divmod(step, per_epoch)
        if epoch not in permutations:
            permutations.clear()
            permutations[epoch] = epoch_permutation(args.seed, epoch, count).to(frames.device)
        return permutations[epoch][position * per_batch:(position + 1) * per_batch]

    def loss_fn(step: int) -> torch.Tensor:
        if sequence:
            starts = batch_indices(step, num_windows, windows_per_batch, window_steps)
            windows = window_batch(frames, starts, args.window)
            if args.drop_frames > 0:  # the same frames dropped at a step, whatever resumes
                mask = drop_frames((len(starts), args.window), args.drop_frames,
                                   torch.Generator().manual_seed(args.seed * 1_000_003 + step),
                                   device=frames.device)
                loss = elbo.differentiable_loss(model.model, model.guide, windows, mask=mask)
                return loss / mask.sum().clamp(min=1)  # negative ELBO per observed frame
            if rp_gssm:
                q = model.objective_inputs(windows).recognitions[0]
                loss = -rp_gssm_elbo(model.prior, q).sum()
            else:
                loss = elbo.differentiable_loss(model.model, model.guide, windows)
            return loss / (len(starts) * args.window)  # negative ELBO per frame
        index = batch_indices(step, num_pairs, args.batch_size, steps_per_epoch)[rows]
        loss = elbo.differentiable_loss(model.model, model.guide, frames[index],
                                        frames[index + 1])
        return loss / args.batch_size  # negative ELBO per pair

    def eval_fn(step: int) -> dict[str, float]:
        scores = evaluate(encoder, frames, centres, num_train)
        metrics = {"r2": scores.r2, "pixel_error": scores.pixel_error}
        if sequence:
            dynamics = evaluate_dynamics(model, frames, centres, num_train)
            metrics.update(velocity_r2=dynamics.velocity_r2,
                           forecast_error_px=dynamics.forecast_error_px,
                           smoothed_r2=dynamics.smoothed_r2)
        return metrics

    optimizer = _optimizer(args, model)
    trainer = Trainer(
        model, optimizer, loss_fn, out_dir=out, num_steps=num_steps,
        scheduler=_scheduler(args, optimizer, model),
        eval_fn=eval_fn, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
        log_every=min(10, num_steps), progress=args.progress, description=name,
        eval_label="held-out", distributed=parallel,
        stop_fn=_stop_rule(args) if sequence and args.eval_every else None,
    )
    resume = args.resume and trainer.has_checkpoint()  # a deleted checkpoint is an error
    if resume and distributed.is_main_process():
        step = trainer.resume_state()["step"]  # verified (or the previous one, with a message)
        if step == num_steps:
            print(f"{name}: finished earlier ({step}/{num_steps} steps), reloaded", flush=True)
        else:
            print(f"{name}: resuming at step {step}/{num_steps}", flush=True)
    history = trainer.fit(resume=resume)
    scores = evaluate(encoder, frames, centres, num_train)
    shown = frames[num_train:num_train + _SHOWN_FRAMES]
    with torch.no_grad():
        maps = encoder.feature_maps(shown).cpu()  # (F, K, H, W)
        com = encoder(shown).cpu()  # (F, 2K)
    extra = {}
    if sequence:
        dynamics = evaluate_dynamics(model, frames, centres, num_train)
        extra = {
            "velocity_r2": dynamics.velocity_r2,
            "forecast_error_px": dynamics.forecast_error_px,
            "baseline_forecast_error_px": dynamics.baseline_forecast_error_px,
            "smoothed_r2": dynamics.smoothed_r2,
            "smoothed_pixel_error": dynamics.smoothed_pixel_error,
            "_forecast": dynamics.forecast,
        }
        if args.eval_drop_frames > 0:
            missing = evaluate_missing_frames(model, frames, centres, num_train,
                                              args.eval_drop_frames, seed=args.seed)
            extra["missing_frames"] = {"fraction": args.eval_drop_frames,
                                       "trained_with_fraction": args.drop_frames,
                                       **missing._asdict()}
    return {
        "r2": scores.r2,
        "r2_per_coordinate": scores.r2_per_coordinate,
        "pixel_error": scores.pixel_error,
        "train_r2": scores.train_r2,
        "untrained_r2": untrained.r2,
        "untrained_pixel_error": untrained.pixel_error,
        "prior_parameters": prior_parameters(name, model, args),
        "steps": trainer.step,
        "stopped": history.get("stopped"),
        "final_loss": history["losses"][-1][1] if history["losses"] else math.nan,
        "train_seconds": history["evaluations"][-1]["wall_time"],
        "_decoded": scores.decoded,
        "_maps": maps,
        "_com": com,
        "_history": history,
        **extra,
    }


def converged(history: dict, window: int, tolerance: float) -> str | None:
    r"""The convergence rule of the state-space prior: at an evaluation at step s >= 2w (w =
    ``window``), with :math:`\bar\ell(a, b]` the mean training loss (negative ELBO per frame)
    over steps a < step <= b,

    .. math::

        \big|\bar\ell(s - 2w, s - w] - \bar\ell(s - w, s]\big| < \text{tolerance}

    stops the run: the loss has stopped moving (in either direction) at the scale of its
    noise. Decided from the trainer's history alone (the logged loss windows), so a resumed
    run stops where an uninterrupted one does.

    :param dict history: the :class:`~rpm.training.trainer.Trainer`'s history.
    :param int window: w, steps.
    :param float tolerance: nats per frame; 0 never stops.
    :return: the reason, or None to go on.
    """
    step = history["evaluations"][-1]["step"]
    if tolerance <= 0 or step < 2 * window:
        return None
    ends = [end for end, _ in history["losses"]]
    means = [mean for _, mean in history["losses"]]
    sums = {0: 0.0, 1: 0.0}
    counts = {0: 0, 1: 0}
    for start, end, mean in zip([0, *ends[:-1]], ends, means, strict=True):
        for half, (low, high) in enumerate(((step - 2 * window, step - window),
                                            (step - window, step))):
            overlap = max(0, min(end, high) - max(start, low))
            sums[half] += overlap * mean
            counts[half] += overlap
    if counts[0] < window or counts[1] < window:
        return None  # the history does not cover both windows (logged windows were longer)
    before, after = sums[0] / counts[0], sums[1] / counts[1]
    if abs(before - after) < tolerance:
        return (f"converged at step {step}: mean loss {after:.4f} over steps {step - window + 1}-"
                f"{step}, {before:.4f} over the {window} before (change below {tolerance})")
    return None


def _stop_rule(args: argparse.Namespace):
    def stop_fn(history: dict) -> str | None:
        return converged(history, args.stop_window, args.stop_tolerance)
    return stop_fn


#: Priors expected not to learn the positions, and why (reported as a result, not a warning).
EXPECTED_FAILURES = {
    "bilinear": "expected: plain InfoNCE's bilinear critic does not learn positions (Fig. 1BC)",
}


def _failed(result: dict) -> bool:
    return result["r2"] < result["untrained_r2"]


def _table(results: dict) -> str:
    lines = [f"{'prior':<11} {'R^2 held-out':>12} {'pixel error':>12} {'untrained R^2':>14} "
             f"{'train time':>11}"]
    for name, result in results.items():
        note = f"  {EXPECTED_FAILURES[name]}" if name in EXPECTED_FAILURES and _failed(result) else ""
        lines.append(
            f"{name:<11} {result['r2']:>12.3f} {result['pixel_error']:>9.2f} px "
            f"{result['untrained_r2']:>14.3f} {result['train_seconds']:>9.1f} s{note}"
        )
    return "\n".join(lines)


def _warnings(results: dict) -> list[str]:
    """One line for each prior whose held-out R^2 ends below the untrained encoder's, except
    the expected failures (``EXPECTED_FAILURES``), which the table reports."""
    return [f"warning: {name}: the trained encoder's held-out R^2 {result['r2']:.3f} is below "
            f"the untrained encoder's {result['untrained_r2']:.3f}: this prior did not learn the "
            "positions"
            for name, result in results.items()
            if _failed(result) and name not in EXPECTED_FAILURES]


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    with torch_threads(args.threads):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from rpm import distributed

    device = resolve_device(args.device)
    with distributed.process_group(device), contextlib.ExitStack() as stack:
        run = None
        if distributed.is_main_process():
            run = stack.enter_context(open_run(args, may_change=("eval_every",),
                                               may_grow=("epochs", "state_space_steps"),
                                               validate=_validate))
        distributed.barrier()  # the run folder and its config.json exist
        if run is None:
            out = Path(args.out)
            if args.resume:
                read_run_config(args)
        else:
            out = run.path
        return _train_and_report(args, _check_arguments(args), out, device, run)


def _train_and_report(args: argparse.Namespace, num_train: int, out: Path, device,
                      run: Run | None) -> int:
    from rpm import distributed
    from rpm.data.bouncing_balls import generate_bouncing_balls
    from rpm.experiments.bouncing_balls.plots import (
        plot_comparison,
        plot_feature_maps,
        plot_forecasts,
        plot_training_curves,
        plot_trajectories,
    )

    video = generate_bouncing_balls(num_frames=args.frames, image_size=args.image_size,
                                    ball_diameter=args.ball_diameter, num_balls=NUM_BALLS,
                                    seed=args.seed)
    frames = video.frames.to(device)  # (T, 3, S, S)
    centres = video.centres  # (T, 3, 2), CPU
    priors = PRIORS if args.prior == "all" else (args.prior,)
    if args.resume and distributed.is_main_process():
        check_models_resumable(out, priors)  # a deleted checkpoint is not a fresh start
    results = {name: _train_prior(name, args, frames, centres, num_train, out / name)
               for name in priors}
    if not distributed.is_main_process():
        return 0

    test_centres = centres[num_train:]
    plot_comparison(out / "comparison.png", results)
    plot_trajectories(out / "trajectories.png", test_centres,
                      {name: result["_decoded"] for name, result in results.items()})
    plot_feature_maps(
        out / "feature_maps.png", frames[num_train:num_train + _SHOWN_FRAMES].cpu(),
        {name: result["_maps"] for name, result in results.items()},
        {name: result["_com"] for name, result in results.items()},
        [f"frame {num_train + i}" for i in range(_SHOWN_FRAMES)],
    )
    plot_training_curves(out / "training.png",
                         {name: result["_history"] for name, result in results.items()},
                         {name: result["untrained_r2"] for name, result in results.items()})
    public = {name: {k: v for k, v in result.items() if not k.startswith("_")}
              for name, result in results.items()}
    write_json_atomic(out / "results.json", {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "train_frames": num_train,
        "priors": public,
        "expected_failures": {name: EXPECTED_FAILURES[name] for name in public
                              if name in EXPECTED_FAILURES and _failed(public[name])},
        **run.provenance(),
    })
    if "state-space" in public:
        result = public["state-space"]
        plot_forecasts(out / "forecast.png", test_centres, results["state-space"]["_forecast"],
                       error_px=result["forecast_error_px"],
                       baseline_px=result["baseline_forecast_error_px"])
        print(f"state-space: velocity R^2 {result['velocity_r2']:.3f}, one-step forecast "
              f"{result['forecast_error_px']:.2f} px (last position: "
              f"{result['baseline_forecast_error_px']:.2f} px)"
              + (f"; stopped: {result['stopped']['reason']}" if result.get("stopped") else ""))
    print(_table(public))
    for line in _warnings(public):
        print(line, file=sys.stderr)
    print(f"results, figures and checkpoints in {out} ({run.elapsed():.0f} s)")
    return 0
