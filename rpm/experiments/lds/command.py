r"""``python -m rpm lds``: an RPM learns the linear dynamical systems of RP-GSSM (``linear_small``,
``linear_medium``, ``linear_large``; Hromadka et al., 2025) from generated sequences.

The data (:func:`rpm.data.lds.generate_lds`): a stationary chain :math:`s_{t+1} = A s_t + w_t`
with :math:`A = 0.95\,R`, R a random rotation, :math:`s_t \sim \mathcal{N}(0, I)`, observed as
:math:`x_t = C s_t + v_t` with noise 0.1; ``--size`` picks (H, P) = (3, 5), (5, 10) or
(10, 20). ``--sequences`` (200) sequences of ``--length`` (100) steps train; ``--test-sequences``
(100) more of the same system are held out. ``--data FILE.npz`` trains on your own sequences
instead (arrays ``observations`` (N, T, D), optional ``states`` (N, T, K), ``held_out`` (N,)
and ``transition_matrix`` (K, K): :mod:`rpm.experiments.lds.fitting`, whose :func:`fit
<rpm.experiments.lds.fitting.fit>` does the same on arrays); without states the scores are
skipped (``"r2": null`` and ``scores_skipped`` in ``results.json``).

The model (:mod:`rpm.experiments.lds.model`): a Gaussian encoder :math:`Q(z_t|x_t) =
\mathcal{N}(W x_t + c + \mathrm{MLP}(x_t), \sigma^2 I)` (D = H, ``--hidden`` tanh units, 0 for
an affine encoder; :math:`\sigma` = ``--recognition-noise``), a learned linear-Gaussian
state-space prior over the frames of a window (H = D, A started at 0.9 I) with the structured
guide, and the marginals :math:`Q_t` estimated by the Gaussian with the mean and covariance of
the batch's frames' recognition mixture (``--marginal gaussian``, ``rpm.RPM(...,
marginal="gaussian")``, ``rpm.marginals.MomentMatchedMarginal``: exact in population for an
affine encoder of these linear-Gaussian data; the pooled mixture of ``--marginal pooled`` caps the
information it rewards at about log M nats a frame, and at latent 5 and 10 the encoder's means
lose the state under it). Training
(:mod:`rpm.experiments.lds.train`): ``--steps`` Adam steps on ``--batch-size`` windows of
``--window`` frames, the negative ELBO per frame, the encoder at ``--lr`` (3e-3) and the prior
at ``--prior-lr`` (3e-2: at 1e-2 the chain of one medium system had not found its eigenvalues
after 600 steps, eigenvalue error 0.76, while the encoder's means held the state).

Results (:mod:`rpm.experiments.lds.evaluate`), in ``results.json``:

* ``r2``: the held-out linear :math:`R^2` of the true state from the smoothed latents
  :math:`E[s_t|\mu_{1:T}]` (affine map fitted on the training sequences' frames);
* ``eigenvalue_error``: the largest absolute difference between the learned A's eigenvalues and
  the true ones, matched by the Hungarian algorithm (invariant to the latent basis);
* ``means_r2`` (the same :math:`R^2` from the encoder's means), the eigenvalues, the one- and
  10-step forecast errors of the learned prior (``forecast_error``) and of a VAR(1) refitted on
  the means (``var_forecast_error``), the untrained model's scores, the history;

``dynamics.png`` shows the eigenvalues (learned and true) and a held-out sequence's true state
against its smoothed latents mapped to it, ``training.png`` the loss and the held-out
:math:`R^2` against the step. The model's folder ``rpm/`` holds its checkpoint, history and
model record (``rpm.load(DIR)`` returns the trained model, :mod:`rpm.experiments.trained`).
The measured numbers, times and machine are in ``benchmarks/README.md``.

References:
    M. Hromadka et al., "Recognition-parametrised Gaussian state-space models" (RP-GSSM), 2025.
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition
    parameterised model".
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

__all__ = ["ARRAYS", "SIZES", "add_parser", "run"]

#: The arrays of ``rpm lds --data``: required, then optional (checked before torch is
#: imported: :func:`~rpm.experiments.data_file.check_data_file`).
ARRAYS = (("observations",), ("states", "held_out", "transition_matrix"))

#: The choices of ``--size`` (the keys of :data:`rpm.data.lds.LDS_SIZES`, written out so that
#: the parser does not import torch).
SIZES = ("small", "medium", "large")
#: The name of the model's folder in the run folder.
MODEL = "rpm"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``lds`` sub-command."""
    parser = subparsers.add_parser(
        "lds",
        help="learn RP-GSSM's linear dynamical systems (linear_small/medium/large) with a "
        "state-space RPM",
        description=__doc__.split("\n\n")[0].replace("``", "").replace(r"\,", " "),
    )
    add_common_arguments(parser, default_out="runs/lds", default_checkpoint_every=200,
                         grow_flag="--steps")
    data = parser.add_argument_group(
        "data", "generated by default; --data FILE.npz trains on your own sequences: arrays "
        "'observations' (N, T, D), optional 'states' (N, T, K) to score against, 'held_out' "
        "(N,) boolean (the sequences scored and not trained on; default: the last N // 3 with "
        "states, none without) and 'transition_matrix' (K, K) for the eigenvalue error; "
        "without states the scores are skipped")
    add_data_file_argument(data, "generated sequences; --size, --sequences, --test-sequences "
                           "and --length then do not apply")
    data.add_argument("--size", choices=SIZES, default="small",
                      help="latent and observation dimensions: small (3, 5), medium (5, 10), "
                      "large (10, 20) (default: small)")
    data.add_argument("--sequences", type=positive_int, default=200,
                      help="training sequences (default: 200)")
    data.add_argument("--test-sequences", type=positive_int, default=100,
                      help="held-out sequences of the same system (default: 100)")
    data.add_argument("--length", type=at_least_two_frames, default=100,
                      help="steps per sequence (default: 100)")
    model = parser.add_argument_group("model")
    model.add_argument("--latent-dim", type=positive_int, default=None,
                       help="dimension D of the latents and of the prior's state (default: the "
                       "states' dimension, the --size's for generated data; with --data "
                       "without states the observations' dimension)")
    model.add_argument("--hidden", type=nonnegative_int, default=0,
                       help="tanh units of the encoder's MLP, added to its affine map; 0: an "
                       "affine encoder (default: 0)")
    add_state_space_model_arguments(model, marginal="gaussian")
    add_window_training_arguments(parser, steps=600, batch_size=64, window=25, lr=3e-3,
                                  prior_lr=3e-2, eval_every=100, held_out="sequences")
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    if args.data is not None:
        num_train, length = _check_data_flags(args)
    else:
        if args.window > args.length:
            raise ConfigurationError(f"--window {args.window} is longer than the sequences "
                                     f"(--length {args.length}): use --window {args.length} or "
                                     "less")
        if args.sequences * args.length < 20:
            raise ConfigurationError(f"--sequences {args.sequences} of --length {args.length} "
                                     "are too few frames for the affine R^2 fit: use more "
                                     "sequences")
        num_train, length = args.sequences, args.length
    check_window_batch_size(args.batch_size, num_train, length, args.window)


def _check_data_flags(args: argparse.Namespace) -> tuple[int, int]:
    """--data: no flag of the generated data, and the file's arrays pass their checks; returns
    the number of training sequences and their length."""
    from rpm.experiments.lds.fitting import GENERATION_FLAGS, load_data

    given = [flag for flag in GENERATION_FLAGS if flag in getattr(args, GIVEN_FLAGS, ())]
    if given:
        raise ConfigurationError(
            f"{', '.join('--' + flag.replace('_', '-') for flag in given)} describe(s) the "
            f"generated data, but --data {args.data} gives the sequences: drop it")
    try:
        data, _ = load_data(args.data, args.window)
    except ValueError as err:
        raise ConfigurationError(f"--data {args.data}: {err}") from None
    return data.num_train, data.observations.shape[1]


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    check_data_file(args, ARRAYS[0])  # before torch: a wrong file is refused at once
    with torch_threads(args.threads), open_run(args, may_change=("eval_every",),
                                               may_grow=("steps",), validate=_validate) as run:
        return _train_and_report(args, run, resolve_device(args.device))


def _train_and_report(args: argparse.Namespace, run, device) -> int:
    import numpy as np
    import torch

    from rpm.data.lds import LDS_SIZES, generate_lds
    from rpm.experiments.common import derived_seed
    from rpm.experiments.figures import plot_training
    from rpm.experiments.lds.evaluate import decoded_states
    from rpm.experiments.lds.fitting import check_arrays, load_data, train_and_score
    from rpm.experiments.lds.plots import plot_dynamics

    out = run.path
    if args.resume:
        check_models_resumable(out, [MODEL])
    if args.data is not None:
        data, transition = load_data(args.data, args.window)
        name = f"lds {args.data}"
    else:
        state_dim, obs_dim = LDS_SIZES[args.size]
        system = generate_lds(args.sequences + args.test_sequences, args.length, state_dim,
                              obs_dim, seed=derived_seed(args.seed, "data"))
        held_out = np.arange(args.sequences + args.test_sequences) >= args.sequences
        data, transition = check_arrays(system.observations, system.states, held_out,
                                        system.transition_matrix, args.window)
        name = f"lds {args.size}"
    fit = train_and_score(data, args, out / MODEL, device, transition, description=name)
    scores, untrained, inference = fit.scores, fit.untrained, fit.inference
    num_train = data.num_train
    learned = torch.linalg.eigvals(inference.transition_matrix)
    true = None if transition is None else torch.linalg.eigvals(transition)
    if scores is None:
        skipped = f"no states in {args.data}"
        scores = dict.fromkeys(("r2", "means_r2", "eigenvalue_error", "forecast_error",
                                "var_forecast_error"))
        plot_dynamics(out / "dynamics.png", learned, true, None, inference.smoothed[0], scores)
    else:
        skipped = None
        decoded = decoded_states(inference.smoothed, data.states, num_train)[num_train]  # (T, K)
        plot_dynamics(out / "dynamics.png", learned, true, data.states[num_train], decoded,
                      scores)
    plot_training(out / "training.png", {name: fit.history},
                  baselines=None if untrained is None else {name: untrained["r2"]},
                  baseline_label="untrained", loss_label="negative ELBO / frame")
    evaluations = fit.history["evaluations"]
    results = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        **scores,
        **({"scores_skipped": skipped} if skipped else {}),
        "data": {"file": args.data, "sequences": len(data.index), "held_out": len(data.index) - num_train,
                 "frames": data.observations.shape[1]},
        "eigenvalues": {"learned": [[v.real, v.imag] for v in learned.tolist()],
                        "true": None if true is None else [[v.real, v.imag] for v in true.tolist()]},
        "untrained": untrained,
        "floors": {"r2": 0.99, "eigenvalue_error": 0.02},
        "steps": args.steps,
        "train_seconds": evaluations[-1]["wall_time"],
        "history": fit.history,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", results)
    if skipped:
        print(f"{name}: trained on {num_train} sequences; scores skipped: {skipped} (give "
              "'states' (N, T, K) in the file to score the latents)")
    else:
        eigen = ("" if scores["eigenvalue_error"] is None
                 else f", eigenvalue error {scores['eigenvalue_error']:.4f}")
        forecasts, var = scores["forecast_error"], scores["var_forecast_error"]
        print(f"{name}: held-out R^2 {scores['r2']:.4f} (means {scores['means_r2']:.4f}; "
              f"untrained {untrained['r2']:.4f}){eigen}, forecast RMSE 1/10 steps "
              f"{forecasts['1']:.3f}/{forecasts['10']:.3f} (VAR on the means "
              f"{var['1']:.3f}/{var['10']:.3f})")
    print(f"results and figures in {out} ({run.elapsed():.0f} s)")
    return 0
