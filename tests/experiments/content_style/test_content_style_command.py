"""``rpm content-style``: the command-line checks and a short end-to-end run whose reported
scores are recomputed from the saved encoder."""

import json

import pytest
import torch

import rpm
from rpm.cli import main
from rpm.data.synthetic import ContentStyleProcess, InvertibleMLP
from rpm.experiments.common import derived_seed
from rpm.experiments.content_style import command, model
from rpm.experiments.content_style.train import block_scores
from rpm.experiments.identifiability.data import held_out_set
from rpm.experiments.identifiability.encoder import MLPEncoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["content-style", "--out", str(tmp_path / name), "--no-progress",
                     "--device", "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def test_prior_choices_are_the_models():
    assert command.PRIORS == model.PRIORS


@pytest.mark.parametrize("argv, message", [
    (["--rows", "independent,bogus"], "expected 'all' or distinct rows"),
    (["--rows", "causal,causal"], "distinct rows"),
    (["--content-dims", "11"], "--content-dims must lie in 1..10"),
    (["--eval-samples", "10"], "--eval-samples"),
    (["--noise-scale", "0.1"], "--prior gaussian"),
    (["--prior", "vmf"], "invalid choice"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("prior", ["rbf", "gaussian"])
def test_small_run_writes_the_table_and_its_scores_are_reproducible(tmp_path, prior):
    argv = ["--rows", "partial,causal", "--prior", prior, "--steps", "40", "--batch-size", "64",
            "--hidden", "16", "--depth", "1", "--eval-samples", "120", "--eval-every", "20",
            "--checkpoint-every", "0", "--seed", "3"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    summary = json.loads((out / "results.json").read_text())
    rows = summary["rows"]
    assert [(r["p_change"], r["statistical"], r["causal"]) for r in rows] == [
        (0.75, False, False), (0.75, True, True)]
    keys = ("content_r2_nonlinear", "style_r2_nonlinear", "content_r2_linear", "style_r2_linear")
    assert all(isinstance(r[key], float) and r[key] <= 1.0 for r in rows for key in keys)
    assert summary["parameters"] == "drawn once per row from the seed"
    assert (out / "table.png").stat().st_size > 0 and (out / "training.png").stat().st_size > 0
    # the causal row's test scores, recomputed from its checkpoint and an independently
    # rebuilt data set (same seeds as the command)
    state = torch.load(out / "causal" / "checkpoint.pt", weights_only=True)["state"]
    encoder = MLPEncoder(5, 16, 1, "unbounded", in_dim=10)
    prefix = "recognition.net."
    encoder.load_state_dict({k[len(prefix):]: v for k, v in state["module"].items()
                             if k.startswith(prefix)})
    # the causal row is the table's fourth (index 3) whichever rows run
    process = ContentStyleProcess(5, 5, 0.75, True, True, seed=derived_seed(3, "data", 3))
    mixing = InvertibleMLP(10, seed=derived_seed(3, "mixing"))
    z, x = held_out_set(process, mixing, 120, derived_seed(3, "test", 3))
    with torch.no_grad():
        again = block_scores(z, encoder(x), 5)
        # rpm.load rebuilds the row's model, in eval mode, with the same representation
        loaded = rpm.load(out, model="causal")
        assert not loaded.training and loaded.trained["command"] == "content-style"
        torch.testing.assert_close(loaded.encode(x), encoder(x))
    for key in keys:
        assert again[key] == pytest.approx(rows[1][key], abs=1e-6)
    # the reference: the style R^2 of the true content, linear least squares written out
    design = torch.cat([z[:, :5], torch.ones(120, 1)], 1).double()
    coef = torch.linalg.lstsq(design[:60], z[:60, 5:].double()).solution
    residual = z[60:, 5:].double() - design[60:] @ coef
    style = z[60:, 5:].double()
    want = (1 - residual.pow(2).sum(0) / (style - style.mean(0)).pow(2).sum(0)).mean()
    assert rows[1]["style_r2_linear_true_content"] == pytest.approx(float(want), abs=1e-6)
