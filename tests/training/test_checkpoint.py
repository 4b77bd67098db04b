"""Checkpoints: a saved and restored training state continues exactly like the original, and
a failed write never damages the previous checkpoint."""

import random

import numpy as np
import pytest
import torch

from rpm.training import checkpoint as ckpt
from rpm.training.checkpoint import (
    CheckpointError,
    capture_rng_state,
    load_checkpoint,
    remove_stale_temporaries,
    restore_rng_state,
    save_checkpoint,
)


def _draw_everything(generators):
    return (
        torch.rand(5),
        np.random.rand(5),
        [random.random() for _ in range(5)],
        torch.rand(5, generator=generators["t"]),
        generators["n"].random(5),
    )


def _assert_same_draws(a, b):
    assert torch.equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2]
    assert torch.equal(a[3], b[3])
    np.testing.assert_array_equal(a[4], b[4])


@pytest.mark.parametrize("through_file", [False, True])
def test_rng_state_round_trip_replays_every_generator(tmp_path, through_file):
    generators = {"t": torch.Generator().manual_seed(3), "n": np.random.default_rng(4)}
    _draw_everything(generators)  # move every generator away from its seed
    state = capture_rng_state(generators)
    if through_file:
        save_checkpoint(tmp_path / "rng.pt", {"rng": state})
        state = load_checkpoint(tmp_path / "rng.pt")["rng"]
    first = _draw_everything(generators)
    second_without_restore = _draw_everything(generators)
    restore_rng_state(state, generators)
    replay = _draw_everything(generators)
    _assert_same_draws(first, replay)
    assert not torch.equal(first[0], second_without_restore[0])  # the draws do move on


def test_restore_rejects_other_generators():
    state = capture_rng_state({"t": torch.Generator()})
    with pytest.raises(ValueError, match=r"generators \['t'\].*registers \['u'\]"):
        restore_rng_state(state, {"u": torch.Generator()})
    with pytest.raises(ValueError, match="torch generator but is now a numpy"):
        restore_rng_state(state, {"t": np.random.default_rng()})
    with pytest.raises(TypeError, match="torch.Generator or numpy.random.Generator"):
        capture_rng_state({"t": random.Random()})


def _make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def _train(model, optimizer, scheduler, generator, steps):
    for _ in range(steps):
        x = torch.randn(16, 3, generator=generator)
        y = torch.randn(16, 1)  # the global generator
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def test_checkpoint_round_trip_continues_exactly(tmp_path):
    generator = torch.Generator().manual_seed(7)
    model, optimizer, scheduler = _make(0)
    _train(model, optimizer, scheduler, generator, 5)
    save_checkpoint(
        tmp_path / "checkpoint.pt",
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": capture_rng_state({"data": generator}),
        },
    )
    _train(model, optimizer, scheduler, generator, 5)

    # A fresh model (other initial values), optimiser, scheduler and generator, restored.
    generator2 = torch.Generator().manual_seed(123)
    model2, optimizer2, scheduler2 = _make(1)
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    model2.load_state_dict(state["model"])
    optimizer2.load_state_dict(state["optimizer"])
    scheduler2.load_state_dict(state["scheduler"])
    restore_rng_state(state["rng"], {"data": generator2})
    _train(model2, optimizer2, scheduler2, generator2, 5)

    for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, p2)
    assert optimizer.param_groups[0]["lr"] == optimizer2.param_groups[0]["lr"] == 0.05 * 0.5**5
    assert scheduler.state_dict() == scheduler2.state_dict()


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 1, "w": torch.arange(4.0)})
    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):
        real_save(obj, f)
        f.truncate(f.tell() // 2)  # a partial file, as a kill during the write leaves
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"step": 2, "w": torch.zeros(4)})
    monkeypatch.undo()
    state = load_checkpoint(path)
    assert state["step"] == 1 and torch.equal(state["w"], torch.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_load_reports_missing_corrupt_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")
    good = tmp_path / "good.pt"
    save_checkpoint(good, {"w": torch.randn(100)})
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"w": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="not an rpm checkpoint"):
        load_checkpoint(foreign)
    with pytest.raises(TypeError, match="as a dict, got list"):
        save_checkpoint(good, [1, 2])


def test_remove_stale_temporaries_touches_only_our_temporaries(tmp_path):
    path = tmp_path / "checkpoint.pt"
    stale = tmp_path / ".checkpoint.pt.0123abcd.tmp"
    stale.write_bytes(b"partial")
    others = [tmp_path / ".history.json.0123.tmp", tmp_path / "checkpoint.pt.tmp", path]
    for other in others:
        other.write_bytes(b"x")
    assert remove_stale_temporaries(path) == [stale]
    assert not stale.exists() and all(other.exists() for other in others)


def test_atomic_write_creates_folder_and_uses_default_permissions(tmp_path):
    path = ckpt.atomic_write(tmp_path / "a" / "b.txt", lambda f: f.write(b"hello"))
    assert path.read_bytes() == b"hello"
    reference = tmp_path / "reference.txt"
    reference.write_bytes(b"")  # created with the process umask, as atomic_write should
    assert path.stat().st_mode & 0o777 == reference.stat().st_mode & 0o777


def _weights_only_load(path):
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.MT19937])
def test_rng_state_is_plain_data_that_weights_only_reads(tmp_path, bit_generator):
    """NumPy's and Python's states are lists and numbers, so torch.load(weights_only=True) reads
    the file, and the decoded states replay every generator (MT19937 keeps a uint32 array)."""
    generators = {"t": torch.Generator().manual_seed(1),
                  "n": np.random.Generator(bit_generator(5))}
    np.random.seed(9)
    random.seed(9)
    _draw_everything(generators)
    save_checkpoint(tmp_path / "rng.pt", {"rng": capture_rng_state(generators)})
    payload = _weights_only_load(tmp_path / "rng.pt")
    state = payload["state"]["rng"]
    assert isinstance(state["random"], list) and isinstance(state["random"][1], list)
    assert isinstance(state["numpy"]["state"]["key"]["array"], list)
    first = _draw_everything(generators)
    restore_rng_state(state, generators)
    _assert_same_draws(first, _draw_everything(generators))


class _Payload:
    """Any Python object: unpickling it would import and call code named in the file."""


@pytest.mark.parametrize("value, where", [
    (np.zeros(3), r"state\['rng'\]\[1\] is a numpy.ndarray"),
    (_Payload(), r"state\['rng'\]\[1\] is a .*_Payload"),
    ({1.5: 2}, r"state\['rng'\]\[1\] has the key 1.5"),
])
def test_save_refuses_objects_a_weights_only_load_could_not_read(tmp_path, value, where):
    with pytest.raises(TypeError, match=where):
        save_checkpoint(tmp_path / "c.pt", {"rng": [0, value]})
    assert not (tmp_path / "c.pt").exists()


def test_load_refuses_a_checkpoint_carrying_a_pickled_object(tmp_path):
    path = tmp_path / "unsafe.pt"
    torch.save({"format": "rpm-checkpoint", "version": 2, "state": {"x": _Payload()}}, path)
    with pytest.raises(CheckpointError, match=r"refusing to load .*pickled Python object "
                                              r"\(.*_Payload\).*--overwrite"):
        load_checkpoint(path)
