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
    resume = re.search(r"`(python -m rpm lds --resume --out \S+)`", message).group(1)
    capsys.readouterr()
    assert main([*resume.split()[3:], "--no-progress"]) == 0
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
    (lambda out: write_model_record(out / "rpm", "pendulum", {}, (3, 8, 8)), RunFolderError,
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
        write_model_record(lds_run / "x", "toy", {}, (5,))
    for shape in ((), (0, 4), (2.5,), "5", (True,)):
        with pytest.raises(ValueError, match="input_shape must be a sequence of positive "):
            write_model_record(lds_run / "x", "lds", {}, shape)
    assert not (lds_run / "x").exists()


def test_the_model_refuses_inputs_of_another_shape_than_it_was_trained_on(lds_run):
    """The toy run's observations have D = 5 (--size small): the record holds [5], and the
    loaded model encodes (N, 5) and (N, T, 5) but refuses 6 numbers, naming both shapes."""
    assert json.loads((lds_run / "rpm" / MODEL_RECORD).read_text())["input_shape"] == [5]
    model = rpm.load(lds_run)
    assert model.trained["input_shape"] == (5,)
    with torch.no_grad():
        assert model.encode(torch.randn(4, 5)).shape == (4, 3)
        assert model.encode_views(torch.randn(2, 6, 5)).shape == (2, 6, 3)
        with pytest.raises(ValueError, match=r"trained on inputs of shape \(5,\) .*got inputs "
                           r"of shape \(6,\)") as refused:
            model.encode(torch.randn(4, 6))
        assert "\n" not in str(refused.value)
        with pytest.raises(ValueError, match=r"got inputs of shape \(6,\)"):
            model.encode_views(torch.randn(2, 3, 6))


def test_a_record_without_input_shape_loads_unchecked(lds_copy):
    """A record written before input_shape existed loads the same weights, without the check."""
    reference = rpm.load(lds_copy)
    path = lds_copy / "rpm" / MODEL_RECORD
    record = json.loads(path.read_text())
    del record["input_shape"]
    path.write_text(json.dumps(record))
    model = rpm.load(lds_copy)
    assert model.trained["input_shape"] is None
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(model.encode(x), reference.encode(x))
    record["input_shape"] = [5, -1]
    path.write_text(json.dumps(record))
    with pytest.raises(RunFolderError, match=r"records input_shape \[5, -1\], not a list"):
        rpm.load(lds_copy)


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
        torch.testing.assert_close(gpu.encode_views(x.cuda()).cpu(), cpu.encode_views(x), atol=1e-5,
                                   rtol=1e-5)


# ---------------------------------------------------------------- runs on your own data (--data)
# A run trained with --data records the sizes read from the file (the observation dimension, the
# input dimension, the channels, the frame size) in its model record, and rpm.load rebuilds the
# model from them: each command's toy run on a file of a shape its defaults do not have loads,
# and embeds new inputs as the encoder written out from (or rebuilt from) the checkpoint.

def _run_on_file(tmp_path, command, arrays, *argv):
    """The run folder of ``rpm COMMAND --data FILE.npz`` on the ``arrays`` (a toy run: one
    thread, the CPU, no evaluation during training, one checkpoint at the end)."""
    import numpy as np

    path = tmp_path / f"{command}.npz"
    np.savez(path, **arrays)
    out = tmp_path / "run"
    assert main([command, "--data", str(path), "--out", str(out), "--no-progress", "--device",
                 "cpu", "--threads", "1", "--eval-every", "0", "--checkpoint-every", "0",
                 *argv]) == 0
    return out


def _loaded(out, command, arguments, model=None):
    """``rpm.load`` of the run: the model, in eval mode, of the command, whose record holds
    ``arguments`` (a subset); and the weights of its checkpoint."""
    from rpm.training.checkpoint import load_checkpoint

    loaded = rpm.load(out, model=model)
    name = model or "rpm"
    assert not loaded.training and loaded.trained["command"] == command
    record = json.loads((out / name / MODEL_RECORD).read_text())["arguments"]
    assert {key: record[key] for key in arguments} == arguments
    weights = load_checkpoint(out / name / "checkpoint.pt")["module"]
    state = loaded.state_dict()
    assert set(state) == set(weights)
    assert all(torch.equal(state[key], weights[key]) for key in weights)
    return loaded, weights


def _prefixed(weights, prefix):
    return {key[len(prefix):]: value for key, value in weights.items() if key.startswith(prefix)}


def test_an_lds_run_on_observations_of_another_dimension_loads(tmp_path):
    """Observations of D = 7 numbers (the default sizes have 5, 10 or 20) and --latent-dim 2: the
    record holds them and the loaded model's means of new sequences are the affine encoder of the
    checkpoint's weights."""
    observations = torch.randn(6, 12, 7, generator=torch.Generator().manual_seed(0))
    out = _run_on_file(tmp_path, "lds", {"observations": observations.numpy()},
                       "--latent-dim", "2", "--steps", "2", "--batch-size", "2", "--window",
                       "4")
    model, weights = _loaded(out, "lds", {"obs_dim": 7, "dim": 2})
    assert model.trained["input_shape"] == (7,)
    assert isinstance(model, rpm.RPM) and isinstance(model.prior, rpm.priors.LinearGaussianPrior)
    x = torch.randn(3, 5, 7)
    expected = (x.double() @ weights["recognition.net.linear.weight"].double().T
                + weights["recognition.net.linear.bias"].double())
    with torch.no_grad():
        z = model.encode_views(x)
    assert z.shape == (3, 5, 2)
    torch.testing.assert_close(z.double(), expected, atol=1e-5, rtol=1e-5)


def test_a_pendulum_run_on_colour_non_square_videos_loads(tmp_path):
    """Videos of 3 channels and 10 x 14 pixels with the flat encoder (whose linear layer depends
    on the frame size): the record holds the channels and the frame size, and the loaded model's
    means of new videos are the convolutions written out from the checkpoint's weights."""
    frames = torch.rand(4, 8, 3, 10, 14, generator=torch.Generator().manual_seed(0))
    out = _run_on_file(tmp_path, "pendulum", {"observations": frames.numpy()},
                       "--encoder", "flat", "--steps", "2", "--batch-size", "2", "--window", "4",
                       "--channels", "2", "--hidden", "4", "--latent-dim", "2",
                       "--eval-drop-frames", "0")
    model, weights = _loaded(out, "pendulum", {"encoder": "flat", "in_channels": 3,
                                               "image_size": [10, 14], "latent_dim": 2})
    assert model.trained["input_shape"] == (3, 10, 14)
    assert isinstance(model, rpm.RPM) and isinstance(model.prior, rpm.priors.LinearGaussianPrior)
    w = {key: value.double() for key, value in _prefixed(weights, "recognition.net.").items()}
    x = torch.rand(2, 5, 3, 10, 14)  # new videos, (N, T, C, H, W)
    h = torch.relu(torch.nn.functional.conv2d(x.double().flatten(0, 1), w["net.0.weight"],
                                              w["net.0.bias"], stride=2, padding=2))
    h = torch.relu(torch.nn.functional.conv2d(h, w["net.2.weight"], w["net.2.bias"], stride=2,
                                              padding=2))  # (M, 4, 3, 4)
    h = torch.relu(h.flatten(1) @ w["net.5.weight"].T + w["net.5.bias"])
    expected = (h @ w["net.7.weight"].T + w["net.7.bias"]).reshape(2, 5, 2)
    with torch.no_grad():
        torch.testing.assert_close(model.encode_views(x).double(), expected, atol=1e-5, rtol=1e-5)


def test_an_identifiability_run_on_pairs_of_another_dimension_loads(tmp_path):
    """Pairs of P = 5 numbers for n = 3 latents (in_dim != dim): the record holds in_dim, and the
    loaded model encodes new inputs as the MLP encoder P -> n given the checkpoint's weights."""
    from rpm.experiments.identifiability.encoder import MLPEncoder

    views = torch.randn(40, 2, 5, generator=torch.Generator().manual_seed(0))
    out = _run_on_file(tmp_path, "identifiability", {"views": views.numpy()}, "--dim", "3",
                       "--steps", "3", "--batch-size", "8", "--hidden", "4", "--depth", "1")
    model, weights = _loaded(out, "identifiability", {"dim": 3, "in_dim": 5}, model="cosine")
    assert model.trained["input_shape"] == (5,)
    assert isinstance(model, rpm.RPM)
    encoder = MLPEncoder(3, 4, 1, "sphere", in_dim=5)
    encoder.load_state_dict(_prefixed(weights, "recognition.net."))
    x = torch.randn(10, 5)
    with torch.no_grad():
        z = model.encode(x)
        assert z.shape == (10, 3)
        torch.testing.assert_close(z, encoder(x))


def test_a_digits_run_on_colour_images_of_another_size_loads(tmp_path):
    """Images of 3 channels and 12 x 12 pixels (the bundled digits: 1 x 8 x 8): the record holds
    the channels, and the loaded RPM embeds new images as the CNN given the checkpoint's weights
    in eval mode."""
    from rpm.experiments.digits.model import DigitsEncoder

    images = torch.rand(48, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    out = _run_on_file(tmp_path, "digits", {"images": images.numpy()}, "--steps", "2",
                       "--batch-size", "16", "--width", "4", "--latent-dim", "8", "--draws", "1",
                       "--methods", "ntxent")
    model, weights = _loaded(out, "digits", {"method": "ntxent", "in_channels": 3},
                             model="ntxent")
    assert isinstance(model, rpm.RPM)
    encoder = DigitsEncoder(width=4, latent_dim=8, in_channels=3)
    encoder.load_state_dict(_prefixed(weights, "recognition.net."))
    encoder.eval()
    x = torch.rand(6, 3, 12, 12)
    with torch.no_grad():
        z = model.encode(x)
        assert z.shape == (6, 8)
        torch.testing.assert_close(z, encoder(x))
        # The CNN pools globally, so 24 x 24 images would pass its layers: the record refuses
        assert model.trained["input_shape"] == (3, 12, 12)
        assert encoder(torch.rand(2, 3, 24, 24)).shape == (2, 8)
        with pytest.raises(ValueError, match=r"trained on inputs of shape \(3, 12, 12\) .*got "
                           r"inputs of shape \(3, 24, 24\)"):
            model.encode(torch.rand(2, 3, 24, 24))
