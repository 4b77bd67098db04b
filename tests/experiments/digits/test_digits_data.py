"""``rpm digits --data FILE.npz`` and :func:`rpm.experiments.digits.fit`: the bundled digits
written to a file, with their split, give the bundled run's scores; images without labels train
and the scores are skipped and said so; every bad file is refused in one line before a run
folder exists."""

import json

import numpy as np
import pytest
import torch

import rpm.experiments.digits
from rpm.cli import main
from rpm.data.digits import load_digits_split

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["--steps", "2", "--batch-size", "32", "--width", "4", "--latent-dim", "8", "--draws",
        "1", "--eval-every", "0", "--checkpoint-every", "0", "--methods", "infonce"]


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["digits", "--out", str(tmp_path / name), "--no-progress", "--device", "cpu",
                     "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def test_the_bundled_digits_in_a_file_give_the_bundled_runs_scores(tmp_path):
    assert _run(tmp_path, *TINY, name="bundled") == 0
    split = load_digits_split()
    path = tmp_path / "digits.npz"
    np.savez(path, images=torch.cat([split.train.images, split.test.images]).numpy(),
             labels=torch.cat([split.train.labels, split.test.labels]).numpy(),
             held_out=np.arange(1797) >= 1347)
    assert _run(tmp_path, "--data", str(path), *TINY, name="file") == 0
    bundled = json.loads((tmp_path / "bundled" / "results.json").read_text())["methods"]
    from_file = json.loads((tmp_path / "file" / "results.json").read_text())["methods"]
    for name in ("infonce", "raw_pixels", "untrained"):
        for key in ("linear_probe", "knn", "latent"):
            if key in bundled[name]:
                assert from_file[name][key] == bundled[name][key], (name, key)


def test_unlabelled_colour_images_train_and_the_scores_are_skipped(tmp_path, capsys):
    images = np.random.default_rng(0).integers(0, 256, size=(40, 3, 6, 7), dtype=np.uint8)
    path = tmp_path / "unlabelled.npz"
    np.savez(path, images=images)
    assert _run(tmp_path, "--data", str(path), *TINY[:-2], "--methods", "infonce,multicrop") == 2
    assert "multicrop method's global views are 8 x 8 images, these are 6 x 7" in \
        capsys.readouterr().err
    assert _run(tmp_path, "--data", str(path), *TINY[:-2], "--methods", "infonce,star4",
                "--num-seeds", "2") == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["scores_skipped"] == f"no labels in {path}"
    assert set(results["methods"]) == {"infonce", "star4"}
    assert "linear_probe" not in results["methods"]["infonce"]
    assert results["evaluation"]["train_images"] == 40 and results["checks"] == {}
    assert f"scores skipped: no labels in {path}" in capsys.readouterr().out
    fit = rpm.experiments.digits.fit(images[:, 0], steps=2, batch_size=16, width=4,
                                     latent_dim=8, methods=["infonce"], progress=False)
    assert fit.scores_skipped == "no labels given"
    assert fit.encoders["infonce"](torch.rand(5, 1, 6, 7)).shape == (5, 8)


def test_fit_scores_with_labels_on_the_default_stratified_split():
    rng = np.random.default_rng(1)
    labels = np.repeat([0, 1], 30)
    images = rng.random((60, 8, 8)) * 0.5 + 0.5 * labels[:, None, None]
    fit = rpm.experiments.digits.fit(images, labels, steps=2, batch_size=16, width=4,
                                     latent_dim=8, draws=1, methods="infonce", progress=False)
    result = fit.results["infonce"]
    assert set(result["linear_probe"]) == {"1", "5", "10", "all"}
    assert 0.0 <= result["knn"]["all"] <= 1.0


def _bad_files():
    rng = np.random.default_rng(0)
    x = rng.random((60, 8, 8))
    y = np.repeat([0, 1, 2], 20)
    return {
        "missing": ({"pixels": x}, "the file has no array 'images' (it has 'pixels')"),
        "vectors": ({"images": x[:, 0]}, "images must have shape (N, H, W) or (N, C, H, W)"),
        "range": ({"images": 255 * x}, "images must hold intensities in [0, 1]"),
        "nan": ({"images": np.where(x > 0.999, np.nan, x)}, "NaN or infinite"),
        "small": ({"images": x[:, :3]}, "the images are 3 x 8 pixels"),
        "labels float": ({"images": x, "labels": y.astype(float)}, "labels must be integer"),
        "labels length": ({"images": x, "labels": y[:50]}, "labels must be integer classes of shape (60,)"),
        "few per class": ({"images": x, "labels": np.r_[np.zeros(55, int), np.ones(5, int)]},
                          "the smallest with"),
        "held_out ints": ({"images": x, "held_out": np.zeros(60, dtype=int)}, "boolean"),
        "held_out length": ({"images": x, "held_out": np.zeros(3, dtype=bool)},
                            "held_out must have shape (60,)"),
        "all held out": ({"images": x, "held_out": np.ones(60, dtype=bool)},
                         "none is left to train on"),
        "batch": ({"images": x[:20]}, "20 training images, fewer than --batch-size 32"),
    }


@pytest.mark.parametrize("case", list(_bad_files()))
def test_a_bad_file_is_refused_in_one_line_before_the_run_folder(tmp_path, capsys, case):
    arrays, message = _bad_files()[case]
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    assert _run(tmp_path, "--data", str(path), "--batch-size", "32") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m rpm digits: error: --data {path}: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()
