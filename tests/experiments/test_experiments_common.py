"""Shared experiment helpers: argparse range types, run folders, run configuration, device,
seeding and atomic JSON."""

import argparse
import json
import math
import random

import numpy as np
import pytest
import torch

from rpm.experiments import common
from rpm.experiments.common import (
    RUN_MARKER,
    ConfigurationError,
    device_name,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    prepare_run_dir,
    probability,
    resolve_device,
    save_run_config,
    seed_everything,
    seed_value,
    write_json_atomic,
)


@pytest.mark.parametrize(
    "parse, good, bad",
    [
        (positive_int, {"1": 1, "20": 20}, ["0", "-2", "1.5", "x", ""]),
        (nonnegative_int, {"0": 0, "7": 7}, ["-1", "2.0", "nan"]),
        (seed_value, {"0": 0, str(2**32 - 1): 2**32 - 1}, ["-1", str(2**32)]),
        (positive_float, {"1e-3": 1e-3, "2": 2.0}, ["0", "-1e-9", "inf", "nan", "x"]),
        (nonnegative_float, {"0": 0.0, "0.5": 0.5}, ["-0.1", "inf"]),
        (probability, {"0": 0.0, "1": 1.0, "0.25": 0.25}, ["-0.01", "1.01", "nan"]),
        (
            device_name,
            {"auto": "auto", "cpu": "cpu", "cuda": "cuda", "cuda:1": "cuda:1"},
            ["gpu", "cuda:", "cuda:x", "mps"],
        ),
    ],
)
def test_argparse_types(parse, good, bad):
    for text, value in good.items():
        assert parse(text) == value and type(parse(text)) is type(value)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=f"got {text!r}"):
            parse(text)


def test_common_arguments_defaults_and_required_out():
    parser = argparse.ArgumentParser()
    common.add_common_arguments(parser, default_out="runs/x", default_checkpoint_every=50)
    args = parser.parse_args([])
    assert (args.out, args.resume, args.overwrite) == ("runs/x", False, False)
    assert (args.checkpoint_every, args.seed, args.device, args.progress) == (50, 0, "auto", True)
    required = argparse.ArgumentParser()
    common.add_common_arguments(required)
    with pytest.raises(SystemExit):
        required.parse_args([])


def test_fresh_run_dir_is_created_and_marked(tmp_path):
    out = prepare_run_dir(tmp_path / "a" / "b")
    assert out.is_dir() and (out / RUN_MARKER).is_file()
    assert prepare_run_dir(out) == out  # only the marker: still empty


def test_nonempty_run_dir_needs_a_flag(tmp_path):
    out = prepare_run_dir(tmp_path / "run")
    (out / "config.json").write_bytes(b"old")
    with pytest.raises(ConfigurationError, match="--resume to continue it or --overwrite"):
        prepare_run_dir(out)
    assert prepare_run_dir(out, resume=True) == out
    assert (out / "config.json").read_bytes() == b"old"
    (out / "checkpoint.pt").write_bytes(b"old")  # the layout of an older rpm
    with pytest.raises(ConfigurationError, match="written by an older rpm.*--overwrite"):
        prepare_run_dir(out, resume=True)
    with pytest.raises(ConfigurationError, match="exclude each other"):
        prepare_run_dir(out, resume=True, overwrite=True)


def test_overwrite_deletes_a_run_folder_only(tmp_path):
    out = prepare_run_dir(tmp_path / "run")
    (out / "checkpoint.pt").write_bytes(b"old")
    (out / "figures").mkdir()
    (out / "figures" / "a.png").write_bytes(b"png")
    prepare_run_dir(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [RUN_MARKER]

    # Without the marker, a folder of rpm's own files is a run folder ...
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for name in ("checkpoint.pt", "history.json", ".checkpoint.pt.ab12.tmp"):
        (legacy / name).write_bytes(b"x")
    prepare_run_dir(legacy, overwrite=True)
    assert sorted(p.name for p in legacy.iterdir()) == [RUN_MARKER]

    # ... but any other folder is refused and left untouched.
    home = tmp_path / "home"
    home.mkdir()
    for name in ("thesis.tex", "history.json"):
        (home / name).write_bytes(b"precious")
    with pytest.raises(ConfigurationError, match=r"refusing to --overwrite .*thesis\.tex"):
        prepare_run_dir(home, overwrite=True)
    assert sorted(p.name for p in home.iterdir()) == ["history.json", "thesis.tex"]


def test_resume_without_checkpoint_and_file_as_out(tmp_path):
    with pytest.raises(ConfigurationError, match="--resume: there is no run to resume"):
        prepare_run_dir(tmp_path, resume=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match="is a file, not a folder"):
        prepare_run_dir(tmp_path / "file")


def test_run_config_must_match_on_resume(tmp_path):
    args = argparse.Namespace(out=str(tmp_path), lr=0.1, resume=False, device="cpu", func=print)
    saved = save_run_config(tmp_path, args)
    assert json.loads((tmp_path / "config.json").read_text()) == saved
    assert saved == {"out": str(tmp_path), "lr": 0.1, "resume": False, "device": "cpu"}
    resumed = argparse.Namespace(**{**vars(args), "resume": True, "device": "cuda"})
    save_run_config(tmp_path, resumed, resume=True)  # device may change
    changed = argparse.Namespace(**{**vars(resumed), "lr": 0.2})
    with pytest.raises(ConfigurationError, match="--lr: was 0.1, now 0.2"):
        save_run_config(tmp_path, changed, resume=True)
    save_run_config(tmp_path, changed, resume=True, may_change=["lr"])


def test_resolve_device(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigurationError, match="--device cuda:0: CUDA is not available"):
        resolve_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigurationError, match=r"only 2 CUDA device\(s\)"):
        resolve_device("cuda:2")
    with pytest.raises(ConfigurationError, match="got 'tpu'"):
        resolve_device("tpu")


def test_seed_everything_reproduces_every_generator():
    def draw():
        return torch.rand(3), np.random.rand(3), random.random()

    seed_everything(11)
    first = draw()
    seed_everything(11)
    second = draw()
    assert torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert first[2] == second[2]
    seed_everything(12)
    assert not torch.equal(draw()[0], first[0])
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        seed_everything(-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(1.0)


def test_write_json_atomic(tmp_path):
    path = write_json_atomic(tmp_path / "r.json", {"r2": 0.5, "nan": math.nan})
    loaded = json.loads(path.read_text())
    assert loaded["r2"] == 0.5 and math.isnan(loaded["nan"])
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text())["r2"] == 0.5  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_resume_takes_unwritten_flags_from_the_saved_config(tmp_path):
    """On resume, flags not written on the command line (given_flags) take their saved values;
    written ones must match, except those free to change and those that may grow."""
    saved = argparse.Namespace(out=str(tmp_path), resume=False, overwrite=False, lr=0.1,
                               steps=100, device="cpu", threads=1)
    save_run_config(tmp_path, saved)
    # `--resume --out DIR`: every other flag at its parser default
    resumed = argparse.Namespace(out=str(tmp_path), resume=True, overwrite=False, lr=0.5,
                                 steps=7, device="auto", threads=1,
                                 given_flags=frozenset({"out", "resume"}))
    config = save_run_config(tmp_path, resumed, resume=True, may_grow=["steps"])
    assert (resumed.lr, resumed.steps, resumed.device) == (0.1, 100, "cpu")
    assert config["lr"] == 0.1 and "given_flags" not in config
    # a written flag that differs is refused; --steps may grow but not shrink
    changed = argparse.Namespace(**{**vars(resumed), "lr": 0.2,
                                    "given_flags": frozenset({"out", "resume", "lr"})})
    with pytest.raises(ConfigurationError, match="--lr: was 0.1, now 0.2"):
        save_run_config(tmp_path, changed, resume=True)
    shrunk = argparse.Namespace(**{**vars(resumed), "steps": 50,
                                   "given_flags": frozenset({"out", "resume", "steps"})})
    with pytest.raises(ConfigurationError, match=r"--steps: was 100, now 50 \(it may only grow"):
        save_run_config(tmp_path, shrunk, resume=True, may_grow=["steps"])
    grown = argparse.Namespace(**{**vars(resumed), "steps": 300, "device": "cuda",
                                  "given_flags": frozenset({"out", "resume", "steps", "device"})})
    save_run_config(tmp_path, grown, resume=True, may_grow=["steps"])
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["steps"], written["device"], written["lr"]) == (300, "cuda", 0.1)


def test_overwrite_accepts_model_subfolders_of_run_files(tmp_path):
    legacy = tmp_path / "legacy"
    (legacy / "cosine").mkdir(parents=True)
    for name in ("config.json", "cosine/checkpoint.pt", "cosine/history.json"):
        (legacy / name).write_bytes(b"x")
    prepare_run_dir(legacy, overwrite=True)
    assert sorted(p.name for p in legacy.iterdir()) == [RUN_MARKER]
    foreign = tmp_path / "foreign"
    (foreign / "data").mkdir(parents=True)
    (foreign / "data" / "table.csv").write_bytes(b"x")
    with pytest.raises(ConfigurationError, match="refusing to --overwrite"):
        prepare_run_dir(foreign, overwrite=True)


def test_derived_seed_matches_its_seed_sequence_and_separates_streams():
    words = np.random.SeedSequence([3, common.SEED_PURPOSES.index("epoch"), 5]).generate_state(
        2, dtype=np.uint32)
    assert common.derived_seed(3, "epoch", 5) == (int(words[0]) << 31) ^ int(words[1])
    seeds = {common.derived_seed(s, p, i) for s in range(3) for p in common.SEED_PURPOSES
             for i in range(3)}
    assert len(seeds) == 3 * len(common.SEED_PURPOSES) * 3
    assert all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(ValueError, match="purpose must be one of"):
        common.derived_seed(0, "weights")


def test_torch_threads_sets_and_restores():
    before = torch.get_num_threads()
    with common.torch_threads(1) as threads:
        assert threads == torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with common.torch_threads(0) as threads:
        assert threads == before
    with pytest.raises(ValueError, match="threads must be >= 0"):
        with common.torch_threads(-1):
            pass


def test_environment_records_versions_device_and_threads():
    import platform

    import pyro

    import rpm

    env = common.environment(torch.device("cpu"))
    assert env["python"] == platform.python_version() and env["torch"] == torch.__version__
    assert env["pyro"] == pyro.__version__ and env["rpm"] == rpm.__version__
    assert env["device"] == "cpu" and env["torch_threads"] == torch.get_num_threads()
    assert env["world_size"] == 1
    commit = env["git_commit"]
    assert commit is None or len(commit.removesuffix("+dirty")) == 40


def test_global_rng_from_seeds_the_global_generator_from_one_draw_and_restores_it():
    """Inside the block the global generator is torch.manual_seed(first draw of the generator),
    the generator has advanced by that one draw, and outside the global state is unchanged."""
    import torch

    from rpm._random import global_rng_from

    torch.manual_seed(123)
    before = torch.get_rng_state()
    generator = torch.Generator().manual_seed(7)
    with global_rng_from(generator):
        inside = torch.rand(5)
    reference = torch.Generator().manual_seed(7)
    seed = int(torch.randint(0, 2**62, (1,), generator=reference))
    assert torch.equal(inside, torch.rand(5, generator=torch.Generator().manual_seed(seed)))
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(generator.get_state(), reference.get_state())
