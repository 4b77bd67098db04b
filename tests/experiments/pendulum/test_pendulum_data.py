"""``rpm pendulum --data FILE.npz`` and :func:`rpm.experiments.pendulum.fit`: the command's own
generated videos written to a file give the generated run's scores; videos of several channels
and non-square frames train; without states the scores are skipped and said so; every bad file
is refused in one line before a run folder exists."""

import json

import numpy as np
import pytest
import torch

import rpm.experiments.pendulum
from rpm.cli import main
from rpm.data.pendulum import generate_pendulum
from rpm.experiments.common import derived_seed

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = ["--steps", "4", "--batch-size", "3", "--window", "6", "--channels", "4",
         "--keypoints", "3", "--eval-every", "2", "--checkpoint-every", "0", "--latent-dim", "3",
         "--eval-drop-frames", "0.25"]
SCORES = ("r2", "means_r2", "knn_r2", "forecast_error", "var_forecast_error",
          "forecast_baseline", "missing_frames", "eigenvalues")


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["pendulum", "--out", str(tmp_path / name), "--no-progress", "--device",
                     "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def test_own_generated_videos_in_a_file_give_the_generated_runs_scores(tmp_path, capsys):
    assert _run(tmp_path, "--sequences", "6", "--test-sequences", "3", "--length", "12",
                "--image-size", "12", *MODEL, name="generated") == 0
    videos = generate_pendulum(9, 12, 12, 0.05, False, seed=derived_seed(0, "data"))
    path = tmp_path / "pendulum.npz"
    np.savez(path, observations=videos.frames.numpy(), states=videos.states.numpy(),
             held_out=np.arange(9) >= 6)
    assert _run(tmp_path, "--data", str(path), *MODEL, name="file") == 0
    generated = json.loads((tmp_path / "generated" / "results.json").read_text())
    from_file = json.loads((tmp_path / "file" / "results.json").read_text())
    for key in SCORES:
        assert from_file[key] == generated[key], key
    assert list(from_file["r2_per_coordinate"].values()) == list(
        generated["r2_per_coordinate"].values())
    assert list(from_file["r2_per_coordinate"]) == ["state_0", "state_1", "state_2"]
    assert from_file["data"]["frame_shape"] == [1, 12, 12]
    assert f"pendulum {path}: held-out R^2" in capsys.readouterr().out


def test_colour_non_square_uint8_videos_without_states(tmp_path, capsys):
    """(N, T, C, H, W) uint8 frames of 3 channels, 10 x 14 pixels: both encoders train; without
    states the scores are null and the output says they were skipped."""
    frames = np.random.default_rng(0).integers(0, 256, size=(4, 8, 3, 10, 14), dtype=np.uint8)
    path = tmp_path / "colour.npz"
    np.savez(path, observations=frames)
    assert _run(tmp_path, "--data", str(path), *MODEL) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["r2"] is None and results["knn_r2"] is None
    assert results["scores_skipped"] == f"no states in {path}"
    assert results["data"]["frame_shape"] == [3, 10, 14] and results["data"]["held_out"] == 0
    assert "missing_frames" not in results
    assert f"scores skipped: no states in {path}" in capsys.readouterr().out
    fit = rpm.experiments.pendulum.fit(frames[:, :, 0], steps=2, batch_size=2, window=4,
                                       encoder="flat", hidden=4, channels=2, latent_dim=2,
                                       progress=False)
    assert fit.scores is None and fit.scores_skipped == "no states given"
    assert fit.data.observations.shape == (4, 8, 1, 10, 14)
    assert float(fit.data.observations.max()) <= 1.0  # uint8 / 255
    assert fit.inference.means.shape == (4, 8, 2)


def test_fit_with_states_scores_its_held_out_videos():
    videos = generate_pendulum(5, 10, 10, seed=1)
    held_out = np.array([True, False, False, False, False])
    fit = rpm.experiments.pendulum.fit(videos.frames[:, :, 0], videos.states, held_out, steps=2,
                                       batch_size=2, window=4, channels=2, keypoints=2,
                                       latent_dim=2, eval_drop_frames=0, progress=False)
    assert fit.data.index.tolist() == [1, 2, 3, 4, 0] and fit.data.num_train == 4
    assert set(fit.scores["r2_per_coordinate"]) == {"state_0", "state_1", "state_2"}
    assert fit.scores["r2"] <= 1.0 and "missing_frames" not in fit.scores
    with pytest.raises(ValueError, match="flat encoder needs a hidden layer"):
        rpm.experiments.pendulum.fit(videos.frames, encoder="flat", hidden=0)
    with pytest.raises(ValueError, match="unknown option image_size"):
        rpm.experiments.pendulum.fit(videos.frames, image_size=10)


def _bad_files():
    x = np.random.default_rng(0).random((6, 10, 12, 12), dtype=np.float32)
    s = np.random.default_rng(1).normal(size=(6, 10, 3))
    inf = x.copy()
    inf[1, 2, 3, 4] = np.inf
    return {
        "missing": ({"frames": x}, "the file has no array 'observations' (it has 'frames')"),
        "vectors": ({"observations": x[:, :, 0]},
                    "observations must have shape (N, T, H, W) or (N, T, C, H, W), got shape "
                    "(6, 10, 12)"),
        "small": ({"observations": x[:, :, :6]}, "the frames are 6 x 12 pixels"),
        "inf": ({"observations": inf}, "the first at index (1, 2, 3, 4)"),
        "one frame": ({"observations": x[:, :1]}, "needs at least 2"),
        "short": ({"observations": x[:, :5]}, "fewer than --window 6"),
        "states": ({"observations": x, "states": s[:, :, 0]}, "states must have shape (N, T, K)"),
        "held_out float": ({"observations": x, "held_out": np.zeros(6)}, "boolean"),
        "held_out length": ({"observations": x, "held_out": np.zeros(7, dtype=bool)},
                            "held_out must have shape (6,)"),
        "all held out": ({"observations": x, "held_out": np.ones(6, dtype=bool)},
                         "none is left to train on"),
        "one video": ({"observations": x[:1], "states": s[:1]}, "too few sequences (1)"),
    }


@pytest.mark.parametrize("case", list(_bad_files()))
def test_a_bad_file_is_refused_in_one_line_before_the_run_folder(tmp_path, capsys, case):
    arrays, message = _bad_files()[case]
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    assert _run(tmp_path, "--data", str(path), "--window", "6") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m rpm pendulum: error: --data {path}: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_generation_flag_with_data_is_refused(tmp_path, capsys):
    path = tmp_path / "good.npz"
    np.savez(path, observations=np.zeros((3, 10, 8, 8)))
    assert _run(tmp_path, "--data", str(path), "--image-size", "16", "--distractors") == 2
    assert "--distractors, --image-size describe(s) the generated videos" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_encoders_take_channels_and_non_square_frames():
    from rpm.experiments.pendulum.model import build_encoder

    for kind in ("keypoints", "flat"):
        encoder = build_encoder(kind, (10, 14), 4, 3, 5, 2, 0.1, in_channels=3)
        loc, scale = encoder(torch.randn(7, 3, 10, 14))
        assert loc.shape == scale.shape == (7, 4)
