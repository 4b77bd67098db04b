"""A global batch over two processes (gloo, CPU) equals one process on the concatenated batch.

``torchrun --nproc_per_node=2 -m rpm identifiability`` trains the same weights as one process
(float tolerance). Below that, each rank holds its own rows (uneven: 5 and 7 pairs); the mixture
components and the implicit prior's negatives are gathered with ``all_gather_with_grad``. The sum
over ranks of the losses and of every parameter gradient must equal the single-process loss and
gradients (float64, 1e-10): this fails for a gather whose backward returns only the local rank's gradient.
"""

import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyro
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import rpm
from rpm._objective import prior_log_ratio
from rpm.distributed import (
    all_gather_with_grad,
    all_reduce_gradients,
    global_rank,
    global_world_size,
    is_distributed,
    local_slice,
)
from rpm.priors import (
    GaussianRandomWalkPrior,
    ImplicitPrior,
    MarkovImplicitPrior,
    PooledImplicitPrior,
    RBFEnergy,
    StateSpacePrior,
)
from tests.helpers import GaussianHead

SIZES = (5, 7)  # rows per rank
X_DIM, D = 4, 3


def _batch():
    generator = torch.Generator().manual_seed(1)
    total = sum(SIZES)
    x = torch.randn(total, X_DIM, generator=generator, dtype=torch.float64)
    x2 = x + 0.3 * torch.randn(total, X_DIM, generator=generator, dtype=torch.float64)
    noise = torch.randn(2, total, D, generator=generator, dtype=torch.float64)
    return x, x2, noise


def _model(kind: str):
    """A fresh RPM with the same parameters in every process (fixed seed, cleared store)."""
    pyro.clear_param_store()
    torch.manual_seed(2)
    if kind == "implicit":
        return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
                       ImplicitPrior(RBFEnergy(lengthscale=0.9)))
    if kind == "pooled":
        return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
                       PooledImplicitPrior(RBFEnergy(lengthscale=0.9)))
    if kind == "sequence-implicit":
        return rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)),
                       MarkovImplicitPrior(RBFEnergy(lengthscale=0.9)))
    if kind == "sequence-state-space":
        return rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), StateSpacePrior(D),
                       encoder_calls="concat")
    return rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)),
                   GaussianRandomWalkPrior(D, scale=1.2, step=0.5))


def _objective(model, x, x2, noise, global_batch):
    """sum_i log P(z_i, z'_i) - log Q(z_i) - log Q(z'_i) with z = loc + scale * fixed noise."""
    q, q2 = model.recognise(x, x2)
    if isinstance(q, pyro.distributions.Delta):
        z, z2 = q.v, q2.v
    else:
        z = q.base_dist.loc + q.base_dist.scale * noise[0]
        z2 = q2.base_dist.loc + q2.base_dist.scale * noise[1]
    return rpm.inference.rpm_elbo(model.prior, [z, z2], [q, q2],
                                  candidates=model.candidates(global_batch))


def _sequence_objective(model, x, x2, noise, global_batch):
    """The ELBO terms of three views (x, x2, x + x2) with z = loc + scale * fixed noise, the
    marginals (and the chain's normalisers) over the global batch."""
    views = [x, x2, x + x2]
    args = (views,) if not isinstance(model.prior, StateSpacePrior) else (torch.stack(views, 1),)
    inputs = model.objective_inputs(*args, global_batch=global_batch)
    q, _ = inputs.recognitions
    if isinstance(q, pyro.distributions.Delta):
        z = q.v
    else:
        z = q.base_dist.loc + q.base_dist.scale * torch.cat([noise, noise[:1]]).transpose(0, 1)
    return prior_log_ratio(inputs.prior, z, inputs.recognitions, inputs.plate, inputs.candidates)


def _grads(model):
    return {name: param.grad.clone() for name, param in model.named_parameters()}


def _slice(rank):
    start = sum(SIZES[:rank])
    return slice(start, start + SIZES[rank])


def _check_gather(rank):
    """The gather itself: forward concatenates, backward sums every rank's gradient."""
    local = torch.arange(SIZES[rank] * 2, dtype=torch.float64).reshape(-1, 2) + 100 * rank
    local.requires_grad_()
    gathered = all_gather_with_grad(local)
    expected = torch.cat([torch.arange(n * 2, dtype=torch.float64).reshape(-1, 2) + 100 * r
                          for r, n in enumerate(SIZES)])
    torch.testing.assert_close(gathered.detach(), expected, rtol=0, atol=0)
    coefficients = [torch.arange(sum(SIZES) * 2, dtype=torch.float64).reshape(-1, 2) + r + 1
                    for r in range(len(SIZES))]
    (coefficients[rank] * gathered.square()).sum().backward()
    # d/dx_r sum_s sum c_s x^2 = 2 x_r sum_s c_s[rows of r]
    want = 2 * local.detach() * sum(c[_slice(rank)] for c in coefficients)
    torch.testing.assert_close(local.grad, want, rtol=0, atol=0)


def _check_log_ratio(rank, kind):
    x, x2, noise = _batch()
    rows = _slice(rank)
    model = _model(kind)
    objective = _sequence_objective if kind.startswith("sequence") else _objective
    local = objective(model, x[rows], x2[rows], noise[:, rows], global_batch=True)
    local.backward()
    total = local.detach().clone()
    dist.all_reduce(total)
    grads = _grads(model)
    for grad in grads.values():
        dist.all_reduce(grad)
    reference_model = _model(kind)
    reference = objective(reference_model, x, x2, noise, global_batch=False)
    reference.backward()
    torch.testing.assert_close(total, reference.detach(), rtol=0, atol=1e-10)
    for name, grad in _grads(reference_model).items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-10, msg=name)


class _Loss(torch.nn.Module):
    """The module a DistributedDataParallel user wraps: forward returns the loss."""

    def __init__(self, model, elbo):
        super().__init__()
        self.model, self.elbo = model, elbo

    def forward(self, x, x2):
        return self.elbo.differentiable_loss(self.model.model, self.model.guide, x, x2)


def _check_ddp(rank):
    x, x2, _ = _batch()
    rows = _slice(rank)
    module = _Loss(_model("implicit"), rpm.RPMELBO(global_batch=True))
    ddp = DistributedDataParallel(module)
    loss = ddp(x[rows], x2[rows])
    loss.backward()  # DDP averages the gradients over the ranks
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = _grads(module)
    reference = _Loss(_model("implicit"), rpm.RPMELBO())
    reference_loss = reference(x, x2)
    reference_loss.backward()
    torch.testing.assert_close(total, reference_loss.detach(), rtol=0, atol=1e-10)
    for name, grad in _grads(reference).items():
        torch.testing.assert_close(len(SIZES) * grads[name], grad, rtol=0, atol=1e-10, msg=name)


def _check_all_reduce_gradients(rank):
    """Gradients of mixed dtypes (one collective per dtype) and a parameter without a gradient
    on one rank: every rank ends with the sum of the ranks' gradients."""
    single = torch.nn.Parameter(torch.zeros(3, dtype=torch.float32))
    double = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    single.grad = torch.arange(3, dtype=torch.float32) + 10 * rank
    if rank == 0:
        double.grad = torch.tensor([1.0, -2.0], dtype=torch.float64)
    all_reduce_gradients([single, double])
    torch.testing.assert_close(single.grad, 2 * torch.arange(3, dtype=torch.float32) + 10)
    assert single.grad.dtype == torch.float32
    torch.testing.assert_close(double.grad, torch.tensor([1.0, -2.0], dtype=torch.float64))
    assert local_slice(12) == slice(6 * rank, 6 * rank + 6)


def _worker(rank, store_path):
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    pyro.enable_validation(True)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=len(SIZES), timeout=datetime.timedelta(seconds=120))
    try:
        assert is_distributed() and global_world_size() == 2 and global_rank() == rank
        _check_gather(rank)
        _check_log_ratio(rank, "implicit")
        _check_log_ratio(rank, "explicit")
        _check_log_ratio(rank, "pooled")
        _check_log_ratio(rank, "sequence-implicit")     # the global batch for sequences:
        _check_log_ratio(rank, "sequence-state-space")  # normalisers and marginals gathered
        _check_ddp(rank)
        _check_all_reduce_gradients(rank)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
def test_two_processes_equal_one_process_on_the_concatenated_batch(tmp_path):
    # Forked children inherit the imported modules; warm the lazy imports of assert_close and
    # of DistributedDataParallel first, or each child spends seconds on them.
    import torch.distributed._functional_collectives  # noqa: F401

    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(_worker, args=(str(tmp_path / "store"),), nprocs=len(SIZES), join=True,
                       start_method=method)


@pytest.mark.parametrize("kind", ["implicit", "explicit"])
def test_global_batch_without_distributed_changes_nothing(kind):
    torch.set_default_dtype(torch.float64)
    x, x2, noise = _batch()
    assert not is_distributed() and global_world_size() == 1 and global_rank() == 0
    local = _objective(_model(kind), x, x2, noise, global_batch=True)
    torch.testing.assert_close(
        local, _objective(_model(kind), x, x2, noise, global_batch=False), rtol=0, atol=1e-12
    )
    tensor = torch.randn(3, 2)
    assert all_gather_with_grad(tensor) is tensor


@pytest.mark.parametrize("kind", ["implicit", "explicit"])
def test_elbo_block_size_streams_the_same_loss(kind):
    """RPMELBO(block_size=...) (streamed mixture and normaliser) == RPMELBO(), same samples."""
    torch.set_default_dtype(torch.float64)
    x, x2, _ = _batch()
    losses, grads = [], []
    for elbo in (rpm.RPMELBO(block_size=3), rpm.RPMELBO()):
        model = _model(kind)
        pyro.set_rng_seed(3)
        loss = elbo.differentiable_loss(model.model, model.guide, x, x2)
        loss.backward()
        losses.append(loss.detach())
        grads.append(_grads(model))
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=1e-10)
    for name, grad in grads[1].items():
        torch.testing.assert_close(grads[0][name], grad, rtol=0, atol=1e-10, msg=name)
    assert math.isfinite(losses[0].item())


def test_elbo_flag_errors():
    with pytest.raises(TypeError, match="global_batch"):
        rpm.RPMELBO(global_batch=1)
    with pytest.raises(ValueError, match="block_size"):
        rpm.RPMELBO(block_size=0)
    with pytest.raises(ValueError, match="at least one dimension"):
        all_gather_with_grad(torch.tensor(1.0))


GLOO = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                          reason="needs torch.distributed with gloo")


@pytest.mark.slow
@GLOO
def test_torchrun_of_the_command_trains_the_weights_of_one_process(tmp_path):
    """Two CPU processes (gloo) of ``rpm identifiability``, each encoding its half of the global
    batch, end with the weights of one process on the whole batch (float tolerance), and process
    0 alone writes the run folder, recording the world size."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    flags = ["identifiability", "--dim", "3", "--steps", "8", "--batch-size", "16", "--hidden",
             "8", "--depth", "1", "--eval-every", "4", "--eval-samples", "200", "--no-progress",
             "--device", "cpu", "--checkpoint-every", "0"]
    two, one = tmp_path / "two", tmp_path / "one"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node=2", "-m", "rpm", *flags, "--out", str(two)],
                   env=env, check=True, capture_output=True, timeout=300)
    subprocess.run([sys.executable, "-m", "rpm", *flags, "--out", str(one)], env=env, check=True,
                   capture_output=True, timeout=300)
    states = [torch.load(out / "cosine" / "checkpoint.pt", weights_only=True)["state"]
              for out in (one, two)]
    assert states[0]["module"].keys() == states[1]["module"].keys()
    for key, value in states[0]["module"].items():
        torch.testing.assert_close(states[1]["module"][key], value, rtol=1e-5, atol=1e-6)
    losses = [[loss for _, loss in state["history"]["losses"]] for state in states]
    # summed over the two ranks; float32 losses of terms of size log N (about 2.8), so their
    # rounding is absolute (a few 1e-7), whatever the loss's own size
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6)
    environments = [json.loads((out / "results.json").read_text())["environment"]
                    for out in (one, two)]
    assert [e["world_size"] for e in environments] == [1, 2]
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())


def test_helpers_without_distributed_are_the_single_process_case():
    assert local_slice(6) == slice(0, 6)
    parameter = torch.nn.Parameter(torch.ones(2))
    parameter.grad = torch.full((2,), 3.0)
    all_reduce_gradients([parameter])
    assert torch.equal(parameter.grad, torch.full((2,), 3.0))
