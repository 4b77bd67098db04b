"""The ``rpm bouncing-balls`` command: the minibatch order, a tiny end-to-end run writing its JSON
(with the environment), figures and weights-only checkpoints, one prior alone equal to the same
prior within ``--prior all``, SGD, argument errors, an interrupted ``--prior all`` run resumed
exactly from its saved configuration, and a finished run extended by more epochs."""

import contextlib
import io
import json
import signal

import numpy as np
import pytest
import torch

import rpm.experiments.bouncing_balls.command as bb
import rpm.training.trainer
from rpm.cli import main
from rpm.training.trainer import Trainer

TINY = [
    "--frames", "48", "--test-frames", "16", "--epochs", "2", "--batch-size", "15",
    "--image-size", "16", "--ball-diameter", "3", "--hidden-channels", "4",
    "--eval-every", "0", "--checkpoint-every", "0", "--no-progress", "--device", "cpu",
]  # fmt: skip
#: --prior all (the default): the state-space prior's length is its own flag
TINY_ALL = [*TINY, "--state-space-steps", "4"]


def _main(capsys, *argv):
    """Runs ``rpm bouncing-balls ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        status = main(["bouncing-balls", *argv])
    except SystemExit as exit:
        status = exit.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_epoch_permutation_is_a_reproducible_permutation():
    first = bb.epoch_permutation(7, 3, 50)
    assert torch.equal(torch.sort(first).values, torch.arange(50))
    assert torch.equal(first, bb.epoch_permutation(7, 3, 50))
    assert not torch.equal(first, bb.epoch_permutation(7, 4, 50))
    assert not torch.equal(first, bb.epoch_permutation(8, 3, 50))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A tiny uninterrupted ``--prior all`` run: (folder, exit status, stdout)."""
    out = tmp_path_factory.mktemp("reference")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(["bouncing-balls", "--out", str(out), *TINY_ALL])
    return out, status, stdout.getvalue()


@pytest.mark.slow
def test_tiny_run_of_every_prior_writes_results_and_figures(reference):
    out, status, stdout = reference
    assert status == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) >= {"config", "priors", "wall_time", "environment", "train_frames"}
    environment = results["environment"]
    assert environment["torch"] == torch.__version__ and environment["device"] == "cpu"
    assert {"python", "pyro", "rpm", "git_commit", "torch_threads"} <= set(environment)
    assert results["config"]["prior"] == "all" and results["train_frames"] == 32
    assert list(results["priors"]) == list(bb.PRIORS)
    for name, result in results["priors"].items():
        for key in ("r2", "pixel_error", "untrained_r2", "train_r2", "train_seconds"):
            assert np.isfinite(result[key]), (name, key)
        assert len(result["r2_per_coordinate"]) == 6
        assert result["r2"] == pytest.approx(np.mean(result["r2_per_coordinate"]))
        assert result["steps"] == 2 * (31 // 15)
        # safe checkpoints: plain data, read without unpickling objects
        state = torch.load(out / name / "checkpoint.pt", weights_only=True)["state"]
        assert state["step"] == result["steps"]
    parameters = {name: r["prior_parameters"] for name, r in results["priors"].items()}
    assert parameters["rbf"]["lengthscale"] > 0 and parameters["cosine"]["kappa"] > 0
    assert np.asarray(parameters["bilinear"]["weight"]).shape == (6, 6)
    assert len(parameters["dynamics"]["step_length"]) == 3
    for figure in ("comparison.png", "trajectories.png", "feature_maps.png"):
        assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the printed table has one line per prior
    for name in bb.PRIORS:
        assert any(line.startswith(name) for line in stdout.splitlines())


@pytest.mark.slow
def test_one_prior_alone_gives_the_same_result_as_within_all(reference, tmp_path, capsys):
    threads = torch.get_num_threads()
    status, _, _ = _main(capsys, "--out", str(tmp_path), *TINY, "--prior", "cosine",
                         "--threads", "1")
    assert status == 0 and torch.get_num_threads() == threads  # restored after the run
    assert json.loads((tmp_path / "results.json").read_text())["environment"]["torch_threads"] == 1
    alone = json.loads((tmp_path / "results.json").read_text())["priors"]
    within = json.loads((reference[0] / "results.json").read_text())["priors"]
    assert list(alone) == ["cosine"]
    assert alone["cosine"]["r2"] == within["cosine"]["r2"]
    assert alone["cosine"]["prior_parameters"] == within["cosine"]["prior_parameters"]


def test_sgd_trains_the_encoder(tmp_path, capsys):
    flags = [*TINY, "--prior", "rbf", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.5"]
    assert _main(capsys, "--out", str(tmp_path), *flags)[0] == 0
    state = torch.load(tmp_path / "rbf" / "checkpoint.pt", weights_only=True)["state"]
    group = state["optimizer"]["param_groups"][0]
    assert group["lr"] == 0.05 and group["momentum"] == 0.5 and not group["nesterov"]
    buffers = [entry["momentum_buffer"] for entry in state["optimizer"]["state"].values()]
    assert buffers and all(buffer.abs().sum() > 0 for buffer in buffers)  # steps were taken


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-size", "1"], "argument --batch-size: expected a batch size >= 2"),
        (["--epochs", "0"], "argument --epochs: expected a positive integer (>= 1), got '0'"),
        (["--lr", "-1"], "argument --lr: expected a positive number (> 0), got '-1'"),
        (["--momentum", "1"], "argument --momentum: expected a momentum in [0, 1), got '1'"),
        (["--prior", "gaussian"], "argument --prior: invalid choice: 'gaussian'"),
        (["--test-frames", "48"], "--test-frames 48 leaves 0 of the --frames 48 for training"),
        (["--batch-size", "40"], "--batch-size 40 is more than the 31 distinct training pairs"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(tmp_path, capsys, argv, message):
    status, _, err = _main(capsys, "--out", str(tmp_path / "run"), *TINY, *argv)
    assert status == 2
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


class _InterruptDynamics(Trainer):
    """A Trainer that receives Ctrl-C during the second step of the dynamics prior."""

    def __init__(self, module, optimizer, loss_fn, **kwargs):
        def interrupting_loss(step):
            if kwargs["description"] == "dynamics" and step == 1:
                signal.raise_signal(signal.SIGINT)
            return loss_fn(step)

        super().__init__(module, optimizer, interrupting_loss, **kwargs)


@pytest.mark.slow
def test_interrupted_run_resumes_the_unfinished_prior_and_skips_the_others(
    reference, tmp_path, capsys, monkeypatch
):
    interrupted = tmp_path / "interrupted"
    with monkeypatch.context() as patch:
        patch.setattr(rpm.training.trainer, "Trainer", _InterruptDynamics)
        status, _, err = _main(capsys, "--out", str(interrupted), *TINY_ALL)
    assert status == 128 + signal.SIGINT and "rerun with --resume" in err
    assert not (interrupted / "results.json").exists()
    finished = {name: (interrupted / name / "checkpoint.pt").read_bytes()
                for name in ("rbf", "bilinear", "cosine")}
    assert torch.load(interrupted / "dynamics" / "checkpoint.pt",
                      weights_only=True)["state"]["step"] == 2
    # --resume reads the saved configuration: no other flag is needed
    status, out, _ = _main(capsys, "--out", str(interrupted), "--resume")
    assert status == 0
    assert "dynamics: resuming at step 2/4" in out
    for name, content in finished.items():
        assert f"{name}: finished earlier" in out
        assert (interrupted / name / "checkpoint.pt").read_bytes() == content  # not retrained
    expected = json.loads((reference[0] / "results.json").read_text())["priors"]
    resumed = json.loads((interrupted / "results.json").read_text())["priors"]
    for name in bb.PRIORS:
        for key in ("r2", "r2_per_coordinate", "pixel_error", "prior_parameters", "final_loss"):
            assert resumed[name][key] == expected[name][key], (name, key)
    # resuming the finished run reloads it: one line per prior, no training
    status, out, err = _main(capsys, "--out", str(interrupted), "--resume")
    assert status == 0 and "resuming" not in out
    assert [line.split(":")[0] for line in out.splitlines() if "finished earlier" in line] == list(
        bb.PRIORS)
    # resuming a different experiment is refused
    status, _, err = _main(capsys, "--out", str(interrupted), "--resume", "--lr", "0.1")
    assert status == 2 and "--lr: was 0.01, now 0.1" in err
    status, _, err = _main(capsys, "--out", str(interrupted), "--resume", "--epochs", "1")
    assert status == 2 and "--epochs: was 2, now 1 (it may only grow" in err
    status, _, err = _main(capsys, "--out", str(tmp_path / "none"), *TINY_ALL, "--resume")
    assert status == 2 and "no run to resume" in err


@pytest.mark.slow
def test_more_epochs_extend_a_finished_run(tmp_path, capsys):
    flags = [*TINY, "--prior", "rbf"]
    assert _main(capsys, "--out", str(tmp_path), *flags)[0] == 0
    before = torch.load(tmp_path / "rbf" / "checkpoint.pt", weights_only=True)["state"]
    status, out, _ = _main(capsys, "--out", str(tmp_path), "--resume", "--epochs", "3")
    assert status == 0 and "rbf: resuming at step 4/6" in out
    after = torch.load(tmp_path / "rbf" / "checkpoint.pt", weights_only=True)["state"]
    assert after["step"] == 6 and [e["step"] for e in after["history"]["evaluations"]] == [4, 6]
    assert after["history"]["evaluations"][0] == before["history"]["evaluations"][0]
    assert json.loads((tmp_path / "config.json").read_text())["epochs"] == 3
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["config"]["epochs"] == 3 and results["priors"]["rbf"]["steps"] == 6


@pytest.mark.slow
def test_rpm_load_gives_each_prior_in_eval_mode(reference):
    """``rpm.load`` of the tiny ``--prior all`` run: asked without a name it lists the priors;
    a pair prior's RPM and the state-space RPM each embed frames as the BallEncoder
    given the checkpoint's weights in eval mode, which differs from train mode (batch
    normalisation), and their read-out of the run's video gives the run's own held-out R^2."""
    import rpm
    from rpm.data.bouncing_balls import generate_bouncing_balls
    from rpm.experiments.bouncing_balls.encoders import BallEncoder
    from rpm.experiments.bouncing_balls.evaluate import evaluate
    from rpm.training.checkpoint import load_checkpoint
    from rpm.training.run_folder import RunFolderError

    out, status, _ = reference
    assert status == 0
    with pytest.raises(RunFolderError, match="holds 5 trained models: choose one with model=, "
                       "one of 'bilinear', 'cosine', 'dynamics', 'rbf', 'state-space'"):
        rpm.load(out)
    video = generate_bouncing_balls(num_frames=48, image_size=16, ball_diameter=3, num_balls=3,
                                    seed=0)
    results = json.loads((out / "results.json").read_text())["priors"]
    frames = video.frames[:12]  # (T, 3, S, S)
    for name, kind, prefix in (("rbf", rpm.RPM, "recognition.net."),
                               ("state-space", rpm.RPM, "recognition.net.encoder.")):
        model = rpm.load(out, model=name)
        assert type(model) is kind and not model.training and model.trained["model"] == name
        weights = load_checkpoint(out / name / "checkpoint.pt")["module"]
        encoder = BallEncoder(in_channels=3, hidden_channels=4, kernel_size=5, num_maps=3)
        encoder.load_state_dict({key[len(prefix):]: value for key, value in weights.items()
                                 if key.startswith(prefix)})
        encoder.eval()
        with torch.no_grad():
            z = model.encode(frames)
            torch.testing.assert_close(z, encoder(frames))
            network = model.recognition.net.encoder if name == "state-space" else model.recognition.net
            assert evaluate(network, video.frames, video.centres, 32).r2 == results[name]["r2"]
            model.train()
            assert (model.encode(frames) - z).abs().max() > 1e-3
