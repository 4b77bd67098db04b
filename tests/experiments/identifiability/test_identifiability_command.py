"""``rpm identifiability``: the command-line checks, short end-to-end runs and the benchmark
script at toy size."""

import json

import pytest
import torch

from rpm.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
    assert (out / "scores.png").stat().st_size > 0 and (out / "training.png").stat().st_size > 0
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


@pytest.mark.slow
def test_benchmark_script_runs_every_setting_and_summarises(tmp_path, capsys):
    """benchmarks/identifiability.py at toy size: every setting, one seed, a summary with
    mean +- std."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[3] / "benchmarks" / "identifiability.py"
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


def test_rpm_load_gives_each_trained_energy_in_eval_mode(tmp_path):
    """``rpm.load`` of a toy run of two energies: asked without a name it lists them; each is
    an RPM in eval mode whose encoding of new inputs is the MLP encoder given the checkpoint's
    weights, and whose encoding of the run's test set gives the run's own test R^2."""
    import rpm
    import rpm.experiments.identifiability.command as ident
    from rpm.cli import build_parser
    from rpm.data.synthetic import InvertibleMLP
    from rpm.experiments.common import derived_seed
    from rpm.experiments.identifiability.data import held_out_set
    from rpm.experiments.identifiability.encoder import MLPEncoder
    from rpm.metrics import r2
    from rpm.training.checkpoint import load_checkpoint
    from rpm.training.run_folder import RunFolderError

    argv = ["--dim", "3", "--steps", "3", "--batch-size", "8", "--hidden", "4", "--depth", "1",
            "--eval-samples", "20", "--eval-every", "0", "--checkpoint-every", "0",
            "--compare-energies", "cosine,rbf"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    with pytest.raises(RunFolderError, match="holds 2 trained models: choose one with model=, "
                                             "one of 'cosine', 'rbf'"):
        rpm.load(out)
    with pytest.raises(RunFolderError, match="has no model 'lp': choose one of 'cosine', 'rbf'"):
        rpm.load(out, model="lp")
    args = build_parser().parse_args(["identifiability", "--out", str(out), *argv])
    process = ident._process(ident._resolve(args), torch.device("cpu"))
    mixing = InvertibleMLP(3, seed=derived_seed(0, "mixing"))
    z_test, x_test = held_out_set(process, mixing, 20, derived_seed(0, "test"))
    results = json.loads((out / "results.json").read_text())["runs"]
    x = torch.randn(10, 3)
    for name in ("cosine", "rbf"):
        model = rpm.load(out, model=name)
        assert isinstance(model, rpm.RPM) and not model.training
        assert model.trained["model"] == name and model.config["compare_energies"] == ["cosine", "rbf"]
        weights = load_checkpoint(out / name / "checkpoint.pt")["module"]
        encoder = MLPEncoder(3, 4, 1, "sphere")
        encoder.load_state_dict({key[len("recognition.net."):]: value for key, value
                                 in weights.items() if key.startswith("recognition.net.")})
        with torch.no_grad():
            torch.testing.assert_close(model.encode(x), encoder(x))
            assert r2(z_test, model.encode(x_test)) == results[name]["r2"]
