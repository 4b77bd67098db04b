"""Reliability of run folders: each case of issue 21 (items 1-8) that used to fail, now ending in
a clear one-line refusal (exit 2, or 130 for Ctrl-C) or the right result. The tiny experiment of
tests/training/toy_experiment.py stands in for a real one where the case does not depend on the
experiment; the lock with two real processes is in tests/training/test_run_folder.py."""

import argparse
import importlib.util
import io
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

import rpm.cli
import rpm.experiments.bouncing_balls.command as bb
import rpm.experiments.identifiability.command as ident
from rpm.cli import _say, build_parser, main
from rpm.experiments.common import write_json_atomic
from rpm.training.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOY = Path(__file__).resolve().parents[1] / "training" / "toy_experiment.py"
TOY_FLAGS = ["--num-steps", "12", "--checkpoint-every", "4", "--eval-every", "4", "--no-progress",
             "--device", "cpu"]
IDENT_TINY = ["--dim", "3", "--steps", "3", "--batch-size", "8", "--hidden", "4", "--depth", "1",
              "--eval-samples", "20", "--eval-every", "0", "--checkpoint-every", "0",
              "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def toy():
    spec = importlib.util.spec_from_file_location("toy_experiment", TOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main(capsys, argv, modules=None):
    """``rpm ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        status = main(argv, modules=modules)
    except SystemExit as exit:
        status = exit.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _one_line_error(status, err, code=2):
    assert status == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".rpm-lock"}


@pytest.fixture
def toy_run(toy, tmp_path, capsys):
    """A finished toy run (12 steps, checkpoints every 4): its folder."""
    out = tmp_path / "run"
    assert _main(capsys, ["toy", "--out", str(out), *TOY_FLAGS], [toy])[0] == 0
    return out


# --------------------------------------------------------------------------- 2. checksums
def _flip(path, count=64):
    data = bytearray(path.read_bytes())
    rng = random.Random(0)
    start = len(data) // 3
    for index in rng.sample(range(start, start + len(data) // 4), count):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_never_resumed_silently(toy, toy_run, capsys):
    """64 flipped bytes: the previous checkpoint is used with a message and the run ends as an
    undamaged one; with no previous checkpoint, a one-line refusal."""
    expected = load_checkpoint(toy_run / "toy" / "checkpoint.pt")
    _flip(toy_run / "toy" / "checkpoint.pt")
    status, _, err = _main(capsys, ["toy", "--out", str(toy_run), "--resume"], [toy])
    assert status == 0
    assert "checkpoint.pt is damaged; continuing from the previous checkpoint" in err
    again = load_checkpoint(toy_run / "toy" / "checkpoint.pt")
    for key, value in expected["module"].items():
        assert torch.equal(again["module"][key], value)
    _flip(toy_run / "toy" / "checkpoint.pt")
    (toy_run / "toy" / "checkpoint.pt.prev").unlink()
    status, _, err = _main(capsys, ["toy", "--out", str(toy_run), "--resume"], [toy])
    line = _one_line_error(status, err)  # damaged data or damaged structure: refused either way
    assert "checkpoint.pt is damaged: its SHA-256" in line or "truncated or corrupt" in line


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(p.read_bytes()[:100]), "truncated or corrupt"),
    (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    (lambda p: (p.unlink(), p.mkdir()), "is a folder, not a checkpoint file"),
    (lambda p: p.unlink(), "is missing although its manifest records"),
])
def test_truncated_empty_folder_or_deleted_checkpoints_are_one_line_errors(
        toy, toy_run, capsys, damage, message):
    (toy_run / "toy" / "checkpoint.pt.prev").unlink()
    damage(toy_run / "toy" / "checkpoint.pt")
    status, _, err = _main(capsys, ["toy", "--out", str(toy_run), "--resume"], [toy])
    line = _one_line_error(status, err)
    assert message in line and "use --resume" not in line


# --------------------------------------------------------------------------- 3. command
@pytest.mark.slow
def test_resuming_with_another_command_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "ident"
    assert _main(capsys, ["identifiability", "--out", str(out), *IDENT_TINY])[0] == 0
    before = _snapshot(out)
    status, _, err = _main(capsys, ["bouncing-balls", "--resume", "--out", str(out)])
    line = _one_line_error(status, err)
    assert "is a run of `python -m rpm identifiability`, not of `python -m rpm bouncing-balls`" in line
    assert f"`python -m rpm identifiability --resume --out {out}`" in line
    assert _snapshot(out) == before


# --------------------------------------------------------------------------- 4. config
@pytest.mark.parametrize("edit, message", [
    (lambda c: {**c, "lr": 0.5}, "lr (0.05 became 0.5)"),
    (lambda c: {k: v for k, v in c.items() if k != "log_every"}, "log_every (deleted)"),
    (lambda c: [c], "holds a list"),
    (lambda c: {**c, "num_steps": "three"}, "num_steps (12 became 'three')"),
])
def test_an_edited_config_is_refused_naming_the_key(toy, toy_run, capsys, edit, message):
    path = toy_run / "config.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    before = _snapshot(toy_run)
    status, _, err = _main(capsys, ["toy", "--out", str(toy_run), "--resume"], [toy])
    assert message in _one_line_error(status, err)
    assert _snapshot(toy_run) == before


def test_a_deleted_checkpoint_is_an_error_not_a_fresh_start(toy, toy_run, capsys):
    for name in ("checkpoint.pt", "checkpoint.pt.prev"):
        (toy_run / "toy" / name).unlink()
    status, _, err = _main(capsys, ["toy", "--out", str(toy_run), "--resume"], [toy])
    assert "missing although its manifest records" in _one_line_error(status, err)


def test_resume_of_a_folder_holding_only_a_config_starts_the_training(toy, tmp_path, capsys):
    """Killed before the first checkpoint: nothing to lose, --resume trains from step 0."""
    out = tmp_path / "run"
    assert _main(capsys, ["toy", "--out", str(out), *TOY_FLAGS], [toy])[0] == 0
    shutil.rmtree(out / "toy")
    assert _main(capsys, ["toy", "--out", str(out), "--resume"], [toy])[0] == 0
    assert load_checkpoint(out / "toy" / "checkpoint.pt")["step"] == 12


# --------------------------------------------------------------------------- 5. errors
def test_invalid_out_is_one_line(toy, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out, message in [(tmp_path / "file", "is a file, not a folder"),
                         (tmp_path / "file" / "run", "cannot create --out"),
                         (Path("/proc/rpm-run"), "cannot create --out")]:
        status, _, err = _main(capsys, ["toy", "--out", str(out), *TOY_FLAGS], [toy])
        assert message in _one_line_error(status, err)


def test_a_folder_that_becomes_unwritable_during_the_run_is_one_line(toy, tmp_path, capsys,
                                                                      monkeypatch):
    """(As root, chmod does not stop writes: the failure of the OS is simulated.)"""
    import rpm.training.checkpoint as checkpoint

    real = checkpoint.atomic_write
    calls = []

    def read_only(path, write):
        calls.append(path)
        if Path(path).name == "checkpoint.pt" and len(calls) > 3:
            raise PermissionError(13, "Read-only file system", str(path))
        return real(path, write)

    monkeypatch.setattr(checkpoint, "atomic_write", read_only)
    status, _, err = _main(capsys, ["toy", "--out", str(tmp_path / "run"), *TOY_FLAGS], [toy])
    line = _one_line_error(status, err)
    assert "Read-only file system" in line and "checkpoint.pt" in line and "--resume" in line


def test_ctrl_c_during_start_up_or_figures_exits_130_with_one_line(tmp_path, capsys,
                                                                    monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ident, "_process", interrupted)
    status, _, err = _main(capsys, ["identifiability", "--out", str(tmp_path / "a"),
                                    *IDENT_TINY])
    assert "interrupted (Ctrl-C)" in _one_line_error(status, err, code=130)


def test_the_interrupt_message_starts_on_a_new_line_on_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, expected in ((Terminal(), "\nrpm x: interrupted\n"),
                             (io.StringIO(), "rpm x: interrupted\n")):
        monkeypatch.setattr("sys.stderr", stream)
        _say("rpm x: interrupted", after_signal=True)
        assert stream.getvalue() == expected


# --------------------------------------------------------------------------- 6. flags
@pytest.mark.parametrize("argv, message", [
    (["--dim", "1"], "invalid data flags"),
    (["--gennorm-beta", "2"], "gennorm"),
    (["--marginal-param", "2"], "marginal"),
    (["--conditional", "anisotropic", "--concentrations", "1,2,3,4"], "concentrations"),
    (["--space", "box"], "vmf"),
    (["--learn-temperature", "--energy", "bilinear"], "--learn-temperature learns kappa"),
    (["--energy-lr", "0.1"], "--energy-lr is the learning rate"),
    (["--threads", "10000"], "argument --threads: expected at most"),
    (["--step", "3"], "unrecognized arguments: --step"),
    (["--lr", "-1e-3"], "argument --lr: expected a positive number (> 0), got '-1e-3'"),
])
def test_refused_identifiability_flags_leave_no_folder(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    status, _, err = _main(capsys, ["identifiability", "--out", str(out), *IDENT_TINY, *argv])
    assert status == 2 and message in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["--momentum", "0.5"], "--momentum is the momentum of --optimizer sgd"),
    (["--prior", "rbf", "--learn-recognition-noise"], "--learn-recognition-noise sets"),
    (["--prior", "rbf", "--state-space-guide", "recognition"], "--state-space-guide sets"),
    (["--prior", "cosine", "--noise-scale", "0.5"], "--noise-scale sets"),
    (["--epoch", "3"], "unrecognized arguments: --epoch"),
    (["--lr", "-1e-3"], "argument --lr: expected a positive number (> 0), got '-1e-3'"),
    (["--threads", "10000"], "argument --threads: expected at most"),
])
def test_refused_bouncing_balls_flags_leave_no_folder(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    status, _, err = _main(capsys, ["bouncing-balls", "--out", str(out), "--no-progress", *argv])
    assert status == 2 and message in err and "Traceback" not in err, err
    assert not out.exists()


def test_resume_help_names_the_flag_of_its_command(capsys):
    helps = {}
    for command, grow, other in (("bouncing-balls", "--epochs", "--steps"),
                                 ("identifiability", "--steps", "--epochs")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        helps[command] = text
        assert f"{grow} may grow to extend it" in text and f"{other} may grow" not in text


def test_a_folder_that_is_not_a_run_is_not_advised_overwrite(toy, tmp_path, capsys):
    (tmp_path / "thesis.tex").write_text("precious")
    status, _, err = _main(capsys, ["toy", "--out", str(tmp_path), *TOY_FLAGS], [toy])
    line = _one_line_error(status, err)
    assert "is not an rpm run folder" in line and "--overwrite" not in line
    status, _, err = _main(capsys, ["toy", "--out", str(tmp_path), *TOY_FLAGS, "--overwrite"],
                           [toy])
    assert "refusing to --overwrite" in _one_line_error(status, err)
    assert (tmp_path / "thesis.tex").read_text() == "precious"


def test_every_parser_refuses_abbreviations():
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            assert action.choices and all(not p.allow_abbrev for p in action.choices.values())


LDS_TINY = ["--steps", "2", "--sequences", "4", "--test-sequences", "2", "--length", "12",
            "--batch-size", "2", "--window", "4", "--eval-every", "0", "--checkpoint-every", "0",
            "--no-progress"]
PENDULUM_TINY = ["--steps", "2", "--sequences", "3", "--test-sequences", "2", "--length", "12",
                 "--image-size", "8", "--batch-size", "2", "--window", "4", "--channels", "2",
                 "--keypoints", "2", "--latent-dim", "2", "--eval-every", "0",
                 "--checkpoint-every", "0", "--eval-drop-frames", "0", "--no-progress"]


@pytest.mark.parametrize("command, tiny", [("lds", LDS_TINY), ("pendulum", PENDULUM_TINY)])
def test_a_device_this_machine_lacks_is_refused_before_the_folder_is_written(
        tmp_path, capsys, monkeypatch, command, tiny):
    """--device cuda without CUDA: one line, nothing written, so the corrected command runs in
    the same --out; --resume --device cuda leaves the finished run as it was."""
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        line = _one_line_error(*_main(capsys, [command, "--out", str(out), *tiny, "--device",
                                               "cuda"])[::2])
    assert "--device cuda: CUDA is not available" in line and "use --device cpu" in line
    assert not out.exists()
    assert status_ok(_main(capsys, [command, "--out", str(out), *tiny, "--device", "cpu"]))
    before = _snapshot(out)
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        line = _one_line_error(*_main(capsys, [command, "--out", str(out), "--resume",
                                               "--device", "cuda"])[::2])
    assert "CUDA is not available" in line
    assert _snapshot(out) == before


# --------------------------------------------------------------------------- 7. provenance
def test_results_keep_the_original_command_and_every_segment(toy, toy_run, capsys):
    first = json.loads((toy_run / "results.json").read_text())
    assert status_ok(_main(capsys, ["toy", "--out", str(toy_run), "--resume", "--num-steps",
                                    "16"], [toy]))
    results = json.loads((toy_run / "results.json").read_text())
    assert results["command"] == first["command"] and "--resume" not in results["command"]
    assert [s["command"].split()[-2:] for s in results["segments"]] == [
        first["command"].split()[-2:], ["--num-steps", "16"]]
    assert results["segments"][0]["wall_time"] == first["segments"][0]["wall_time"]
    assert results["wall_time"] == pytest.approx(sum(s["wall_time"] for s in results["segments"]))
    assert results["wall_time"] > first["wall_time"]


def status_ok(result):
    return result[0] == 0


def test_results_of_a_finished_run_say_how_each_segment_ended(toy, toy_run, capsys):
    """The segment that writes results.json is still running when it writes them; when it ends
    results.json says how, as the run record does."""
    from rpm.training.run_folder import read_record

    results = json.loads((toy_run / "results.json").read_text())
    assert [s["end"] for s in results["segments"]] == ["finished"]
    assert status_ok(_main(capsys, ["toy", "--out", str(toy_run), "--resume", "--num-steps",
                                    "16"], [toy]))
    results = json.loads((toy_run / "results.json").read_text())
    record = read_record(toy_run)
    assert [s["end"] for s in results["segments"]] == ["finished", "finished"]
    assert results["segments"] == record["segments"]


def test_a_run_that_fails_after_writing_its_results_says_so_in_them(toy, tmp_path, capsys,
                                                                     monkeypatch):
    def failing(args, run):
        write_json_atomic(run.path / "results.json", run.provenance())
        raise RuntimeError("the figures failed")

    monkeypatch.setattr(toy, "_run", failing)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="the figures failed"):
        main(["toy", "--out", str(out), *TOY_FLAGS], modules=[toy])
    results = json.loads((out / "results.json").read_text())
    assert [s["end"] for s in results["segments"]] == ["failed (RuntimeError)"]


# --------------------------------------------------------------------------- 8. output
def test_progress_off_a_terminal_is_one_line_per_tenth(toy, tmp_path, capsys):
    flags = [f for f in TOY_FLAGS if f != "--no-progress"]
    status, _, err = _main(capsys, ["toy", "--out", str(tmp_path / "run"), *flags,
                                    "--num-steps", "40"], [toy])
    assert status == 0 and "\r" not in err
    lines = err.strip().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        f"toy: step {4 * k}/40 ({10 * k}%)" for k in range(1, 11)]
    assert "mse" in lines[-1]


def test_progress_lines_show_a_held_out_score_only_at_the_step_it_was_computed(
        toy, tmp_path, capsys):
    """Lines every 4 steps, evaluations every 10: the score is on the lines of steps 20 and 40
    alone, never repeated on the lines between evaluations."""
    flags = [f for f in TOY_FLAGS if f != "--no-progress"]
    status, _, err = _main(capsys, ["toy", "--out", str(tmp_path / "run"), *flags,
                                    "--num-steps", "40", "--eval-every", "10"], [toy])
    assert status == 0
    lines = err.strip().splitlines()
    scored = [line.split(":")[1].split()[1] for line in lines if "mse" in line]
    assert len(lines) == 10 and scored == ["20/40", "40/40"]
    assert all("loss" in line for line in lines)


@pytest.mark.slow
def test_no_progress_table_does_not_mention_a_progress_bar(tmp_path, capsys):
    status, out, _ = _main(capsys, ["identifiability", "--out", str(tmp_path / "run"),
                                    *IDENT_TINY])
    assert status == 0 and "progress bar" not in out


def test_the_bilinear_critic_failing_is_a_result_not_a_warning():
    results = {name: {"r2": 0.2 if name == "bilinear" else 0.9, "untrained_r2": 0.5,
                      "pixel_error": 3.0, "train_seconds": 1.0} for name in ("rbf", "bilinear")}
    assert bb._warnings(results) == []
    table = bb._table(results).splitlines()
    assert "expected: plain InfoNCE's bilinear critic" in table[2]
    assert "expected" not in table[1]
    results["rbf"]["r2"] = 0.1  # an unexpected failure is still a warning
    assert [line.split(":")[1] for line in bb._warnings(results)] == [" rbf"]


def test_rpm_cli_module_documents_the_exit_statuses():
    assert rpm.cli.EXIT_INTERRUPTED == 130 and rpm.cli.EXIT_USAGE == 2


def test_an_interrupted_run_says_so_on_its_own_lines_and_its_resume_keeps_both_segments(
        toy, tmp_path, capsys, monkeypatch):
    import signal

    from rpm.training.trainer import Trainer

    class Interrupting(Trainer):
        def __init__(self, module, optimizer, loss_fn, **kwargs):
            def loss(step):
                if step == 3:
                    signal.raise_signal(signal.SIGINT)
                return loss_fn(step)

            super().__init__(module, optimizer, loss, **kwargs)

    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(toy, "Trainer", Interrupting)
        status, _, err = _main(capsys, ["toy", "--out", str(out), *TOY_FLAGS], [toy])
    assert status == 130
    assert err.splitlines() == [
        "toy: SIGINT received: stopping after the current step with a checkpoint (again to "
        "stop at once, without one)",
        f"python -m rpm toy: interrupted at step 4; checkpoint saved to {out / 'toy' / 'checkpoint.pt'}; "
        "rerun with --resume to continue"]
    assert _main(capsys, ["toy", "--out", str(out), "--resume"], [toy])[0] == 0
    results = json.loads((out / "results.json").read_text())
    assert [s["end"] for s in results["segments"]] == ["interrupted", "finished"]
    assert "--resume" not in results["command"] and "--resume" in results["segments"][1]["command"]
    assert results["wall_time"] == pytest.approx(sum(s["wall_time"] for s in results["segments"]))


def test_a_model_folder_deleted_with_its_checkpoint_is_refused_on_resume(tmp_path):
    """The issue's deleted checkpoint, when the whole model folder went with it: a model
    without a checkpoint is legitimate only after every trained one, in an unfinished run."""
    from rpm.experiments.common import check_models_resumable
    from rpm.training.run_folder import RunFolderError

    names = ["rbf", "bilinear", "cosine"]
    check_models_resumable(tmp_path, names)  # nothing trained yet
    for name in ("rbf", "bilinear"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "checkpoint.pt").write_bytes(b"x")
    check_models_resumable(tmp_path, names)  # killed before cosine's first checkpoint
    (tmp_path / "bilinear" / "checkpoint.pt").unlink()
    with pytest.raises(RunFolderError, match="checkpoints of bilinear are missing .* although "
                                             "rbf trained after them"):
        check_models_resumable(tmp_path, ["bilinear", "rbf", "cosine"])
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(RunFolderError, match="bilinear, cosine are missing .* the run finished"):
        check_models_resumable(tmp_path, names)
