r"""``python -m rpm rpm-hmm``: the RPM-HMM (Walker et al., 2023) learns the states and the
transition matrix of a Markov chain of digits from the images alone.

The data (:mod:`rpm.experiments.rpm_hmm.chain`): a chain of ``--length`` (10,000) frames of
scikit-learn's 8x8 digits (nothing downloaded) whose digits 0..K-1 (``--states``, 6) follow the
row-normalised RBF kernel over the states, :math:`A_{ij} \propto \exp(-(i-j)^2/\ell)`
(``--lengthscale`` :math:`\ell`, 1: Walker et al.'s ``RBF(1, 1)``), each frame an image of its
digit drawn from the training part of the fixed stratified split
(:func:`rpm.data.digits.load_digits_split`); a held-out chain of ``--test-length`` (2,000)
frames of the same chain shows only test images, never trained on.

The model (:mod:`rpm.experiments.rpm_hmm.model`): a :class:`~rpm.CategoricalRecognition`
factor :math:`f(z|x)` per frame (an MLP with two layers of ``--hidden`` units), a hidden Markov
chain over its K states with learned initial and transition logits, Pyro's
:class:`~pyro.distributions.DiscreteHMM` with the emission factors :math:`\log f(z_t|x_t) -
\log F(z_t)`. Training: ``--steps`` Adam steps (the encoder at ``--lr``, the chain's logits at
``--prior-lr``, a warm-up over ``--warmup`` of the steps and a cosine decay), each on
``--batch-size`` (32) windows of ``--window`` (100) consecutive frames of the training chain
drawn uniformly; the loss is :math:`-\log P` of the windows (the exact marginal likelihood,
``Trace_ELBO`` on the program) per frame, with the normaliser :math:`F(z)` the mean of
:math:`f(z|x)` over the batch's frames (the RPM of the batch's empirical distribution).

Results, in ``results.json``: ``state_accuracy``, the share of the held-out chain's frames whose
posterior mode :math:`\arg\max_k q(z_t = k \mid x_{1:T})` (exact, by forward-backward over the
whole held-out chain, the normaliser over its frames) is their digit after the Hungarian
matching of states to digits (:mod:`rpm.experiments.rpm_hmm.evaluate`); ``transition_error``,
the largest absolute difference between the learned and the true transition matrices after
the same matching; ``recognition_accuracy`` (the factor's own mode, without the chain),
``train_state_accuracy`` (the training chain's), the matching, both matrices, the untrained
model's scores and the history. ``transitions.png`` shows the learned matrix beside the true
one and a stretch of the held-out chain, ``training.png`` the loss and the held-out accuracy
against the step. The model's folder ``rpm/`` holds its checkpoint, history and model record
(``rpm.load(DIR)``).

References:
    W. I. Walker, H. Soulat, C. Yu, M. Sahani, "Unsupervised representation learning with
    recognition-parametrised probabilistic models", AISTATS 2023.
"""

from __future__ import annotations

import argparse
import json
import sys

from rpm.experiments.common import (
    ConfigurationError,
    add_common_arguments,
    add_training_arguments,
    at_least_two_frames,
    check_models_resumable,
    environment,
    open_run,
    positive_float,
    positive_int,
    resolve_device,
    torch_threads,
    write_json_atomic,
)

__all__ = ["FLOORS", "add_parser", "run"]

#: The name of the model's folder in the run folder.
MODEL = "rpm"
#: What the default run must reach.
FLOORS = {"state_accuracy": 0.97, "transition_error": 0.05}
#: The most states: one per digit class (``rpm.experiments.rpm_hmm.chain.MAX_STATES``, written
#: out so that the parser does not import torch).
MAX_STATES = 10


def state_count(text: str) -> int:
    """argparse ``type=``: K, the states of the chain, an integer in [2, 10] (the digits
    0..K-1)."""
    value = positive_int(text)
    if not 2 <= value <= MAX_STATES:
        raise argparse.ArgumentTypeError(
            f"expected K in [2, {MAX_STATES}] states (a chain needs at least 2 states; the "
            f"digits give at most {MAX_STATES}), got {text!r}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``rpm-hmm`` sub-command."""
    parser = subparsers.add_parser(
        "rpm-hmm",
        help="the RPM-HMM learns the states and transitions of a Markov chain of digits",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_common_arguments(parser, default_out="runs/rpm-hmm", default_checkpoint_every=200,
                         grow_flag="--steps")
    data = parser.add_argument_group("data", "a chain of scikit-learn's digits whose classes "
                                     "follow a Markov chain")
    data.add_argument("--states", type=state_count, default=6,
                      help="K, the states: the digits 0..K-1, in [2, 10] (default: 6)")
    data.add_argument("--length", type=at_least_two_frames, default=10000,
                      help="frames of the training chain, >= 2 (default: 10000)")
    data.add_argument("--test-length", type=at_least_two_frames, default=2000,
                      help="frames of the held-out chain (test images only), >= 2 "
                      "(default: 2000)")
    data.add_argument("--lengthscale", type=positive_float, default=1.0,
                      help="l of the true transitions A_ij ~ exp(-(i-j)^2 / l) (default: 1, "
                      "Walker et al.'s)")
    model = parser.add_argument_group("model")
    model.add_argument("--hidden", type=positive_int, default=256,
                       help="units of each of the encoder's two hidden layers (default: 256)")
    train = add_training_arguments(
        parser, {"steps": 800, "batch_size": 32, "lr": 1e-3, "prior_lr": 1e-2, "warmup": 0.05,
                 "eval_every": 100},
        descriptions={"batch_size": "windows of the training chain per step",
                      "lr": "peak learning rate of the encoder",
                      "prior_lr": "peak learning rate of the chain's initial and transition "
                      "logits",
                      "eval_every": "score the held-out chain every STEPS steps; 0: at the "
                      "end only"})
    train.add_argument("--window", type=at_least_two_frames, default=100,
                       help="consecutive frames per window, >= 2 (default: 100)")
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    """The checks across flags, before the run folder is created or written."""
    if args.window > args.length:
        raise ConfigurationError(f"--window {args.window} is longer than the training chain "
                                 f"(--length {args.length}): use --window {args.length} or less")


def run(args: argparse.Namespace) -> int:
    """Runs the experiment described in the module docstring; returns the exit status 0."""
    with torch_threads(args.threads), open_run(args, may_change=("eval_every",),
                                               may_grow=("steps",), validate=_validate) as run:
        return _train_and_report(args, run, resolve_device(args.device))


def _chains(args: argparse.Namespace):
    """The true transition matrix and the training and held-out chains (module docstring)."""
    from rpm.data.digits import load_digits_split
    from rpm.experiments.common import derived_seed
    from rpm.experiments.rpm_hmm.chain import digit_chain, rbf_transition_matrix, sample_states

    split = load_digits_split()
    true = rbf_transition_matrix(args.states, args.lengthscale)
    chains = []
    for index, (part, length) in enumerate(((split.train, args.length),
                                            (split.test, args.test_length))):
        keep = part.labels < args.states
        states = sample_states(true, length, derived_seed(args.seed, "data", 2 * index))
        chains.append(digit_chain(states, part.images[keep], part.labels[keep],
                                  part.indices[keep], derived_seed(args.seed, "data",
                                                                   2 * index + 1)))
    return true, chains[0], chains[1]


def _scores(model, chain, images, true) -> dict:
    """The held-out scores of the module docstring, with the matching and the matched
    learned matrix."""
    from rpm.experiments.rpm_hmm.evaluate import (
        match_states,
        matched_transition_matrix,
        state_accuracy,
        transition_error,
    )

    modes = model.posterior_modes(images[None])[0].cpu()  # (T,)
    sigma = match_states(modes, chain.states, model.num_states)
    recognised = model.recognition_log_probs(images[None])[0].argmax(-1).cpu()  # (T,)
    learned = model.transition_matrix
    return {"state_accuracy": state_accuracy(modes, chain.states, sigma),
            "transition_error": transition_error(learned, true, sigma),
            "recognition_accuracy": state_accuracy(recognised, chain.states, sigma),
            "matching": sigma.tolist(),
            "learned_transition_matrix": matched_transition_matrix(learned, sigma).tolist(),
            "modes": sigma[modes].tolist()}


def _train_and_report(args: argparse.Namespace, run, device) -> int:
    import numpy as np
    import pyro
    import torch
    from pyro.infer import Trace_ELBO

    from rpm.experiments.common import fit_with_cosine_schedule, seed_everything
    from rpm.experiments.figures import plot_training
    from rpm.experiments.lds.train import sample_windows
    from rpm.experiments.rpm_hmm.evaluate import match_states, state_accuracy
    from rpm.experiments.rpm_hmm.model import model_from_arguments
    from rpm.experiments.rpm_hmm.plots import plot_transitions
    from rpm.experiments.trained import write_model_record

    out = run.path
    if args.resume:
        check_models_resumable(out, [MODEL])
    true, train_chain, test_chain = _chains(args)
    train_images = train_chain.images.to(device)  # (T, 1, 8, 8)
    test_images = test_chain.images.to(device)
    seed_everything(args.seed)
    arguments = {"states": args.states, "hidden": args.hidden}
    model = model_from_arguments(arguments).to(device)
    write_model_record(out / MODEL, "rpm-hmm", arguments, train_images.shape[1:])
    with torch.no_grad():
        untrained = _scores(model, test_chain, test_images, true)
    elbo = Trace_ELBO()
    frames = args.batch_size * args.window

    def loss_fn(step: int) -> torch.Tensor:
        windows = sample_windows(train_images[None], args.batch_size, args.window, args.seed,
                                 step)  # (B, W, 1, 8, 8)
        with pyro.validation_enabled(False):  # our own tensors
            return elbo.differentiable_loss(model.model, model.guide, windows) / frames

    def eval_fn(step: int) -> dict:
        with torch.no_grad():
            scores = _scores(model, test_chain, test_images, true)
        return {"state_accuracy": scores["state_accuracy"],
                "transition_error": scores["transition_error"]}

    chain_params = [model.initial_logits_unconstrained, model.transition_logits_unconstrained]
    encoder_params = list(model.recognition.parameters())
    optimizer = torch.optim.Adam([{"params": encoder_params, "lr": args.lr},
                                  {"params": chain_params, "lr": args.prior_lr}])
    history = fit_with_cosine_schedule(model, optimizer, loss_fn, args, out / MODEL, "rpm-hmm",
                                       eval_fn, log_every=min(10, args.steps))
    model.eval()
    with torch.no_grad():
        scores = _scores(model, test_chain, test_images, true)
        train_modes = model.posterior_modes(train_images[None])[0].cpu()
    sigma = torch.as_tensor(scores["matching"])
    modes = np.asarray(scores.pop("modes"))
    plot_transitions(out / "transitions.png", np.asarray(scores["learned_transition_matrix"]),
                     true.numpy(), test_chain.states.numpy(), modes, scores["transition_error"],
                     scores["state_accuracy"])
    plot_training(out / "training.png", {"rpm-hmm": history}, score="state_accuracy",
                  score_label="held-out state accuracy",
                  baselines={"rpm-hmm": untrained["state_accuracy"]},
                  baseline_label="untrained", loss_label="-log P / frame")
    results = {
        "config": json.loads((out / "config.json").read_text()),
        "environment": environment(device),
        "state_accuracy": scores["state_accuracy"],
        "transition_error": scores["transition_error"],
        "recognition_accuracy": scores["recognition_accuracy"],
        "train_state_accuracy": state_accuracy(train_modes, train_chain.states, sigma),
        "train_matching_agrees": bool(torch.equal(
            match_states(train_modes, train_chain.states, args.states), sigma)),
        "matching": scores["matching"],
        "transition_matrix": {"learned": scores["learned_transition_matrix"],
                              "true": true.tolist()},
        "initial_probs": model.initial_probs.cpu()[torch.argsort(sigma)].tolist(),
        "untrained": {key: untrained[key] for key in
                      ("state_accuracy", "transition_error", "recognition_accuracy")},
        "floors": FLOORS,
        "data": {"states": args.states, "length": args.length, "test_length": args.test_length,
                 "lengthscale": args.lengthscale,
                 "train_images": int(train_chain.rows.unique().numel()),
                 "test_images": int(test_chain.rows.unique().numel()),
                 "shared_images": int(np.intersect1d(train_chain.rows.numpy(),
                                                     test_chain.rows.numpy()).size)},
        "normaliser": "F(z): the mean of f(z|x) over the frames of each training batch (B "
                      "windows of W frames); over the whole held-out chain for its scores",
        "posterior_mode": "argmax_k q(z_t = k | x_{1:T}), the exact smoothed marginal of the "
                          "whole held-out chain",
        "steps": args.steps,
        "train_seconds": history["evaluations"][-1]["wall_time"],
        "history": history,
        **run.provenance(),
    }
    write_json_atomic(out / "results.json", results)
    print(f"rpm-hmm: held-out state accuracy {scores['state_accuracy']:.4f} (recognition alone "
          f"{scores['recognition_accuracy']:.4f}; untrained {untrained['state_accuracy']:.4f}), "
          f"transition error {scores['transition_error']:.4f}")
    for key, floor in FLOORS.items():
        value = results[key]
        if (value < floor) if key == "state_accuracy" else (value > floor):
            print(f"warning: {key} {value:.4f} misses the default run's floor {floor}",
                  file=sys.stderr)
    print(f"results and figures in {out} ({run.elapsed():.0f} s)")
    return 0
