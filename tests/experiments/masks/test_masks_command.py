"""``rpm masks``: the flags' checks, the encoder, and a small run of the command with its
results.json fields, figure and --resume."""

import json

import pytest
import torch

from rpm.cli import main
from rpm.experiments.masks import command, model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--videos", "6", "--frames", "20", "--test-videos", "2", "--image-size", "16",
         "--steps", "30", "--batch-size", "32", "--channels", "8", "--hidden", "32",
         "--eval-every", "15", "--checkpoint-every", "0", "--shape-warmup", "20"]


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["masks", "--out", str(tmp_path / name), "--no-progress", "--device", "cpu",
                     "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def test_the_parser_lists_the_model_priors():
    assert command.PRIORS == model.PRIORS


@pytest.mark.parametrize("argv, message", [
    (["--objects", "4"], "--objects must be 1 to 3"),
    (["--image-size", "24"], "power of 2"),
    (["--frames", "3", "--delta-t", "3"], "need videos of more than 3 frames"),
    (["--window", "1"], "--window must be >= 2"),
    (["--priors", "laplace,laplace"], "distinct priors"),
    (["--priors", "cauchy"], "distinct priors"),
    (["--shape", "0"], "positive number"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_encoder():
    encoder = model.MaskEncoder(16, 4, channels=4, hidden=8)
    assert encoder(torch.rand(5, 1, 16, 16)).shape == (5, 4)
    with pytest.raises(ValueError, match="power of 2"):
        model.MaskEncoder(12, 4)


def test_small_run_writes_results_and_resumes(tmp_path, capsys):
    assert _run(tmp_path, *SMALL) == 0
    out = tmp_path / "run"
    results = json.loads((out / "results.json").read_text())
    assert set(results["priors"]) == {"normal", "laplace", "learned"}
    for result in results["priors"].values():
        assert 0.0 <= result["mcc"] <= 1.0
        assert len(result["mcc_per_factor"]) == 4
        assert result["trajectory"]["step"] == [0, 15, 30]
    assert results["true_shape"] == 0.5 and results["delta_t"] == 1
    shapes = results["priors"]["learned"]["trajectory"]["shape"]
    assert shapes[:2] == [1.0, 1.0] and shapes[2] != 1.0  # held for --shape-warmup 20 steps
    assert results["learned_shape"] == results["priors"]["learned"]["prior_parameters"]["shape"]
    assert 0.3 < results["fitted_shape"] < 0.8
    assert (out / "masks.png").stat().st_size > 0
    assert (out / "training.png").stat().st_size > 0
    assert all((out / name / "checkpoint.pt").exists() for name in results["priors"])
    capsys.readouterr()
    assert _run(tmp_path, "--resume") == 0
    assert "finished earlier (30/30 steps), reloaded" in capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert again["priors"]["laplace"]["mcc"] == pytest.approx(results["priors"]["laplace"]["mcc"])


def test_windows_train_the_sequence_form(tmp_path):
    """--window 3: the Markov implicit chain over windows of three frames."""
    argv = [*SMALL, "--window", "3", "--priors", "laplace", "--steps", "10", "--eval-every", "0"]
    assert _run(tmp_path, *argv) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["config"]["window"] == 3 and list(results["priors"]) == ["laplace"]
    assert 0.0 <= results["priors"]["laplace"]["mcc"] <= 1.0


def test_rpm_load_gives_each_prior_s_model_in_eval_mode(tmp_path):
    """``rpm.load`` of a small run: each prior's RPM in eval mode, whose encoding of new frames
    is the mask encoder given the checkpoint's weights."""
    import rpm
    from rpm.experiments.masks.model import MaskEncoder
    from rpm.training.checkpoint import load_checkpoint

    assert _run(tmp_path, *SMALL, "--priors", "normal,learned") == 0
    out = tmp_path / "run"
    frames = torch.rand(5, 1, 16, 16)
    for name in ("normal", "learned"):
        model = rpm.load(out, model=name)
        assert isinstance(model, rpm.RPM) and not model.training
        assert model.trained == {"command": "masks", "model": name, "step": 30,
                                 "folder": str(out), "input_shape": (1, 16, 16)}
        weights = load_checkpoint(out / name / "checkpoint.pt")["module"]
        encoder = MaskEncoder(16, 4, 8, 32).eval()
        encoder.load_state_dict({key[len("recognition.net."):]: value for key, value
                                 in weights.items() if key.startswith("recognition.net.")})
        with torch.no_grad():
            torch.testing.assert_close(model.encode(frames), encoder(frames))
