"""``python -m rpm mutual-information``: a short end-to-end run at toy size (the results.json
fields, the figures, the ceilings), the staircase's data, and the command-line checks."""

import json
import math

import numpy as np
import pytest
import torch

from rpm.cli import main
from rpm.experiments.mutual_information.command import ESTIMATORS
from rpm.experiments.mutual_information.staircase import (
    StaircaseConfig,
    cubic_matrix,
    pair_for,
    train_critics,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["mutual-information", "--out", str(tmp_path / name), "--no-progress",
                     "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def _config(**changes):
    settings = dict(mis=[1.0, 3.0], steps=6, batch_size=16, dim=4, lr=1e-3, prior_lr=1e-3,
                    hidden=8, joint_hidden=8, layers=1, embed_dim=4, tau=5.0, alpha=0.1,
                    momentum=0.9, rpm_hidden=0, seed=0)
    settings.update(changes)
    return StaircaseConfig(**settings)


@pytest.mark.slow
def test_a_toy_staircase_writes_its_results_and_figures(tmp_path, capsys):
    status = _run(tmp_path, "--mi", "1,3", "--steps", "30", "--average-last", "10", "--dim",
                  "4", "--batch-size", "16", "--hidden", "8", "--joint-hidden", "8",
                  "--embed-dim", "4", "--cubic")
    assert status == 0
    out = tmp_path / "run"
    results = json.loads((out / "results.json").read_text())
    for section in (results["critics"], results["cubic"]["critics"]):
        assert set(section) == {"separable", "joint"}
        for critic in section.values():
            assert [step["true_mi"] for step in critic["steps"]] == [1.0, 3.0]
            for step in critic["steps"]:
                assert set(step["estimates"]) == set(ESTIMATORS)
                for name in ESTIMATORS:
                    assert math.isfinite(step["estimates"][name])
                    assert step["bias"][name] == pytest.approx(
                        step["estimates"][name] - step["true_mi"])
                    assert step["variance"][name] >= 0
    # InfoNCE and I_alpha never above their ceilings, at any step
    assert results["ceilings"]["infonce"] == pytest.approx(math.log(16))
    for variant in results["max_estimates"].values():
        for critic in variant.values():
            assert critic["infonce"] <= math.log(16) + 1e-6
            assert critic["interpolated"] <= results["ceilings"]["interpolated"] + 1e-6
    assert (out / "separable.png").stat().st_size > 0 and (out / "joint.png").exists()
    assert "bias" in capsys.readouterr().out


def test_each_stage_has_its_mutual_information_and_the_cubic_map_is_orthogonal():
    config = _config(dim=6, mis=[2.0, 5.0])
    for stage, mi in enumerate(config.mis):
        assert pair_for(config, "gaussian", stage).mutual_information == pytest.approx(mi)
    w = cubic_matrix(6, 0).double()
    torch.testing.assert_close(w @ w.T, torch.eye(6, dtype=torch.float64), atol=1e-6, rtol=0)
    x, y = pair_for(config, "cubic", 0).sample(5, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)
    _, y_plain = pair_for(config, "gaussian", 0).sample(5, gen)
    torch.testing.assert_close(y, (y_plain @ cubic_matrix(6, 0).T) ** 3 / math.sqrt(15))


def test_critic_training_is_reproducible_and_sees_the_same_batches_for_every_critic():
    first = train_critics("separable", "gaussian", _config())
    again = train_critics("separable", "gaussian", _config())
    assert first.shape == (2, 6, 6)
    np.testing.assert_array_equal(first, again)
    # InfoNCE's estimate never exceeds log N
    assert first[..., 0].max() <= math.log(16) + 1e-6


@pytest.mark.parametrize("argv, message", [
    (["--mi", "2,-1"], "positive MI"),
    (["--critics", "joint,joint"], "distinct critics"),
    (["--steps", "10", "--average-last", "20"], "--average-last 20 exceeds"),
    (["--batch-size", "16", "--dim", "20"], "must exceed --dim"),
    (["--alpha", "0"], "--alpha must be > 0"),
])
def test_bad_flags_are_refused_in_one_line(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_resume_is_refused(tmp_path, capsys):
    assert _run(tmp_path, "--resume") == 2
    assert "no checkpoints" in capsys.readouterr().err
