"""The candidates of a step and the queue of earlier latents: first in first out, detached, and
carried by state_dict (through a model and a checkpoint round trip)."""

import io

import pytest
import torch

import rpm
from rpm.inference import Candidates, LatentQueue
from rpm.priors import ImplicitPrior, RBFEnergy, StateSpacePrior


def test_the_queue_is_first_in_first_out_and_drops_the_oldest_beyond_its_size():
    queue = LatentQueue(size=5, dim=2)
    assert len(queue) == 0 and queue.latents().shape == (0, 2)
    pushed = []
    for step in range(4):                       # batches of 2: rows 0..7
        batch = torch.arange(2 * step, 2 * step + 2, dtype=torch.float32)[:, None].expand(2, 2)
        queue.push(batch)
        pushed.extend(batch.tolist())
        expected = torch.tensor(pushed[-5:])    # the newest K, oldest first
        assert torch.equal(queue.latents(), expected), step
    queue.push(torch.full((7, 2), 9.0))         # a batch longer than the queue: its newest K
    assert torch.equal(queue.latents(), torch.full((5, 2), 9.0))


def test_the_queue_holds_detached_copies():
    queue = LatentQueue(size=4, dim=3)
    z = torch.randn(2, 3, requires_grad=True)
    queue.push(z * 2)
    latents = queue.latents()
    assert not latents.requires_grad
    with torch.no_grad():
        z.add_(1.0)                              # the source moves on; the queue does not
    assert torch.equal(latents, queue.latents())
    assert not torch.equal(queue.latents(), (z * 2).detach())


def test_the_queue_state_round_trips_through_the_models_state_dict():
    torch.set_default_dtype(torch.float64)
    queue = LatentQueue(size=6, dim=2)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(3, 2)), ImplicitPrior(RBFEnergy()),
                    queue=queue)
    for _ in range(4):
        queue.push(torch.randn(4, 2))           # wrapped around: head in the middle
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(3, 2)), ImplicitPrior(RBFEnergy()),
                    queue=LatentQueue(size=6, dim=2))
    fresh.load_state_dict(torch.load(buffer))
    assert torch.equal(fresh.queue.latents(), queue.latents()) and len(fresh.queue) == 6
    assert {"queue.memory", "queue.filled", "queue.head"} <= set(model.state_dict())


def test_a_non_persistent_queue_stays_out_of_the_state_dict_but_moves_with_the_module():
    owner = torch.nn.Module()
    owner.queue = LatentQueue(size=3, dim=2, persistent=False)
    owner.queue.push(torch.ones(2, 2))
    assert owner.state_dict() == {}
    owner.double()
    assert owner.queue.memory.dtype == torch.float64 and len(owner.queue) == 2


def test_bad_queue_arguments_are_refused():
    with pytest.raises(ValueError, match="size"):
        LatentQueue(size=0, dim=2)
    queue = LatentQueue(size=3, dim=2)
    with pytest.raises(ValueError, match=r"shape \(B, 2\)"):
        queue.push(torch.zeros(4, 3))
    with pytest.raises(TypeError, match="LatentQueue"):
        Candidates(queue=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="takes no queue"):
        rpm.RPM(rpm.GaussianRecognition(torch.nn.Linear(3, 4)), StateSpacePrior(2),
                queue=LatentQueue(3, 2))


def test_local_candidates_are_the_batch_then_the_queue():
    queue = LatentQueue(size=3, dim=2)
    candidates = Candidates(queue=queue)
    z2 = torch.randn(4, 2)
    assert candidates.is_local and candidates.gather(z2) is z2 and candidates.offset(4) == 0
    assert candidates.negatives(z2) is z2
    queue.push(torch.ones(2, 2))
    assert not candidates.is_local
    assert torch.equal(candidates.negatives(z2), torch.cat([z2, torch.ones(2, 2)]))
    assert not Candidates(global_batch=True).is_global   # no process group: nothing to gather
