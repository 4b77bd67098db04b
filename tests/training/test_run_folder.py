"""The run-folder contract (rpm.training.run_folder): the lock refuses a second writer naming it,
with two real processes, and is never stale after a SIGKILL; the run record detects an edited
configuration, naming the keys."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rpm.training.run_folder import (
    LOCK_NAME,
    RunFolderError,
    RunLock,
    config_digest,
    new_record,
    read_record,
    verify_config,
    write_record,
)

TOY = Path(__file__).with_name("toy_experiment.py")
REPO = Path(__file__).resolve().parents[2]
FLAGS = ["--no-progress", "--device", "cpu", "--eval-every", "0", "--checkpoint-every", "5"]


def test_a_second_lock_is_refused_naming_the_holder_and_released_at_exit(tmp_path):
    with RunLock(tmp_path, "rpm toy --out X") as first:
        assert first.held
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "rpm toy --out X"
        with pytest.raises(RunFolderError, match=rf"is in use by process {os.getpid()} on .*"
                                                 r"\(`rpm toy --out X`, started 20"):
            RunLock(tmp_path, "another").acquire()
    assert not first.held and (tmp_path / LOCK_NAME).read_text() == ""
    with RunLock(tmp_path, "another") as second:  # free again
        assert second.held


def _toy(out, *extra, **kwargs):
    return subprocess.Popen([sys.executable, "-u", str(TOY), "toy", "--out", str(out), *FLAGS,
                             *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def _wait_for_lock(out, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            holder = json.loads((out / LOCK_NAME).read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        if holder.get("pid") and (out / "toy" / "checkpoint.pt").is_file():
            return holder
        time.sleep(0.05)
    raise AssertionError("the first run never took the lock")


@pytest.mark.slow
def test_two_real_processes_on_one_folder(tmp_path):
    """The issue's case: a run trains in R while a second `--overwrite` (then a fresh run, then
    `--resume`) starts on R. Each second process exits 2 with one line naming the first; the
    first finishes with its own seed in config.json and results.json. A SIGKILLed holder leaves
    no stale lock: `--resume` takes the folder at once."""
    out = tmp_path / "R"
    first = _toy(out, "--seed", "7", "--num-steps", "3000", "--step-delay", "0.02")
    holder = _wait_for_lock(out)
    assert holder["pid"] == first.pid
    for extra in (["--seed", "8", "--overwrite"], ["--seed", "8"], ["--resume"]):
        second = subprocess.run([sys.executable, str(TOY), "toy", "--out", str(out), *FLAGS,
                                 *extra], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in second.stderr
        assert f"is in use by process {first.pid}" in lines[0] and "toy" in lines[0]
    first.kill()  # SIGKILL: the OS releases the lock
    assert first.wait(timeout=30) == -signal.SIGKILL
    assert json.loads((out / "config.json").read_text())["seed"] == 7
    resumed = subprocess.run([sys.executable, str(TOY), "toy", "--out", str(out), "--resume",
                              "--step-delay", "0", "--checkpoint-every", "0"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    results = json.loads((out / "results.json").read_text())
    assert json.loads((out / "config.json").read_text())["seed"] == 7
    assert [s["end"] for s in read_record(out)["segments"]] == ["killed", "finished"]
    assert results["command"].startswith("python -m rpm toy --out") and "--seed 7" in results["command"]


def _recorded(folder, config):
    record = new_record("toy")
    record.update(config=config, config_sha256=config_digest(config))
    write_record(folder, record)
    (folder / "config.json").write_text(json.dumps(config))
    return read_record(folder)


def test_verify_config_names_the_edited_keys(tmp_path):
    config = {"lr": 0.001, "batch_size": 256, "energy": "cosine"}
    record = _recorded(tmp_path, config)
    assert verify_config(tmp_path, record) == config
    cases = [
        ({**config, "lr": 0.5}, r"lr \(0.001 became 0.5\)"),
        ({k: v for k, v in config.items() if k != "batch_size"}, r"batch_size \(deleted\)"),
        ({**config, "energy": "rbf"}, r"energy \('cosine' became 'rbf'\)"),
        ([1, 2], "holds a list, not the run's configuration"),
    ]
    for edited, message in cases:
        (tmp_path / "config.json").write_text(json.dumps(edited))
        with pytest.raises(RunFolderError, match=message):
            verify_config(tmp_path, record)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RunFolderError, match="is not valid JSON"):
        verify_config(tmp_path, record)
    record["config"]["lr"] = 0.5  # the record itself edited
    (tmp_path / "config.json").write_text(json.dumps(record["config"]))
    with pytest.raises(RunFolderError, match="record .* was edited"):
        verify_config(tmp_path, record)


def test_an_older_text_marker_is_not_a_record(tmp_path):
    (tmp_path / ".rpm-run").write_text("rpm run folder: rpm --overwrite may delete its content\n")
    with pytest.raises(RunFolderError, match="older rpm .*--overwrite"):
        read_record(tmp_path)
    assert read_record(tmp_path / "none") is None
