"""``rpm digits``: the command-line checks and a short end-to-end run (results.json, figures,
checkpoints, resume; rpm's NT-Xent follows the plain-torch step)."""

import json

import pytest

from rpm.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["--steps", "6", "--batch-size", "32", "--width", "4", "--latent-dim", "8", "--draws", "2",
        "--eval-every", "3", "--checkpoint-every", "0"]


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["digits", "--out", str(tmp_path / name), "--no-progress", "--device", "cpu",
                     "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "1"], "batch size >= 2"),
    (["--batch-size", "2000"], "more than the 1347 training images"),
    (["--methods", "simclr"], "expected distinct methods"),
    (["--methods", "rbf,rbf"], "expected distinct methods"),
    (["--methods", "rbf", "--temperature", "0.5"], "drop --temperature"),
    (["--steps", "0"], "positive integer"),
])
def test_bad_flags_exit_2_with_a_message_and_leave_no_folder(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_end_to_end_run_writes_results_figures_and_resumes(tmp_path, capsys):
    assert _run(tmp_path, *TINY, "--methods", "ntxent,torch_ntxent,gaussian") == 0
    out = tmp_path / "run"
    summary = json.loads((out / "results.json").read_text())
    assert {"config", "environment", "methods", "checks", "evaluation", "wall_time"} <= set(summary)
    methods = summary["methods"]
    assert list(methods) == ["ntxent", "torch_ntxent", "gaussian", "raw_pixels", "untrained"]
    for name, result in methods.items():
        assert ("latent" in result) == (name != "raw_pixels")
        for scores in (result, result.get("latent", result)):
            for classifier in ("linear_probe", "knn"):
                assert list(scores[classifier]) == ["1", "5", "10", "all"]
                assert all(0.0 <= v <= 1.0 for v in scores[classifier].values())
                draws = [len(scores[f"{classifier}_draws"][k]) for k in ("1", "5", "10", "all")]
                assert draws == [2, 2, 2, 1]
    # raw pixels of the digits are far above chance (10%) with all labels
    assert methods["raw_pixels"]["linear_probe"]["all"] > 0.9
    # the same objective from the same start on the same batches: the same losses
    rpm_losses = [loss for _, loss in methods["ntxent"]["losses"]]
    torch_losses = [loss for _, loss in methods["torch_ntxent"]["losses"]]
    assert rpm_losses == pytest.approx(torch_losses, abs=1e-4)
    assert "ntxent_vs_torch_ntxent" in summary["checks"] and "floors" in summary["checks"]
    assert methods["gaussian"]["mean_scale"] > 0
    for name in ("label_efficiency.png", "training.png", "ntxent/checkpoint.pt", "gaussian/history.json"):
        assert (out / name).stat().st_size > 0
    capsys.readouterr()
    assert _run(tmp_path, "--resume") == 0
    assert "finished earlier (6/6 steps), reloaded" in capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert again["methods"]["ntxent"]["linear_probe"] == methods["ntxent"]["linear_probe"]
    assert len(again["segments"]) == 2


def test_step_benchmark_times_every_method(capsys):
    """benchmarks/digits_step.py at toy size: a row per method, torch_ntxent's ratio 1."""
    import importlib.util
    from pathlib import Path

    from rpm.experiments.digits.model import METHODS

    path = Path(__file__).parents[3] / "benchmarks" / "digits_step.py"
    spec = importlib.util.spec_from_file_location("digits_step_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--batch-size", "16", "--rounds", "1", "--steps", "1"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == set(METHODS) and rows["torch_ntxent"][-1] == "1.000"
