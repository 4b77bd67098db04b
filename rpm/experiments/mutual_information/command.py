r"""``python -m rpm mutual-information``: Poole et al.'s MI staircase, every variational bound of
:mod:`rpm.mi` and the RPM ELBO as estimators of a known mutual information.

Data (:class:`~rpm.mi.CorrelatedGaussian`): x, y in :math:`\mathbb{R}^{20}` (``--dim``) jointly
Gaussian with one correlation :math:`\rho` per dimension, chosen so that the MI steps through
``--mi`` (2, 4, 6, 8, 10 nats), ``--steps`` Adam steps (``--lr``) of ``--batch-size`` pairs per
stage; the cubic variant observes :math:`(W y)^3 / \sqrt{15}` (W orthogonal: the same MI,
unit variance; ``--cubic`` adds it). Estimators
(:mod:`~rpm.experiments.mutual_information.staircase`): InfoNCE, NWJ,
MINE (DV with the moving-average gradient), JS (f-GAN critic scored by NWJ), SMILE (``--tau``)
and I_alpha (``--alpha``), each with its own critic, for each critic family of ``--critics``
(separable: two MLPs and a dot product, ``--hidden`` units; joint: an MLP on every
concatenated pair, ``--joint-hidden`` units; ``--layers`` hidden layers); and the RPM ELBO
(:class:`~rpm.mi.RPMEstimator`: Gaussian encoders, a Gaussian prior over (z, z') with a
learned cross-covariance at ``--prior-lr``, the moment-matched Gaussian marginal), which has
no critic: one run per variant, reported under every critic.

Output folder (``--out``, the run-folder contract of :mod:`rpm.experiments.common`):
``config.json``; ``results.json`` with ``critics`` {critic: {``steps``: one entry per stage,
{``true_mi``, ``estimates`` {estimator: mean of the stage's last ``--average-last`` estimates},
``bias`` (estimate minus the true MI), ``variance`` (of those estimates)}}} for the Gaussian
staircase, the same under ``cubic``, the ``ceilings`` (log N, 1 + log((N-1)/alpha)), the
configuration, the environment and the provenance; one figure per critic, ``CRITIC.png``
(estimates against the step, the true MI as a staircase); the bias and variance table is
printed. There are no checkpoints (the run is minutes long): ``--resume`` is refused.

References:
    B. Poole, S. Ozair, A. van den Oord, A. A. Alemi and G. Tucker, "On variational bounds of
    mutual information", ICML 2019.
    J. Song and S. Ermon, "Understanding the limitations of variational mutual information
    estimators", ICLR 2020.
"""

from __future__ import annotations

import argparse
import json
import math

from rpm.experiments.common import (
    ConfigurationError,
    add_common_arguments,
    add_training_arguments,
    environment,
    momentum,
    open_run,
    positive_float,
    positive_int,
    probability,
    resolve_device,
    torch_threads,
    write_json_atomic,
)

__all__ = ["CRITICS", "ESTIMATORS", "add_parser", "run"]

#: The critic families (written out so the parser does not import torch).
CRITICS = ("separable", "joint")
#: The estimators of results.json, in order; the last is the RPM ELBO.
ESTIMATORS = ("infonce", "nwj", "mine", "js", "smile", "interpolated", "rpm_elbo")


def _mi_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected positive MI values in nats separated by commas (e.g. 2,4,6,8,10), got "
            f"{text!r}")
    return values


def _critic_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if not names or any(n not in CRITICS for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct critics from {', '.join(CRITICS)} separated by commas, got "
            f"{text!r}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``mutual-information`` sub-command."""
    parser = subparsers.add_parser(
        "mutual-information",
        help="Poole et al.'s MI staircase: every variational bound and the RPM ELBO against "
        "a known MI",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/mutual-information",
                         default_checkpoint_every=0)
    data = parser.add_argument_group("data")
    data.add_argument("--mi", type=_mi_list, default=[2.0, 4.0, 6.0, 8.0, 10.0], metavar="LIST",
                      help="true MI of each stage in nats (default: 2,4,6,8,10)")
    data.add_argument("--dim", type=positive_int, default=20,
                      help="dimension of x and y (default: 20)")
    data.add_argument("--cubic", action="store_true",
                      help="also run the cubic variant (y replaced by (W y)^3 / sqrt(15)); doubles the "
                      "time")
    model = parser.add_argument_group("estimators")
    model.add_argument("--critics", type=_critic_list, default=list(CRITICS), metavar="LIST",
                       help="critic families (default: separable,joint)")
    model.add_argument("--hidden", type=positive_int, default=256,
                       help="hidden units of the separable critic's MLPs (default: 256)")
    model.add_argument("--joint-hidden", type=positive_int, default=64,
                       help="hidden units of the joint critic's MLP, evaluated on all N^2 pairs "
                       "(default: 64, which keeps the default run within 15 minutes on two "
                       "CPU cores)")
    model.add_argument("--layers", type=positive_int, default=1,
                       help="hidden layers of the critics' MLPs (default: 1)")
    model.add_argument("--embed-dim", type=positive_int, default=32,
                       help="output dimension of the separable critic's networks (default: 32)")
    model.add_argument("--tau", type=positive_float, default=5.0,
                       help="SMILE's clip (default: 5)")
    model.add_argument("--alpha", type=probability, default=0.01,
                       help="I_alpha's interpolation, in (0, 1] (default: 0.01)")
    model.add_argument("--momentum", type=momentum, default=0.99,
                       help="MINE's moving average (default: 0.99)")
    model.add_argument("--rpm-hidden", type=int, default=0,
                       help="tanh units of the RPM encoders' MLPs; 0: affine (default: 0)")
    train = add_training_arguments(
        parser, {"steps": 4000, "batch_size": 64, "lr": 5e-4, "prior_lr": 1e-3},
        descriptions={"steps": "Adam steps per stage", "batch_size": "pairs per batch N",
                      "lr": "Adam learning rate of the critics and the RPM encoders",
                      "prior_lr": "Adam learning rate of the RPM prior"})
    train.add_argument("--average-last", type=positive_int, default=1000,
                       help="the estimate of a stage is the mean of its last STEPS steps "
                       "(default: 1000)")
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    if args.resume:
        raise ConfigurationError("mutual-information keeps no checkpoints (the run takes "
                                 "minutes): start afresh with --overwrite")
    if args.average_last > args.steps:
        raise ConfigurationError(f"--average-last {args.average_last} exceeds --steps "
                                 f"{args.steps}: use at most --average-last {args.steps}")
    if args.batch_size <= args.dim:
        raise ConfigurationError(f"--batch-size {args.batch_size} must exceed --dim {args.dim} "
                                 "(the RPM's Gaussian marginal entropy needs N > D)")
    if args.alpha <= 0:
        raise ConfigurationError("--alpha must be > 0 (alpha = 0 is NWJ with a baseline)")
    if args.rpm_hidden < 0:
        raise ConfigurationError(f"--rpm-hidden must be >= 0, got {args.rpm_hidden}")


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    if args.resume:
        _validate(args)
    with torch_threads(args.threads), open_run(args, validate=_validate) as run:
        return _train_and_report(args, run)


def _summary(trace, mi: float, last: int) -> tuple[float, float]:
    tail = trace[-last:]
    return float(tail.mean()), float(tail.var())


def _staircase_results(traces: dict, mis, last: int) -> dict:
    """critic -> {"steps": [...]} from critic -> estimator -> (stages, steps) arrays."""
    out = {}
    for critic, by_estimator in traces.items():
        steps = []
        for stage, mi in enumerate(mis):
            entry = {"true_mi": mi, "estimates": {}, "bias": {}, "variance": {}}
            for name in ESTIMATORS:
                mean, var = _summary(by_estimator[name][stage], mi, last)
                entry["estimates"][name] = mean
                entry["bias"][name] = mean - mi
                entry["variance"][name] = var
            steps.append(entry)
        out[critic] = {"steps": steps}
    return out


def _table(title: str, results: dict) -> str:
    lines = [title, f"{'critic':<10} {'MI':>5} " + " ".join(f"{n:>17}" for n in ESTIMATORS),
             f"{'':<10} {'':>5} " + " ".join(f"{'bias':>8} {'var':>8}" for _ in ESTIMATORS)]
    for critic, entry in results.items():
        for step in entry["steps"]:
            lines.append(f"{critic:<10} {step['true_mi']:>5g} " + " ".join(
                f"{step['bias'][n]:>+8.2f} {step['variance'][n]:>8.3f}" for n in ESTIMATORS))
    return "\n".join(lines)


def _train_and_report(args: argparse.Namespace, run) -> int:
    import numpy as np
    from tqdm.auto import tqdm

    from rpm.experiments.mutual_information.plots import plot_staircase
    from rpm.experiments.mutual_information.staircase import (
        CRITIC_ESTIMATORS,
        StaircaseConfig,
        train_critics,
        train_rpm,
    )

    out = run.path
    device = resolve_device(args.device)
    config = StaircaseConfig(
        mis=args.mi, steps=args.steps, batch_size=args.batch_size, dim=args.dim, lr=args.lr,
        prior_lr=args.prior_lr, hidden=args.hidden, joint_hidden=args.joint_hidden,
        layers=args.layers,
        embed_dim=args.embed_dim, tau=args.tau, alpha=args.alpha, momentum=args.momentum,
        rpm_hidden=args.rpm_hidden, seed=args.seed)
    variants = ["gaussian", "cubic"] if args.cubic else ["gaussian"]
    total = len(variants) * (len(args.critics) + 1) * len(args.mi) * args.steps
    bar = tqdm(total=total, desc="mutual-information", disable=not args.progress,
               mininterval=1.0, smoothing=0.05)
    traces: dict = {v: {} for v in variants}   # variant -> critic -> estimator -> (S, T)
    seconds: dict = {v: {} for v in variants}
    try:
        for variant in variants:
            start = run.elapsed()
            rpm_trace = train_rpm(variant, config, tick=lambda: bar.update(), device=device)
            seconds[variant]["rpm_elbo"] = run.elapsed() - start
            for critic in args.critics:
                bar.set_postfix_str(f"{variant} {critic}")
                start = run.elapsed()
                values = train_critics(critic, variant, config, tick=lambda: bar.update(),
                                       device=device)
                seconds[variant][critic] = run.elapsed() - start
                traces[variant][critic] = {
                    **{name: values[..., k] for k, name in enumerate(CRITIC_ESTIMATORS)},
                    "rpm_elbo": rpm_trace}
    finally:
        bar.close()
    n = args.batch_size
    ceilings = {"infonce": math.log(n), "interpolated": 1 + math.log((n - 1) / args.alpha)}
    for critic in args.critics:
        plot_staircase(out / f"{critic}.png", critic,
                       {v: traces[v][critic] for v in variants}, args.mi, ceilings)
    gaussian = _staircase_results(traces["gaussian"], args.mi, args.average_last)
    results = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "critics": gaussian,
        "ceilings": ceilings,
        "max_estimates": {v: {c: {name: float(np.max(trace)) for name, trace in by.items()}
                              for c, by in traces[v].items()} for v in variants},
        "train_seconds": seconds,
        **run.provenance(),
    }
    if args.cubic:
        results["cubic"] = {"critics": _staircase_results(traces["cubic"], args.mi,
                                                          args.average_last)}
    write_json_atomic(out / "results.json", results)
    print(_table("Gaussian staircase: bias and variance of the last "
                 f"{args.average_last} estimates of each stage", gaussian))
    if args.cubic:
        print(_table("cubic staircase", results["cubic"]["critics"]))
    print(f"results and figures in {out} ({run.elapsed():.0f} s)")
    return 0
