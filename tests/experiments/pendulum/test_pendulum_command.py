"""``rpm pendulum``: the encoder, the command-line checks and a short end-to-end run at toy
size (with distractors)."""

import json

import pytest
import torch

from rpm.cli import main
from rpm.data.missing import drop_frames
from rpm.data.pendulum import generate_pendulum
from rpm.experiments.lds.evaluate import affine_fit, forecast_errors, infer_states
from rpm.experiments.lds.model import build_sequence_model
from rpm.experiments.pendulum.missing_frames import evaluate_missing_frames
from rpm.experiments.pendulum.model import GaussianConvEncoder, GaussianKeypointEncoder
from rpm.experiments.pendulum.readout import knn_heldout_r2

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
    (["--drop-frames", "1"], "fraction of frames in [0, 1)"),
    (["--encoder", "flat", "--hidden", "0"], "needs a hidden layer"),
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
            "--encoder", "flat", "--prior", "free"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    results = json.loads((out / "results.json").read_text())
    for key in ("r2", "r2_per_coordinate", "means_r2", "forecast_error", "var_forecast_error",
                "forecast_baseline", "eigenvalues", "untrained", "wall_time"):
        assert key in results
    assert set(results["r2_per_coordinate"]) == {"sin_theta", "cos_theta", "omega"}
    assert set(results["forecast_error"]) == set(results["var_forecast_error"]) == {"1", "10"}
    assert results["config"]["distractors"] == "iid"  # the bare flag
    assert "distractor_r2" not in results  # only moving distractors have a state to read out
    assert len(results["eigenvalues"]) == 5  # H = --state-dim
    assert (out / "pendulum.png").stat().st_size > 0 and (out / "training.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["pendulum", "--resume", "--out", str(out), "--no-progress"]) == 0
    assert "finished earlier (4/4 steps), reloaded" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["r2"] == results["r2"]


def test_moving_distractors_run_at_toy_size_and_read_out_their_own_state(tmp_path):
    argv = ["--distractors", "moving", "--steps", "2", "--sequences", "5", "--test-sequences",
            "2", "--length", "12", "--image-size", "12", "--batch-size", "2", "--window", "5",
            "--channels", "4", "--hidden", "8", "--eval-every", "2", "--checkpoint-every", "0",
            "--latent-dim", "2", "--state-dim", "4", "--encoder", "flat",
            "--eval-drop-frames", "0"]
    assert _run(tmp_path, *argv) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["config"]["distractors"] == "moving"
    assert set(results["r2_per_coordinate"]) == {"sin_theta", "cos_theta", "omega"}
    per_coordinate = results["distractor_r2_per_coordinate"]
    assert len(per_coordinate) == 8 and results["distractor_r2"] == pytest.approx(
        sum(per_coordinate.values()) / 8)
    assert results["floors"] == {"r2": 0.90}


def test_an_unknown_kind_of_distractors_exits_2(tmp_path, capsys):
    assert _run(tmp_path, "--distractors", "waving") == 2
    assert "invalid choice: 'waving'" in capsys.readouterr().err


# --------------------------------------------------------------------------- keypoint encoder
def test_the_command_offers_every_encoder():
    from rpm.experiments.pendulum import command, model

    assert command.ENCODERS == model.ENCODERS


@pytest.mark.parametrize("size", [8, 21])
def test_keypoint_encoder_shapes_and_constant_noise(size):
    encoder = GaussianKeypointEncoder(out_dim=5, channels=4, keypoints=3, hidden=6, noise=0.2)
    loc, scale = encoder(torch.randn(7, 1, size, size))
    assert loc.shape == scale.shape == (7, 5)
    assert encoder.keypoints(torch.randn(7, 1, size, size)).shape == (7, 6)
    torch.testing.assert_close(scale, torch.full((7, 5), 0.2))
    assert "log_scale" not in dict(encoder.named_parameters())


def test_keypoints_are_the_soft_argmax_in_pixel_centre_coordinates():
    # maps = 40 x the frame: the softmax puts weight 1 - O(S^2 e^-40) on the one bright pixel,
    # whose centre is ((2 (j + 1/2) / S - 1), (2 (i + 1/2) / S - 1)) (column j, row i)
    size, row, column = 12, 3, 8
    encoder = GaussianKeypointEncoder(out_dim=2, keypoints=2)
    encoder.maps = torch.nn.Conv2d(1, 2, 1)
    with torch.no_grad():
        encoder.maps.weight.fill_(40.0)
        encoder.maps.bias.zero_()
    frame = torch.zeros(1, 1, size, size)
    frame[0, 0, row, column] = 1.0
    x, y = 2 * (column + 0.5) / size - 1, 2 * (row + 0.5) / size - 1
    torch.testing.assert_close(encoder.keypoints(frame), torch.tensor([[x, y, x, y]]),
                               atol=1e-6, rtol=0)  # float32


def test_untrained_keypoints_carry_the_angle_linearly():
    # the claim of the module docstring: the soft-argmax of (random) maps of a pendulum frame
    # sits on the pendulum, so (sin theta, cos theta) is affine in the points from the start
    videos = generate_pendulum(6, 20, image_size=16, noise=0.0, seed=1)
    encoder = GaussianKeypointEncoder(out_dim=2, channels=4, keypoints=4)
    with torch.no_grad():
        points = encoder.keypoints(videos.frames.flatten(0, 1)).double()  # (120, 8)
    target = videos.states.flatten(0, 1)[:, :2]
    design = torch.cat([points, torch.ones(len(points), 1, dtype=torch.float64)], 1)
    fitted = design @ torch.linalg.lstsq(design, target).solution
    r2 = 1 - (fitted - target).square().sum(0) / (target - target.mean(0)).square().sum(0)
    assert (r2 > 0.9).all(), r2
    flat = GaussianConvEncoder(16, out_dim=8, channels=4, hidden=8)
    with torch.no_grad():
        means = flat(videos.frames.flatten(0, 1))[0].double()
    design = torch.cat([means, torch.ones(len(means), 1, dtype=torch.float64)], 1)
    fitted = design @ torch.linalg.lstsq(design, target).solution
    flat_r2 = 1 - (fitted - target).square().sum(0) / (target - target.mean(0)).square().sum(0)
    assert (flat_r2 < r2).all(), (flat_r2, r2)


# --------------------------------------------------------------------------- missing frames
def _dense_smoother(params, loc, scale, observed):
    """E[s_{1:T} | mu_t, t observed] by conditioning the joint Gaussian (float64, no filter)."""
    a, q = params["transition_matrix"], params["transition_scale_tril"]
    c, r = params["observation_matrix"], params["observation_scale_tril"]
    b, m1, s1 = params["observation_offset"], params["init_loc"], params["init_scale_tril"]
    length, hidden = loc.shape[0], a.shape[0]
    means, covs = [m1], [s1 @ s1.T]
    for _ in range(length - 1):
        means.append(a @ means[-1])
        covs.append(a @ covs[-1] @ a.T + q @ q.T)
    joint = torch.zeros(length * hidden, length * hidden, dtype=torch.float64)
    for t in range(length):
        for u in range(t + 1):
            block = torch.linalg.matrix_power(a, t - u) @ covs[u]  # Cov(s_t, s_u)
            joint[t * hidden:(t + 1) * hidden, u * hidden:(u + 1) * hidden] = block
            joint[u * hidden:(u + 1) * hidden, t * hidden:(t + 1) * hidden] = block.T
    rows = [t for t in range(length) if observed[t]]
    big_c = torch.zeros(len(rows) * c.shape[0], length * hidden, dtype=torch.float64)
    noise = torch.zeros(len(rows) * c.shape[0], len(rows) * c.shape[0], dtype=torch.float64)
    for k, t in enumerate(rows):
        d = c.shape[0]
        big_c[k * d:(k + 1) * d, t * hidden:(t + 1) * hidden] = c
        noise[k * d:(k + 1) * d, k * d:(k + 1) * d] = r @ r.T + torch.diag(scale[t] ** 2)
    prior_mean = torch.cat(means)
    residual = torch.cat([loc[t] - c @ means[t] - b for t in rows])
    gain = joint @ big_c.T @ torch.linalg.inv(big_c @ joint @ big_c.T + noise)
    return (prior_mean + gain @ residual).reshape(length, hidden)


def test_missing_frames_read_outs_against_dense_gaussian_conditioning():
    videos = generate_pendulum(5, 9, image_size=12, noise=0.05, seed=2)
    encoder = GaussianKeypointEncoder(out_dim=2, channels=3, keypoints=2)
    model = build_sequence_model(encoder, 2, 3, prior="stationary")
    frames, states = videos.frames, videos.states
    scores = evaluate_missing_frames(model, frames, states, num_train=3, fraction=0.4, seed=5)
    # the same mask, read-outs recomputed from the dense conditional of each held-out video
    mask = torch.ones(5, 9, dtype=torch.bool)
    mask[3:] = drop_frames((2, 9), 0.4, torch.Generator().manual_seed(5))
    assert scores["dropped_frames"] == int((~mask).sum()) > 0
    full = infer_states(model, frames)
    chain = model.prior.distribution(9)
    params = {name: getattr(chain, name).detach().double() for name in chain.arg_constraints}
    coef = affine_fit(full.smoothed[:3].flatten(0, 1), states[:3].flatten(0, 1))
    imputed, seen, truth = [], [], []
    for n in (3, 4):
        smoothed = _dense_smoother(params, full.means[n], encoder.log_scale.exp().double()
                                   .expand(9, 2), mask[n])
        torch.testing.assert_close(smoothed, infer_states(model, frames[n:n + 1],
                                                          mask=mask[n:n + 1]).smoothed[0])
        dropped = ~mask[n]
        imputed.append(smoothed[dropped] @ coef[:-1] + coef[-1])
        seen.append(full.smoothed[n][dropped] @ coef[:-1] + coef[-1])
        truth.append(states[n][dropped])
    truth = torch.cat(truth)
    rmse = (torch.cat(imputed) - truth).square().mean().sqrt().item()
    assert scores["imputation_error"] == pytest.approx(rmse, rel=1e-9)
    rmse = (torch.cat(seen) - truth).square().mean().sqrt().item()
    assert scores["observed_error"] == pytest.approx(rmse, rel=1e-9)
    # with nothing dropped the forecasts are the run's one-step forecasts
    none = evaluate_missing_frames(model, frames, states, num_train=3, fraction=0.0)
    assert none["dropped_frames"] == 0
    expected = forecast_errors(full, states, 3, horizons=(1,))["model"]["1"]
    assert none["forecast_error"] == pytest.approx(expected, rel=1e-9)
    assert none["full_forecast_error"] == pytest.approx(expected, rel=1e-9)


def test_end_to_end_run_with_dropped_frames_scores_forecasts_and_imputations(tmp_path):
    argv = ["--steps", "3", "--sequences", "5", "--test-sequences", "3", "--length", "12",
            "--image-size", "12", "--batch-size", "3", "--window", "6", "--channels", "3",
            "--keypoints", "2", "--latent-dim", "2", "--eval-every", "0",
            "--checkpoint-every", "0", "--drop-frames", "0.25", "--eval-drop-frames", "0.5"]
    assert _run(tmp_path, *argv) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["config"]["encoder"] == "keypoints"
    assert results["config"]["prior"] == "stationary"
    assert len(results["eigenvalues"]) == 6  # H = 3D by default
    missing = results["missing_frames"]
    assert missing["fraction"] == 0.5 and missing["trained_with_fraction"] == 0.25
    assert 0 < missing["dropped_frames"] < 3 * 12
    for key in ("forecast_error", "full_forecast_error", "imputation_error", "observed_error"):
        assert 0 < missing[key] < float("inf")
    assert set(results["knn_r2_per_coordinate"]) == {"sin_theta", "cos_theta", "omega"}
    assert results["knn_r2"] <= 1
    assert missing["full_forecast_error"] == pytest.approx(results["forecast_error"]["1"])


def test_knn_read_out_against_a_brute_force_loop():
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(4, 6, 3, generator=generator, dtype=torch.float64)
    states = torch.stack([latents[..., 0].sin(), latents[..., 1] * latents[..., 2]], -1)
    r2 = knn_heldout_r2(states, latents, num_train=3, k=4)
    train_x, train_y = latents[:3].flatten(0, 1), states[:3].flatten(0, 1)
    mean, std = train_x.mean(0), train_x.std(0)
    residual, total = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    test_y = states[3]
    for t in range(6):
        distance = (((latents[3, t] - mean) / std - (train_x - mean) / std) ** 2).sum(-1)
        nearest = distance.argsort()[:4]
        residual += (test_y[t] - train_y[nearest].mean(0)) ** 2
    total = ((test_y - test_y.mean(0)) ** 2).sum(0)
    torch.testing.assert_close(r2, 1 - residual / total)
    # a read-out of the latents themselves is exact with one neighbour of identical copies
    copies = torch.cat([latents[:3], latents[:1]])
    assert knn_heldout_r2(copies, copies, num_train=3, k=1).tolist() == pytest.approx([1.0] * 3)


def _keypoint_means(weights: dict, x: torch.Tensor) -> torch.Tensor:
    """The keypoint encoder's means written out in float64 from its weights: the three
    convolutions, a softmax over each map's pixels, the centres of mass at pixel-centre
    coordinates in (-1, 1), interleaved (x_1, y_1, ...), then the affine map."""
    w = {key[len("recognition.net."):]: value.double() for key, value in weights.items()
         if key.startswith("recognition.net.")}
    h = torch.relu(torch.nn.functional.conv2d(x, w["maps.0.weight"], w["maps.0.bias"], padding=2))
    h = torch.relu(torch.nn.functional.conv2d(h, w["maps.2.weight"], w["maps.2.bias"], padding=1))
    logits = torch.nn.functional.conv2d(h, w["maps.4.weight"], w["maps.4.bias"])  # (M, K, S, S)
    m, k, s, _ = logits.shape
    p = logits.reshape(m, k, s * s).softmax(-1).reshape(m, k, s, s)
    grid = 2 * (torch.arange(s, dtype=torch.float64) + 0.5) / s - 1
    points = torch.stack([(p.sum(2) * grid).sum(-1), (p.sum(3) * grid).sum(-1)], -1).reshape(m, 2 * k)
    return points @ w["linear.weight"].T + w["linear.bias"]


def test_rpm_load_gives_the_trained_model_in_eval_mode(tmp_path):
    """``rpm.load`` of a toy run: an RPM over sequences in eval mode with the run's configuration; its
    means of new videos are the keypoint encoder written out from the checkpoint's weights,
    and its smoothed latents give the run's own held-out R^2."""
    import rpm
    from rpm.experiments.common import derived_seed
    from rpm.experiments.lds.evaluate import heldout_r2
    from rpm.training.checkpoint import load_checkpoint

    argv = ["--steps", "3", "--sequences", "4", "--test-sequences", "2", "--length", "12",
            "--image-size", "10", "--batch-size", "2", "--window", "4", "--channels", "3",
            "--keypoints", "2", "--latent-dim", "2", "--eval-every", "0",
            "--checkpoint-every", "0", "--eval-drop-frames", "0"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    model = rpm.load(out)
    assert isinstance(model, rpm.RPM) and not model.training
    assert model.config["image_size"] == 10 and model.trained["step"] == 3
    weights = load_checkpoint(out / "rpm" / "checkpoint.pt")["module"]
    x = torch.rand(2, 5, 1, 10, 10)  # new videos, (N, T, 1, S, S)
    with torch.no_grad():
        z = model.encode_views(x)
    assert z.shape == (2, 5, 2)
    expected = _keypoint_means(weights, x.double().flatten(0, 1)).reshape(2, 5, 2)
    torch.testing.assert_close(z.double(), expected, atol=1e-5, rtol=1e-5)
    videos = generate_pendulum(6, 12, 10, 0.05, False, seed=derived_seed(0, "data"))
    smoothed = infer_states(model, videos.frames).smoothed
    results = json.loads((out / "results.json").read_text())
    assert heldout_r2(videos.states, smoothed, 4).mean().item() == results["r2"]
