r"""``python -m rpm identifiability``: does contrastive learning (the RPM ELBO with an implicit prior)
recover the latents of synthetic data? (Zimmermann et al., 2021; Rusak et al., 2024;
``docs/theory.md``, *Evaluation*.)

Latent pairs :math:`z \sim p(z)`, :math:`z' \sim p(z' \mid z)` (``--space``, ``--marginal``,
``--conditional``) are mixed by a random invertible leaky-ReLU MLP g into observations
:math:`x = g(z)`, :math:`x' = g(z')`. An MLP encoder h, projected onto ``--encoder-space``, is
the Delta recognition model :math:`Q(z|x) = \delta(z - h(x))` of an RPM with the implicit prior
of energy ``--energy`` (Eq. 21-22 of Aitchison & Ganev). Training minimises the negative ELBO
per pair, ``RPMELBO().differentiable_loss(model, guide, x, x2) / N`` (Eq. 15; InfoNCE minus
:math:`\log N`, Eq. 23-25), with Adam, a linear warm-up and a cosine decay of the learning rate.

Evaluation on fresh latents :math:`z \sim p(z)` never seen in training: the held-out affine
:math:`R^2` of :math:`z \approx A h(g(z)) + b` and the MCC (:mod:`rpm.metrics`), every
``--eval-every`` steps on the *validation* set (the progress display's ``val r2``,
``scores.png``),
and at the end on a separate *test* set (the summary table, each run's ``r2`` and ``mcc`` in
``results.json``). The baselines are the identity encoder :math:`h(x) = x` and the untrained
encoder, on the test set; a run that ends below either prints a warning.

Your own pairs: ``--data FILE.npz`` (arrays ``views`` (N, 2, ...), optional ``latents`` (N, K)
and ``held_out`` (N,)) trains on them instead, and scores against the latents when the file has
them (:mod:`rpm.experiments.identifiability.fitting`, whose :func:`fit
<rpm.experiments.identifiability.fitting.fit>` does the same on arrays); without latents the
scores are skipped (``"r2": null`` and ``scores_skipped`` in ``results.json``).

Output folder (``--out``, the run-folder contract of :mod:`rpm.experiments.common`):
``config.json``, ``results.json`` (the configuration and the environment; ``runs``, one entry
per energy with its test ``r2`` and ``mcc``, per-dimension scores, the baselines, the
trajectories, the learned energy parameters; the provenance: the command, its segments and
their wall time), ``scores.png`` (validation R^2 and MCC against the step, with the identity
map's), ``training.png`` (loss and validation R^2 against the step), and
one subfolder per energy with its ``checkpoint.pt`` and ``history.json``. With
``--compare-energies cosine,anisotropic`` every energy is trained on the same data (same g, same
minibatches, same encoder initialisation), and ``comparison.png`` shows the per-dimension
:math:`R^2` of each energy and the learned against the true concentrations :math:`\Lambda`
(AnInfoNCE).

More than one process: ``torchrun --nproc_per_node=K -m rpm identifiability ...`` (gloo on the
CPU, NCCL on GPUs, one GPU per process) trains on the same global minibatches of
``--batch-size`` pairs, each process encoding its slice of 1/K, with the marginals and the
InfoNCE normaliser over the whole batch (:func:`~rpm.experiments.identifiability.train.train_energy`)
; process 0 writes the run folder.

Speed: the pairs are sampled on the training device, ``--chunk-steps`` minibatches at once
from a generator seeded by the step (:class:`~rpm.experiments.identifiability.data.PairStream`:
one host synchronisation of the vMF rejection sampler per chunk, exact resumption without
sampler state); nothing in a training step reads a value back to the host (recognition and
Pyro input validation are off in the loop; the trainer reads the losses every 100 steps); the
evaluation is one forward pass of the held-out set and a 10-dimensional least-squares fit;
Adam is fused on CUDA, and ``--compile`` compiles the encoder. The defaults (n = 3 latents on
the sphere, vMF(1) pairs, 3000 steps of 256 pairs, width 128, one CPU thread) show the result
on a CPU: the encoder recovers the latents, well above the mixed observations themselves (the
identity baseline). The published setting, n = 10 (``--dim 10``), needs far more pairs
(``--dim 10 --batch-size 1024 --lr 2e-3 --steps 64000``), and AnInfoNCE (``--dim 10
--conditional anisotropic --compare-energies cosine,anisotropic --energy-lr 0.1``) more steps
than the defaults. The measured scores, steps and times of every setting are in
``benchmarks/README.md``.

References:
    R. S. Zimmermann, Y. Sharma, S. Schneider, M. Bethge and W. Brendel, "Contrastive learning
    inverts the data generating process", ICML 2021.
    E. Rusak, P. Reizinger, A. Juhos, O. Bringmann, R. S. Zimmermann and W. Brendel, "InfoNCE:
    identifying the gap between theory and practice", 2024.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
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
    read_run_config,
    resolve_device,
    torch_threads,
    write_json_atomic,
)
from rpm.experiments.data_file import add_data_file_argument, check_data_file

__all__ = ["ARRAYS", "CONDITIONALS", "ENCODER_SPACES", "ENERGIES", "MARGINALS", "SPACES",
           "add_parser", "run"]

#: The arrays of ``rpm identifiability --data``: required, then optional (checked before torch is
#: imported: :func:`~rpm.experiments.data_file.check_data_file`).
ARRAYS = (("views",), ("latents", "held_out"))

# The choices of the flags, written out so that the parser is built without importing torch
# (``python -m rpm --help`` stays fast); tests check them against the library's own tuples
# (rpm.data.synthetic, rpm.experiments.identifiability.encoder and .model).
SPACES = ("sphere", "box", "unbounded")
MARGINALS = ("uniform", "normal", "laplace")
CONDITIONALS = ("vmf", "normal", "laplace", "gennorm", "anisotropic")
ENERGIES = ("cosine", "anisotropic", "lp", "rbf", "bilinear")
ENCODER_SPACES = ("sphere", "box", "unbounded")
#: The energies with a temperature that --learn-temperature learns.
_TEMPERED = ("cosine", "lp", "rbf")


# --------------------------------------------------------------------------- command line
def _energy_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    unknown = [name for name in names if name not in ENERGIES]
    if unknown or len(set(names)) != len(names) or len(names) < 2:
        raise argparse.ArgumentTypeError(
            f"expected two or more distinct energies from {', '.join(ENERGIES)} separated by "
            f"commas (e.g. cosine,anisotropic), got {text!r}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``identifiability`` sub-command."""
    parser = subparsers.add_parser(
        "identifiability",
        help="recover the latents of synthetic data by contrastive learning (Zimmermann et al.)",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/identifiability",
                         default_checkpoint_every=1000, grow_flag="--steps")
    data = parser.add_argument_group(
        "data", "generated by default; --data FILE.npz trains on your own positive pairs: "
        "arrays 'views' (N, 2, ...), optional 'latents' (N, K), the true latents of each pair's "
        "first view, to score against, and 'held_out' (N,) boolean (the pairs scored and not "
        "trained on, both the validation and the test set; default: the last N // 5 with "
        "latents, none without); without latents the scores are skipped")
    add_data_file_argument(data, "generated pairs; --space, --marginal, --conditional, their "
                           "parameters and --eval-samples then do not apply")
    data.add_argument("--dim", type=positive_int, default=3,
                      help="number n of latents (ambient dimension on the sphere; default: 3; "
                      "the published setting is 10); with --data the encoder's output "
                      "dimension (default: the latents' K, else a view's size)")
    data.add_argument("--space", choices=SPACES, default="sphere",
                      help="latent space (default: sphere)")
    data.add_argument("--marginal", choices=MARGINALS, default="uniform",
                      help="marginal p(z) (default: uniform)")
    data.add_argument("--marginal-param", type=positive_float, default=None,
                      help="scale of a normal or laplace marginal (default: 1.0)")
    data.add_argument("--conditional", choices=CONDITIONALS, default="vmf",
                      help="positive-pair conditional p(z'|z) (default: vmf)")
    data.add_argument("--conditional-param", type=positive_float, default=None,
                      help="kappa of vmf (default: 1.0), or the scale of normal, laplace and "
                      "gennorm (default: 0.05)")
    data.add_argument("--gennorm-beta", type=positive_float, default=None,
                      help="shape of the gennorm conditional (default: 3)")
    data.add_argument("--concentrations", metavar="LIST", default=None,
                      help="precisions Lambda of the anisotropic conditional: 'a,b' (first half "
                      "a, second half b) or n values (default: 5,25)")
    model = parser.add_argument_group("model")
    model.add_argument("--energy", choices=ENERGIES, default=None,
                       help="energy f(z,z') of the implicit prior (default: cosine)")
    model.add_argument("--compare-energies", type=_energy_list, default=None, metavar="LIST",
                       help="train each of these energies on the same data (e.g. "
                       "cosine,anisotropic) and draw comparison.png; excludes --energy")
    model.add_argument("--p", type=positive_float, default=None,
                       help="exponent of the lp energy (default: 1)")
    model.add_argument("--tau", type=positive_float, default=1.0,
                       help="temperature: cosine kappa = 1/tau, lp tau, rbf 2 l^2 = tau, "
                       "initial anisotropic Lambda = I/tau and bilinear W = I/tau (default: 1)")
    model.add_argument("--learn-temperature", action="store_true",
                       help="learn kappa (cosine), tau (lp) or l (rbf) as well")
    model.add_argument("--encoder-space", choices=ENCODER_SPACES, default=None,
                       help="where the encoder's outputs live (default: the --space)")
    model.add_argument("--hidden", type=positive_int, default=128,
                       help="width of the encoder's hidden layers (default: 128)")
    model.add_argument("--depth", type=positive_int, default=3,
                       help="number of hidden layers of the encoder (default: 3)")
    train = add_training_arguments(
        parser, {"steps": 3000, "batch_size": 256, "lr": 1e-3, "warmup": 0.05, "eval_every": 250,
                 "eval_samples": 10000, "chunk_steps": 16}, contrastive=True,
        descriptions={"batch_size": "pairs per minibatch, >= 2; with torchrun the global batch, "
                      "split over the processes",
                      "eval_every": "evaluate the validation R^2 and MCC every STEPS steps; 0: "
                      "at the end only",
                      "eval_samples": "fresh samples of each held-out set, validation and test"})
    train.add_argument("--energy-lr", type=positive_float, default=0.03,
                       help="peak learning rate of the energy's parameters (kappa, tau, l, "
                       "Lambda, W), which start far from their optimum (default: 0.03)")
    train.add_argument("--compile", action="store_true",
                       help="compile the encoder with torch.compile")
    parser.set_defaults(func=run)


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fills the defaults that depend on other flags and rejects flags that do not apply."""
    if args.compare_energies is not None and args.energy is not None:
        raise ConfigurationError("--energy and --compare-energies exclude each other: give the "
                                 "energies to compare as --compare-energies cosine,anisotropic")
    energies = args.compare_energies or [args.energy or "cosine"]
    if args.p is not None and "lp" not in energies:
        raise ConfigurationError(f"--p is the exponent of the lp energy, but the energies are "
                                 f"{', '.join(energies)}; drop --p or use --energy lp")
    if args.concentrations is not None and args.conditional != "anisotropic":
        raise ConfigurationError(f"--concentrations apply to --conditional anisotropic only, got "
                                 f"--conditional {args.conditional}; drop --concentrations")
    if args.data is None and args.eval_samples < 2 * args.dim + 4:
        raise ConfigurationError(f"--eval-samples {args.eval_samples} is too few for the affine "
                                 f"R^2 fit of {args.dim} latents; use at least "
                                 f"{2 * args.dim + 4} (e.g. 10000)")
    tempered = [name for name in energies if name in _TEMPERED]
    if args.learn_temperature and not tempered:
        raise ConfigurationError(
            f"--learn-temperature learns kappa (cosine), tau (lp) or l (rbf), but the energies are "
            f"{', '.join(energies)}, which have no temperature to learn (anisotropic and bilinear "
            "learn their Lambda or W anyway): drop --learn-temperature")
    if "energy_lr" in getattr(args, GIVEN_FLAGS, ()) and all(
            name in _TEMPERED and not args.learn_temperature for name in energies):
        raise ConfigurationError(
            f"--energy-lr is the learning rate of the energy's parameters, but {', '.join(energies)}"
            " without --learn-temperature have none: drop --energy-lr")
    resolved = argparse.Namespace(**vars(args))
    resolved.energies = energies
    resolved.encoder_space = args.encoder_space or args.space
    resolved.p = 1.0 if args.p is None else args.p
    if args.conditional == "anisotropic" and args.concentrations is None:
        resolved.concentrations = "5,25"
    return resolved


def _process(args: argparse.Namespace, device):
    """The latent process of the flags; its ValueErrors become ConfigurationErrors."""
    from rpm.data.synthetic import LatentProcess

    try:
        return LatentProcess(
            dim=args.dim, space=args.space, marginal=args.marginal,
            marginal_param=args.marginal_param, conditional=args.conditional,
            conditional_param=args.conditional_param, gennorm_beta=args.gennorm_beta,
            concentrations=args.concentrations, device=device)
    except (TypeError, ValueError) as error:
        raise ConfigurationError(f"invalid data flags (--space/--marginal/--conditional and "
                                 f"their parameters): {error}") from None


def _table(runs: dict, progress: bool = False) -> str:
    lines = ["test set (the progress display showed the validation set):" if progress else
             "test set (the evaluations during training used the validation set):",
             f"{'energy':<12} {'R^2':>7} {'MCC':>7} {'identity R^2':>13} {'untrained R^2':>14} "
             f"{'time':>8}"]
    for name, result in runs.items():
        lines.append(f"{name:<12} {result['r2']:>7.4f} {result['mcc']:>7.4f} "
                     f"{result['baseline']['identity']['r2']:>13.4f} "
                     f"{result['baseline']['untrained']['r2']:>14.4f} "
                     f"{result['train_seconds']:>7.1f}s")
    return "\n".join(lines)


def _warnings(runs: dict) -> list[str]:
    """One line for each energy whose test R^2 ends below a baseline."""
    lines = []
    for name, result in runs.items():
        below = [f"the {base} encoder's {result['baseline'][base]['r2']:.4f}"
                 for base in ("identity", "untrained")
                 if result["r2"] < result["baseline"][base]["r2"]]
        if below:
            lines.append(f"warning: {name}: the trained encoder's test R^2 {result['r2']:.4f} is "
                         f"below {' and '.join(below)}: training did not recover the latents "
                         "(train longer with --resume --steps N, or change --lr)")
    return lines


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    check_data_file(args, ARRAYS[0])  # before torch: a wrong file is refused at once
    with torch_threads(args.threads):
        return _run(args)


def _validate(args: argparse.Namespace) -> None:
    """Every check of the flags, before the run folder is created or written: the flag
    combinations (:func:`_resolve`) and the latent process they describe, built on the CPU."""
    from rpm import distributed

    resolved = _resolve(args)
    if args.data is None:
        _process(resolved, "cpu")
    else:
        _check_data(resolved)
    world = distributed.global_world_size()
    if args.batch_size % world:
        raise ConfigurationError(
            f"--batch-size {args.batch_size} is the global batch of the {world} processes: "
            f"make it a multiple of {world}")


def _check_data(args: argparse.Namespace) -> None:
    """--data: no flag of the generated pairs, and the file's arrays pass their checks."""
    from rpm.experiments.identifiability.fitting import GENERATION_FLAGS, data_dim, load_data

    given = [flag for flag in GENERATION_FLAGS if flag in getattr(args, GIVEN_FLAGS, ())]
    if given:
        raise ConfigurationError(
            f"{', '.join('--' + flag.replace('_', '-') for flag in given)} describe(s) the "
            f"generated pairs, but --data {args.data} gives them: drop it")
    try:
        load_data(args.data, args.batch_size, data_dim(args))
    except ValueError as err:
        raise ConfigurationError(f"--data {args.data}: {err}") from None


def _run(args: argparse.Namespace) -> int:
    from rpm import distributed

    device = resolve_device(args.device)
    with distributed.process_group(device), contextlib.ExitStack() as stack:
        run = None
        if distributed.is_main_process():
            run = stack.enter_context(open_run(args, may_change=("eval_every", "compile"),
                                               may_grow=("steps",), validate=_validate))
        distributed.barrier()  # the run folder and its config.json exist
        if run is None:
            out = Path(args.out)
            if args.resume:
                read_run_config(args)
        else:
            out = run.path
        return _train_and_report(_resolve(args), out, device, run)


def _train_and_report(args: argparse.Namespace, out: Path, device, run: Run | None) -> int:
    from rpm import distributed
    from rpm.data.synthetic import InvertibleMLP
    from rpm.experiments.common import derived_seed
    from rpm.experiments.figures import plot_training
    from rpm.experiments.identifiability.data import PairStream, held_out_set
    from rpm.experiments.identifiability.plots import (
        plot_comparison,
        plot_scores,
        plot_training_curves,
    )
    from rpm.experiments.identifiability.train import train_energy

    if args.resume and distributed.is_main_process():
        check_models_resumable(out, args.energies)  # a deleted checkpoint is not a fresh start
    skipped = truth = None
    if args.data is not None:
        from rpm.experiments.identifiability.fitting import data_dim, load_data, train_and_score

        fit = train_and_score(load_data(args.data, args.batch_size, data_dim(args)), args, out,
                              device)
        runs = fit.results
        skipped = fit.scores_skipped and f"no latents in {args.data}"
    else:
        process = _process(args, device)
        mixing = InvertibleMLP(args.dim, seed=derived_seed(args.seed, "mixing")).to(device)
        held_out = {part: held_out_set(process, mixing, args.eval_samples,
                                       derived_seed(args.seed, part))
                    for part in ("eval", "test")}
        stream = PairStream(process, mixing, args.batch_size, args.seed, args.chunk_steps)
        runs = {name: train_energy(name, args, stream, held_out, out / name, device,
                                   process=process)[0]
                for name in args.energies}
        truth = process.concentrations
    if not distributed.is_main_process():
        return 0
    if skipped:
        plot_training(out / "training.png", {name: {"losses": run["losses"], "evaluations": []}
                                             for name, run in runs.items()},
                      title="Identifiability: training curves")
    else:
        plot_scores(out / "scores.png", runs)
        plot_training_curves(out / "training.png", runs)
    if len(runs) > 1 and not skipped:
        plot_comparison(out / "comparison.png", runs, None if truth is None else truth.tolist())
    summary = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "held_out_sets": ({"validation": "the progress display, the trajectories and scores.png",
                           "test": "r2, mcc and the baselines of each run",
                           "samples_each": args.eval_samples} if args.data is None else
                          {"validation and test": f"the held-out pairs of {args.data}"}),
        **({"scores_skipped": skipped} if skipped else {}),
        "runs": runs,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", summary)
    if skipped:
        print(f"trained {', '.join(runs)} on {args.data}; scores skipped: {skipped} (give "
              "'latents' (N, K) in the file to score the encoder)")
    else:
        print(_table(runs, args.progress))
        for line in _warnings(runs):
            print(line, file=sys.stderr)
    print(f"results and figures in {out} ({run.elapsed():.0f} s"
          + (f"; {summary['wall_time']:.0f} s over {len(summary['segments'])} segments)"
             if len(summary["segments"]) > 1 else ")"))
    return 0
