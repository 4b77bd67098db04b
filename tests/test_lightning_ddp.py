"""PyTorch Lightning's DDP over two CPU processes trains the weights of one process on the global
batch: ``examples/lightning_rpm.py`` (``Trainer(strategy="ddp", accelerator="cpu", devices=2)``
with :class:`rpm.lightning.RPMLightningModule`), three SGD steps of 2 x 8 pairs, float64, for
the NT-Xent RPM (a contrastive prior) and the Gaussian pair RPM (``marginal="gaussian"``,
learned correlation), against a plain torch loop in this process: ``RPMELBO()`` on the 16
pairs that the two processes are dealt at each step, divided by 16, ``torch.optim.SGD``. SGD
(not Adam, which forgets a constant factor) so that a gradient off by the number of processes
fails. Every parameter within 1e-10 (measured: about 1e-16).

The script runs in its own process group (Lightning starts the second process by running it
again) under a timeout that kills the whole group, from a temporary folder, writing nothing
but its two state dicts there (no logger, checkpoints or progress bar)."""

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import rpm

pytest.importorskip("lightning")

ROOT = Path(__file__).resolve().parents[1]
STEPS, BATCH, WORLD, LR = 3, 8, 2, 0.1


def _example():
    """examples/lightning_rpm.py as a module (its data and models; it imports Lightning only in
    ``main``)."""
    spec = importlib.util.spec_from_file_location("lightning_rpm", ROOT / "examples" /
                                                  "lightning_rpm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Runs ``command`` in a new session; on timeout kills the session (the launcher and the
    processes it started) and fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the Lightning run did not finish in {timeout} s:\n{output[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, output)


def _global_batches(num: int) -> list[torch.Tensor]:
    """The rows of the global batch of each step: Lightning gives each process's training
    DataLoader torch's ``DistributedSampler`` (shuffled, seed 0: Lightning's default), and
    process r's step t takes the next BATCH of that sampler's indices for rank r."""
    dataset = torch.utils.data.TensorDataset(torch.zeros(num))
    dealt = [list(torch.utils.data.DistributedSampler(dataset, num_replicas=WORLD, rank=rank,
                                                      shuffle=True, seed=0))
             for rank in range(WORLD)]
    return [torch.tensor([i for rows in dealt for i in rows[step * BATCH:(step + 1) * BATCH]])
            for step in range(STEPS)]


def _one_process(example, prior: str) -> dict:
    """STEPS SGD steps of one process on the global batches (16 pairs each, the 8 that each
    process is dealt at that step; the ELBO does not depend on their order)."""
    num = STEPS * BATCH * WORLD
    x, x2 = example.make_data(num, 0, torch.float64)
    model = example.make_model(prior, 0, torch.float64)
    optimiser = torch.optim.SGD(model.parameters(), lr=LR)
    for rows in _global_batches(num):
        optimiser.zero_grad()
        loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x[rows], x2[rows])
        (loss / len(rows)).backward()
        optimiser.step()
    return model.state_dict()


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
def test_lightning_ddp_on_two_processes_steps_as_one_process_on_the_global_batch(tmp_path):
    example = _example()
    out = tmp_path / "out"
    started = time.perf_counter()
    result = _run([sys.executable, str(ROOT / "examples" / "lightning_rpm.py"),
                   "--prior", "nt-xent", "gaussian", "--devices", str(WORLD),
                   "--steps", str(STEPS), "--batch-size", str(BATCH), "--optimiser", "sgd",
                   "--lr", str(LR), "--precision", "64-true", "--timeout", "60",
                   "--out", str(out)], cwd=tmp_path, timeout=400)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:]
    print(f"Lightning DDP run (2 processes, both priors): {wall:.1f} s wall")
    for prior in ("nt-xent", "gaussian"):
        assert f"{prior}: loss" in result.stdout and f"after {STEPS} steps on {WORLD} process(es)" \
            in result.stdout, result.stdout[-3000:]
        trained = torch.load(out / f"{prior}.pt", weights_only=True)
        expected = _one_process(example, prior)
        initial = example.make_model(prior, 0, torch.float64).state_dict()
        assert trained.keys() == expected.keys()
        errors = {key: float((trained[key] - value).abs().max()) for key, value in expected.items()}
        print(f"{prior}: max abs parameter difference {max(errors.values()):.1e}")
        assert max(errors.values()) < 1e-10, errors
        moved = max(float((expected[key] - value).abs().max()) for key, value in initial.items())
        assert moved > 1e-3, f"{prior}: the steps barely moved the parameters ({moved})"
    # nothing but the two state dicts in the temporary folder: no logs, no checkpoints
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "out", "out/gaussian.pt", "out/nt-xent.pt"]


def test_lightning_module_of_one_process_is_the_negative_elbo_per_pair_and_refuses_bad_arguments():
    from pyro.infer import Trace_ELBO

    from rpm.lightning import RPMLightningModule

    example = _example()
    x, x2 = example.make_data(16, 0, torch.float64)
    model = example.make_model("gaussian", 0, torch.float64)
    module = RPMLightningModule(model)
    expected = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2) / 16
    torch.testing.assert_close(module.loss([x, x2]), expected, rtol=0, atol=1e-12)
    assert isinstance(module.configure_optimizers(), torch.optim.Adam)
    with pytest.raises(TypeError, match="model must be an rpm.RPM"):
        RPMLightningModule(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="elbo must be an rpm.RPMELBO"):
        RPMLightningModule(model, elbo=Trace_ELBO())
    with pytest.raises(TypeError, match="optimiser must be a function of the parameters"):
        RPMLightningModule(model, optimiser=0.1)
