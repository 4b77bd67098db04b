r"""The training loop shared by the experiments: minimise a loss with checkpoints, evaluation,
non-finite-loss detection and exact resumption.

The loop performs, for :math:`s = s_0, \dots, S - 1`,

.. math::

    \theta_{s+1} = \mathrm{step}\big(\theta_s, \nabla_\theta \ell_s(\theta_s)\big),
    \qquad \ell_s = \texttt{loss\_fn}(s),

where ``loss_fn`` draws its own minibatch, e.g. the negative RPM ELBO (Eq. 15 of Aitchison &
Ganev) or an InfoNCE loss (Eq. 25). A run interrupted at step :math:`s_0` and resumed from its
checkpoint reproduces the uninterrupted run exactly on the CPU, because the checkpoint holds
:math:`\theta_{s_0}`, the optimiser and scheduler state, and the state of every random number
generator the loss draws from.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import numbers
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from rpm import distributed as rpm_distributed
from rpm._validation import check_bool, check_int, check_positive
from rpm.training.checkpoint import (
    Generator,
    atomic_write,
    capture_rng_state,
    checkpoint_expected,
    load_latest_checkpoint,
    remove_stale_temporaries,
    restore_rng_state,
    save_checkpoint,
)

__all__ = ["NonFiniteLossError", "Trainer", "TrainingInterrupted"]

_LOGGER = logging.getLogger(__name__)

#: File names inside ``out_dir``.
CHECKPOINT_NAME = "checkpoint.pt"
HISTORY_NAME = "history.json"

_STATE_KEYS = frozenset(
    {
        "step",
        "num_steps",
        "module",
        "optimizer",
        "scheduler",
        "rng",
        "history",
        "pending_losses",
        "elapsed",
        "extra",
    }
)


class NonFiniteLossError(FloatingPointError):
    """The loss (or, at a checkpoint, a parameter) became NaN or infinite.

    :ivar int step: the first step whose loss was not finite (the argument given to
        ``loss_fn``).
    :ivar checkpoint_path: the last good checkpoint, or ``None`` if none was saved.
    """

    def __init__(self, message: str, step: int, checkpoint_path: Path | None) -> None:
        super().__init__(message)
        self.step = step
        self.checkpoint_path = checkpoint_path


class TrainingInterrupted(Exception):
    """Training was stopped by SIGINT (Ctrl-C) or SIGTERM; a checkpoint was saved first.

    :ivar int step: number of completed steps, saved in the checkpoint.
    :ivar Path checkpoint_path: where the checkpoint was written.
    :ivar int signal_number: the signal received (``signal.SIGINT`` or ``signal.SIGTERM``).
    """

    def __init__(self, step: int, checkpoint_path: Path, signal_number: int) -> None:
        super().__init__(
            f"interrupted at step {step}; checkpoint saved to {checkpoint_path}; "
            "rerun with --resume (fit(resume=True)) to continue"
        )
        self.step = step
        self.checkpoint_path = checkpoint_path
        self.signal_number = signal_number


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _LineProgress:
    """The progress display when stderr is not a terminal (a log file, a pipe): one line at
    every 10% of the steps, instead of a bar redrawn with carriage returns. A line shows the
    latest loss, and the evaluation's metrics only on the line of the step they were computed
    at (a line between evaluations does not repeat an older score)."""

    def __init__(self, total: int, initial: int, description: str, every: float = 0.1) -> None:
        self.total, self.n, self.description = total, initial, description
        self._stride = max(1, math.ceil(every * total))
        self._next = (initial // self._stride + 1) * self._stride
        self._postfix: dict[str, str] = {}
        self._metrics: dict[str, str] = {}
        self._metrics_step: int | None = None

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self._next or self.n == self.total:
            while self._next <= self.n:
                self._next += self._stride
            shown = dict(self._postfix)
            if self._metrics_step == self.n:
                shown.update(self._metrics)
            fields = "".join(f", {key} {value}" for key, value in shown.items())
            print(f"{self.description}: step {self.n}/{self.total} "
                  f"({100 * self.n // self.total}%){fields}", file=sys.stderr, flush=True)

    def set_postfix(self, postfix: Mapping[str, str], refresh: bool = False) -> None:
        self._postfix = dict(postfix)

    def set_metrics(self, metrics: Mapping[str, str], step: int | None) -> None:
        """The latest evaluation's fields and the step it was computed at."""
        self._metrics, self._metrics_step = dict(metrics), step

    def __enter__(self) -> _LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class Trainer:
    r"""Minimise ``loss_fn`` over ``num_steps`` optimiser steps with periodic evaluation and
    atomic, exactly resumable checkpoints.

    Each step runs ``loss = loss_fn(step)``, ``zero_grad``, ``loss.backward()``, optional
    gradient-norm clipping, ``optimizer.step()``, ``scheduler.step()`` and ``after_step(step)``;
    :math:`\ell_s` is
    the minibatch loss of step :math:`s` (e.g. the negative RPM ELBO, Eq. 15 of Aitchison &
    Ganev). The step losses stay on the device and are read back only every ``log_every``
    steps and at evaluations and checkpoints, so the loop never waits for the device in between.
    At those points a NaN or infinite loss stops the run with :class:`NonFiniteLossError`
    naming the first bad step and the last good checkpoint, which is never overwritten by a
    diverged state.

    Files in ``out_dir``: ``checkpoint.pt`` (every ``checkpoint_every`` steps, at the end and on
    SIGINT/SIGTERM) and ``history.json`` (rewritten after every evaluation and checkpoint),
    both written atomically. The checkpoint holds the module's ``state_dict``, the optimiser and
    scheduler states, the RNG states (torch, NumPy, Python, CUDA when
    initialised, and every entry of ``generators``), the step, the history and any
    ``extra_state``. ``fit(resume=True)`` continues from it: a run killed at any point (even by
    SIGKILL) and resumed gives bit for bit the parameters and history of an uninterrupted run
    on the CPU, provided that ``loss_fn`` and ``eval_fn`` draw randomness only from those
    generators and keep no other state across steps (otherwise register that state through
    ``extra_state``).

    On SIGINT (Ctrl-C) or SIGTERM, received in the main thread, the current step is completed,
    a checkpoint saved and :class:`TrainingInterrupted` raised; a second signal acts at once
    (``KeyboardInterrupt`` / termination), without a checkpoint.

    ``history`` is ``{"losses": [[step, mean loss over the window ending at step], ...],
    "evaluations": [{"step": step, **metrics, "wall_time": seconds}, ...]}``, where ``step``
    counts completed optimiser steps and ``wall_time`` is the training time so far, summed
    over resumptions.

    :param torch.nn.Module module: holds every trained parameter and buffer (e.g. an
        :class:`rpm.RPM`); put into training mode by :meth:`fit`.
    :param torch.optim.Optimizer optimizer: a :mod:`torch.optim` optimiser over the module's
        parameters (Pyro's ``pyro.optim`` wrappers are not supported).
    :param callable loss_fn: ``loss_fn(step) -> Tensor``: draws a minibatch and returns the
        differentiable scalar loss to minimise; ``step`` is the number of completed steps.
    :param path-like out_dir: folder of the checkpoint and history (created if missing).
    :param int num_steps: total number of optimiser steps, >= 1.
    :param scheduler: optional learning-rate scheduler, stepped once per optimiser step.
    :param callable eval_fn: ``eval_fn(step) -> dict[str, float]`` run every ``eval_every``
        steps and at the end. It may switch the module to eval mode; the trainer restores the
        mode afterwards. Gradients are not disabled for it.
    :param int eval_every: evaluation period in steps; 0 evaluates only at the end.
    :param int checkpoint_every: checkpoint period in steps; 0 checkpoints only at the end and
        on interruption.
    :param int log_every: period, in steps, of reading the losses back from the device,
        checking them and appending their mean to the history; >= 1.
    :param dict generators: extra random generators the losses draw from, by name
        (``torch.Generator`` or ``numpy.random.Generator``), saved and restored.
    :param bool progress: show a tqdm progress bar with the loss and the latest metrics (named
        with their step when it is not the current one); when stderr is not a terminal, one
        line every 10% of the steps instead, with the metrics on the lines of the steps they
        were computed at.
    :param float grad_clip: if given, clip the global gradient norm to this value (> 0).
    :param str description: label of the progress bar.
    :param bool eval_at_start: also evaluate before the first step (not repeated on resume).
    :param dict extra_state: further objects with ``state_dict()`` / ``load_state_dict()``
        (e.g. a minibatch sampler) saved in the checkpoint by name.
    :param callable after_step: ``after_step(step)``, called after the optimiser and scheduler
        steps of step ``step`` (the argument ``loss_fn`` got) and before the step is counted,
        checked or checkpointed: the place for the state a step changes besides the parameters,
        e.g. pushing the latents of that step's forward into a queue (``prior.push(z)``, the
        state rule of :mod:`rpm.marginals._candidates`: no loss evaluation pushes). What it
        changes must be in the module (a queue is a buffer) or in ``extra_state`` for a
        resumed run to be exact; under ``distributed`` every rank calls it.
    :param str eval_label: shown before the metrics in the progress bar, e.g. ``"val"`` when
        ``eval_fn`` scores a validation set other than the final test set.
    :param callable stop_fn: ``stop_fn(history) -> str | None``, called after every evaluation
        (``eval_every``) with the history so far: a string (the reason, e.g. a convergence rule
        that held) stops the run there, with a checkpoint, and is recorded as
        ``history["stopped"] = {"step": step, "reason": reason}``; a stopped run resumed stays
        stopped. It must decide from the history alone (so that a resumed run decides as an
        uninterrupted one).
    :param bool distributed: under ``torch.distributed`` (e.g. ``torchrun``), each rank's
        ``loss_fn`` returns its share of a global loss (e.g. its rows of the negative ELBO of the
        global batch, ``RPMELBO(global_batch=True)``, divided by the global batch size): the
        gradients are summed over the ranks before every step
        (:func:`rpm.distributed.all_reduce_gradients`), rank 0's buffers are copied to every
        rank after it, the logged losses are summed over the ranks, only rank 0 writes files
        and shows the bar, and a signal stops every rank at the next logging step (a rank acts
        only on decisions all ranks share, so that no rank waits alone in a collective).
        Every rank starts from the same parameters (the same seed), resumes from rank 0's
        checkpoint (a folder every rank can read) and so stays identical to the others.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[int], torch.Tensor],
        *,
        out_dir: str | os.PathLike,
        num_steps: int,
        scheduler: Any = None,
        eval_fn: Callable[[int], Mapping[str, float]] | None = None,
        eval_every: int = 0,
        checkpoint_every: int = 0,
        log_every: int = 50,
        generators: Mapping[str, Generator] | None = None,
        progress: bool = True,
        grad_clip: float | None = None,
        description: str = "train",
        eval_at_start: bool = False,
        extra_state: Mapping[str, Any] | None = None,
        eval_label: str = "",
        distributed: bool = False,
        stop_fn: Callable[[dict], str | None] | None = None,
        after_step: Callable[[int], None] | None = None,
    ) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}; "
                "use torch.optim directly rather than a pyro.optim wrapper"
            )
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable as loss_fn(step), got {loss_fn!r}")
        if eval_fn is not None and not callable(eval_fn):
            raise TypeError(f"eval_fn must be callable as eval_fn(step) or None, got {eval_fn!r}")
        if after_step is not None and not callable(after_step):
            raise TypeError(f"after_step must be callable as after_step(step) or None, "
                            f"got {after_step!r}")
        if stop_fn is not None and (not callable(stop_fn) or eval_fn is None or not eval_every):
            raise ValueError("stop_fn must be callable as stop_fn(history) and is checked after "
                             "each periodic evaluation: pass eval_fn and eval_every > 0 with it")
        if scheduler is not None and not (
            hasattr(scheduler, "step")
            and hasattr(scheduler, "state_dict")
            and hasattr(scheduler, "load_state_dict")
        ):
            raise TypeError(
                "scheduler must have step(), state_dict() and load_state_dict() like a "
                f"torch.optim.lr_scheduler, got {type(scheduler).__name__}"
            )
        self.num_steps = check_int("num_steps", num_steps, minimum=1)
        self.eval_every = check_int("eval_every", eval_every, minimum=0)
        self.checkpoint_every = check_int("checkpoint_every", checkpoint_every, minimum=0)
        self.log_every = check_int("log_every", log_every, minimum=1)
        if self.eval_every and eval_fn is None:
            raise ValueError(
                f"eval_every={eval_every} needs an eval_fn; pass eval_fn or eval_every=0"
            )
        if grad_clip is not None:
            grad_clip = check_positive("grad_clip", grad_clip)
        extra_state = dict(extra_state or {})
        for name, obj in extra_state.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(
                    f"extra_state[{name!r}] must have state_dict() and load_state_dict(), "
                    f"got {type(obj).__name__}"
                )
        self.module = module
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.scheduler = scheduler
        self.eval_fn = eval_fn
        self.stop_fn = stop_fn
        self.after_step = after_step
        self.generators = dict(generators or {})
        capture_rng_state(self.generators)  # validates the generators now rather than later
        self.progress = bool(progress)
        self.grad_clip = grad_clip
        self.description = description
        self.eval_at_start = bool(eval_at_start)
        self.extra_state = extra_state
        if not isinstance(eval_label, str):
            raise TypeError(f"eval_label must be a string, got {type(eval_label).__name__}")
        self.eval_label = eval_label
        self.distributed = check_bool("distributed", distributed)
        self._main = not self.distributed or rpm_distributed.global_rank() == 0
        self.out_dir = Path(out_dir)
        self._resume_cache: dict | None = None
        self._reset()

    # ----------------------------------------------------------------------------- paths
    @property
    def checkpoint_path(self) -> Path:
        """``out_dir / "checkpoint.pt"``."""
        return self.out_dir / CHECKPOINT_NAME

    @property
    def history_path(self) -> Path:
        """``out_dir / "history.json"``."""
        return self.out_dir / HISTORY_NAME

    # ----------------------------------------------------------------------------- state
    def _reset(self) -> None:
        self.step = 0
        self.history: dict = {"losses": [], "evaluations": []}
        self._elapsed_before = 0.0
        self._started = time.perf_counter()
        self._buffer: torch.Tensor | None = None  # device losses of the current window
        self._count = 0  # number of losses in the current window
        self._pending: torch.Tensor | None = None  # CPU window restored from a checkpoint
        self._last_checkpoint_step: int | None = None
        self._latest_metrics: dict[str, float] = {}
        self._latest_step: int | None = None  # the step of the latest evaluation
        self._signal_received: int | None = None

    def _elapsed(self) -> float:
        return self._elapsed_before + (time.perf_counter() - self._started)

    def state_dict(self) -> dict:
        """Everything needed to continue the run exactly: the checkpoint's content."""
        return {
            "step": self.step,
            "num_steps": self.num_steps,
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "rng": capture_rng_state(self.generators),
            "history": copy.deepcopy(self.history),
            "pending_losses": self._window_values(),
            "elapsed": self._elapsed(),
            "extra": {name: obj.state_dict() for name, obj in self.extra_state.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state produced by :meth:`state_dict`, in place (the optimiser keeps
        referring to the module's parameter objects)."""
        missing = _STATE_KEYS - set(state)
        if missing:
            raise ValueError(f"not a Trainer checkpoint: it lacks {sorted(missing)}")
        if state["step"] > self.num_steps:
            raise ValueError(
                f"the checkpoint is at step {state['step']}, beyond num_steps={self.num_steps}; "
                "pass num_steps >= the checkpoint's step to resume"
            )
        if (state["scheduler"] is None) != (self.scheduler is None):
            raise ValueError(
                "the checkpoint was saved "
                + ("without" if state["scheduler"] is None else "with")
                + " a scheduler but the trainer has "
                + ("one" if self.scheduler is not None else "none")
            )
        if set(state["extra"]) != set(self.extra_state):
            raise ValueError(
                f"the checkpoint holds extra_state {sorted(state['extra'])} but the trainer has "
                f"{sorted(self.extra_state)}"
            )
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        for name, obj in self.extra_state.items():
            obj.load_state_dict(state["extra"][name])
        restore_rng_state(state["rng"], self.generators)
        self.step = int(state["step"])
        self.history = copy.deepcopy(state["history"])
        self._elapsed_before = float(state["elapsed"])
        self._started = time.perf_counter()
        pending = state["pending_losses"]
        self._buffer = None
        self._pending = pending if pending.numel() else None
        self._count = pending.numel()
        self._last_checkpoint_step = self.step
        evaluations = self.history["evaluations"]
        self._latest_metrics = (
            {k: v for k, v in evaluations[-1].items() if k not in ("step", "wall_time")}
            if evaluations
            else {}
        )
        self._latest_step = evaluations[-1]["step"] if evaluations else None

    def has_checkpoint(self) -> bool:
        """Whether ``out_dir`` holds a checkpoint to resume from: the file exists, or its
        checksum manifest records one (then a missing file is an error of
        :meth:`resume_state`, never a silent fresh start)."""
        return self.checkpoint_path.exists() or checkpoint_expected(self.checkpoint_path)

    def resume_state(self) -> dict:
        """The verified state :meth:`fit` resumes from (loaded once, kept until then): the
        checkpoint, or the previous one, with a message on stderr, when it is damaged or
        missing.

        :raises CheckpointError: if no verified checkpoint can be loaded.
        """
        if self._resume_cache is None:
            state, _, note = load_latest_checkpoint(self.checkpoint_path, map_location="cpu")
            if note and self._main:
                print(f"{self.description}: {note}", file=sys.stderr, flush=True)
            self._resume_cache = state
        return self._resume_cache

    # ----------------------------------------------------------------------------- loop
    def fit(self, resume: bool = False) -> dict:
        """Train until ``num_steps``.

        :param bool resume: continue from ``out_dir/checkpoint.pt``; otherwise start at step 0
            and refuse to overwrite an existing checkpoint.
        :returns: the history (also in ``self.history`` and ``out_dir/history.json``).
        :raises NonFiniteLossError: on a NaN or infinite loss.
        :raises TrainingInterrupted: on SIGINT or SIGTERM, after saving a checkpoint.
        """
        self.out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.checkpoint_path)
        remove_stale_temporaries(self.history_path)
        if resume:
            if not self.has_checkpoint():
                raise FileNotFoundError(
                    f"cannot resume: no checkpoint at {self.checkpoint_path}; "
                    "start the run without resume"
                )
            self.load_state_dict(self.resume_state())
            self._resume_cache = None
            self._write_history()
            _LOGGER.info("resumed from %s at step %d", self.checkpoint_path, self.step)
        else:
            if self.checkpoint_path.exists():
                raise FileExistsError(
                    f"{self.checkpoint_path} already exists; resume from it (resume=True, "
                    "--resume) or choose an empty out_dir (--overwrite deletes the old run)"
                )
            self._reset()
        self.module.train()
        if self.step >= self.num_steps or "stopped" in self.history:
            return self.history  # a finished (or stopped) run, reloaded: nothing to show
        with self._deferred_signals(), self._progress_bar() as bar:
            if self.eval_at_start and self.eval_fn is not None and self.step == 0:
                if not any(e["step"] == 0 for e in self.history["evaluations"]):
                    self._evaluate(bar)
            while self.step < self.num_steps:
                if self._signal_received is not None and not self.distributed:
                    self._interrupt()
                self._train_step()
                step = self.step
                final = step == self.num_steps
                evaluate = self.eval_fn is not None and (
                    final or (self.eval_every > 0 and step % self.eval_every == 0)
                )
                checkpoint = final or (
                    self.checkpoint_every > 0 and step % self.checkpoint_every == 0
                )
                if evaluate or checkpoint or step % self.log_every == 0:
                    self._sync(bar)
                    if self.distributed and self._any_rank_signalled() and not final:
                        self._interrupt()
                if evaluate:
                    self._evaluate(bar)
                    reason = None if (final or self.stop_fn is None) else self.stop_fn(
                        copy.deepcopy(self.history))
                    if reason is not None:
                        self.history["stopped"] = {"step": step, "reason": str(reason)}
                        checkpoint = True
                if checkpoint:
                    self._save()
                bar.update(1)  # after the evaluation, so that a line shows its scores
                if "stopped" in self.history:
                    break
        return self.history

    def _train_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.step)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise TypeError(f"loss_fn(step) must return a 0-dim tensor, got {got}")
        if not loss.requires_grad:
            raise ValueError(
                "loss_fn(step) returned a tensor that does not require grad; it must depend "
                "differentiably on the trained parameters"
            )
        loss.backward()
        if self.distributed:
            rpm_distributed.all_reduce_gradients(
                [p for group in self.optimizer.param_groups for p in group["params"]])
        if self.grad_clip is not None:
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        self.optimizer.step()
        if self.distributed:
            rpm_distributed.broadcast_buffers(self.module)
        if self.scheduler is not None:
            self.scheduler.step()
        if self.after_step is not None:
            self.after_step(self.step)
        self._record(loss.detach())
        self.step += 1

    def _record(self, loss: torch.Tensor) -> None:
        if self._buffer is None:
            self._buffer = torch.zeros(self.log_every, dtype=torch.float64, device=loss.device)
            if self._pending is not None:
                self._buffer[: self._count] = self._pending.to(loss.device)
                self._pending = None
        self._buffer[self._count] = loss  # stays on the device: no synchronisation
        self._count += 1

    def _window_values(self) -> torch.Tensor:
        if self._buffer is None:
            return (
                self._pending if self._pending is not None else torch.zeros(0, dtype=torch.float64)
            )
        return self._buffer[: self._count].cpu()

    def _check_finite(self, values: torch.Tensor) -> None:
        bad = (~torch.isfinite(values)).nonzero()
        if bad.numel():
            index = int(bad[0])
            first = self.step - values.numel() + index
            raise NonFiniteLossError(
                f"non-finite loss ({values[index].item()}) at step {first}; "
                f"{self._last_good_message()}; lower the learning rate or set grad_clip",
                step=first,
                checkpoint_path=self._last_good_path(),
            )

    def _check_parameters_finite(self) -> None:
        # Runs only before a checkpoint, which synchronises anyway.
        bad = [n for n, p in self.module.named_parameters() if not bool(torch.isfinite(p).all())]
        if bad:
            raise NonFiniteLossError(
                f"parameters {bad} became non-finite by step {self.step} although every loss "
                f"was finite; {self._last_good_message()}; lower the learning rate or set "
                "grad_clip",
                step=self.step - 1,
                checkpoint_path=self._last_good_path(),
            )

    def _check_optimizer_covers_module(self) -> None:
        # A parameter left out of the optimiser is never trained, silently. Cheap (no device
        # work), so checked at every synchronisation.
        optimized = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        orphans = [
            name
            for name, p in self.module.named_parameters()
            if p.requires_grad and id(p) not in optimized
        ]
        if orphans:
            raise ValueError(
                f"module parameters {orphans} are not in the optimizer, so they are never "
                "trained: build the optimizer over module.parameters(), and freeze "
                "intentionally untrained parameters with requires_grad_(False). (A plain "
                "PyroModule of your own adopts the tensor of the same name left in Pyro's global "
                "param store by an earlier model: give each model a distinct name, "
                "PyroModule(name=...), as rpm's models have by default.)"
            )

    def _last_good_path(self) -> Path | None:
        return None if self._last_checkpoint_step is None else self.checkpoint_path

    def _last_good_message(self) -> str:
        if self._last_checkpoint_step is None:
            return "no checkpoint was saved before, the run has to start afresh"
        return (
            f"the last good checkpoint is {self.checkpoint_path} "
            f"(step {self._last_checkpoint_step}), left untouched"
        )

    def _any_rank_signalled(self) -> bool:
        if not rpm_distributed.is_distributed():
            return self._signal_received is not None
        flag = torch.tensor([0 if self._signal_received is None else self._signal_received],
                            device=rpm_distributed.collective_device())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() and self._signal_received is None:
            self._signal_received = int(flag.item())
        return bool(flag.item())

    def _sync(self, bar: tqdm) -> None:
        values = self._window_values()
        if values.numel() == 0:
            return
        if self.distributed and rpm_distributed.is_distributed():
            # each rank's share: their sum is the global loss
            values = values.to(rpm_distributed.collective_device(), copy=True)
            torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.SUM)
            values = values.cpu()
        self._check_finite(values)
        self._check_optimizer_covers_module()
        self.history["losses"].append([self.step, values.mean().item()])
        self._count = 0
        self._pending = None
        self._show(bar)

    def _postfix(self) -> dict[str, str]:
        """The progress bar's fields: the latest logged loss and the latest evaluation's
        metrics, each name followed by ``(step S)`` when they were computed at an earlier step
        S than the current one."""
        postfix = self._loss_postfix()
        stale = self._latest_step is not None and self._latest_step != self.step
        suffix = f" (step {self._latest_step})" if stale else ""
        for key, value in self._metric_postfix().items():
            postfix[key + suffix] = value
        return postfix

    def _loss_postfix(self) -> dict[str, str]:
        if not self.history["losses"]:
            return {}
        return {"loss": f"{self.history['losses'][-1][1]:.4g}"}

    def _metric_postfix(self) -> dict[str, str]:
        prefix = f"{self.eval_label} " if self.eval_label else ""
        return {prefix + key: f"{value:.4g}" if isinstance(value, float) else str(value)
                for key, value in self._latest_metrics.items()}

    def _show(self, bar: tqdm | _LineProgress) -> None:
        if isinstance(bar, _LineProgress):
            bar.set_postfix(self._loss_postfix())
            bar.set_metrics(self._metric_postfix(), self._latest_step)
        else:
            bar.set_postfix(self._postfix(), refresh=False)

    def _evaluate(self, bar: tqdm) -> None:
        was_training = self.module.training
        metrics = self.eval_fn(self.step)
        self.module.train(was_training)
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"eval_fn(step) must return a dict name -> number, got {type(metrics).__name__}"
            )
        clean: dict[str, float] = {}
        for key, value in metrics.items():
            if not isinstance(key, str) or key in ("step", "wall_time"):
                raise ValueError(
                    f"eval_fn returned the metric name {key!r}; names must be strings other "
                    "than 'step' and 'wall_time'"
                )
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"eval_fn returned metric {key!r} = {value!r}; expected a number or a "
                    "one-element tensor"
                )
            clean[key] = value if isinstance(value, int) else float(value)
        self.history["evaluations"].append(
            {"step": self.step, **clean, "wall_time": self._elapsed()}
        )
        self._latest_metrics = clean
        self._latest_step = self.step
        self._write_history()
        self._show(bar)

    def _save(self) -> None:
        self._check_parameters_finite()
        if self._main:
            save_checkpoint(self.checkpoint_path, self.state_dict())
        self._last_checkpoint_step = self.step
        self._write_history()
        _LOGGER.info("step %d: checkpoint saved to %s", self.step, self.checkpoint_path)

    def _write_history(self) -> None:
        if not self._main:
            return
        text = json.dumps(self.history).encode()
        atomic_write(self.history_path, lambda f: f.write(text))

    def _interrupt(self) -> None:
        signum = self._signal_received
        self._check_finite(self._window_values())
        self._save()  # keeps the partial loss window, so the history matches an unbroken run
        raise TrainingInterrupted(self.step, self.checkpoint_path, signum)

    # ----------------------------------------------------------------------------- helpers
    def _progress_bar(self) -> tqdm | _LineProgress:
        show = self.progress and self._main
        if show and not _is_terminal(sys.stderr):
            return _LineProgress(self.num_steps, self.step, self.description)
        return tqdm(
            total=self.num_steps,
            initial=self.step,
            desc=self.description,
            disable=not show,
            dynamic_ncols=True,
        )

    @contextlib.contextmanager
    def _deferred_signals(self) -> Iterator[None]:
        """Turn the first SIGINT/SIGTERM into a flag checked between steps, so that the
        checkpoint never sees a half-applied optimiser step."""
        self._signal_received = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        immediate = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
        previous = {}

        def handler(signum: int, frame: Any) -> None:
            if self._signal_received is None:
                self._signal_received = signum
                signal.signal(signum, immediate[signum])  # a second signal acts at once
                if self._main:  # on its own line, after the terminal's ^C
                    name = signal.Signals(signum).name
                    print(("\n" if _is_terminal(sys.stderr) else "")
                          + f"{self.description}: {name} received: stopping after the current "
                          "step with a checkpoint (again to stop at once, without one)",
                          file=sys.stderr, flush=True)

        for signum in immediate:
            current = signal.getsignal(signum)
            if current is signal.SIG_IGN:  # e.g. started with nohup: leave it ignored
                continue
            previous[signum] = current
            signal.signal(signum, handler)
        try:
            yield
        finally:
            for signum, old in previous.items():
                signal.signal(signum, old if old is not None else signal.SIG_DFL)
