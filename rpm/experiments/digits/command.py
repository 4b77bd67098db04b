r"""``python -m rpm digits``: self-supervised learning on real images, the 8x8 digits that scikit-learn
ships, evaluated by how few labels a classifier on the learned representation needs.

Data: :func:`rpm.data.digits.load_digits_split` (1797 images, nothing downloaded; a fixed
stratified split, 1347 training and 450 test images). Augmented views of every image of a
minibatch (:mod:`rpm.data.augment`: a small random affine map and pixel noise, no flips; two,
four, or two and four local crops) are the views; a small CNN with a projection head
(:mod:`rpm.experiments.digits.model`) is trained without labels by each method: the RPMs with
the cross-view InfoNCE prior (``infonce``), the pooled NT-Xent prior (``ntxent``), the RBF energy
(``rbf``), a Gaussian encoder (``gaussian``), the star and mixture-of-partners priors over J = 4
views (``star4``, ``mixture4``), the star prior over 2 global views and 4 local crops with the
multi-crop rule (``multicrop``), a queue of earlier latents (``queue``, MoCo's normaliser), and
NT-Xent written in plain torch (``torch_ntxent``, the same objective as ``ntxent``, from the
same initialisation on the same batches). The baselines are the raw pixels and the untrained
encoder. The default run trains ``DEFAULT_METHODS`` (within 6 minutes of one CPU core);
``--methods all`` trains every method (about 11 minutes; ``benchmarks/README.md``).

Evaluation (:mod:`rpm.evaluation`, batch normalisation in eval mode) of two representations:
the backbone's :math:`h` before the projection head (the usual protocol of SimCLR and its
successors) and the latent :math:`z` itself, the RPM's latent variable (the projection head's
output; the mean for the Gaussian encoder). Each is scored by a linear probe (standardised
logistic regression) and kNN (cosine, 5 neighbours, or as many as there are labels per class)
trained on 1, 5 and 10 labelled training images per class (``--draws`` random stratified draws,
the same images for every method; the mean is reported) and on all labels, on the test images.
With few labels :math:`z` is the better representation here (the contrastive objective
clusters it by class; :math:`h` keeps more of what the augmentations change), with all labels
:math:`h` is; both are reported, and the floors name which one meets them.

Seeds: ``--num-seeds K`` trains every method from the seeds ``--seed`` to ``--seed`` + K - 1 (the
initialisation, the batches, the label draws); ``methods`` then holds the mean over the seeds
(``_std`` and ``_draws`` over every seed and draw) and ``per_seed`` each seed's results.

More than one process: ``torchrun --nproc_per_node=K -m rpm digits ...`` (gloo on the CPU, NCCL
on GPUs) trains on the same global minibatches of ``--batch-size`` images, each process encoding
its slice of 1/K, with the normalisers over the whole batch
(:func:`~rpm.experiments.digits.train.train_method`; batch normalisation per process); process
0 scores and writes the run folder.

Output folder (``--out``, the run-folder contract of :mod:`rpm.experiments.common`):
``config.json``; ``results.json`` with, for each method and baseline under ``methods``,
``linear_probe`` and ``knn`` of :math:`h` keyed by labels per class (``"1"``, ``"5"``, ``"10"``,
``"all"``; test accuracy in [0, 1], the mean over draws), their ``_std`` and ``_draws``, the
same for :math:`z` under ``latent`` (not for the raw pixels), the Gaussian encoder's mean
standard deviation (``mean_scale``) and whether it issued :class:`rpm.ScaleFloorWarning`
(``scale_floor_warning``), the training losses (``losses``: :math:`-\mathcal{L}/N`;
``reported_losses``: the loss the progress lines show, named by ``loss_name``, e.g. NT-Xent,
:math:`-\mathcal{L}/N` + ``loss_offset``) and validation scores, ``train_seconds``, the
views (``[global, local]``); ``seeds``; under ``checks`` the gap between ``ntxent`` and
``torch_ntxent`` at every label count and the floors; the configuration, the
environment and the provenance. Figures: ``label_efficiency.png`` (accuracy against labels per
class) and ``training.png`` (loss and validation kNN accuracy against the step). One subfolder
per method with its ``checkpoint.pt`` and ``history.json`` (``seed{s}/`` above them with several
seeds); ``--resume`` continues (``--steps`` may grow).

Your own images: ``--data FILE.npz`` (arrays ``images`` (N, H, W) or (N, C, H, W), optional
``labels`` (N,) and ``held_out`` (N,)) trains on them instead and scores with the labels when the
file has them (:mod:`rpm.experiments.digits.fitting`, whose :func:`fit
<rpm.experiments.digits.fitting.fit>` does the same on arrays); without labels the scores are
skipped (``scores_skipped`` in ``results.json``). The floors of :data:`FLOORS` are the bundled
digits'.

The measured scores and times are in ``benchmarks/README.md``.

References:
    T. Chen, S. Kornblith, M. Norouzi and G. Hinton, "A simple framework for contrastive learning
    of visual representations", ICML 2020.
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition parameterised
    model".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rpm.experiments.common import (
    GIVEN_FLAGS,
    ConfigurationError,
    Run,
    add_common_arguments,
    add_training_arguments,
    check_batch_size,
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

__all__ = ["ARRAYS", "FLOORS", "METHODS", "add_parser", "run"]

#: The arrays of ``rpm digits --data``: required, then optional (checked before torch is
#: imported: :func:`~rpm.experiments.data_file.check_data_file`).
ARRAYS = (("images",), ("labels", "held_out"))

# Written out so that the parser is built without importing torch; a test checks them against
# rpm.experiments.digits.model.METHODS.
METHODS = ("infonce", "ntxent", "rbf", "gaussian", "star4", "mixture4", "multicrop", "queue", "torch_ntxent")
#: The methods of the default run (within the 6 minutes of a 2-core CPU); ``--methods all``
#: trains every one of :data:`METHODS`.
DEFAULT_METHODS = ("infonce", "ntxent", "gaussian", "star4", "torch_ntxent")
_COSINE = tuple(name for name in METHODS if name != "rbf")
#: Test accuracy the best RPM prior must reach with the defaults, by labels per class (the best
#: of its representations and classifiers, named in results.json's checks).
FLOORS = {"1": 0.85, "5": 0.95}
#: The evaluated representations: the backbone's h (the usual protocol) and the latent z.
REPRESENTATIONS = ("backbone", "latent")
#: Largest gap (accuracy points / 100) allowed between ntxent and torch_ntxent at any label count.
NTXENT_TOLERANCE = 0.01


def _method_list(text: str) -> list[str]:
    if text.strip() == "all":
        return list(METHODS)
    names = [part.strip() for part in text.split(",")]
    unknown = [name for name in names if name not in METHODS]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct methods from {', '.join(METHODS)} separated by commas (e.g. "
            f"ntxent,torch_ntxent), or all, got {text!r}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``digits`` sub-command."""
    parser = subparsers.add_parser(
        "digits",
        help="self-supervised learning on scikit-learn's 8x8 digits, scored by label efficiency",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/digits", default_checkpoint_every=500,
                         grow_flag="--steps")
    data = parser.add_argument_group(
        "data", "scikit-learn's digits by default; --data FILE.npz trains on your own images: "
        "arrays 'images' (N, H, W) or (N, C, H, W) (channels first, intensities in [0, 1]; "
        "uint8 images are divided by 255), optional 'labels' (N,) integer classes to score "
        "with and 'held_out' (N,) boolean (the test images, never trained on; default: a "
        "stratified quarter with labels, none without); without labels the scores are skipped")
    add_data_file_argument(data, "the bundled digits")
    model = parser.add_argument_group("model")
    model.add_argument("--methods", type=_method_list, default=list(DEFAULT_METHODS), metavar="LIST",
                       help=f"methods to train, separated by commas, from {','.join(METHODS)}; "
                       f"all: every one (default: {','.join(DEFAULT_METHODS)})")
    model.add_argument("--temperature", type=positive_float, default=1.0,
                       help="temperature tau of the cosine energy, kappa = 1/tau (default: 1)")
    model.add_argument("--width", type=positive_int, default=16,
                       help="channels of the CNN's first layer, then 2x and 4x (default: 16)")
    model.add_argument("--latent-dim", type=positive_int, default=64,
                       help="dimension of the projection head's output z (default: 64)")
    train = add_training_arguments(
        parser, {"steps": 800, "batch_size": 256, "lr": 2e-3, "warmup": 0.05, "eval_every": 100},
        contrastive=True,
        descriptions={"batch_size": "images per minibatch, two views each, >= 2, at most the "
                      "1347 training images",
                      "eval_every": "validation kNN accuracy every STEPS steps; 0: at the end "
                      "only"})
    train.add_argument("--draws", type=positive_int, default=5,
                       help="random draws of the labelled images per label count (default: 5)")
    train.add_argument("--num-seeds", type=positive_int, default=1,
                       help="train every method from the seeds SEED, SEED+1, ..., SEED+K-1 "
                       "(initialisation, batches, label draws) and report the mean (default: 1)")
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    """Every check of the flags, before the run folder is created or written."""
    from rpm import distributed

    world = distributed.global_world_size()
    if args.batch_size % world:
        raise ConfigurationError(f"--batch-size {args.batch_size} is the global batch of the {world} "
                                 f"processes: make it a multiple of {world}")
    if args.data is not None:
        from rpm.experiments.digits.fitting import load_data

        try:
            load_data(args.data, args.batch_size, args.methods)
        except ValueError as err:
            raise ConfigurationError(f"--data {args.data}: {err}") from None
    else:
        check_batch_size(args.batch_size, 1347, "images",
                         what="the training part of the fixed split of the 1797 digits")
    if "temperature" in getattr(args, GIVEN_FLAGS, ()) and not set(args.methods) & set(_COSINE):
        raise ConfigurationError(f"--temperature is the cosine energy's, but the methods are "
                                 f"{', '.join(args.methods)}: drop --temperature")


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    import contextlib

    check_data_file(args, ARRAYS[0])  # before torch: a wrong file is refused at once
    from rpm import distributed

    with torch_threads(args.threads):
        device = resolve_device(args.device)
        with distributed.process_group(device), contextlib.ExitStack() as stack:
            run = None
            if distributed.is_main_process():
                run = stack.enter_context(open_run(args, may_change=("eval_every",), may_grow=("steps",),
                                                   validate=_validate))
            distributed.barrier()  # the run folder and its config.json exist
            if run is None:
                if args.resume:
                    read_run_config(args)
                return _train_and_report(args, Path(args.out), device, None)
            return _train_and_report(args, run.path, device, run)


def _baselines(args: argparse.Namespace, data, device, seed: int) -> dict:
    from rpm.experiments.common import seed_everything
    from rpm.experiments.digits.model import DigitsEncoder
    from rpm.experiments.digits.train import score_encoder, score_features

    seed_everything(seed)  # the initialisation every method starts from
    untrained = DigitsEncoder(args.width, args.latent_dim).to(device)
    raw = score_features(data.train.images.flatten(1), data.train.labels, data.test.images.flatten(1),
                         data.test.labels, args.draws, seed)
    return {"raw_pixels": {"kind": "baseline", **raw},
            "untrained": {"kind": "baseline", **score_encoder(untrained, data, device, args.draws, seed)}}


def _seeds(args: argparse.Namespace) -> list[int]:
    return [args.seed + k for k in range(args.num_seeds)]


def _folder(out: Path, name: str, seed: int, seeds: list[int]) -> Path:
    """A method's folder: ``out/name`` for one seed, ``out/seed{s}/name`` for several."""
    return out / name if len(seeds) == 1 else out / f"seed{seed}" / name


def _mean_over_seeds(runs: list[dict]) -> dict:
    """One method's result over seeds: the scores (``linear_probe``, ``knn``, also under
    ``latent``) are the means over the seeds of the means over the draws, ``_std`` the standard
    deviation over every (seed, draw) score, ``_draws`` every draw; the rest is the first
    seed's (``train_seconds``: the sum)."""
    import statistics

    if len(runs) == 1:
        return runs[0]
    if "linear_probe" not in runs[0]:  # images without labels: nothing scored
        return {**runs[0], "train_seconds": sum(r["train_seconds"] for r in runs)}

    def merge(parts: list[dict]) -> dict:
        merged = dict(parts[0])
        for classifier in ("linear_probe", "knn"):
            keys = parts[0][classifier]
            merged[classifier] = {k: statistics.fmean(p[classifier][k] for p in parts) for k in keys}
            draws = {k: [d for p in parts for d in p[f"{classifier}_draws"][k]] for k in keys}
            merged[f"{classifier}_draws"] = draws
            merged[f"{classifier}_std"] = {k: statistics.pstdev(v) for k, v in draws.items()}
        return merged

    result = merge(runs)
    if "latent" in runs[0]:
        result["latent"] = merge([r["latent"] for r in runs])
    if "train_seconds" in runs[0]:
        result["train_seconds"] = sum(r["train_seconds"] for r in runs)
    if "mean_scale" in runs[0]:
        result["mean_scale"] = statistics.fmean(r["mean_scale"] for r in runs)
    return result


def _checks(methods: dict) -> dict:
    checks = {}
    if "ntxent" in methods and "torch_ntxent" in methods:
        a, b = methods["ntxent"], methods["torch_ntxent"]
        gaps = {f"{c}{'' if rep == 'backbone' else '_' + rep}": {
                    k: abs(_scores(a, rep)[c][k] - _scores(b, rep)[c][k]) for k in a[c]}
                for rep in REPRESENTATIONS for c in ("linear_probe", "knn")}
        worst = max(max(g.values()) for g in gaps.values())
        checks["ntxent_vs_torch_ntxent"] = {"gap": gaps, "max_gap": worst, "tolerance": NTXENT_TOLERANCE,
                                            "passed": worst <= NTXENT_TOLERANCE}
    candidates = [(name, rep, classifier) for name, m in methods.items() if m["kind"] == "rpm"
                  for rep in REPRESENTATIONS for classifier in ("linear_probe", "knn")]
    if candidates:
        checks["floors"] = {}
        for k, floor in FLOORS.items():
            name, rep, classifier = max(candidates, key=lambda c: _scores(methods[c[0]], c[1])[c[2]][k])
            value = _scores(methods[name], rep)[classifier][k]
            checks["floors"][k] = {"floor": floor, "best_prior": name, "representation": rep,
                                   "classifier": classifier, "accuracy": value, "passed": value >= floor}
    return checks


def _scores(result: dict, representation: str) -> dict:
    return result if representation == "backbone" else result[representation]


def _table(methods: dict) -> str:
    keys = list(next(iter(methods.values()))["linear_probe"])
    head = " ".join(f"{k:>6}" for k in keys)
    lines = ["test accuracy (%) by labelled images per class, mean over draws; h: the backbone's "
             "representation, z: the latent",
             f"{'method':<16} {'linear probe':^{7 * len(keys)}} {'kNN':^{7 * len(keys)}} {'time':>7}",
             f"{'':<16} {head} {head}"]
    for name, m in methods.items():
        for rep in REPRESENTATIONS:
            if rep != "backbone" and rep not in m:
                continue
            scores = _scores(m, rep)
            probe = " ".join(f"{100 * scores['linear_probe'][k]:>6.1f}" for k in keys)
            knn = " ".join(f"{100 * scores['knn'][k]:>6.1f}" for k in keys)
            time = f"{m['train_seconds']:>6.0f}s" if "train_seconds" in m and rep == "backbone" else ""
            label = f"{name} ({'h' if rep == 'backbone' else 'z'})" if name != "raw_pixels" else name
            lines.append(f"{label:<16} {probe} {knn} {time}".rstrip())
    return "\n".join(lines)


def _messages(checks: dict) -> list[str]:
    lines = []
    pair = checks.get("ntxent_vs_torch_ntxent")
    if pair and not pair["passed"]:
        lines.append(f"warning: ntxent and torch_ntxent differ by {100 * pair['max_gap']:.1f} points at "
                     f"some label count (more than {100 * pair['tolerance']:.0f}); they are the same "
                     "objective on the same batches")
    for key, floor in checks.get("floors", {}).items():
        if not floor["passed"]:
            lines.append(f"warning: the best prior ({floor['best_prior']}, {floor['classifier']} on its "
                         f"{floor['representation']}) reaches {100 * floor['accuracy']:.1f}% with {key} "
                         f"label(s) per class, below the floor {100 * floor['floor']:.0f}% of the "
                         "default run")
    return lines


def _train_and_report(args: argparse.Namespace, out: Path, device, run: Run | None) -> int:
    from rpm import distributed
    from rpm.data.digits import load_digits_split
    from rpm.experiments.digits.plots import plot_label_efficiency
    from rpm.experiments.digits.train import train_method
    from rpm.experiments.figures import plot_training

    if args.data is not None:
        from rpm.experiments.digits.fitting import load_data

        data = load_data(args.data, args.batch_size)
    else:
        data = load_digits_split()
    labelled = data.train.labels is not None
    seeds = _seeds(args)
    per_seed = {}
    for seed in seeds:
        trained = {name: train_method(name, args, data, device, _folder(out, name, seed, seeds),
                                      seed)[0]
                   for name in args.methods}
        if distributed.is_main_process():
            per_seed[seed] = {**trained,
                              **(_baselines(args, data, device, seed) if labelled else {})}
    if not distributed.is_main_process():
        return 0
    methods = {name: _mean_over_seeds([per_seed[seed][name] for seed in seeds])
               for name in per_seed[seeds[0]]}
    skipped = None if labelled else f"no labels in {args.data}"
    if labelled:
        plot_label_efficiency(out / "label_efficiency.png", methods,
                              title="rpm digits: test accuracy against labelled images per class")
    plot_training(out / "training.png",
                  {n: {"losses": m["reported_losses"],
                       "evaluations": m["evaluations"] if labelled else []}
                   for n, m in methods.items() if "reported_losses" in m},
                  score="knn", score_label="validation kNN accuracy",
                  loss_label="loss (NT-Xent, InfoNCE or -ELBO / N)")
    checks = _checks(methods) if labelled else {}
    if args.data is not None:
        checks.pop("floors", None)  # the floors are the bundled digits
    summary = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "evaluation": {"features": "the backbone's representation (before the projection head), "
                       "batch normalisation in eval mode",
                       "labels_per_class": ["1", "5", "10", "all"], "draws": args.draws,
                       "accuracy": "test accuracy in [0, 1], mean over the draws",
                       "train_images": int(data.train.images.shape[0]),
                       "test_images": int(data.test.images.shape[0]),
                       "data": args.data or "scikit-learn's digits"},
        **({"scores_skipped": skipped} if skipped else {}),
        "seeds": seeds,
        "methods": methods,
        **({"per_seed": {str(seed): per_seed[seed] for seed in seeds}} if len(seeds) > 1 else {}),
        "checks": checks,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", summary)
    if skipped:
        print(f"trained {', '.join(methods)} on {args.data}; scores skipped: {skipped} (give "
              "'labels' (N,) in the file to score the representations)")
    else:
        print(_table(methods))
    for line in _messages(checks):
        print(line, file=sys.stderr)
    print(f"results and figures in {out} ({run.elapsed():.0f} s"
          + (f"; {summary['wall_time']:.0f} s over {len(summary['segments'])} segments)"
             if len(summary["segments"]) > 1 else ")"))
    return 0
