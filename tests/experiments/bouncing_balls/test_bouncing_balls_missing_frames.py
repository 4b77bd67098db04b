"""Forecasts and imputations of the state-space prior with dropped held-out frames, against
dense Gaussian conditioning on the observed frames (numpy float64), and the --drop-frames flag."""

import json

import numpy as np
import pytest
import torch

from rpm.cli import main
from rpm.data.bouncing_balls import generate_bouncing_balls
from rpm.data.missing import drop_frames
from rpm.experiments.bouncing_balls.missing_frames import evaluate_missing_frames
from rpm.experiments.bouncing_balls.state_space import build_state_space_model, evaluate_dynamics
from tests.experiments.bouncing_balls.test_bouncing_balls_state_space import ARGS, Oracle, dense_joint

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("kind", ["stationary", "free"])
def test_imputation_and_forecast_against_dense_conditioning_on_the_observed_frames(kind):
    torch.set_default_dtype(torch.float64)
    num_frames, num_train, fraction, seed = 36, 24, 0.3, 5
    video = generate_bouncing_balls(num_frames, seed=2, dtype=torch.float64)
    noisy = video.centres + 0.8 * torch.randn(video.centres.shape,
                                              generator=torch.Generator().manual_seed(0))
    model = build_state_space_model(ARGS, 3, 3, kind=kind)
    model.recognition.net.encoder = Oracle(noisy)
    frames = torch.arange(float(num_frames)).reshape(num_frames, 1, 1, 1)
    scores = evaluate_missing_frames(model, frames, video.centres, num_train, fraction, seed=seed)
    observed = np.ones(num_frames, dtype=bool)
    observed[num_train:] = drop_frames((num_frames - num_train,), fraction,
                                       torch.Generator().manual_seed(seed)).numpy()
    dropped = ~observed & (np.arange(num_frames) >= num_train)
    assert scores.dropped_frames == dropped.sum() > 0

    mean, cov_s, big_c, noise, b = dense_joint(model, num_frames)
    F, D = num_frames, b.shape[0]
    mu = noisy.flatten(1).numpy().reshape(-1)
    targets = video.centres.flatten(1).numpy()
    design = np.concatenate([mu.reshape(F, D), np.ones((F, 1))], 1)
    mu = mu - np.tile(b, F)  # z_t - b = C s_t + v_t
    position = np.linalg.lstsq(design[:num_train], targets[:num_train], rcond=None)[0]

    def conditional_latent(rows):
        """C E[s | mu at the frames `rows`], (F, D)."""
        idx = np.concatenate([np.arange(t * D, (t + 1) * D) for t in rows]) if len(rows) else []
        if len(idx) == 0:
            return (big_c @ mean).reshape(F, D) + b
        cross = cov_s @ big_c.T[:, idx]
        gain = cross @ np.linalg.inv((big_c @ cov_s @ big_c.T + noise)[np.ix_(idx, idx)])
        return (big_c @ (mean + gain @ (mu[idx] - (big_c @ mean)[idx]))).reshape(F, D) + b

    def pixel_error(latent, rows):
        decoded = np.concatenate([latent, np.ones((F, 1))], 1) @ position
        return np.linalg.norm((decoded - targets)[rows].reshape(-1, 3, 2), axis=-1).mean()

    obs_rows = np.flatnonzero(observed)
    imputed = conditional_latent(obs_rows)
    assert scores.imputation_error_px == pytest.approx(pixel_error(imputed, dropped), rel=1e-8)
    everything = conditional_latent(np.arange(F))
    assert scores.observed_error_px == pytest.approx(pixel_error(everything, dropped), rel=1e-8)
    # one-step forecasts: frame t from the observed frames before t
    forecast = np.stack([conditional_latent(obs_rows[obs_rows < t])[t] for t in range(F)])
    held_out = np.arange(F) >= num_train
    assert scores.forecast_error_px == pytest.approx(pixel_error(forecast, held_out), rel=1e-8)
    full = evaluate_dynamics(model, frames, video.centres, num_train)
    assert scores.full_forecast_error_px == pytest.approx(full.forecast_error_px, rel=1e-10)


@pytest.mark.slow
def test_tiny_run_with_dropped_frames_writes_the_missing_frame_scores(tmp_path):
    status = main([
        "bouncing-balls", "--prior", "state-space", "--out", str(tmp_path), "--frames", "48",
        "--test-frames", "16", "--state-space-steps", "4", "--batch-size", "15",
        "--image-size", "16", "--ball-diameter", "3", "--hidden-channels", "4", "--eval-every",
        "0", "--checkpoint-every", "0", "--no-progress", "--device", "cpu", "--window", "4",
        "--drop-frames", "0.25", "--eval-drop-frames", "0.5",
    ])
    assert status == 0
    result = json.loads((tmp_path / "results.json").read_text())["priors"]["state-space"]
    missing = result["missing_frames"]
    assert missing["fraction"] == 0.5 and missing["trained_with_fraction"] == 0.25
    for key in ("forecast_error_px", "imputation_error_px", "observed_error_px",
                "full_forecast_error_px"):
        assert np.isfinite(missing[key]), key
    assert missing["full_forecast_error_px"] == pytest.approx(result["forecast_error_px"])


def test_drop_frames_belongs_to_the_state_space_prior(tmp_path, capsys):
    status = main(["bouncing-balls", "--prior", "rbf", "--out", str(tmp_path), "--drop-frames", "0.25"])
    assert status != 0
    assert "--drop-frames sets the frames the state-space prior trains without" in capsys.readouterr().err
