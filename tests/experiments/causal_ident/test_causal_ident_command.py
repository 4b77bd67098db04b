"""``rpm causal-ident``: the command-line checks and a tiny end-to-end run whose reported
scores are recomputed from the saved encoder."""

import json

import pytest
import torch

import rpm
from rpm.cli import main
from rpm.data.scenes import CausalScenes, render_scenes
from rpm.experiments.causal_ident import command, model
from rpm.experiments.causal_ident.rows import DEFAULT_ROWS, FACTORS, PUBLISHED, ROWS
from rpm.experiments.causal_ident.train import factor_scores, view_pair
from rpm.experiments.common import derived_seed

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["causal-ident", "--out", str(tmp_path / name), "--no-progress",
                     "--device", "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def test_energy_and_pooling_choices_are_the_models():
    assert command.ENERGIES == model.ENERGIES
    assert command.POOLINGS == model.POOLINGS


def test_average_pooling_is_the_mean_of_the_last_feature_map():
    torch.manual_seed(0)
    encoder = model.SceneEncoder(3, 32, width=4, hidden=8, pooling="average").eval()
    x = torch.rand(5, 3, 32, 32)
    with torch.no_grad():
        features = encoder.features(x).double()  # (5, 8, 4, 4)
        mean = torch.zeros(5, 8, dtype=torch.float64)
        for i in range(4):
            for j in range(4):
                mean += features[:, :, i, j] / 16
        expected = encoder.head.double()(mean)
        encoder.float()
        got = encoder(x)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    # flatten feeds every cell to the head: its first layer has 16 times the inputs
    flat = model.SceneEncoder(3, 32, width=4, hidden=8)
    assert flat.pooling == "flatten"
    assert flat.head[0].in_features == 16 * encoder.head[0].in_features
    with pytest.raises(ValueError, match="pooling"):
        model.SceneEncoder(3, 32, pooling="max")


def test_a_model_record_without_pooling_builds_the_flatten_encoder():
    arguments = {"rep_dims": 3, "size": 16, "width": 4, "hidden": 8, "energy": "cosine",
                 "temperature": 0.1}
    encoder = model.model_from_arguments(arguments).recognition.net
    assert encoder.pooling == "flatten"
    assert model.model_from_arguments({**arguments, "pooling": "average"}
                                      ).recognition.net.pooling == "average"


def test_every_row_has_its_published_scores():
    assert list(PUBLISHED) == list(ROWS)
    assert all(len(values) == len(FACTORS) for values in PUBLISHED.values())
    assert set(DEFAULT_ROWS) <= set(ROWS)


@pytest.mark.parametrize("argv, message", [
    (["--rows", "colour,bogus"], "expected 'all' or distinct rows"),
    (["--rows", "colour,colour"], "distinct rows"),
    (["--size", "20"], "--size must be a multiple of 8"),
    (["--eval-samples", "10"], "--eval-samples"),
    (["--hue-shift", "0.7"], "--hue-shift must be <= 0.5"),
    (["--energy", "vmf"], "invalid choice"),
    (["--pooling", "max"], "invalid choice"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", list(ROWS))
def test_every_row_makes_pairs_of_its_kind(name):
    spec = ROWS[name]
    x, x2 = view_pair(spec, CausalScenes(), 6, 16, torch.Generator().manual_seed(0))
    assert x.shape == x2.shape == (6, 3, 16, 16)
    assert 0 <= x.min() and x2.max() <= 1
    again = view_pair(spec, CausalScenes(), 6, 16, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], x) and torch.equal(again[1], x2)
    if spec.change:  # the first view is the unaugmented rendering of the scene
        z = CausalScenes().sample(6, torch.Generator().manual_seed(0))
        assert torch.equal(x, render_scenes(z, 16))
    assert not torch.equal(x, x2)


def test_tiny_run_writes_the_table_and_its_scores_are_reproducible(tmp_path):
    argv = ["--rows", "colour,change_hues", "--steps", "4", "--batch-size", "8", "--size", "16",
            "--rep-dims", "3", "--width", "4", "--hidden", "8", "--eval-samples", "140",
            "--eval-every", "2", "--checkpoint-every", "0", "--seed", "2"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    summary = json.loads((out / "results.json").read_text())
    rows = summary["rows"]
    assert [r["views"] for r in rows] == ["colour", "change_hues"]
    for row in rows:
        assert list(row["scores"]) == list(FACTORS)
        assert all(isinstance(v, float) and v <= 1.0 for v in row["scores"].values())
        assert 0.0 <= row["scores"]["class"] <= 1.0
        assert row["published"] == dict(zip(FACTORS, PUBLISHED[row["views"]], strict=True))
        assert row["trajectory"]["step"] == [0, 2, 4]
    assert (out / "table.png").stat().st_size > 0 and (out / "training.png").stat().st_size > 0
    # rpm.load rebuilds the row's model; its test scores, recomputed from an independently
    # redrawn held-out set (the command's seeds), are the reported ones
    loaded = rpm.load(out, model="change_hues")
    assert not loaded.training and loaded.trained["command"] == "causal-ident"
    assert loaded.trained["step"] == 4
    generator = torch.Generator().manual_seed(derived_seed(2, "test"))
    z = CausalScenes().sample(140, generator)
    with torch.no_grad():
        again = factor_scores(z, loaded.encode(render_scenes(z, 16)))
    for factor in FACTORS:
        assert again[factor] == pytest.approx(rows[1]["scores"][factor], abs=1e-6)
    state = torch.load(out / "change_hues" / "checkpoint.pt", weights_only=True)["state"]
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, state["module"][key])
