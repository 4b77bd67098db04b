"""``rpm.load`` (rpm/experiments/trained.py): the folders it refuses, each with one line that
says what to do; an older run made loadable by ``--resume``; the README's snippet run on a real
run folder; a GPU load. The load of each command's run, against the embeddings computed from
its checkpoint, is tested with the command (tests/experiments/*/test_*_command.py)."""

import json
import re
import runpy
import shutil
from pathlib import Path

import pytest
import torch

import rpm
from rpm.cli import main
from rpm.experiments.trained import MODEL_RECORD, model_names, write_model_record
from rpm.training.checkpoint import CheckpointError
from rpm.training.run_folder import RunFolderError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
LDS_TINY = ["--steps", "2", "--sequences", "4", "--test-sequences", "2", "--length", "12",
            "--batch-size", "2", "--window", "4", "--eval-every", "0", "--checkpoint-every", "0",
            "--no-progress", "--device", "cpu", "--threads", "1"]


@pytest.fixture(scope="module")
def lds_run(tmp_path_factory):
    """A finished toy ``rpm lds`` run (leave it as it is; copy it to change it)."""
    out = tmp_path_factory.mktemp("lds") / "run"
    assert main(["lds", "--out", str(out), *LDS_TINY]) == 0
    return out


@pytest.fixture
def lds_copy(lds_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(lds_run, copy)
    return copy


def test_the_models_of_a_run_are_its_folders_with_a_record(lds_run):
    assert model_names(lds_run) == ["rpm"]
    assert json.loads((lds_run / "rpm" / MODEL_RECORD).read_text())["command"] == "lds"


def test_a_missing_folder_a_file_or_a_foreign_folder_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run folder at .*: give the --out folder"):
        rpm.load(tmp_path / "nothing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="is a file, not a run folder"):
        rpm.load(tmp_path / "file")
    (tmp_path / "other").mkdir()
    with pytest.raises(RunFolderError, match=r"is not an rpm run folder \(it has no run record"):
        rpm.load(tmp_path / "other")


def test_a_run_of_an_older_rpm_is_refused_and_resume_makes_it_loadable(lds_copy, capsys):
    """Without the model record (what an older rpm wrote) the load says to re-run, and the
    ``--resume`` it names records the finished run without training: the model then loads with
    the same weights."""
    reference = rpm.load(lds_copy).state_dict()
    (lds_copy / "rpm" / MODEL_RECORD).unlink()
    with pytest.raises(RunFolderError) as refused:
        rpm.load(lds_copy)
    message = str(refused.value)
    assert "written by an older rpm" in message and "\n" not in message
    resume = re.search(r"`(rpm lds --resume --out \S+)`", message).group(1)
    capsys.readouterr()
    assert main([*resume.split()[1:], "--no-progress"]) == 0
    assert "finished earlier (2/2 steps), reloaded" in capsys.readouterr().out
    again = rpm.load(lds_copy).state_dict()
    assert all(torch.equal(again[key], value) for key, value in reference.items())


@pytest.mark.parametrize("damage, error, message", [
    (lambda out: (out / "rpm" / "checkpoint.pt").unlink(), RunFolderError,
     "has no checkpoint yet"),
    (lambda out: (out / "rpm" / "checkpoint.pt").write_bytes(b"\0" * 64), CheckpointError,
     "damaged|corrupt"),
    (lambda out: (out / "config.json").write_text(
        (out / "config.json").read_text().replace('"hidden": 0', '"hidden": 8')),
     RunFolderError, r"differs from the configuration the run was made with: hidden"),
    (lambda out: (out / "rpm" / MODEL_RECORD).write_text("{"), RunFolderError,
     "cannot read the model record"),
    (lambda out: write_model_record(out / "rpm", "pendulum", {}), RunFolderError,
     "records a model of `rpm pendulum` in a run of `rpm lds`"),
])
def test_a_damaged_run_is_refused_with_one_line(lds_copy, damage, error, message):
    damage(lds_copy)
    with pytest.raises(error, match=message) as refused:
        rpm.load(lds_copy)
    assert "\n" not in str(refused.value)


def test_bad_devices_and_records_are_refused(lds_run, monkeypatch):
    with pytest.raises(ValueError, match="device must be a torch device such as 'cpu'"):
        rpm.load(lds_run, device="gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available here .*load with device='cpu'"):
        rpm.load(lds_run, device="cuda")
    with pytest.raises(ValueError, match="command must be one of"):
        write_model_record(lds_run / "x", "toy", {})


def test_the_readme_snippet_runs_on_a_run_folder(lds_run, tmp_path, capsys):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use a trained model", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert '"runs/lds-small"' in code
    script = tmp_path / "snippet.py"
    script.write_text(code.replace('"runs/lds-small"', repr(str(lds_run))))
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out.splitlines() == ["lds 2 small", "torch.Size([4, 100, 3])"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cpu_run_loads_on_the_gpu(lds_run):
    cpu = rpm.load(lds_run)
    gpu = rpm.load(lds_run, device="cuda")
    assert all(p.device.type == "cuda" for p in gpu.parameters()) and not gpu.training
    x = torch.randn(3, 12, 5)
    with torch.no_grad():
        torch.testing.assert_close(gpu.encode(x.cuda()).cpu(), cpu.encode(x), atol=1e-5,
                                   rtol=1e-5)
