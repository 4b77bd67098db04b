"""``--batch-size`` against the model and the data, and ``--data`` before torch: every refusal is
one line on stderr, exit status 2, with no run folder written, and a wrong ``--data`` file is
refused before torch is imported."""

import itertools
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rpm.cli import main


def _refused(tmp_path, capsys, argv):
    """Runs ``argv`` with a fresh --out; returns the one line of stderr after checking the exit
    status 2 and that nothing was written."""
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out), "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()
    return err


def _distinct_windows(sequences: int, length: int, span: int) -> int:
    """The distinct (sequence, first frame) of a window spanning ``span`` frames, counted."""
    return len({(n, t) for n, t in itertools.product(range(sequences), range(length))
                if t + span <= length})


@pytest.mark.parametrize("command, data", [
    ("lds", ["--sequences", "4", "--length", "10", "--window", "5", "--steps", "2"]),
    ("pendulum", ["--sequences", "4", "--length", "10", "--window", "5", "--image-size", "8",
                  "--steps", "2"]),
])
def test_window_commands_refuse_one_window_and_more_than_the_distinct_windows(
        tmp_path, capsys, command, data):
    err = _refused(tmp_path, capsys, [command, *data, "--batch-size", "1"])
    assert f"python -m rpm {command}: error: --batch-size 1: a batch needs at least 2 windows" in err
    available = _distinct_windows(4, 10, 5)  # 24
    err = _refused(tmp_path, capsys, [command, *data, "--batch-size", str(available + 1)])
    assert (f"--batch-size {available + 1} is more than the {available} distinct training "
            f"windows" in err)
    assert f"use --batch-size {available} or less" in err


def test_lds_default_data_refuse_the_reported_batch_sizes(tmp_path, capsys):
    """The defaults (200 sequences of 100 frames, windows of 25): 15,200 distinct windows."""
    _refused(tmp_path, capsys, ["lds", "--batch-size", "1"])
    err = _refused(tmp_path, capsys, ["lds", "--batch-size", "100000"])
    assert f"more than the {_distinct_windows(200, 100, 25)} distinct training windows" in err


def test_lds_data_file_counts_the_training_windows_of_the_file(tmp_path, capsys):
    """Five sequences of 12 frames, no states (all train), windows of 4: 45 windows."""
    path = tmp_path / "mine.npz"
    np.savez(path, observations=np.random.default_rng(0).normal(size=(5, 12, 3)))
    available = _distinct_windows(5, 12, 4)
    err = _refused(tmp_path, capsys, ["lds", "--data", str(path), "--window", "4",
                                      "--batch-size", str(available + 1), "--steps", "2"])
    assert f"more than the {available} distinct training windows" in err


def test_masks_counts_the_windows_delta_t_apart(tmp_path, capsys):
    """3 videos of 10 frames, windows of 3 frames 2 apart (a span of 5 frames): 18 windows."""
    data = ["masks", "--videos", "3", "--frames", "10", "--window", "3", "--delta-t", "2",
            "--steps", "2"]
    available = _distinct_windows(3, 10, 5)
    err = _refused(tmp_path, capsys, [*data, "--batch-size", str(available + 1)])
    assert f"more than the {available} distinct training windows" in err


@pytest.mark.parametrize("argv, available, unit", [
    (["bouncing-balls", "--prior", "rbf", "--frames", "40", "--test-frames", "8"], 31, "pairs"),
    (["digits"], 1347, "images"),
])
def test_pair_commands_refuse_more_than_their_training_pairs(tmp_path, capsys, argv, available,
                                                             unit):
    err = _refused(tmp_path, capsys, [*argv, "--batch-size", str(available + 1)])
    assert f"more than the {available} distinct training {unit}" in err


@pytest.mark.parametrize("command", ["masks", "digits", "bouncing-balls"])
def test_contrastive_commands_refuse_a_batch_of_one_before_writing(tmp_path, capsys, command):
    """Refused by the parser (its usage, then one error line), with nothing written."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main([command, "--batch-size", "1", "--out", str(out)])
    assert exit_.value.code == 2
    assert "error: argument --batch-size: expected a batch size >= 2" in capsys.readouterr().err
    assert not out.exists()


def test_check_batch_size_bounds():
    from rpm.experiments.common import ConfigurationError, check_batch_size

    check_batch_size(2, 2, "pairs")
    check_batch_size(10**6, None, "pairs")  # fresh samples every step: no upper bound
    with pytest.raises(ConfigurationError, match="at least 2 pairs"):
        check_batch_size(1, None, "pairs")
    with pytest.raises(ConfigurationError, match="more than the 2 distinct training pairs"):
        check_batch_size(3, 2, "pairs")
    with pytest.raises(ConfigurationError, match="the 1 distinct training pairs: .*; give more data$"):
        check_batch_size(2, 1, "pairs")  # no batch size fits: only more data helps


@pytest.mark.parametrize("sequences, length, window", [(1, 2, 2), (3, 7, 4), (4, 10, 10)])
def test_window_bound_is_the_count_of_distinct_windows(sequences, length, window):
    from rpm.experiments.common import ConfigurationError
    from rpm.experiments.lds.arguments import check_window_batch_size

    available = _distinct_windows(sequences, length, window)
    if available >= 2:
        check_window_batch_size(available, sequences, length, window)
    with pytest.raises(ConfigurationError, match=f"the {available} distinct training windows"):
        check_window_batch_size(available + 1, sequences, length, window)


#: Runs each --data command on a file that is no archive, in one process, and reports whether
#: torch was imported by the time of the refusal.
_BEFORE_TORCH = textwrap.dedent("""
    import sys
    from rpm.cli import main
    bad, out = sys.argv[1], sys.argv[2]
    for command in ("lds", "pendulum", "identifiability", "digits"):
        assert main([command, "--data", bad, "--out", out]) == 2
        assert "torch" not in sys.modules, command
    print("no torch")
""")


def test_a_wrong_data_file_is_refused_before_torch_is_imported(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_text("not an archive")
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", _BEFORE_TORCH, str(bad), str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "no torch\n"
    lines = result.stderr.splitlines()
    assert len(lines) == 4 and all("error: --data " in line and "not a NumPy .npz archive" in line
                                   for line in lines), result.stderr
    assert not out.exists()


@pytest.mark.parametrize("command, required", [("lds", "observations"), ("digits", "images")])
def test_a_data_file_without_the_required_array_names_it(tmp_path, capsys, command, required):
    path = tmp_path / "mine.npz"
    np.savez(path, something=np.zeros(3))
    err = _refused(tmp_path, capsys, [command, "--data", str(path)])
    assert f"the file has no array '{required}' (it has 'something')" in err
