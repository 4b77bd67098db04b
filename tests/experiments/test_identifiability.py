"""``rpm identifiability``: the data stream, the energies' temperature, the
learning-rate schedule, the command-line checks and short end-to-end runs."""

import json
import math

import pytest
import torch

from rpm.cli import main
from rpm.data.synthetic import InvertibleMLP, LatentProcess
from rpm.experiments.identifiability.data import PairStream, held_out_set
from rpm.experiments.identifiability.model import (
    ENERGIES,
    build_energy,
    build_rpm,
    energy_parameters,
)
from rpm.experiments.identifiability.train import (
    _concentration_report,
    cosine_schedule,
    oracle_concentrations,
)
from rpm.priors import AnisotropicEnergy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------- data


def _stream(chunk_steps=4, batch_size=8, seed=3, kappa=5.0):
    process = LatentProcess(dim=4, space="sphere", conditional="vmf", conditional_param=kappa)
    mixing = InvertibleMLP(4, seed=1)
    return PairStream(process, mixing, batch_size, seed, chunk_steps), mixing


def test_pair_stream_is_a_pure_function_of_the_step():
    """A fresh stream (a resumed run) gives the minibatch of any step exactly, whatever steps
    were drawn before; different steps give different pairs."""
    stream, _ = _stream()
    sequence = [stream(step) for step in range(10)]
    fresh, _ = _stream()
    for step in (9, 2, 5, 4):  # out of order, across chunk boundaries
        x, x2 = fresh(step)
        assert torch.equal(x, sequence[step][0]) and torch.equal(x2, sequence[step][1])
    assert not torch.equal(sequence[3][0], sequence[4][0])
    other_seed = PairStream(stream.process, stream.mixing, 8, seed=4, chunk_steps=4)
    assert not torch.equal(other_seed(0)[0], sequence[0][0])


def test_pair_stream_observes_the_mixed_vmf_pairs():
    """x = g(z) and x' = g(z') for the recomputed latents; the positives follow vMF(z, kappa):
    E[z^T z'] = A_4(kappa) = I_2(kappa) / I_1(kappa) (Monte Carlo, 4 standard errors)."""
    from scipy.special import iv

    kappa = 5.0
    stream, mixing = _stream(chunk_steps=2, batch_size=4000, kappa=kappa)
    x, x2 = stream(1)
    z, z2 = stream.latents(1)
    torch.testing.assert_close(x, mixing(z))
    torch.testing.assert_close(x2, mixing(z2))
    cosine = (z * z2).sum(-1).double()
    expected = iv(2, kappa) / iv(1, kappa)
    assert abs(cosine.mean().item() - expected) < 4 * cosine.std().item() / math.sqrt(4000)


def test_held_out_set_is_fresh_and_reproducible():
    process = LatentProcess(dim=3, space="box", conditional="laplace")
    mixing = InvertibleMLP(3, seed=0)
    z, x = held_out_set(process, mixing, 100, seed=11)
    z_again, _ = held_out_set(process, mixing, 100, seed=11)
    z_other, _ = held_out_set(process, mixing, 100, seed=12)
    assert torch.equal(z, z_again) and not torch.equal(z, z_other)
    torch.testing.assert_close(x, mixing(z))
    assert z.abs().max() <= 1.0


# --------------------------------------------------------------------------- model


@pytest.mark.parametrize("name", ENERGIES)
def test_energies_have_scale_one_over_tau(name):
    """Each energy at temperature tau against its formula written out (module table)."""
    torch.set_default_dtype(torch.float64)
    z, z2 = torch.randn(5, 3), torch.randn(6, 3)
    tau = 0.25
    energy = build_energy(name, 3, tau=tau, p=1.0)
    zn = z / z.norm(dim=-1, keepdim=True)
    z2n = z2 / z2.norm(dim=-1, keepdim=True)
    expected = torch.empty(5, 6)
    for i in range(5):
        for j in range(6):
            if name == "cosine":
                expected[i, j] = (zn[i] @ z2n[j]) / tau
            elif name == "anisotropic":
                expected[i, j] = -0.5 * ((zn[i] - z2n[j]) ** 2).sum() / tau
            elif name == "lp":
                expected[i, j] = -(z[i] - z2[j]).abs().sum() / tau
            elif name == "rbf":
                expected[i, j] = -((z[i] - z2[j]) ** 2).sum() / tau
            else:
                expected[i, j] = (z[i] @ z2[j]) / tau
    torch.testing.assert_close(energy(z, z2), expected)
    assert isinstance(energy_parameters(energy), dict) and energy_parameters(energy)


def test_cosine_schedule_matches_warmup_and_cosine():
    factor = cosine_schedule(100, 0.1)
    assert [factor(s) for s in range(10)] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factor(10) == pytest.approx(1.0)
    assert factor(55) == pytest.approx(0.5)
    assert factor(99) == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))
    values = [factor(s) for s in range(10, 100)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert cosine_schedule(10, 0.0)(0) == pytest.approx(1.0)


# --------------------------------------------------------------------------- command line


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["identifiability", "--out", str(tmp_path / name), "--no-progress",
                     "--device", "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "1"], "batch size >= 2"),
    (["--steps", "0"], "positive integer"),
    (["--tau", "-1"], "positive number"),
    (["--energy", "cosine", "--compare-energies", "cosine,lp"], "exclude each other"),
    (["--compare-energies", "cosine,cosine"], "distinct energies"),
    (["--p", "2"], "--p is the exponent of the lp energy"),
    (["--space", "box"], "vmf"),
    (["--marginal-param", "2"], "marginal"),
    (["--concentrations", "5,25"], "--conditional anisotropic"),
    (["--conditional", "anisotropic", "--concentrations", "1,2,3,4"], "concentrations"),
    (["--eval-samples", "9"], "--eval-samples"),
    (["--energy", "neural"], "invalid choice"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_end_to_end_run_writes_results_and_beats_the_untrained_encoder(tmp_path, capsys):
    """150 steps on 3 latents (vMF kappa = 10): results.json with the environment and the run's
    test scores, trajectories and wall time; the PNG; a weights-only checkpoint in the energy's
    subfolder; R^2 above the untrained encoder's and the identity's; --resume of the finished
    run reloads it (one line, no bar) and reproduces the scores; more --steps extend it."""
    argv = ["--dim", "3", "--conditional-param", "10", "--steps", "150", "--batch-size", "128",
            "--hidden", "32", "--depth", "2", "--lr", "3e-3", "--eval-every", "50",
            "--eval-samples", "2000", "--checkpoint-every", "0"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    summary = json.loads((out / "results.json").read_text())
    assert {"config", "environment", "runs", "wall_time", "held_out_sets"} <= set(summary)
    assert summary["environment"]["device"] == "cpu" and summary["environment"]["world_size"] == 1
    assert summary["config"]["steps"] == 150 and summary["config"]["dim"] == 3
    results = summary["runs"]["cosine"]
    assert (out / "trajectories.png").stat().st_size > 0
    state = torch.load(out / "cosine" / "checkpoint.pt", weights_only=True)["state"]
    assert state["step"] == 150
    for key in ("r2", "mcc", "trajectory", "baseline", "time_to_r2"):
        assert key in results
    assert isinstance(results["r2"], float) and isinstance(results["mcc"], float)
    assert results["trajectory"]["step"] == [0, 50, 100, 150]
    assert len(results["r2_per_dimension"]) == 3
    untrained = results["baseline"]["untrained"]["r2"]
    identity = results["baseline"]["identity"]["r2"]
    assert results["r2"] > untrained + 0.1 and results["r2"] > identity
    capsys.readouterr()
    assert main(["identifiability", "--resume", "--out", str(out)]) == 0  # no other flag
    printed = capsys.readouterr()
    assert "cosine: finished earlier (150/150 steps), reloaded" in printed.out
    assert "it/s" not in printed.err  # no progress bar
    again = json.loads((out / "results.json").read_text())["runs"]["cosine"]
    assert again["r2"] == results["r2"] and again["mcc"] == results["mcc"]
    assert _run(tmp_path, "--resume", "--steps", "100") == 2
    assert "--steps: was 150, now 100 (it may only grow" in capsys.readouterr().err
    assert main(["identifiability", "--resume", "--out", str(out), "--steps", "200"]) == 0
    assert "cosine: resuming at step 150/200" in capsys.readouterr().out
    extended = json.loads((out / "results.json").read_text())
    assert extended["config"]["steps"] == 200
    assert extended["runs"]["cosine"]["trajectory"]["step"] == [0, 50, 100, 150, 200]


@pytest.mark.slow
def test_compare_energies_trains_each_on_the_same_data(tmp_path):
    """Two energies in their own subfolders from the same initialisation; comparison.png; the
    anisotropic run reports its learned concentrations matched to the true ones."""
    argv = ["--dim", "4", "--conditional", "anisotropic", "--concentrations", "5,25",
            "--compare-energies", "cosine,anisotropic", "--steps", "20", "--batch-size", "64",
            "--hidden", "16", "--depth", "1", "--eval-every", "0", "--eval-samples", "500",
            "--checkpoint-every", "0"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    results = json.loads((out / "results.json").read_text())
    assert (out / "comparison.png").stat().st_size > 0
    assert set(results["runs"]) == {"cosine", "anisotropic"}
    assert (out / "cosine" / "checkpoint.pt").is_file()
    assert (out / "anisotropic" / "checkpoint.pt").is_file()
    cosine, aniso = results["runs"]["cosine"], results["runs"]["anisotropic"]
    assert cosine["baseline"] == aniso["baseline"]  # same data and encoder initialisation
    assert aniso["concentration_true"] == [5.0, 5.0, 25.0, 25.0]
    assert len(aniso["concentration_matched"]) == 4
    assert aniso["group_ratio_true"] == pytest.approx(5.0)
    assert "concentration_matched" not in cosine


def test_concentration_report_matches_true_to_learned_dimensions():
    """Learned Lambda read through the MCC matching (true d -> recovered index[d]) and the
    ratio of group means, second half over first half, against the truth's."""
    report = _concentration_report({"concentration": [1.0, 2.0, 3.0, 4.0]},
                                   torch.tensor([3, 2, 1, 0]), torch.tensor([5.0, 5, 25, 25]))
    assert report["concentration_matched"] == [4.0, 3.0, 2.0, 1.0]
    assert report["group_ratio_true"] == pytest.approx(5.0)
    assert report["group_ratio_learned"] == pytest.approx(1.5 / 3.5)
    assert report["group_ratio_error"] == pytest.approx(abs(1.5 / 3.5 / 5.0 - 1.0))
    assert _concentration_report({"kappa": 1.0}, torch.tensor([0]), None) == {}


def test_oracle_concentrations_recover_the_box_precisions():
    """In the box with a uniform marginal, the optimal critic of the truncated anisotropic
    Gaussian conditional is exactly -(z'-z)^T Lambda (z'-z) / 2 plus a function of z, so the
    anisotropic energy fitted on the true latents recovers Lambda (here within 15%), from a
    start 2x off in both directions."""
    process = LatentProcess(dim=2, space="box", conditional="anisotropic",
                            concentrations=torch.tensor([20.0, 80.0]))
    # A trained RPM whose parameters have the same names must neither leak in nor change.
    trained = build_rpm(torch.nn.Identity(), AnisotropicEnergy(2, normalize=False, init=3.0))
    trained.model(torch.randn(8, 2), torch.randn(8, 2))
    fitted = oracle_concentrations(process, num_steps=250, batch_size=512, seed=0, lr=0.5,
                                   normalize=False, init=torch.tensor([40.0, 40.0]))
    assert fitted == pytest.approx([20.0, 80.0], rel=0.15)
    concentration = trained.prior.energy.concentration.detach()  # held in float64
    torch.testing.assert_close(concentration, torch.full((2,), 3.0, dtype=concentration.dtype))


@pytest.mark.slow
def test_benchmark_script_runs_every_setting_and_summarises(tmp_path, capsys):
    """benchmarks/identifiability.py at toy size: every setting, one seed, a summary with
    mean +- std."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "identifiability.py"
    spec = importlib.util.spec_from_file_location("identifiability_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    status = bench.main(["--seeds", "0", "--dim", "4", "--steps", "4", "--batch-size", "32",
                         "--hidden", "8", "--eval-every", "0", "--device", "cpu", "--threads",
                         "1", "--extra", "--eval-samples 200 --depth 1", "--out",
                         str(tmp_path)])
    assert status == 0
    summary = json.loads((tmp_path / "summary-sphere-box-aninfonce.json").read_text())
    assert set(summary) == {"sphere", "box", "aninfonce"}
    assert " +- " in summary["sphere"]["r2"] and " +- " in summary["box"]["mcc"]
    assert " +- " in summary["aninfonce"]["anisotropic"]["group_ratio_learned"]
