"""``rpm digits``: the command-line checks and a short end-to-end run (results.json, figures,
checkpoints, resume; rpm's NT-Xent follows the plain-torch step)."""

import json
import math

import pytest

from rpm.cli import main
from rpm.experiments.digits import command

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
    (["--batch-size", "2000"], "more than the 1347 distinct training images"),
    (["--methods", "simclr"], "expected distinct methods"),
    (["--methods", "rbf,rbf"], "expected distinct methods"),
    (["--methods", "rbf", "--temperature", "0.5"], "drop --temperature"),
    (["--methods", "all,rbf"], "expected distinct methods"),
    (["--num-seeds", "0"], "positive integer"),
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
    # what the progress lines show: NT-Xent (lightly's value), -ELBO/N + log(2N - 1)
    for name in ("ntxent", "torch_ntxent"):
        result = methods[name]
        assert result["loss_name"] == "NT-Xent" and result["loss_offset"] == math.log(63)
        assert [step for step, _ in result["reported_losses"]] == [s for s, _ in result["losses"]]
        for (_, reported), (_, loss) in zip(result["reported_losses"], result["losses"], strict=True):
            assert reported == pytest.approx(loss + math.log(63), abs=1e-12)
    assert "ntxent_vs_torch_ntxent" in summary["checks"] and "floors" in summary["checks"]
    assert methods["gaussian"]["mean_scale"] > 0
    assert methods["gaussian"]["scale_floor_warning"] is False  # 6 steps: far above the floor
    for name in ("label_efficiency.png", "training.png", "ntxent/checkpoint.pt", "gaussian/history.json"):
        assert (out / name).stat().st_size > 0
    capsys.readouterr()
    assert _run(tmp_path, "--resume") == 0
    assert "finished earlier (6/6 steps), reloaded" in capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert again["methods"]["ntxent"]["linear_probe"] == methods["ntxent"]["linear_probe"]
    assert len(again["segments"]) == 2


def test_methods_all_and_the_default_set():
    from rpm.cli import build_parser

    parser = build_parser()
    base = ["digits", "--out", "x"]
    assert parser.parse_args([*base, "--methods", "all"]).methods == list(command.METHODS)
    assert parser.parse_args(base).methods == list(command.DEFAULT_METHODS)
    assert set(command.DEFAULT_METHODS) < set(command.METHODS)


@pytest.mark.slow
def test_views_methods_train_on_their_views_and_the_queue_is_checkpointed(tmp_path):
    """The priors over J views (J = 4, multi-crop) and the queue run end to end; the queue's
    latents are in the checkpoint (exact resumption), filled by the loop after each step."""
    import torch

    from rpm.experiments.digits.model import QUEUE_SIZE

    assert _run(tmp_path, *TINY, "--methods", "star4,mixture4,multicrop,queue") == 0
    out = tmp_path / "run"
    methods = json.loads((out / "results.json").read_text())["methods"]
    assert {name: methods[name]["views"] for name in ("star4", "mixture4", "multicrop", "queue")} == {
        "star4": [4, 0], "mixture4": [4, 0], "multicrop": [2, 4], "queue": [2, 0]}
    for name in ("star4", "mixture4", "multicrop", "queue"):
        losses = [loss for _, loss in methods[name]["losses"]]
        assert losses and all(abs(v) < 1e3 for v in losses)
    state = torch.load(out / "queue" / "checkpoint.pt", weights_only=True)["state"]["module"]
    filled = [v for k, v in state.items() if k.endswith("queue.filled")]
    assert [int(v) for v in filled] == [min(QUEUE_SIZE, 6 * 32)]  # 6 steps of 32 second views


@pytest.mark.slow
def test_several_seeds_report_the_mean_and_each_seed(tmp_path):
    assert _run(tmp_path, *TINY, "--methods", "ntxent", "--num-seeds", "2", "--seed", "3") == 0
    out = tmp_path / "run"
    summary = json.loads((out / "results.json").read_text())
    assert summary["seeds"] == [3, 4] and set(summary["per_seed"]) == {"3", "4"}
    for name in ("ntxent", "untrained", "raw_pixels"):
        runs = [summary["per_seed"][seed][name] for seed in ("3", "4")]
        for key in ("1", "5", "10", "all"):
            mean = (runs[0]["knn"][key] + runs[1]["knn"][key]) / 2
            assert summary["methods"][name]["knn"][key] == pytest.approx(mean, abs=1e-12)
            assert len(summary["methods"][name]["knn_draws"][key]) == (4 if key != "all" else 2)
    assert (out / "seed3" / "ntxent" / "checkpoint.pt").exists()
    assert (out / "seed4" / "ntxent" / "checkpoint.pt").exists()
    # different seeds: different initialisations and batches
    assert summary["per_seed"]["3"]["ntxent"]["losses"] != summary["per_seed"]["4"]["ntxent"]["losses"]


@pytest.mark.slow
def test_torchrun_trains_on_the_global_batch(tmp_path):
    """Two CPU processes (gloo), each encoding half of the global batch: rpm's NT-Xent over the
    global batch (RPMELBO(global_batch=True)) and the plain-torch share of each process
    (distributed_ntxent_share) give the same losses; process 0 writes the run folder."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "two"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    "-m", "rpm", "digits", *TINY, "--methods", "ntxent,torch_ntxent", "--no-progress",
                    "--device", "cpu", "--out", str(out)], env=env, check=True, capture_output=True,
                   timeout=300)
    summary = json.loads((out / "results.json").read_text())
    assert summary["environment"]["world_size"] == 2
    losses = {name: [loss for _, loss in summary["methods"][name]["losses"]]
              for name in ("ntxent", "torch_ntxent")}
    assert len(losses["ntxent"]) == len(losses["torch_ntxent"]) >= 1
    assert losses["ntxent"] == pytest.approx(losses["torch_ntxent"], abs=1e-4)
    # each process adds its share of log(2N - 1): the summed loss is NT-Xent of the global batch
    reported = [loss for _, loss in summary["methods"]["ntxent"]["reported_losses"]]
    assert reported == pytest.approx([loss + math.log(63) for loss in losses["ntxent"]], abs=1e-9)


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


def test_scale_information_benchmark_runs_every_prior(capsys, tmp_path):
    """benchmarks/scale_information.py at toy size: a row per prior with the median scale per
    corruption strength, Spearman's rho in [-1, 1] and the share at the floor."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[3] / "benchmarks" / "scale_information.py"
    spec = importlib.util.spec_from_file_location("scale_information_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "rows.json"
    assert bench.main(["--steps", "2", "--batch-size", "8", "--latent-dim", "4", "--levels", "3",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [row["prior"] for row in rows] == list(bench.PRIORS)
    for row in rows:
        assert list(row["median_scale_by_strength"]) == ["0.00", "0.50", "1.00"]
        assert all(v > 1e-3 for v in row["median_scale_by_strength"].values())  # above the floor
        assert -1.0 <= row["spearman"] <= 1.0 and 0.0 <= row["at_floor"] <= 1.0
    assert len(capsys.readouterr().out.splitlines()) == 1 + len(bench.PRIORS)


@pytest.mark.slow
def test_rpm_load_gives_each_method_in_eval_mode(tmp_path):
    """``rpm.load`` of a toy run of an RPM method and the plain-torch one: each embeds new
    images as the CNN given the checkpoint's weights in eval mode (batch normalisation with its
    running statistics); in train mode the same images get other codes, so eval mode matters."""
    import torch

    import rpm
    from rpm.experiments.digits.model import DigitsEncoder
    from rpm.training.checkpoint import load_checkpoint

    assert _run(tmp_path, *TINY, "--methods", "ntxent,torch_ntxent") == 0
    out = tmp_path / "run"
    x = torch.rand(16, 1, 8, 8)  # new images
    for name, prefix, kind in (("ntxent", "recognition.net.", rpm.RPM),
                               ("torch_ntxent", "", DigitsEncoder)):
        model = rpm.load(out, model=name)
        assert isinstance(model, kind) and not model.training
        weights = load_checkpoint(out / name / "checkpoint.pt")["module"]
        encoder = DigitsEncoder(width=4, latent_dim=8)
        encoder.load_state_dict({key[len(prefix):]: value for key, value in weights.items()
                                 if key.startswith(prefix)})
        encoder.eval()
        with torch.no_grad():
            z = model.encode(x)
            torch.testing.assert_close(z, encoder(x))
            assert (model.train().encode(x) - z).abs().max() > 1e-3
