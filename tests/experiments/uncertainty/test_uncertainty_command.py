"""``rpm uncertainty`` through ``main``: a smoke-size run's results and figures, its resumption,
the trained models loading back, and the command line's refusals."""

import json
import math

import matplotlib.image
import pytest
import torch

from rpm.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: A run of a few steps of every model.
SMOKE = ["--steps", "4", "--mean-steps", "4", "--batch-size", "16", "--particles", "2",
         "--eval-samples", "300", "--eval-every", "2", "--smoothing-steps", "20", "--hidden", "16",
         "--digits-steps", "4", "--digits-batch-size", "16", "--digits-particles", "2",
         "--digits-hidden", "16", "--mc-samples", "4", "--checkpoint-every", "0"]


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["uncertainty", "--out", str(tmp_path / name), "--no-progress", "--device",
                     "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize("argv, message", [
    (["--kappa-min", "40"], "--kappa-min 40.0 must be below --kappa-max 32.0"),
    (["--eval-samples", "1"], "--eval-samples 1: a rank correlation needs at least 2"),
    (["--digits-batch-size", "1"], "--digits-batch-size 1: a batch needs at least 2 images"),
    (["--digits-batch-size", "2000"], "is more than the 1347 training images"),
    (["--min-side", "1"], "--min-side 1 shows every view whole"),
    (["--min-side", "0"], "argument --min-side: expected a positive number"),
    (["--min-side", "1.5"], "argument --min-side: expected a fraction in (0, 1]"),
    (["--max-blur", "3"], "--max-blur 3.0: the 7 x 7 kernel covers 3 sigma only up to"),
    (["--dim", "1"], "argument --dim: expected a dimension >= 2"),
    (["--part", "both"], "argument --part: invalid choice"),
    (["--batch-size", "1"], "argument --batch-size: expected a batch size >= 2"),
    (["--normaliser", "pair"], "argument --normaliser: invalid choice"),
])
def test_bad_flags_are_one_error_line_and_write_nothing(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_the_normaliser_choices_are_the_objectives():
    from rpm._objective import NORMALISERS
    from rpm.experiments.uncertainty.command import NORMALISERS as CHOICES

    assert sorted(CHOICES) == sorted(NORMALISERS)


def test_a_smoke_run_writes_its_results_and_figures_and_resumes(tmp_path, capsys):
    assert _run(tmp_path, *SMOKE) == 0
    out = tmp_path / "run"
    results = json.loads((out / "results.json").read_text())
    controlled, digits = results["controlled"], results["digits"]
    for key in ("rank_correlation", "means_rank_correlation"):
        assert -1.0 <= controlled[key] <= 1.0
    assert 0.0 <= controlled["cosine_mean_absolute_error"] <= 2.0
    assert controlled["cosine_mse"] <= 4.0 and controlled["paper_cosine_mse"] is None
    assert controlled["untrained"]["rank_correlation"] is None  # every kappa starts equal
    # the first phase's own scores: its widths' ranking, and its learned coupling a
    assert set(controlled["first_phase"]) >= {"rank_correlation", "means_rank_correlation"}
    assert controlled["means_kappa_pos"] > 0
    if controlled["rank_correlation"] < 0.8:
        assert "(a floor of the median of seeds 0-2" in capsys.readouterr().err
    assert 15.0 < controlled["kappa"]["true"]["min"] < controlled["kappa"]["true"]["max"] < 34.0
    assert controlled["process"]["positive_threshold"] == pytest.approx(11.1483, abs=1e-4)
    assert [e["step"] for e in controlled["histories"]["controlled"]["evaluations"]] == [0, 2, 4]
    assert 0.0 <= digits["cropped_has_bigger_uncertainty"] <= 1.0
    assert -1.0 <= digits["blur_rank_correlation"] <= 1.0
    assert digits["crop_sides"] == [1.0, 0.85, 0.7, 0.55, 0.5]
    assert len(digits["crop_kappa_median"]) == 5 and len(digits["blur_kappa_median"]) == 6
    for name in ("without_posterior", "with_posterior"):
        assert 0.0 <= digits["expected_calibration_error"][name] <= 1.0
        assert 0.0 <= digits["probe_accuracy"][name] <= 1.0
    assert results["floors"]["controlled.rank_correlation"] == 0.8
    assert results["config"]["seed"] == 0 and results["config"]["part"] == "all"
    for figure in ("kappa.png", "corruptions.png", "reliability.png", "training.png"):
        image = matplotlib.image.imread(out / figure)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300
    capsys.readouterr()
    assert _run(tmp_path, "--resume") == 0
    printed = capsys.readouterr().out
    for model in ("controlled-means", "controlled", "digits"):
        assert f"{model}: finished earlier (4/4 steps), reloaded" in printed
    again = json.loads((out / "results.json").read_text())
    assert again["controlled"]["rank_correlation"] == controlled["rank_correlation"]
    assert again["digits"]["expected_calibration_error"] == digits["expected_calibration_error"]


def test_the_trained_models_load_back(tmp_path):
    """rpm.load gives each model with its trained weights: the controlled encoder's
    concentrations of the run's own held-out scores, and the digits encoder."""
    import rpm

    argv = [arg for arg in SMOKE]
    assert _run(tmp_path, *argv, "--part", "controlled") == 0
    model = rpm.load(tmp_path / "run", model="controlled")
    x = torch.rand(7, 10)
    q = model.recognition(x)
    assert q.concentration.shape == (7,) and bool((q.concentration > 0).all())
    means = rpm.load(tmp_path / "run", model="controlled-means")
    # the directions were trained in the first phase only (a Delta encoder of (direction, log
    # width, log partner weight)): both models share them; the widths went on training
    latents = means.recognition(x).v
    assert latents.shape == (7, 12)
    torch.testing.assert_close(torch.nn.functional.normalize(latents[:, :10], dim=-1), q.loc)
    assert not torch.allclose(torch.exp(-latents[:, 10]), q.concentration)
    process = json.loads((tmp_path / "run" / "results.json").read_text())["controlled"][
        "process"]
    # the default energy is the process's positive rule
    assert model.prior.energy.kappa_pos.item() == process["kappa_pos"] == 20.0
    assert model.prior.energy.threshold.item() == pytest.approx(process["positive_threshold"])
    assert means.prior.energy.pair_concentration.item() != pytest.approx(
        process["effective_kappa_pos"])
    with pytest.raises(ValueError, match="trained on inputs of shape"):
        model.encode(torch.rand(3, 4))


@pytest.mark.parametrize("energy", ["rule", "cosine"])
def test_the_controlled_model_record_rebuilds_its_energy(energy):
    """model_from_arguments gives the concentration phase's prior the record's energy: the
    process's positive rule, or the cosine energy at the matched concentration; a record from
    before the choice (no "energy") is the cosine one."""
    from rpm.experiments.uncertainty.model import PositiveRuleEnergy, model_from_arguments
    from rpm.priors import CosineEnergy

    arguments = {"part": "controlled", "obs_dim": 10, "dim": 10, "hidden": 8, "depth": 1,
                 "concentration_hidden": 4, "initial_concentration": 22.0, "kappa_pos": 8.94,
                 "energy": energy, "rule_kappa_pos": 20.0, "rule_threshold": 11.15}
    built = model_from_arguments(arguments).prior.energy
    if energy == "rule":
        assert isinstance(built, PositiveRuleEnergy)
        assert (built.kappa_pos.item(), built.threshold.item()) == (20.0, 11.15)
    else:
        assert isinstance(built, CosineEnergy) and built.kappa.item() == pytest.approx(8.94)
    del arguments["energy"]
    assert isinstance(model_from_arguments(arguments).prior.energy, CosineEnergy)


def test_a_first_phase_record_of_either_form_rebuilds():
    """A controlled-means record with weight_hidden is the width-aware Delta RPM (latents of
    D + 2 columns under ConvolvedCosineEnergy); one without (the earlier first phase) is the
    directions' Delta RPM under the learned cosine energy, so older runs still load."""
    from rpm.experiments.uncertainty.model import ConvolvedCosineEnergy, model_from_arguments
    from rpm.priors import CosineEnergy

    arguments = {"part": "controlled-means", "obs_dim": 10, "dim": 6, "hidden": 8, "depth": 1,
                 "kappa_pos": 4.93}
    older = model_from_arguments(arguments)
    assert isinstance(older.prior.energy, CosineEnergy)
    assert older.recognition.net(torch.rand(3, 10)).shape == (3, 6)
    current = model_from_arguments({**arguments, "concentration_hidden": 4,
                                    "initial_concentration": 22.0, "weight_hidden": 5})
    assert isinstance(current.prior.energy, ConvolvedCosineEnergy)
    latents = current.recognition.net(torch.rand(3, 10))
    assert latents.shape == (3, 8)
    torch.testing.assert_close(latents[:, 6], torch.full((3,), -math.log(22.0)))
