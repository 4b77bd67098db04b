"""The training loop: exact resumption after a crash, SIGINT, SIGKILL (real processes), loss
windows, evaluation schedule, non-finite losses and gradient clipping."""

import importlib.util
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyro
import pyro.nn
import pytest
import torch
from torch.distributions import constraints

from rpm.experiments.common import seed_everything
from rpm.training.checkpoint import load_checkpoint
from rpm.training.trainer import NonFiniteLossError, Trainer, TrainingInterrupted

TOY = Path(__file__).with_name("toy_experiment.py")
REPO = Path(__file__).resolve().parents[2]


def _load_toy():
    spec = importlib.util.spec_from_file_location("toy_experiment", TOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Net(pyro.nn.PyroModule):
    def __init__(self):
        super().__init__()
        self.linear = pyro.nn.PyroModule[torch.nn.Linear](3, 2)
        self.scale = pyro.nn.PyroParam(torch.ones(2), constraints.positive)

    def forward(self, x):
        return self.scale * self.linear(x)


class Sampler:
    """Stateful minibatch index sampler (an epoch permutation), saved through extra_state."""

    def __init__(self, n, generator):
        self.n, self.generator, self.perm, self.pos = n, generator, None, n

    def next(self, size):
        if self.pos + size > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.generator), 0
        self.pos += size
        return self.perm[self.pos - size : self.pos]

    def state_dict(self):
        return {"perm": self.perm, "pos": self.pos}

    def load_state_dict(self, state):
        self.perm, self.pos = state["perm"], state["pos"]


def _run(out_dir, *, resume=False, crash_at=None, signal_at=(None, None), num_steps=30, **kwargs):
    """A run that draws from every kind of generator: torch global, a torch.Generator, NumPy
    global and Generator, Python random, plus a stateful sampler."""
    seed_everything(0)
    pyro.clear_param_store()
    model = Net()
    data = torch.randn(40, 3)
    target = data @ torch.tensor([[1.0, -1.0], [2.0, 0.5], [0.0, 3.0]])
    tgen, ngen = torch.Generator().manual_seed(1), np.random.default_rng(2)
    sampler = Sampler(40, tgen)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1 / (1 + 0.1 * epoch))
    losses = {}

    def loss_fn(step):
        if step == crash_at:
            raise RuntimeError("simulated crash")
        if step == signal_at[0]:
            os.kill(os.getpid(), signal_at[1])
        idx = sampler.next(8)
        noise = (
            0.1 * torch.randn(8, 2) + float(ngen.normal()) + np.random.normal() + random.random()
        )
        loss = (model(data[idx]) - target[idx] - 0.01 * noise).pow(2).mean()
        losses[step] = loss.item()
        return loss

    def eval_fn(step):
        return {"loss_all": (model(data) - target).pow(2).mean().item(), "probe": torch.rand(())}

    trainer = Trainer(
        model,
        optimizer,
        loss_fn,
        out_dir=out_dir,
        num_steps=num_steps,
        scheduler=scheduler,
        eval_fn=eval_fn,
        generators={"t": tgen, "n": ngen},
        extra_state={"sampler": sampler},
        **{
            "progress": False,
            "eval_every": 6,
            "checkpoint_every": 10,
            "log_every": 4,
            "eval_at_start": True,
            **kwargs,
        },
    )
    trainer.fit(resume=resume)
    return trainer, losses


def _without_wall_time(history):
    return {
        "losses": history["losses"],
        "evaluations": [
            {k: v for k, v in e.items() if k != "wall_time"} for e in history["evaluations"]
        ],
    }


def _assert_same_run(a, b):
    """Same parameters (bit for bit), optimiser state and history except wall times."""
    assert a["step"] == b["step"]
    assert a["module"].keys() == b["module"].keys()
    for key in a["module"]:
        assert torch.equal(a["module"][key], b["module"][key]), key
    for sa, sb in zip(
        a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True
    ):
        for key in sa:
            assert torch.equal(sa[key], sb[key]), key
    assert _without_wall_time(a["history"]) == _without_wall_time(b["history"])


def test_resume_after_crash_reproduces_uninterrupted_run(tmp_path):
    reference, _ = _run(tmp_path / "ref")
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_path / "crash", crash_at=23)
    assert load_checkpoint(tmp_path / "crash" / "checkpoint.pt")["step"] == 20
    resumed, _ = _run(tmp_path / "crash", resume=True)
    _assert_same_run(reference.state_dict(), resumed.state_dict())
    # The resumed run's parameters are still the ones the optimiser updates.
    optimized = {id(p) for group in resumed.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in resumed.module.parameters()}
    saved = json.loads((tmp_path / "crash" / "history.json").read_text())
    assert _without_wall_time(saved) == _without_wall_time(reference.history)


def test_an_ignored_sigint_stays_ignored(tmp_path):
    """Started with SIGINT ignored (nohup, a background job of a script), the trainer leaves it
    ignored: a SIGINT neither stops the run nor changes it, and the disposition is unchanged."""
    reference, _ = _run(tmp_path / "ref")
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ignored, _ = _run(tmp_path / "ignored", signal_at=(13, signal.SIGINT))
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    _assert_same_run(reference.state_dict(), ignored.state_dict())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_checkpoint_midwindow_and_resume_matches(tmp_path, signum):
    reference, _ = _run(tmp_path / "ref")
    handler_before = signal.getsignal(signum)
    with pytest.raises(TrainingInterrupted) as info:
        _run(tmp_path / "int", signal_at=(13, signum))
    # The signal arrives during step 13; that step completes, then the run stops.
    assert info.value.step == 14 and info.value.signal_number == signum
    assert "interrupted at step 14" in str(info.value) and "--resume" in str(info.value)
    state = load_checkpoint(info.value.checkpoint_path)
    assert state["step"] == 14 and state["pending_losses"].numel() == 2  # window 12..13
    assert signal.getsignal(signum) is handler_before  # handler restored
    resumed, _ = _run(tmp_path / "int", resume=True)
    _assert_same_run(reference.state_dict(), resumed.state_dict())


def test_loss_windows_and_evaluation_schedule(tmp_path):
    trainer, losses = _run(tmp_path, num_steps=23, eval_every=6, checkpoint_every=10, log_every=4)
    # Synchronisation points: multiples of log_every, eval_every, checkpoint_every, and the end.
    ends = [s for s in range(1, 24) if s % 4 == 0 or s % 6 == 0 or s % 10 == 0 or s == 23]
    starts = [0] + ends[:-1]
    expected = [
        [end, float(np.mean(np.array([losses[i] for i in range(start, end)], dtype=np.float64)))]
        for start, end in zip(starts, ends, strict=True)
    ]
    got = trainer.history["losses"]
    assert [s for s, _ in got] == ends
    np.testing.assert_allclose([m for _, m in got], [m for _, m in expected], rtol=1e-12)
    assert [e["step"] for e in trainer.history["evaluations"]] == [0, 6, 12, 18, 23]
    assert all(e["wall_time"] >= 0 for e in trainer.history["evaluations"])
    wall = [e["wall_time"] for e in trainer.history["evaluations"]]
    assert wall == sorted(wall)


def test_nan_loss_stops_with_step_and_last_good_checkpoint(tmp_path):
    seed_everything(0)
    w = torch.nn.Parameter(torch.ones(3))
    module = torch.nn.Module()
    module.w = w

    def loss_fn(step):
        loss = (w - torch.randn(3)).pow(2).sum()
        return loss * float("nan") if step == 17 else loss

    trainer = Trainer(
        module,
        torch.optim.SGD([w], lr=0.1),
        loss_fn,
        out_dir=tmp_path,
        num_steps=40,
        checkpoint_every=10,
        log_every=5,
        progress=False,
    )
    with pytest.raises(FloatingPointError) as info:
        trainer.fit()
    assert isinstance(info.value, NonFiniteLossError)
    message = str(info.value)
    assert "non-finite loss (nan) at step 17" in message
    assert f"{tmp_path / 'checkpoint.pt'} (step 10)" in message
    assert info.value.step == 17 and info.value.checkpoint_path == tmp_path / "checkpoint.pt"
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["step"] == 10 and torch.isfinite(state["module"]["w"]).all()
    assert trainer.step == 20  # stopped at the synchronisation point after step 17


def test_nan_before_any_checkpoint_says_so(tmp_path):
    w = torch.nn.Parameter(torch.ones(1))
    module = torch.nn.Module()
    module.w = w
    trainer = Trainer(
        module,
        torch.optim.SGD([w], lr=0.1),
        lambda step: w.sum() * (float("inf") if step == 2 else 1.0),
        out_dir=tmp_path,
        num_steps=10,
        checkpoint_every=5,
        log_every=3,
        progress=False,
    )
    with pytest.raises(
        NonFiniteLossError, match=r"loss \(inf\) at step 2; no checkpoint was saved"
    ):
        trainer.fit()
    assert not (tmp_path / "checkpoint.pt").exists()


def test_nonfinite_parameters_are_never_checkpointed(tmp_path):
    w = torch.nn.Parameter(torch.ones(2))
    module = torch.nn.Module()
    module.w = w
    # A finite loss whose step overflows float32: w - 1e38 * 1e3 = -inf.
    trainer = Trainer(
        module,
        torch.optim.SGD([w], lr=1e38),
        lambda step: (w * 1e3).sum() if step == 5 else w.sum() * 0.0,
        out_dir=tmp_path,
        num_steps=10,
        checkpoint_every=3,
        progress=False,
    )
    with pytest.raises(NonFiniteLossError, match=r"parameters \['w'\] became non-finite by step 6"):
        trainer.fit()
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 3


def test_parameter_replaced_by_a_stale_param_store_is_an_error(tmp_path):
    pyro.clear_param_store()
    Net()(torch.ones(1, 3))  # an earlier model leaves its parameters in the global store
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built before the first forward
    trainer = Trainer(
        model,
        optimizer,
        lambda step: model(torch.ones(1, 3)).sum(),
        out_dir=tmp_path,
        num_steps=3,
        progress=False,
    )
    with pytest.raises(ValueError, match=r"are not in the optimizer.*distinct name"):
        trainer.fit()


def test_grad_clip_scales_the_gradient_to_the_given_norm(tmp_path):
    w = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    module = torch.nn.Module()
    module.w = w
    slope = torch.tensor([3.0, 4.0, 0.0, 12.0], dtype=torch.float64)  # gradient norm 13
    trainer = Trainer(
        module,
        torch.optim.SGD([w], lr=1.0),
        lambda step: (w * slope).sum(),
        out_dir=tmp_path,
        num_steps=1,
        grad_clip=2.6,
        progress=False,
    )
    trainer.fit()
    torch.testing.assert_close(w.detach(), -slope * 2.6 / 13, rtol=1e-6, atol=0)


def test_eval_mode_is_restored_and_metrics_validated(tmp_path):
    module = torch.nn.Linear(2, 1)
    modes = []

    def loss_fn(step):
        modes.append(module.training)
        return module(torch.ones(1, 2)).sum()

    def eval_fn(step):
        module.eval()
        return {"x": 1}

    trainer = Trainer(
        module,
        torch.optim.SGD(module.parameters(), lr=0.1),
        loss_fn,
        out_dir=tmp_path / "a",
        num_steps=4,
        eval_fn=eval_fn,
        eval_every=1,
        progress=False,
    )
    trainer.fit()
    assert modes == [True] * 4
    bad = Trainer(
        module,
        torch.optim.SGD(module.parameters(), lr=0.1),
        loss_fn,
        out_dir=tmp_path / "b",
        num_steps=2,
        eval_fn=lambda step: {"step": 1.0},
        progress=False,
    )
    with pytest.raises(ValueError, match="'step'"):
        bad.fit()


def test_invalid_arguments_and_files(tmp_path):
    module = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)

    def loss(step):
        return module(torch.ones(1, 2)).sum()

    with pytest.raises(ValueError, match="needs an eval_fn"):
        Trainer(module, opt, loss, out_dir=tmp_path, num_steps=3, eval_every=2)
    with pytest.raises(ValueError, match="num_steps must be >= 1, got 0"):
        Trainer(module, opt, loss, out_dir=tmp_path, num_steps=0)
    with pytest.raises(TypeError, match="log_every must be an int"):
        Trainer(module, opt, loss, out_dir=tmp_path, num_steps=3, log_every=2.0)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        Trainer(module, object(), loss, out_dir=tmp_path, num_steps=3)
    with pytest.raises(TypeError, match="0-dim tensor, got \\(1, 1\\)"):
        Trainer(
            module,
            opt,
            lambda s: module(torch.ones(1, 2)),
            out_dir=tmp_path,
            num_steps=1,
            progress=False,
        ).fit()
    with pytest.raises(FileNotFoundError, match="cannot resume: no checkpoint"):
        Trainer(module, opt, loss, out_dir=tmp_path / "new", num_steps=1).fit(resume=True)
    Trainer(module, opt, loss, out_dir=tmp_path / "done", num_steps=2, progress=False).fit()
    with pytest.raises(FileExistsError, match="already exists; resume from it"):
        Trainer(module, opt, loss, out_dir=tmp_path / "done", num_steps=2, progress=False).fit()
    with pytest.raises(ValueError, match="beyond num_steps=1"):
        Trainer(module, opt, loss, out_dir=tmp_path / "done", num_steps=1).fit(resume=True)


# ------------------------------------------------------------------ real processes
TOY_FLAGS = ["--num-steps", "120", "--checkpoint-every", "20", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def toy_reference(tmp_path_factory):
    """The uninterrupted toy run, in this process."""
    out = tmp_path_factory.mktemp("reference")
    toy = _load_toy()
    from rpm.cli import main

    assert main(["toy", "--out", str(out), *TOY_FLAGS], modules=[toy]) == 0
    pyro.clear_param_store()
    return load_checkpoint(out / "toy" / "checkpoint.pt")


def _sigint_default() -> None:
    """In the child: SIGINT at its default disposition, so Python turns it into
    KeyboardInterrupt even when the suite itself runs with SIGINT ignored (started by nohup)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_toy(out, *extra):
    return subprocess.Popen(
        [sys.executable, "-u", str(TOY), "toy", "--out", str(out), *TOY_FLAGS, *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_default,
    )


def _wait_for_checkpoint(process, min_step, timeout=60.0):
    """Read the process's log until it reports a checkpoint at a step >= min_step."""
    lines = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in process.stdout], daemon=True
    ).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=deadline - time.monotonic())
        except queue.Empty:
            break
        match = re.match(r"step (\d+): checkpoint saved", line)
        if match and int(match.group(1)) >= min_step:
            return int(match.group(1))
    process.kill()
    raise AssertionError(f"no checkpoint at step >= {min_step}: {process.stderr.read()}")


@pytest.mark.slow
def test_sigint_and_sigkill_of_real_processes_then_resume_match_uninterrupted_run(
    tmp_path, toy_reference
):
    """One chain, to start as few Python processes as possible: SIGINT a run (clean exit 130,
    message, checkpoint), resume it in a new process, SIGKILL that one midway, resume again."""
    process = _start_toy(tmp_path, "--step-delay", "0.02")
    _wait_for_checkpoint(process, 20)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130
    stderr = process.stderr.read()
    match = re.search(
        r"python -m rpm toy: interrupted at step (\d+); checkpoint saved to (.*); rerun with --resume", stderr
    )
    assert match and "Traceback" not in stderr, stderr
    assert Path(match.group(2)) == tmp_path / "toy" / "checkpoint.pt"
    interrupted_at = int(match.group(1))
    assert load_checkpoint(tmp_path / "toy" / "checkpoint.pt")["step"] == interrupted_at < 120

    process = _start_toy(tmp_path, "--step-delay", "0.02", "--resume")
    _wait_for_checkpoint(process, 40)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    killed_at = load_checkpoint(tmp_path / "toy" / "checkpoint.pt")["step"]
    assert interrupted_at < killed_at < 120 and killed_at >= 40  # killed midway

    toy = _load_toy()
    from rpm.cli import main

    assert main(["toy", "--out", str(tmp_path), *TOY_FLAGS, "--resume"], modules=[toy]) == 0
    _assert_same_run(toy_reference, load_checkpoint(tmp_path / "toy" / "checkpoint.pt"))
    saved = json.loads((tmp_path / "toy" / "history.json").read_text())
    assert _without_wall_time(saved) == _without_wall_time(toy_reference["history"])


def test_resuming_a_finished_run_reloads_it_without_a_progress_bar(tmp_path, capsys):
    first, _ = _run(tmp_path, num_steps=8)
    capsys.readouterr()
    again, losses = _run(tmp_path, num_steps=8, resume=True, progress=True)
    assert losses == {}  # no step was taken
    assert capsys.readouterr().err == ""  # and no (100%) bar drawn
    _assert_same_run(first.state_dict(), again.state_dict())


def test_eval_label_prefixes_the_metrics_in_the_progress_bar(tmp_path):
    trainer, _ = _run(tmp_path, num_steps=4, eval_label="val")
    assert set(trainer._postfix()) == {"loss", "val loss_all", "val probe"}
    with pytest.raises(TypeError, match="eval_label must be a string"):
        _run(tmp_path / "bad", num_steps=4, eval_label=1)


def test_metrics_from_an_earlier_step_are_named_with_their_step(tmp_path):
    """The progress bar keeps the latest evaluation between evaluations, marked with the step
    it was computed at, so that an older score never reads as the current one."""
    trainer, _ = _run(tmp_path, num_steps=4, eval_label="val")
    fresh = trainer._postfix()
    trainer.step += 3  # steps taken since the evaluation at step 4
    stale = trainer._postfix()
    assert set(stale) == {"loss", "val loss_all (step 4)", "val probe (step 4)"}
    assert stale["val loss_all (step 4)"] == fresh["val loss_all"]


@pytest.mark.parametrize("grad_clip, error", [(0.0, ValueError), (float("inf"), ValueError),
                                              ("1", TypeError), (True, TypeError)])
def test_bad_grad_clip_is_refused(tmp_path, grad_clip, error):
    with pytest.raises(error, match="grad_clip"):
        _run(tmp_path, num_steps=2, grad_clip=grad_clip)


def _stop_below(threshold):
    """A stop rule from the history alone: the latest evaluation's full-data loss."""
    def stop_fn(history):
        last = history["evaluations"][-1]
        return f"loss_all {last['loss_all']:.3f} < {threshold}" if last["loss_all"] < threshold \
            else None
    return stop_fn


def test_stop_fn_stops_at_an_evaluation_with_a_checkpoint_and_a_resume_stays_stopped(tmp_path):
    full, _ = _run(tmp_path / "full", num_steps=60)
    evaluations = full.history["evaluations"]
    # a threshold first crossed at an evaluation inside the run
    threshold = 0.5 * (evaluations[3]["loss_all"] + evaluations[4]["loss_all"])
    expected_step = next(e["step"] for e in evaluations[1:] if e["loss_all"] < threshold)
    assert 0 < expected_step < 60
    stopped, losses = _run(tmp_path / "stopped", num_steps=60, stop_fn=_stop_below(threshold))
    assert stopped.step == expected_step and max(losses) == expected_step - 1
    assert stopped.history["stopped"]["step"] == expected_step
    assert stopped.history["stopped"]["reason"].startswith("loss_all")
    assert load_checkpoint(stopped.checkpoint_path)["step"] == expected_step
    assert json.loads(stopped.history_path.read_text())["stopped"]["step"] == expected_step
    # the same steps as the run without the rule, up to the stop
    assert stopped.history["losses"] == [w for w in full.history["losses"] if w[0] <= expected_step]
    again, more = _run(tmp_path / "stopped", num_steps=80, stop_fn=_stop_below(threshold),
                       resume=True)
    assert more == {} and again.step == expected_step
    # a crash before the stop, resumed, stops at the same step with the same parameters
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_path / "crash", num_steps=60, stop_fn=_stop_below(threshold), crash_at=expected_step - 3)
    resumed, _ = _run(tmp_path / "crash", num_steps=60, stop_fn=_stop_below(threshold), resume=True)
    _assert_same_run(resumed.state_dict(), stopped.state_dict())
    assert resumed.history["stopped"] == stopped.history["stopped"]
    with pytest.raises(ValueError, match="stop_fn"):
        _run(tmp_path / "bad", num_steps=5, eval_every=0, stop_fn=_stop_below(threshold))


class _QueueNet(torch.nn.Module):
    """A linear map whose loss pulls its outputs towards the mean of a queue of its earlier
    outputs (a buffer: the checkpoint carries it)."""

    def __init__(self):
        super().__init__()
        from rpm.inference import LatentQueue

        self.linear = torch.nn.Linear(3, 2)
        self.queue = LatentQueue(10, 2)

    def loss(self, x):
        z = self.linear(x)
        centre = self.queue.latents().mean(0) if len(self.queue) else torch.zeros(2)
        return (z - centre).pow(2).mean(), z


def _queue_data(step):
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(100 + step))


def _queue_run(out_dir, *, resume=False, crash_at=None, num_steps=9):
    torch.manual_seed(0)
    model = _QueueNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    latents, calls = {}, []

    def loss_fn(step):
        if step == crash_at:
            raise RuntimeError("simulated crash")
        loss, latents[step] = model.loss(_queue_data(step))
        return loss

    def after_step(step):
        calls.append((step, model.linear.weight.detach().clone()))
        model.queue.push(latents.pop(step))

    trainer = Trainer(model, optimizer, loss_fn, out_dir=out_dir, num_steps=num_steps,
                      progress=False, checkpoint_every=5, log_every=1, after_step=after_step)
    trainer.fit(resume=resume)
    return model, calls


def test_after_step_runs_after_the_optimiser_step_and_its_pushes_resume_exactly(tmp_path):
    """after_step(s) runs once per step, in order, after the optimiser's update of step s: a
    queue pushed there with the latents of step s's forward equals the hand-written loop's
    (loss, backward, step, push), and a crashed run resumed from its checkpoint gives the same
    queue and parameters bit for bit."""
    model, calls = _queue_run(tmp_path / "run")
    torch.manual_seed(0)
    reference = _QueueNet()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    weights = []
    for step in range(9):
        optimizer.zero_grad()
        loss, z = reference.loss(_queue_data(step))
        loss.backward()
        optimizer.step()
        weights.append(reference.linear.weight.detach().clone())
        reference.queue.push(z)
    assert [step for step, _ in calls] == list(range(9))
    assert all(torch.equal(w, ref) for (_, w), ref in zip(calls, weights, strict=True))
    assert torch.equal(model.queue.latents(), reference.queue.latents()) and len(model.queue) == 10
    assert torch.equal(model.linear.weight, reference.linear.weight)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _queue_run(tmp_path / "crash", crash_at=7)
    resumed, calls = _queue_run(tmp_path / "crash", resume=True)
    assert [step for step, _ in calls] == [5, 6, 7, 8]
    assert torch.equal(resumed.queue.latents(), reference.queue.latents())
    assert torch.equal(resumed.linear.weight, reference.linear.weight)
    with pytest.raises(TypeError, match="after_step must be callable"):
        Trainer(model, optimizer, lambda step: None, out_dir=tmp_path / "bad", num_steps=1,
                after_step=3)
