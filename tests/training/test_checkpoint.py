"""Checkpoints: a saved and restored training state continues exactly like the original, and
a failed write never damages the previous checkpoint."""

import os
import random
import stat

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
    state = load_checkpoint(path)
    assert state["step"] == 1 and torch.equal(state["w"], torch.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "checkpoint.pt.sha256"]
    # A crash at every fsync of the save (manifest, previous copy, checkpoint, commit): the
    # file that stays verifies and holds one of the two states, never a damaged one.
    real_fsync = os.fsync
    counted = []
    monkeypatch.setattr(os, "fsync", lambda fd: counted.append(fd) or real_fsync(fd))
    save_checkpoint(path, {"step": 1, "w": torch.arange(4.0)})
    monkeypatch.undo()
    assert len(counted) >= 6
    seen = set()
    for crash_at in range(1, len(counted) + 1):
        calls = []

        def crash(fd, crash_at=crash_at, calls=calls):
            calls.append(fd)
            if len(calls) == crash_at:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.ftruncate(fd, os.fstat(fd).st_size // 2)  # a partial file
                raise OSError("disk full")
            return real_fsync(fd)

        monkeypatch.setattr(os, "fsync", crash)
        try:
            save_checkpoint(path, {"step": 2, "w": torch.zeros(4)})
        except OSError as err:
            assert "disk full" in str(err)
        monkeypatch.undo()
        state = load_checkpoint(path)  # verified: never a damaged file
        assert state["step"] in (1, 2)
        assert torch.equal(state["w"], torch.arange(4.0) if state["step"] == 1 else torch.zeros(4))
        seen.add(state["step"])
        remove_stale_temporaries(path)
        save_checkpoint(path, {"step": 1, "w": torch.arange(4.0)})  # back to the start
    assert seen == {1, 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.pt", "checkpoint.pt.prev", "checkpoint.pt.sha256"]
    assert load_checkpoint(tmp_path / "checkpoint.pt.prev")["step"] in (1, 2)  # verified


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


def _flip_bytes(path, count=64, seed=0):
    """Flip ``count`` bytes in the middle of the tensor data, where the file still unpickles."""
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    start = len(data) // 4
    for index in rng.sample(range(start, start + len(data) // 4), count):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_refused_never_loaded(tmp_path):
    """Bytes flipped inside the weights still unpickle (the issue's case: 17 weights changed,
    --resume exited 0); the SHA-256 recorded at save time refuses the file."""
    path = tmp_path / "checkpoint.pt"
    weights = torch.randn(4000)
    save_checkpoint(path, {"step": 3, "w": weights})
    _flip_bytes(path)
    unverified = load_checkpoint(path, verify=False)  # it does unpickle, with other weights
    assert not torch.equal(unverified["w"], weights)
    with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoint\.pt is damaged: its "
                                              r"SHA-256 .* is not the one recorded"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="damaged"):  # no previous one to fall back on
        ckpt.load_latest_checkpoint(path)


def test_latest_falls_back_to_the_previous_verified_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})
    save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    state, used, note = ckpt.load_latest_checkpoint(path)
    assert (state["step"], used, note) == (2, path, None)
    _flip_bytes(path, count=8)
    state, used, note = ckpt.load_latest_checkpoint(path)
    assert state["step"] == 1 and used.name == "checkpoint.pt.prev"
    assert "is damaged; continuing from the previous checkpoint checkpoint.pt.prev (step 1)" in note
    path.unlink()  # deleted: the manifest says one was written
    assert ckpt.checkpoint_expected(path)
    state, _, note = ckpt.load_latest_checkpoint(path)
    assert state["step"] == 1 and "is missing" in note
    (tmp_path / "checkpoint.pt.prev").unlink()
    with pytest.raises(CheckpointError, match="missing although its manifest records"):
        ckpt.load_latest_checkpoint(path)
    assert not ckpt.checkpoint_expected(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.load_latest_checkpoint(tmp_path / "other.pt")


def test_empty_folder_and_unverifiable_checkpoints_are_one_line_errors(tmp_path):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is empty \(0 bytes\)"):
        load_checkpoint(empty)
    folder = tmp_path / "folder.pt"
    folder.mkdir()
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint file"):
        load_checkpoint(folder)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 1})
    (tmp_path / "checkpoint.pt.sha256").unlink()
    with pytest.raises(CheckpointError, match="has no checksum manifest"):
        load_checkpoint(path)
    (tmp_path / "checkpoint.pt.sha256").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="manifest .* is damaged"):
        load_checkpoint(path)
