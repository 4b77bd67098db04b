"""``rpm lds``: the scores (against independent computations), the command-line checks and a
short end-to-end run at toy size."""

import itertools
import json

import numpy as np
import pytest
import torch

from rpm.cli import main
from rpm.data.lds import generate_lds
from rpm.experiments.lds.evaluate import eigenvalue_error, forecast_errors, heldout_r2, infer_states
from rpm.experiments.lds.model import GaussianMLPEncoder, build_sequence_model
from rpm.experiments.lds.train import sample_windows

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["lds", "--out", str(tmp_path / name), "--no-progress", "--device", "cpu",
                     "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def test_eigenvalue_error_is_the_best_matching_by_brute_force():
    """Against every permutation: the matching that minimises the summed absolute differences,
    and its largest difference; invariant to a change of basis of the learned matrix."""
    generator = torch.Generator().manual_seed(0)
    for dim in (2, 3, 5):
        learned = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        truth = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        a = np.linalg.eigvals(learned.numpy())
        b = np.linalg.eigvals(truth.numpy())
        best = min(itertools.permutations(range(dim)),
                   key=lambda p: sum(abs(a[i] - b[p[i]]) for i in range(dim)))
        expected = max(abs(a[i] - b[best[i]]) for i in range(dim))
        assert eigenvalue_error(learned, truth) == pytest.approx(expected, abs=1e-9)
        basis = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        similar = basis @ truth @ torch.linalg.inv(basis)
        assert eigenvalue_error(similar, truth) < 1e-8
    with pytest.raises(ValueError, match="square matrices"):
        eigenvalue_error(torch.eye(2), torch.eye(3))


def test_heldout_r2_fits_on_the_training_sequences_only():
    """A latent that is the state on the training sequences and noise on the held-out ones
    scores about 0 or below; an invertible affine map of the state scores 1."""
    generator = torch.Generator().manual_seed(1)
    states = torch.randn(10, 20, 2, generator=generator, dtype=torch.float64)
    mixed = states @ torch.tensor([[2.0, 1.0], [0.5, -1.0]], dtype=torch.float64) + 3.0
    torch.testing.assert_close(heldout_r2(states, mixed, 6), torch.ones(2, dtype=torch.float64))
    cheat = states.clone()
    cheat[6:] = torch.randn(4, 20, 2, generator=generator, dtype=torch.float64)
    assert heldout_r2(states, cheat, 6).max() < 0.2


def test_sample_windows_are_consecutive_frames_of_one_sequence_and_reproducible():
    sequences = torch.arange(5 * 12, dtype=torch.float64).reshape(5, 12, 1)  # frame id
    windows = sample_windows(sequences, 7, 4, seed=0, step=3)
    assert windows.shape == (7, 4, 1)
    steps = windows[:, 1:, 0] - windows[:, :-1, 0]
    assert torch.all(steps == 1)  # consecutive frames of one sequence
    assert torch.all(windows[:, 0, 0] // 12 == windows[:, -1, 0] // 12)
    assert torch.equal(windows, sample_windows(sequences, 7, 4, seed=0, step=3))
    assert not torch.equal(windows, sample_windows(sequences, 7, 4, seed=0, step=4))
    with pytest.raises(ValueError, match="window"):
        sample_windows(sequences, 7, 13, seed=0, step=0)


def _oracle_model(system, noise):
    """A model whose encoder is the least-squares inverse of C and whose prior is the true chain
    (in the encoder's units)."""
    state_dim, obs_dim = system.states.shape[-1], system.observations.shape[-1]
    encoder = GaussianMLPEncoder(obs_dim, state_dim, hidden=0, noise=noise).double()
    model = build_sequence_model(encoder, state_dim).double()
    with torch.no_grad():
        encoder.linear.weight.copy_(torch.linalg.pinv(system.observation_matrix))
        encoder.linear.bias.zero_()
        prior = model.prior
        prior.transition_matrix.copy_(system.transition_matrix)
        prior.init_loc.zero_()
        prior.init_scale_tril = torch.eye(state_dim, dtype=torch.float64)
        prior.transition_scale_tril = torch.linalg.cholesky(system.process_covariance)
        prior.observation_matrix.copy_(torch.eye(state_dim, dtype=torch.float64))
        prior.observation_scale_tril = 1e-3 * torch.eye(state_dim, dtype=torch.float64)
    return model


def test_smoothed_latents_and_forecasts_of_the_true_model():
    """With the true chain and the least-squares encoder: the smoothed latents beat the means,
    the eigenvalue error is 0, and the 1-step forecast of A E[s_t | mu_{1:t}] matches its closed
    form error sqrt(tr(A P A^T + Q) / H) within Monte Carlo error; 10 steps ahead the error
    approaches the state's standard deviation 1."""
    system = generate_lds(60, 50, 3, 5, seed=2)
    noise = 0.1 * float(torch.linalg.svdvals(torch.linalg.pinv(system.observation_matrix))[0])
    model = _oracle_model(system, noise)
    inference = infer_states(model, system.observations)
    r2_smoothed = heldout_r2(system.states, inference.smoothed, 40).mean().item()
    r2_means = heldout_r2(system.states, inference.means, 40).mean().item()
    assert r2_smoothed > r2_means > 0.98
    assert eigenvalue_error(inference.transition_matrix, system.transition_matrix) < 1e-12
    errors = forecast_errors(inference, system.states, 40, horizons=(1, 10))
    a, q = system.transition_matrix, system.process_covariance
    filtered_cov = inference.filtered.filtered_scale_tril[..., -1, :, :]
    filtered_cov = (filtered_cov @ filtered_cov.transpose(-1, -2)).reshape(-1, 3, 3)[-1]
    one_step = torch.sqrt(torch.trace(a @ filtered_cov @ a.T + q) / 3).item()
    assert errors["model"]["1"] == pytest.approx(one_step, rel=0.1)
    assert errors["var"]["1"] == pytest.approx(one_step, rel=0.15)
    assert 0.7 < errors["model"]["10"] < 1.1


@pytest.mark.parametrize("argv, message", [
    (["--size", "huge"], "invalid choice"),
    (["--window", "1"], "at least 2 frames"),
    (["--window", "50", "--length", "20"], "longer than the sequences"),
    (["--steps", "0"], "positive integer"),
    (["--marginal", "both"], "invalid choice"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_end_to_end_run_writes_results_and_resumes(tmp_path, capsys):
    """A toy run: results.json with r2, eigenvalue_error and the forecasts, the figure, a
    checkpoint; --resume reloads it with the same scores and --steps may grow."""
    argv = ["--steps", "6", "--sequences", "12", "--test-sequences", "6", "--length", "20",
            "--batch-size", "4", "--window", "8", "--eval-every", "3", "--checkpoint-every", "0"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    results = json.loads((out / "results.json").read_text())
    for key in ("r2", "means_r2", "eigenvalue_error", "forecast_error", "var_forecast_error",
                "eigenvalues", "untrained", "train_seconds", "wall_time", "environment"):
        assert key in results
    assert set(results["forecast_error"]) == {"1", "10"}
    assert len(results["eigenvalues"]["true"]) == 3
    assert 0.0 < results["r2"] <= 1.0 and results["eigenvalue_error"] >= 0.0
    assert [e["step"] for e in results["history"]["evaluations"]] == [3, 6]
    assert (out / "dynamics.png").stat().st_size > 0 and (out / "training.png").stat().st_size > 0
    state = torch.load(out / "rpm" / "checkpoint.pt", weights_only=True)["state"]
    assert state["step"] == 6
    capsys.readouterr()
    assert main(["lds", "--resume", "--out", str(out), "--no-progress"]) == 0
    assert "finished earlier (6/6 steps), reloaded" in capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert again["r2"] == results["r2"] and again["eigenvalue_error"] == results["eigenvalue_error"]
    assert main(["lds", "--resume", "--out", str(out), "--no-progress", "--steps", "8"]) == 0
    assert "resuming at step 6/8" in capsys.readouterr().out


def test_marginal_flag_builds_its_estimate():
    """``rpm lds`` defaults to the moment-matched Gaussian marginal, ``rpm pendulum`` to the
    pooled mixture; each choice of ``--marginal`` builds the model with that estimate."""
    import rpm
    from rpm.cli import build_parser
    from rpm.marginals import MomentMatchedMarginal, SequenceMixtureMarginal

    parser = build_parser()
    assert parser.parse_args(["lds"]).marginal == "gaussian"
    assert parser.parse_args(["pendulum"]).marginal == "pooled"
    assert parser.parse_args(["lds"]).prior_lr == 3e-2
    assert parser.parse_args(["pendulum"]).prior_lr == 1e-2
    x = torch.randn(3, 4, 5)
    expected = {"gaussian": (MomentMatchedMarginal, True), "pooled": (SequenceMixtureMarginal, True),
                "per-view": (SequenceMixtureMarginal, False)}
    for name, (kind, pooled) in expected.items():
        model = build_sequence_model(GaussianMLPEncoder(5, 2, hidden=0), 2, marginal=name)
        assert type(model) is rpm.RPM
        assert model.marginal_kind == ("gaussian" if name == "gaussian" else "mixture")
        marginal = model.marginal(model.recognise(x))
        assert type(marginal) is kind
        assert marginal.pooled == pooled
    with pytest.raises(ValueError, match="marginal"):
        build_sequence_model(GaussianMLPEncoder(5, 2, hidden=0), 2, marginal="mixture")


def test_rpm_load_gives_the_trained_model_in_eval_mode(tmp_path):
    """``rpm.load`` of a toy run: an RPM over sequences in eval mode with the run's configuration and
    every tensor of its checkpoint; its means of new sequences are the affine map of the
    checkpoint's weights, and its smoothed latents give the run's own held-out R^2."""
    import rpm
    from rpm.experiments.common import derived_seed
    from rpm.training.checkpoint import load_checkpoint

    argv = ["--steps", "4", "--sequences", "12", "--test-sequences", "6", "--length", "16",
            "--batch-size", "4", "--window", "8", "--eval-every", "0", "--checkpoint-every", "0"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    model = rpm.load(out, device=torch.device("cpu"))
    assert isinstance(model, rpm.RPM) and not model.training
    assert model.config == json.loads((out / "config.json").read_text())
    assert model.trained == {"command": "lds", "model": "rpm", "step": 4, "folder": str(out),
                             "input_shape": (5,)}
    weights = load_checkpoint(out / "rpm" / "checkpoint.pt")["module"]
    loaded = model.state_dict()
    assert set(loaded) == set(weights)
    assert all(torch.equal(loaded[key], weights[key]) for key in weights)
    x = torch.randn(3, 7, 5)  # new sequences of observations, (N, T, P)
    expected = (x.double() @ weights["recognition.net.linear.weight"].double().T
                + weights["recognition.net.linear.bias"].double())  # W x + c, affine encoder
    with torch.no_grad():
        torch.testing.assert_close(model.encode_views(x).double(), expected, atol=1e-5, rtol=1e-5)
    data = generate_lds(18, 16, 3, 5, seed=derived_seed(0, "data"))
    smoothed = infer_states(model, data.observations.float()).smoothed
    results = json.loads((out / "results.json").read_text())
    assert heldout_r2(data.states, smoothed, 12).mean().item() == results["r2"]
