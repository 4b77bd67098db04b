"""``rpm identifiability --data FILE.npz`` and :func:`rpm.experiments.identifiability.fit`:
pairs of the command's own latent process and mixing train and are scored against their
latents (the identity baseline against an independent computation); without latents the scores
are skipped and said so; every bad file is refused in one line before a run folder exists."""

import json

import numpy as np
import pytest
import torch

import rpm.experiments.identifiability
from rpm.cli import main
from rpm.data.synthetic import InvertibleMLP, LatentProcess
from rpm.experiments.identifiability.data import ArrayPairStream
from rpm.metrics import mcc, r2

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAINING = ["--steps", "4", "--batch-size", "16", "--hidden", "8", "--depth", "1",
            "--eval-every", "2", "--checkpoint-every", "0"]


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["identifiability", "--out", str(tmp_path / name), "--no-progress",
                     "--device", "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def _pairs(num=100, dim=3):
    process = LatentProcess(dim=dim, space="sphere", conditional="vmf", conditional_param=5.0)
    z, z2 = process.sample_pairs(num, torch.Generator().manual_seed(0))
    mixing = InvertibleMLP(dim, seed=1)
    with torch.no_grad():
        return torch.stack([mixing(z), mixing(z2)], 1), z  # (N, 2, n), (N, n)


def test_own_pairs_with_latents_are_scored_on_the_held_out_pairs(tmp_path, capsys):
    views, latents = _pairs()
    path = tmp_path / "pairs.npz"
    np.savez(path, views=views.numpy(), latents=latents.numpy())  # default: last 20 held out
    assert _run(tmp_path, "--data", str(path), "--compare-energies", "cosine,anisotropic",
                *TRAINING) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    identity = {"r2": r2(latents[80:], views[80:, 0]), "mcc": mcc(latents[80:], views[80:, 0])}
    for name in ("cosine", "anisotropic"):
        run = results["runs"][name]
        assert -1.0 < run["r2"] <= 1.0 and 0.0 <= run["mcc"] <= 1.0
        assert run["baseline"]["identity"] == pytest.approx(identity)
        assert run["trajectory"]["step"] == [0, 2, 4]
    assert "scores_skipped" not in results
    assert "pairs.npz" in results["held_out_sets"]["validation and test"]
    assert (tmp_path / "run" / "scores.png").stat().st_size > 0
    assert "cosine" in capsys.readouterr().out


def test_without_latents_training_runs_and_the_scores_are_skipped(tmp_path, capsys):
    """Views of 2 x 3 numbers each (flattened to 6), no latents: every pair trains, the scores
    are null and the output says so; fit() gives the trained model, embedding into --dim."""
    views, _ = _pairs(40)
    views = torch.cat([views, views.square()], -1).reshape(40, 2, 2, 3)
    path = tmp_path / "no_latents.npz"
    np.savez(path, views=views.numpy())
    assert _run(tmp_path, "--data", str(path), *TRAINING) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["scores_skipped"] == f"no latents in {path}"
    assert results["runs"]["cosine"]["r2"] is None
    assert results["runs"]["cosine"]["baseline"] is None
    assert f"scores skipped: no latents in {path}" in capsys.readouterr().out
    assert (tmp_path / "run" / "training.png").stat().st_size > 0
    fit = rpm.experiments.identifiability.fit(views, steps=2, batch_size=8, hidden=8, dim=2,
                                              progress=False)
    assert fit.scores_skipped == "no latents given" and fit.results["cosine"]["mcc"] is None
    embedded = fit.models["cosine"].encode(views[:5, 0].reshape(5, 6))
    assert embedded.shape == (5, 2)
    torch.testing.assert_close(embedded.norm(dim=-1), torch.ones(5))  # on the sphere


def test_array_pair_stream_draws_distinct_training_pairs_reproducibly():
    views = torch.arange(20.0).reshape(10, 2, 1)  # pair i: (2i, 2i + 1)
    stream = ArrayPairStream(views, 4, seed=0)
    x, x2 = stream(3)
    assert torch.equal(x2, x + 1) and len(set(x[:, 0].tolist())) == 4
    again = ArrayPairStream(views, 4, seed=0)(3)
    assert torch.equal(again[0], x)
    assert not torch.equal(stream(4)[0], x)


def _bad_files():
    views, latents = (t.numpy() for t in _pairs(40))
    nan = views.copy()
    nan[5, 1, 2] = np.nan
    return {
        "missing": ({"pairs": views}, "the file has no array 'views' (it has 'pairs')"),
        "one view": ({"views": views[:, 0]}, "views must have shape (N, 2, ...), got shape (40, 3)"),
        "three views": ({"views": np.stack([views[:, 0]] * 3, 1)}, "the two views of each pair"),
        "nan": ({"views": nan}, "the first at index (5, 1, 2)"),
        "latents": ({"views": views, "latents": latents[:30]},
                    "latents must have shape (N, K) = (40, K)"),
        "held_out ints": ({"views": views, "held_out": np.ones(40, dtype=int)}, "boolean"),
        "held_out length": ({"views": views, "held_out": np.zeros(4, dtype=bool)},
                            "held_out must have shape (40,)"),
        "all held out": ({"views": views, "held_out": np.ones(40, dtype=bool)},
                         "none is left to train on"),
        "batch": ({"views": views[:10]}, "10 training pairs, fewer than --batch-size 16"),
        "few held out": ({"views": views, "latents": latents},
                         "8 held-out pairs are too few for the affine R^2 fit of 3 latents"),
    }


@pytest.mark.parametrize("case", list(_bad_files()))
def test_a_bad_file_is_refused_in_one_line_before_the_run_folder(tmp_path, capsys, case):
    arrays, message = _bad_files()[case]
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    assert _run(tmp_path, "--data", str(path), "--batch-size", "16") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m rpm identifiability: error: --data {path}: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_dim_below_the_latents_and_generation_flags_are_refused(tmp_path, capsys):
    views, latents = _pairs(100)
    path = tmp_path / "pairs.npz"
    np.savez(path, views=views.numpy(), latents=latents.numpy())
    assert _run(tmp_path, "--data", str(path), "--dim", "2", "--batch-size", "16") == 2
    assert "--dim 2 is smaller than the latents' 3" in capsys.readouterr().err
    assert _run(tmp_path, "--data", str(path), "--space", "box") == 2
    assert "--space describe(s) the generated pairs" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
