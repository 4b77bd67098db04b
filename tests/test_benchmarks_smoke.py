"""The step benchmarks (benchmarks/step_overhead.py, multiview.py, dense_infonce.py, losses.py)
run at toy size and print a row per size with the baseline's ratio; their numbers live in
benchmarks/README.md."""

import importlib.util
from pathlib import Path

import pyro
import pytest
import torch

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def load(name):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("flags", [[], ["--no-validation"]])
def test_step_overhead_runs(capsys, restore_threads, flags):
    bench = load("step_overhead")
    try:
        bench.main(bench.parse_args(["--hidden", "8", "--batch-sizes", "4", "--warmup", "1",
                                     "--repeats", "1", "--threads", "1", "--clock", "cpu",
                                     "--svi-floor", "--device", "cpu", *flags]))
        assert pyro.infer.util.is_validation_enabled() == (not flags)
    finally:
        pyro.enable_validation(True)
    rows = capsys.readouterr().out.splitlines()
    assert f"validation={not flags}" in rows[0]
    assert rows[-1].split()[0] == "4" and len(rows[-1].split()) == 1 + 1 + 3 + 3


def test_multiview_runs(capsys, restore_threads):
    bench = load("multiview")
    bench.main(bench.parse_args(["--pairs", "8", "--warmup", "1", "--repeats", "1"]))
    out = capsys.readouterr().out
    assert "J=4 per_view" in out and "J=4 concat" in out and "structured" in out
    assert "1.00x the pair step" in out


def test_dense_infonce_runs_and_agrees(capsys, restore_threads):
    bench = load("dense_infonce")
    bench.main(bench.parse_args(["--sizes", "4", "--spreads", "1", "500", "--repeats", "1"]))
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split()[:2] for row in rows] == [["4", "1"], ["4", "500"]]


def test_multiview_sequence_toy_routes_and_recursions(capsys, restore_threads):
    bench = load("multiview")
    bench.main(bench.parse_args(["--warmup", "1", "--repeats", "1", "--svi", "--kalman-recursions",
                                 "--skip-views"]))
    out = capsys.readouterr().out
    assert "structured, SVI+Trace_ELBO (recursions)" in out and "J=4" not in out


def test_content_style_dims_runs(tmp_path, capsys, restore_threads):
    bench = load("content_style_dims")
    table = bench.main(bench.parse_args([
        "--dims", "2,7", "--steps", "4", "--out", str(tmp_path),
        "--extra", "--batch-size 16 --hidden 8 --depth 1 --eval-samples 60 --threads 1"]))
    assert list(table) == [2, 7]
    assert capsys.readouterr().out.splitlines()[-1].split()[0] == "7"


def test_losses_runs_and_agrees(capsys, restore_threads):
    """Each form of rpm.losses against its plain-torch formula (the benchmark checks the values
    agree before timing)."""
    bench = load("losses")
    bench.main(bench.parse_args(["--sizes", "4", "--dim", "3", "--views", "3", "--bank", "5",
                                 "--warmup", "1", "--repeats", "1"]))
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [" ".join(row.split()[1:-3]) for row in rows] == [
        "ntxent", "ntxent bank", "ntxent J=3 out", "ntxent J=3 in", "infonce",
        "infonce negatives"]
