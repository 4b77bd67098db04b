"""``rpm rpm-hmm``: the chain and the scores against independent computations, the command
line's refusals, and a smoke-size run through ``main``."""

import itertools
import json
import math

import matplotlib.image
import pytest
import torch

from rpm.cli import main
from rpm.data.digits import load_digits_split
from rpm.experiments.rpm_hmm.chain import digit_chain, rbf_transition_matrix, sample_states
from rpm.experiments.rpm_hmm.evaluate import match_states, state_accuracy, transition_error

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["rpm-hmm", "--out", str(tmp_path / name), "--no-progress", "--device",
                     "cpu", "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def test_the_transition_matrix_is_walker_et_al_s_rbf_kernel():
    """A_ij = exp(-(i-j)^2 / l) / sum_j', by loops; l = 2 is exp(-(i-j)^2 / 2)."""
    for lengthscale in (1.0, 2.0):
        matrix = rbf_transition_matrix(6, lengthscale)
        for i in range(6):
            row = [math.exp(-((i - j) ** 2) / lengthscale) for j in range(6)]
            for j in range(6):
                assert matrix[i, j].item() == pytest.approx(row[j] / sum(row), abs=1e-15)


def test_sampled_states_follow_the_transition_matrix():
    """The empirical transition frequencies of 40,000 steps match A within 5 standard errors,
    and the draw depends on its seed alone."""
    matrix = rbf_transition_matrix(4, 2.0)
    states = sample_states(matrix, 40000, seed=3)
    counts = torch.zeros(4, 4, dtype=torch.float64)
    counts.index_put_((states[:-1], states[1:]), torch.ones(len(states) - 1,
                                                             dtype=torch.float64),
                      accumulate=True)
    visits = counts.sum(1, keepdim=True)
    frequencies = counts / visits
    standard_error = (matrix * (1 - matrix) / visits).sqrt()
    assert ((frequencies - matrix).abs() <= 5 * standard_error + 1e-12).all()
    torch.manual_seed(0)
    assert torch.equal(states, sample_states(matrix, 40000, seed=3))
    assert not torch.equal(states[:100], sample_states(matrix, 100, seed=4))


def test_a_chain_shows_images_of_its_states_from_its_pool_only():
    split = load_digits_split()
    states = sample_states(rbf_transition_matrix(3), 500, seed=0)
    keep = split.test.labels < 3
    chain = digit_chain(states, split.test.images[keep], split.test.labels[keep],
                        split.test.indices[keep], seed=1)
    by_row = dict(zip(split.test.indices.tolist(), split.test.labels.tolist(), strict=True))
    assert [by_row[row] for row in chain.rows.tolist()] == states.tolist()
    assert not set(chain.rows.tolist()) & set(split.train.indices.tolist())
    with pytest.raises(ValueError, match="no image of the digit"):
        digit_chain(torch.tensor([0, 5]), split.test.images[keep], split.test.labels[keep],
                    split.test.indices[keep], seed=1)


def test_the_matching_is_the_best_permutation_by_brute_force():
    """Against every permutation of 4 states: the most frames right, the accuracy it gives,
    and the transition error of a relabelled true matrix is 0."""
    generator = torch.Generator().manual_seed(0)
    classes = torch.randint(4, (300,), generator=generator)
    relabel = torch.tensor([2, 0, 3, 1])  # state of each class
    noisy = torch.where(torch.rand(300, generator=generator) < 0.3,
                        torch.randint(4, (300,), generator=generator), relabel[classes])
    best = max(itertools.permutations(range(4)),
               key=lambda p: sum(p[s] == c for s, c in zip(noisy.tolist(), classes.tolist(),
                                                            strict=True)))
    sigma = match_states(noisy, classes, 4)
    assert tuple(sigma.tolist()) == best
    right = sum(best[s] == c for s, c in zip(noisy.tolist(), classes.tolist(), strict=True))
    assert state_accuracy(noisy, classes, sigma) == pytest.approx(right / 300)
    true = rbf_transition_matrix(4)
    learned = torch.empty(4, 4, dtype=torch.float64)
    for i in range(4):
        for j in range(4):
            learned[relabel[i], relabel[j]] = true[i, j]
    assert transition_error(learned, true, torch.argsort(relabel)) == 0.0


@pytest.mark.parametrize("argv, message", [
    (["--length", "1"], "argument --length: expected an integer >= 2"),
    (["--test-length", "1"], "argument --test-length: expected an integer >= 2"),
    (["--states", "1"], "argument --states: expected K in [2, 10] states"),
    (["--states", "11"], "argument --states: expected K in [2, 10] states"),
    (["--window", "1"], "argument --window: expected an integer >= 2"),
    (["--window", "50", "--length", "20"], "--window 50 is longer than the training chain"),
    (["--lengthscale", "0"], "argument --lengthscale"),
])
def test_bad_flags_are_one_error_line_and_write_nothing(tmp_path, capsys, argv, message):
    assert _run(tmp_path, *argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_smoke_run_writes_its_results_and_figures_and_resumes(tmp_path, capsys):
    argv = ["--steps", "6", "--length", "200", "--test-length", "60", "--states", "3",
            "--batch-size", "4", "--window", "10", "--hidden", "16", "--eval-every", "3",
            "--checkpoint-every", "0"]
    assert _run(tmp_path, *argv) == 0
    out = tmp_path / "run"
    results = json.loads((out / "results.json").read_text())
    for key in ("state_accuracy", "recognition_accuracy", "train_state_accuracy"):
        assert 0.0 <= results[key] <= 1.0
    assert 0.0 <= results["transition_error"] <= 1.0
    assert sorted(results["matching"]) == [0, 1, 2]
    learned = torch.tensor(results["transition_matrix"]["learned"])
    torch.testing.assert_close(learned.sum(1), torch.ones(3, dtype=learned.dtype))
    torch.testing.assert_close(torch.tensor(results["transition_matrix"]["true"],
                                            dtype=torch.float64), rbf_transition_matrix(3))
    assert results["data"]["shared_images"] == 0
    assert results["data"]["test_images"] <= 3 * 46  # test images of the digits 0-2
    assert [e["step"] for e in results["history"]["evaluations"]] == [0, 3, 6]
    assert results["floors"] == {"state_accuracy": 0.97, "transition_error": 0.05}
    assert results["config"]["states"] == 3 and results["config"]["seed"] == 0
    for figure in ("transitions.png", "training.png"):
        image = matplotlib.image.imread(out / figure)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300
    assert (out / "rpm" / "model.json").exists()
    capsys.readouterr()
    assert _run(tmp_path, "--resume") == 0
    assert "finished earlier (6/6 steps), reloaded" in capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert again["state_accuracy"] == results["state_accuracy"]
    assert again["transition_matrix"] == results["transition_matrix"]


def test_a_finished_run_loads_as_the_trained_model(tmp_path):
    import rpm

    argv = ["--steps", "2", "--length", "50", "--test-length", "20", "--states", "2",
            "--batch-size", "2", "--window", "5", "--hidden", "8", "--eval-every", "0"]
    assert _run(tmp_path, *argv) == 0
    model = rpm.load(tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    sigma = torch.tensor(results["matching"])
    inverse = torch.argsort(sigma)
    learned = model.transition_matrix[inverse][:, inverse]
    torch.testing.assert_close(learned, torch.tensor(results["transition_matrix"]["learned"]))
