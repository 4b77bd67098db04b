"""``rpm lds --data FILE.npz`` and :func:`rpm.experiments.lds.fit`: the command's own generated
data written to a file gives the same scores as the generated run; files without states train
and say the scores were skipped; every bad file is refused in one line before a run folder
exists."""

import json

import numpy as np
import pytest
import torch

import rpm.experiments.lds
from rpm.cli import main
from rpm.data.lds import generate_lds
from rpm.experiments.common import derived_seed

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAINING = ["--steps", "6", "--batch-size", "4", "--window", "8", "--eval-every", "3",
            "--checkpoint-every", "0"]
SCORES = ("r2", "means_r2", "eigenvalue_error", "forecast_error", "var_forecast_error",
          "untrained")


def _run(tmp_path, *argv, name="run"):
    try:
        return main(["lds", "--out", str(tmp_path / name), "--no-progress", "--device", "cpu",
                     "--threads", "1", *argv])
    except SystemExit as exit:
        return exit.code


def _system():
    """The sequences ``rpm lds --sequences 12 --test-sequences 6 --length 20`` generates."""
    return generate_lds(18, 20, 3, 5, seed=derived_seed(0, "data"))


def test_own_generated_data_in_a_file_gives_the_generated_runs_scores(tmp_path, capsys):
    assert _run(tmp_path, "--sequences", "12", "--test-sequences", "6", "--length", "20",
                *TRAINING, name="generated") == 0
    system = _system()
    path = tmp_path / "lds.npz"
    np.savez(path, observations=system.observations.numpy(), states=system.states.numpy(),
             held_out=np.arange(18) >= 12, transition_matrix=system.transition_matrix.numpy())
    assert _run(tmp_path, "--data", str(path), *TRAINING, name="file") == 0
    generated = json.loads((tmp_path / "generated" / "results.json").read_text())
    from_file = json.loads((tmp_path / "file" / "results.json").read_text())
    for key in SCORES:
        assert from_file[key] == generated[key], key
    assert from_file["data"] == {"file": str(path), "sequences": 18, "held_out": 6, "frames": 20}
    assert "scores_skipped" not in from_file
    assert f"lds {path}: held-out R^2 {from_file['r2']:.4f}" in capsys.readouterr().out


def test_the_public_fit_is_the_commands_training_and_scoring(tmp_path):
    """fit() on the arrays, with the held-out sequences in the middle of the file: the same
    scores as the command with them last (the split, not the order, decides)."""
    system = _system()
    assert _run(tmp_path, "--sequences", "12", "--test-sequences", "6", "--length", "20",
                *TRAINING) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    order = np.r_[0:6, 12:18, 6:12]  # the held-out sequences 12-17 moved to rows 6-11
    held_out = np.zeros(18, dtype=bool)
    held_out[6:12] = True
    fit = rpm.experiments.lds.fit(
        system.observations.numpy()[order], system.states[order], held_out,
        transition_matrix=system.transition_matrix, steps=6, batch_size=4, window=8,
        eval_every=3, checkpoint_every=0, progress=False, device="cpu")
    for key in ("r2", "means_r2", "eigenvalue_error", "forecast_error", "var_forecast_error"):
        assert fit.scores[key] == results[key], key
    assert fit.data.num_train == 12
    assert fit.data.index.tolist() == [*range(6), *range(12, 18), *range(6, 12)]
    assert fit.inference.smoothed.shape == (18, 20, 3)
    assert not fit.model.recognition.net.training


def test_without_states_training_runs_and_the_scores_are_skipped(tmp_path, capsys):
    system = _system()
    path = tmp_path / "no_states.npz"
    np.savez(path, observations=system.observations.numpy())
    assert _run(tmp_path, "--data", str(path), *TRAINING) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["r2"] is None and results["eigenvalue_error"] is None
    assert results["scores_skipped"] == f"no states in {path}"
    assert results["data"]["held_out"] == 0  # nothing to score: every sequence trains
    assert results["eigenvalues"]["true"] is None and len(results["eigenvalues"]["learned"]) == 5
    assert results["history"]["evaluations"][-1]["step"] == 6
    assert (tmp_path / "run" / "dynamics.png").stat().st_size > 0
    assert f"scores skipped: no states in {path}" in capsys.readouterr().out
    fit = rpm.experiments.lds.fit(system.observations, steps=2, batch_size=2, window=4,
                                  progress=False, latent_dim=2)
    assert fit.scores is None and fit.scores_skipped == "no states given"
    assert fit.inference.means.shape == (18, 20, 2)


def _bad_files():
    x = np.random.default_rng(0).normal(size=(6, 10, 2))
    s = np.random.default_rng(1).normal(size=(6, 10, 1))
    nan = x.copy()
    nan[2, 3, 1] = np.nan
    return {
        "only states": ({"states": s}, "has no array 'observations' (it has 'states')"),
        "flat observations": ({"observations": x[:, :, 0]},
                              "observations must have shape (N, T, D), got shape (6, 10)"),
        "text": ({"observations": np.full((6, 10, 2), "a")}, "must be a numeric array"),
        "nan": ({"observations": nan}, "1 NaN or infinite value(s) (the first at index (2, 3, 1))"),
        "one frame": ({"observations": x[:, :1]}, "needs at least 2"),
        "short": ({"observations": x[:, :5]}, "5 frames, fewer than --window 8"),
        "one sequence": ({"observations": x[:1], "states": s[:1]}, "too few sequences (1)"),
        "states shape": ({"observations": x, "states": s[:, :9]},
                         "states must have shape (N, T, K) = (6, 10, K)"),
        "held_out ints": ({"observations": x, "held_out": np.array([0, 0, 0, 0, 1, 1])},
                          "held_out must be a boolean array"),
        "held_out length": ({"observations": x, "held_out": np.zeros(5, dtype=bool)},
                            "held_out must have shape (6,)"),
        "all held out": ({"observations": x, "held_out": np.ones(6, dtype=bool)},
                         "none is left to train on"),
        "none held out": ({"observations": x, "states": s, "held_out": np.zeros(6, dtype=bool)},
                          "at least one held-out sequence"),
        "few frames": ({"observations": x[:, :8], "states": s[:, :8],
                        "held_out": np.array([False, True, True, True, True, True])},
                       "too few training frames to score"),
        "transition": ({"observations": x, "states": s, "transition_matrix": np.eye(2)},
                       "transition_matrix must have shape (K, K) = (1, 1)"),
    }


@pytest.mark.parametrize("case", list(_bad_files()))
def test_a_bad_file_is_refused_in_one_line_before_the_run_folder(tmp_path, capsys, case):
    arrays, message = _bad_files()[case]
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    assert _run(tmp_path, "--data", str(path), "--window", "8") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m rpm lds: error: --data {path}: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, message", [
    (["--data", "missing.npz"], "--data missing.npz: no such file"),
    (["--data", "{tmp}/plain.npz"], "the file holds a single array, not named arrays"),
    (["--data", "{tmp}/text.npz"], "not a NumPy .npz archive"),
    (["--data", "{tmp}/good.npz", "--length", "30"], "--length describe(s) the generated data"),
])
def test_a_missing_file_or_a_generation_flag_is_refused(tmp_path, capsys, argv, message):
    np.save(tmp_path / "plain.npy", np.zeros((3, 4, 2)))
    (tmp_path / "plain.npz").write_bytes((tmp_path / "plain.npy").read_bytes())
    (tmp_path / "text.npz").write_text("observations: 1 2 3")
    np.savez(tmp_path / "good.npz", observations=np.zeros((3, 10, 2)))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert _run(tmp_path, *argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_fit_checks_its_options_as_the_command_line_does():
    x = torch.randn(4, 10, 2)
    with pytest.raises(ValueError, match="unknown option batch=...; the options of lds are"):
        rpm.experiments.lds.fit(x, batch=3)
    with pytest.raises(ValueError, match="size"):
        rpm.experiments.lds.fit(x, size="small")  # the generated data's flag
    with pytest.raises(ValueError, match=r"steps=0: expected a positive integer"):
        rpm.experiments.lds.fit(x, steps=0)
    with pytest.raises(ValueError, match="prior must be one of free, stationary"):
        rpm.experiments.lds.fit(x, prior="none")
    with pytest.raises(ValueError, match="progress must be True or False"):
        rpm.experiments.lds.fit(x, progress=1)
    with pytest.raises(ValueError, match="fewer than --window 25"):
        rpm.experiments.lds.fit(x)
