"""The state-space prior of ``rpm bouncing-balls``: its scores against independent computations
with the true centres as the encoder's output, the displacement-noise start, and a tiny run's
results."""

import argparse
import json

import numpy as np
import pytest
import torch

from rpm.cli import main
from rpm.data.bouncing_balls import generate_bouncing_balls
from rpm.distributions import GaussianStateSpace
from rpm.experiments.bouncing_balls.command import converged
from rpm.experiments.bouncing_balls.evaluate import fit_linear_decoder
from rpm.experiments.bouncing_balls.state_space import (
    build_state_space_model,
    displacement_noise,
    evaluate_dynamics,
    window_batch,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARGS = argparse.Namespace(hidden_channels=4, state_space_noise=0.3, ball_diameter=5.0, image_size=32)


class Oracle(torch.nn.Module):
    """Maps 'frames' holding their own index to the true centres (the perfect encoder)."""

    def __init__(self, centres):
        super().__init__()
        self.centres = centres.flatten(1)

    def forward(self, frames):
        return self.centres[frames.reshape(len(frames), -1)[:, 0].long()]


def test_displacement_noise_is_the_covariance_of_the_equations():
    L = displacement_noise(2, 0.3, 2.5)
    eye = torch.eye(2)
    expected = torch.cat([torch.cat([(0.09 + 6.25) * eye, 6.25 * eye], 1),
                          torch.cat([6.25 * eye, 6.25 * eye], 1)])
    assert torch.allclose(L @ L.T, expected, atol=1e-6)
    assert torch.equal(L, L.tril())


def test_window_batch():
    frames = torch.arange(20.0).reshape(20, 1, 1, 1)
    batch = window_batch(frames, torch.tensor([0, 5, 12]), 4)
    assert batch.shape == (3, 4, 1, 1, 1)
    assert batch[1, :, 0, 0, 0].tolist() == [5.0, 6.0, 7.0, 8.0]


@pytest.mark.parametrize("kind", ["stationary", "free"])
def test_dynamics_scores_with_the_true_centres(kind):
    """With the true centres as the encoder's means, the untrained prior (damped or plain
    constant velocity) reads the velocities out of its smoothed states, and each one-step
    forecast equals the forecast of GaussianStateSpace on the prefix (noise R + sigma^2),
    decoded by the position decoder; the baseline is the mean step length, one ball
    diameter."""
    torch.set_default_dtype(torch.float64)
    video = generate_bouncing_balls(120, seed=1, dtype=torch.float64)
    num_train = 100
    model = build_state_space_model(ARGS, 3, 3, kind=kind)
    model.recognition.net.encoder = Oracle(video.centres)
    frames = torch.arange(120.0).reshape(120, 1, 1, 1)
    scores = evaluate_dynamics(model, frames, video.centres, num_train)
    assert scores.velocity_r2 > 0.95
    step = (video.centres[num_train:] - video.centres[num_train - 1:-1]).norm(dim=-1).mean()
    assert scores.baseline_forecast_error_px == pytest.approx(step.item(), rel=1e-12)
    assert scores.baseline_forecast_error_px == pytest.approx(5.0, rel=1e-6)
    assert scores.forecast_error_px < 0.85 * scores.baseline_forecast_error_px

    prior = model.prior
    sigma = model.recognition.net.log_scale.exp().detach()
    r_cov = prior.observation_scale_tril @ prior.observation_scale_tril.T + torch.diag(sigma ** 2)
    targets = video.centres.flatten(1)
    decoder = fit_linear_decoder(targets[:num_train], targets[:num_train])
    for t in (num_train, num_train + 7, 119):
        learned = prior.distribution(t)
        chain = GaussianStateSpace(learned.init_loc, learned.init_scale_tril,
                                   learned.transition_matrix, learned.transition_scale_tril,
                                   learned.observation_matrix, torch.linalg.cholesky(r_cov),
                                   duration=t, observation_offset=learned.observation_offset)
        latent = chain.forecast(targets[:t], 1).loc[0].detach()
        decoded = torch.cat([latent, torch.ones(1)]) @ decoder
        assert torch.allclose(scores.forecast[t - num_train].flatten(), decoded, atol=1e-8)


@pytest.mark.slow
def test_tiny_run_writes_the_dynamics_scores(tmp_path):
    status = main([
        "bouncing-balls", "--prior", "state-space", "--out", str(tmp_path), "--frames", "48",
        "--test-frames", "16", "--state-space-steps", "4", "--batch-size", "15", "--image-size", "16",
        "--ball-diameter", "3", "--hidden-channels", "4", "--eval-every", "0",
        "--checkpoint-every", "0", "--no-progress", "--device", "cpu", "--window", "4",
    ])
    assert status == 0
    result = json.loads((tmp_path / "results.json").read_text())["priors"]["state-space"]
    for key in ("r2", "pixel_error", "velocity_r2", "forecast_error_px",
                "baseline_forecast_error_px"):
        assert np.isfinite(result[key]), key
    assert result["baseline_forecast_error_px"] == pytest.approx(3.0, rel=1e-5)
    assert result["prior_parameters"]["window"] == 4
    assert np.asarray(result["prior_parameters"]["transition_matrix"]).shape == (12, 12)
    assert (tmp_path / "forecast.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_run_stopped_by_its_convergence_rule_says_so(tmp_path, capsys):
    status = main([
        "bouncing-balls", "--prior", "state-space", "--out", str(tmp_path), "--frames", "48",
        "--test-frames", "16", "--state-space-steps", "40", "--batch-size", "15",
        "--image-size", "16", "--ball-diameter", "3", "--hidden-channels", "4", "--eval-every", "5",
        "--checkpoint-every", "0", "--no-progress", "--device", "cpu", "--window", "4",
        "--stop-window", "5", "--stop-tolerance", "100",
    ])
    assert status == 0
    result = json.loads((tmp_path / "results.json").read_text())["priors"]["state-space"]
    # the rule compares the mean loss of the last 5 steps with the 5 before: first at step 10
    assert result["stopped"]["step"] == result["steps"] == 10
    assert f"stopped: {result['stopped']['reason']}" in capsys.readouterr().out


def dense_joint(model, num_frames: int):
    """The model's chain over ``num_frames`` frames written out densely (numpy float64) from its
    equations: the states' mean (F H,) and covariance (F H, F H), the block-diagonal emission
    (F D, F H), the means' noise covariance (F D, F D: R R^T plus the recognition variance) and
    the offset b (D,); the recognition means are z = big_c s + b + noise."""
    prior = model.prior.distribution(num_frames)
    m1, S1, A, Q, C, R, b = (t.detach().numpy() for t in (
        prior.init_loc, prior.init_scale_tril, prior.transition_matrix,
        prior.transition_scale_tril, prior.observation_matrix, prior.observation_scale_tril,
        prior.observation_offset))
    sigma = model.recognition.net.log_scale.exp().detach().numpy()
    H, F = A.shape[0], num_frames
    # s = mean + L (s_1 noise, w_1, ..., w_{F-1}): s_t = A^{t-1} s_1 + sum_{u<t} A^{t-1-u} w_u
    mean = np.concatenate([np.linalg.matrix_power(A, t) @ m1 for t in range(F)])
    L = np.zeros((F * H, F * H))
    for t in range(F):
        for u in range(t + 1):
            L[t * H:(t + 1) * H, u * H:(u + 1) * H] = np.linalg.matrix_power(A, t - u) @ (
                S1 if u == 0 else Q)
    return (mean, L @ L.T, np.kron(np.eye(F), C), np.kron(np.eye(F), R @ R.T + np.diag(sigma ** 2)),
            b)


@pytest.mark.parametrize("kind", ["stationary", "free"])
def test_smoothed_position_scores_against_dense_gaussian_conditioning(kind):
    """The smoothed read-out C E[s_t | mu_{1:F}] equals the posterior mean of the joint Gaussian
    of all states and recognition means (conditioned densely, numpy float64); its R^2 and pixel
    error are those of the affine decoder fitted on the training frames."""
    torch.set_default_dtype(torch.float64)
    num_frames, num_train = 36, 28
    video = generate_bouncing_balls(num_frames, seed=2, dtype=torch.float64)
    noisy = video.centres + 0.8 * torch.randn(video.centres.shape,
                                              generator=torch.Generator().manual_seed(0))
    model = build_state_space_model(ARGS, 3, 3, kind=kind)
    model.recognition.net.encoder = Oracle(noisy)
    frames = torch.arange(float(num_frames)).reshape(num_frames, 1, 1, 1)
    scores = evaluate_dynamics(model, frames, video.centres, num_train)

    mean, cov_s, big_c, noise, b = dense_joint(model, num_frames)
    F, D = num_frames, b.shape[0]
    mu = noisy.flatten(1).numpy().reshape(-1) - np.tile(b, F)  # z_t - b = C s_t + v_t
    gain = cov_s @ big_c.T @ np.linalg.inv(big_c @ cov_s @ big_c.T + noise)
    latent = (big_c @ (mean + gain @ (mu - big_c @ mean))).reshape(F, D) + b

    targets = video.centres.flatten(1).numpy()
    design = np.concatenate([latent, np.ones((F, 1))], 1)
    coef = np.linalg.lstsq(design[:num_train], targets[:num_train], rcond=None)[0]
    residual = targets[num_train:] - design[num_train:] @ coef
    test = targets[num_train:]
    r2 = 1 - (residual ** 2).sum(0) / ((test - test.mean(0)) ** 2).sum(0)
    error = np.linalg.norm(residual.reshape(-1, 3, 2), axis=-1).mean()
    assert scores.smoothed_r2 == pytest.approx(r2.mean(), rel=1e-8)
    assert scores.smoothed_pixel_error == pytest.approx(error, rel=1e-8)


def _history(losses, window_steps=10):
    """A trainer history whose loss windows of ``window_steps`` steps have the given means."""
    return {"losses": [[window_steps * (i + 1), m] for i, m in enumerate(losses)],
            "evaluations": [{"step": window_steps * len(losses)}]}


def test_convergence_rule_compares_the_mean_loss_of_two_windows():
    # 20 windows of 10 steps: the last 100 steps average 1.0, the 100 before 1.0 + delta
    for delta, stops in ((0.02, False), (-0.02, False), (0.005, True), (-0.005, True)):
        losses = [5.0] * 4 + [1.0 + delta + 0.3 * (-1) ** i for i in range(10)] + [
            1.0 + 0.2 * (-1) ** i for i in range(10)]
        reason = converged(_history(losses), window=100, tolerance=0.01)
        assert (reason is not None) == stops, (delta, reason)
    assert converged(_history([1.0] * 19), window=100, tolerance=0.01) is None  # step 190 < 200
    assert converged(_history([1.0] * 30), window=100, tolerance=0.0) is None  # 0: never
    # windows of 10 steps weighted by their length when they straddle the split (step 250)
    losses = [2.0] * 5 + [1.0] * 20
    assert converged(_history(losses), window=100, tolerance=0.01) is not None
    assert converged(_history([2.0] * 14 + [1.0] * 11), window=100, tolerance=0.01) is None


def test_pinned_emission_keeps_c_and_r_through_training_and_resume(tmp_path, capsys):
    flags = ["bouncing-balls", "--prior", "state-space", "--out", str(tmp_path), "--frames", "48",
             "--test-frames", "16", "--state-space-steps", "3", "--batch-size", "15",
             "--image-size", "16", "--ball-diameter", "3", "--hidden-channels", "4",
             "--eval-every", "0", "--checkpoint-every", "0", "--no-progress", "--device", "cpu",
             "--window", "4", "--eval-drop-frames", "0", "--state-space-emission", "pinned"]
    assert main(flags) == 0
    args = argparse.Namespace(hidden_channels=4, state_space_noise=0.15, ball_diameter=3.0,
                              image_size=16, state_space_emission_noise=0.05)  # the defaults
    start = build_state_space_model(args, 3, 3, emission="pinned").prior
    assert torch.allclose(start.observation_scale_tril, 0.05 * torch.eye(6))
    learned = build_state_space_model(args, 3, 3).prior
    assert {name for name, _ in start.named_parameters()} == {"transition_weight", "observation_offset"}
    assert start.observation_matrix.shape == learned.observation_matrix.shape
    assert torch.equal(start.observation_matrix, learned.observation_matrix)  # the same start

    def saved():
        state = torch.load(tmp_path / "state-space" / "checkpoint.pt", weights_only=True)["state"]
        return {key.split("prior.")[-1]: value for key, value in state["module"].items()
                if key.startswith("prior.")}, state["step"]

    prior, step = saved()
    assert step == 3
    assert torch.equal(prior["observation_matrix"], start.observation_matrix)
    assert torch.equal(prior["observation_scale_tril"], start.observation_scale_tril)
    assert not torch.equal(prior["transition_weight"], start.transition_weight)  # learned
    result = json.loads((tmp_path / "results.json").read_text())["priors"]["state-space"]
    assert np.allclose(result["prior_parameters"]["observation_matrix"], start.observation_matrix)
    # --resume with more steps reloads the pinned buffers and keeps them
    assert main(["bouncing-balls", "--out", str(tmp_path), "--resume", "--state-space-steps", "5",
                 "--no-progress"]) == 0
    prior, step = saved()
    assert step == 5
    assert torch.equal(prior["observation_matrix"], start.observation_matrix)
    assert torch.equal(prior["observation_scale_tril"], start.observation_scale_tril)
    # the free prior has no such switch
    capsys.readouterr()
    assert main([*flags[:4], str(tmp_path / "free"), *flags[5:], "--state-space-prior", "free"]) == 2
    assert "--state-space-emission" in capsys.readouterr().err


def test_prior_learning_rate_halves_every_halflife_and_the_encoder_rate_stays():
    from rpm.experiments.bouncing_balls import command

    args = argparse.Namespace(hidden_channels=4, state_space_noise=0.15, ball_diameter=3.0,
                              image_size=16, lr=1e-2, prior_lr=1e-3, optimizer="adam",
                              prior_lr_halflife=4.0)
    model = build_state_space_model(args, 3, 3, emission="pinned")
    optimizer = command._optimizer(args, model)
    scheduler = command._scheduler(args, optimizer, model)
    for step in range(1, 11):
        optimizer.step()
        scheduler.step()
        assert optimizer.param_groups[0]["lr"] == 1e-2
        assert optimizer.param_groups[1]["lr"] == pytest.approx(1e-3 * 2.0 ** (-step / 4.0), rel=1e-12)
    # the schedule resumes from its state: a fresh scheduler at the saved step
    fresh = command._scheduler(args, command._optimizer(args, model), model)
    fresh.load_state_dict(scheduler.state_dict())
    assert fresh.get_last_lr() == scheduler.get_last_lr()
    assert command._scheduler(argparse.Namespace(**{**vars(args), "prior_lr_halflife": 0.0}),
                              optimizer, model) is None
    with pytest.raises(ValueError, match="halflife"):
        command.HalvingRate(0.0)
