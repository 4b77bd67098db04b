"""``rpm peer-supervision``: the command-line checks, the peers' draw and a short end-to-end
run (results.json, figures, checkpoints, resume, rpm.load)."""

import json
import math

import pytest
import torch

from rpm.cli import main
from rpm.experiments.peer_supervision import command
from rpm.experiments.peer_supervision.model import one_view_log_posterior
from rpm.experiments.peer_supervision.views import peer_partners, step_views

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["--steps", "4", "--batch-size", "32", "--hidden", "8", "--restarts", "2",
        "--eval-every", "2", "--checkpoint-every", "0"]


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["peer-supervision", "--out", str(tmp_path / name), "--no-progress",
                     "--device", "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize("argv, message", [
    (["--views", "0"], "expected distinct view counts >= 1"),
    (["--views", "2,2"], "expected distinct view counts >= 1"),
    (["--views", "two"], "expected distinct view counts >= 1"),
    (["--views", "500"], "the rarest digit has"),
    (["--batch-size", "1"], "batch size >= 2"),
    (["--batch-size", "2000"], "more than the 1347 training images"),
    (["--clusters", "1"], "expected K >= 2 clusters"),
    (["--restarts", "0"], "positive integer"),
    (["--steps", "0"], "positive integer"),
])
def test_bad_flags_exit_2_with_one_line_and_leave_no_folder(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()[-1]) > 0 and message in err.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()


def test_views_default_and_order():
    from rpm.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["peer-supervision"]).views == list(command.DEFAULT_VIEWS)
    assert parser.parse_args(["peer-supervision", "--views", "5,1"]).views == [5, 1]


@pytest.mark.parametrize("num_views", [2, 3, 5])
def test_partners_are_distinct_other_images_of_the_anchors_digit(num_views):
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (60,), generator=g)
    labels[:4 * num_views] = torch.arange(4).repeat_interleave(num_views)  # J per class at least
    anchors = torch.randperm(60, generator=g)[:40]
    partners = peer_partners(labels, anchors, num_views, g)
    assert len(partners) == num_views - 1
    for n, anchor in enumerate(anchors.tolist()):
        chosen = [int(p[n]) for p in partners]
        assert all(labels[i] == labels[anchor] for i in chosen)
        assert len(set(chosen + [anchor])) == num_views


def test_partners_are_uniform_over_the_other_images_of_the_digit():
    """The partner of an anchor of a 4-image class is each of the other 3 with probability 1/3
    (20000 draws; 5 standard deviations of a binomial proportion)."""
    labels = torch.tensor([0, 0, 0, 0, 1, 1])
    g = torch.Generator().manual_seed(1)
    draws = 20000
    anchors = torch.zeros(draws, dtype=torch.long)
    (partner,) = peer_partners(labels, anchors, 2, g)
    counts = torch.bincount(partner, minlength=6).double() / draws
    tolerance = 5 * math.sqrt((1 / 3) * (2 / 3) / draws)
    assert counts[0] == 0 and counts[4] == 0 and counts[5] == 0
    assert torch.allclose(counts[1:4], torch.full((3,), 1 / 3, dtype=torch.float64), atol=tolerance)


def test_a_step_draws_the_same_views_again_and_augmentations_of_one_image():
    images = torch.rand(30, 1, 8, 8)
    labels = torch.arange(30) % 3
    first = step_views(images, labels, 3, 8, seed=4, step=7)
    again = step_views(images, labels, 3, 8, seed=4, step=7)
    assert len(first) == 3 and all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    # each view is a training image of the anchor's digit
    index = [[int(torch.nonzero((images == v[n]).flatten(1).all(1))[0]) for n in range(8)]
             for v in first]
    for n in range(8):
        assert len({labels[index[j][n]].item() for j in range(3)}) == 1
        assert len({index[j][n] for j in range(3)}) == 3
    pair = step_views(images, labels, 1, 8, seed=4, step=7)
    assert len(pair) == 2 and pair[0].shape == (8, 1, 8, 8) and not torch.equal(pair[0], pair[1])


def test_one_view_posterior_is_the_joint_marginalised_over_the_other_views():
    """q(Z|x_1) from (D2) summed over every combination of the other views of the data, against
    one_view_log_posterior (float64, J = 3, K = 3, 5 data images)."""
    import rpm

    torch.set_default_dtype(torch.float64)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    model = rpm.DiscreteRPM(rpm.CategoricalRecognition(net, 3), 3,
                            prior=torch.tensor([0.2, 0.3, 0.5]))
    data = torch.randn(5, 2, 2)
    with torch.no_grad():
        f = torch.softmax(net(data), -1)  # (5, K)
        F = f.mean(0)  # (K,)
        prior = model.prior_probs
        for n in range(5):
            joint = torch.zeros(3)
            for a in range(5):
                for b in range(5):  # the other two views range over the data
                    joint += prior * f[n] / F * f[a] / F * f[b] / F / 5 / 5
            expected = (joint / joint.sum()).log()
            got = one_view_log_posterior(model, data[n:n + 1], data)[0]
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_end_to_end_run_writes_results_figures_and_resumes(tmp_path, capsys):
    import rpm

    assert _run(tmp_path, *TINY, "--views", "2,3,1") == 0
    out = tmp_path / "run"
    summary = json.loads((out / "results.json").read_text())
    assert {"config", "environment", "evaluation", "accuracy", "accuracy_views",
            "accuracy_per_views", "accuracy_augmentations", "kmeans_raw", "kmeans_untrained",
            "runs", "baselines", "checks", "wall_time"} <= set(summary)
    assert set(summary["accuracy_per_views"]) == {"2", "3"}
    assert summary["accuracy_views"] == 2
    assert summary["accuracy"] == summary["accuracy_per_views"]["2"]
    assert summary["accuracy_augmentations"] == summary["runs"]["augmentations"]["accuracy"]
    for value in (summary["accuracy"], summary["accuracy_augmentations"], summary["kmeans_raw"],
                  summary["kmeans_untrained"], *summary["accuracy_per_views"].values()):
        assert 0.0 <= value <= 1.0
    assert summary["kmeans_raw"] > 0.6  # k-means on the digits' pixels: far above chance (10%)
    assert set(summary["runs"]) == {"views2", "views3", "augmentations"}
    for result in summary["runs"].values():
        counts = torch.tensor(result["confusion"])
        assert counts.shape == (10, 10) and int(counts.sum()) == 450
        # the accuracy is the matched cells of the confusion matrix
        matched = sum(counts[label, k] for k, label in enumerate(result["label_of_cluster"])
                      if label >= 0)
        assert int(matched) / 450 == pytest.approx(result["accuracy"])
        # the selected restart has the highest training log-likelihood
        likelihoods = [r["log_likelihood"] for r in result["restarts"]]
        assert len(likelihoods) == 2
        assert result["log_likelihood"] == max(likelihoods)
        assert result["restarts"][result["selected_restart"]]["accuracy"] == result["accuracy"]
        assert sum(result["prior"]) == pytest.approx(1.0, abs=1e-5)
    assert summary["checks"]["floor"]["floor"] == command.FLOOR
    for name in ("confusion.png", "training.png", "views2/restart0/checkpoint.pt",
                 "augmentations/restart1/history.json", "views3/restart1/model.json"):
        assert (out / name).stat().st_size > 0
    # the selected model loads and gives the same held-out clusters
    selected = summary["runs"]["views2"]["model"]
    model = rpm.load(out, model=selected)
    assert isinstance(model, rpm.DiscreteRPM) and model.num_views == 2
    from rpm.data.digits import load_digits_split
    from rpm.evaluation import match_clusters

    data = load_digits_split()
    clusters = one_view_log_posterior(model, data.test.images, data.train.images).argmax(-1)
    assert match_clusters(clusters, data.test.labels, 10).accuracy == summary["accuracy"]
    capsys.readouterr()
    assert _run(tmp_path, "--resume") == 0
    assert "finished earlier (4/4 steps), reloaded" in capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert again["accuracy_per_views"] == summary["accuracy_per_views"]
    assert len(again["segments"]) == 2


@pytest.mark.slow
def test_augmentations_alone_report_their_accuracy_as_the_headline(tmp_path):
    assert _run(tmp_path, *TINY, "--views", "1", "--restarts", "1") == 0
    summary = json.loads((tmp_path / "run" / "results.json").read_text())
    assert summary["accuracy_per_views"] == {} and summary["accuracy_views"] == 1
    assert summary["accuracy"] == summary["accuracy_augmentations"]
    assert "floor" not in summary["checks"]
