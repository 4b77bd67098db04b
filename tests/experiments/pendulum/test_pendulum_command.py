"""``rpm pendulum``: the encoder, the command-line checks and a short end-to-end run at toy
size (with distractors)."""

import json

import pytest
import torch

from rpm.cli import main
from rpm.experiments.pendulum.model import GaussianConvEncoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["pendulum", "--out", str(tmp_path / name), "--no-progress", "--device",
                     "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize("size", [8, 21, 28])
def test_encoder_shapes_and_constant_noise(size):
    encoder = GaussianConvEncoder(size, out_dim=5, channels=4, hidden=8, noise=0.2)
    loc, scale = encoder(torch.randn(3, 1, size, size))
    assert loc.shape == scale.shape == (3, 5)
    torch.testing.assert_close(scale, torch.full((3, 5), 0.2))
    assert "log_scale" not in dict(encoder.named_parameters())  # a buffer, not learned


@pytest.mark.parametrize("argv, message", [
    (["--window", "1"], "integer >= 2"),
    (["--window", "30", "--length", "20"], "longer than the videos"),
    (["--image-size", "6"], "too small"),
    (["--noise", "-0.1"], "non-negative"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_end_to_end_run_with_distractors_writes_results_and_resumes(tmp_path, capsys):
    argv = ["--distractors", "--steps", "4", "--sequences", "6", "--test-sequences", "3",
            "--length", "16", "--image-size", "16", "--batch-size", "3", "--window", "6",
            "--channels", "4", "--hidden", "8", "--eval-every", "2", "--checkpoint-every", "0",
            "--latent-dim", "3", "--state-dim", "5", "--marginal", "per-view",
            "--prior", "stationary"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    results = json.loads((out / "results.json").read_text())
    for key in ("r2", "r2_per_coordinate", "means_r2", "forecast_error", "var_forecast_error",
                "forecast_baseline", "eigenvalues", "untrained", "wall_time"):
        assert key in results
    assert set(results["r2_per_coordinate"]) == {"sin_theta", "cos_theta", "omega"}
    assert set(results["forecast_error"]) == set(results["var_forecast_error"]) == {"1", "10"}
    assert results["config"]["distractors"] is True
    assert len(results["eigenvalues"]) == 5  # H = --state-dim
    assert (out / "pendulum.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["pendulum", "--resume", "--out", str(out), "--no-progress"]) == 0
    assert "finished earlier (4/4 steps), reloaded" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["r2"] == results["r2"]
