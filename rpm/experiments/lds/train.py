r"""Training of a sequence RPM on windows of whole sequences (``rpm lds``, ``rpm pendulum``).

Each step draws ``batch_size`` windows of ``window`` consecutive frames: a sequence of the
training set and a start in it, uniformly, from a generator seeded by the step alone
(:func:`~rpm.experiments.common.derived_seed` with purpose ``"train"``), so that a resumed run
draws the same windows. The loss is the negative RPM ELBO per frame,

.. math::

    \ell = -\frac{1}{N T}\, \mathcal{L}(x_{1:N, 1:T}), \qquad
    \mathcal{L} = E_{Q}\Big[\log P(z_{1:T}) + \sum_t \big(\log Q(z_t|x_t) - \log Q_t(z_t)\big)
        - \log Q(z_{1:T}|x_{1:T})\Big]

(``docs/theory.md``, sequences; the structured guide Q), computed by
:class:`~rpm.RPMELBO` and minimised with Adam, the encoder at ``lr`` and the prior at
``prior_lr``, both with a linear warm-up over the first 5% of the steps and a cosine decay
(:func:`~rpm.training.schedule.cosine_schedule`), through :class:`~rpm.training.trainer.Trainer`
(checkpoints, exact resumption, progress).

**Missing frames** (``drop_frames`` = p > 0): each frame of each window is dropped with
probability p (:func:`rpm.data.missing.drop_frames`, from a generator seeded by the step alone,
so a resumed run drops the same frames), and the loss is the negative ELBO of the observed
frames (``mask=`` of :meth:`rpm.RPM.model`: no observation update, likelihood factor or
marginal term for a dropped frame) per observed frame.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyro
import torch

import rpm
from rpm.data.missing import drop_frames as drop_frames_mask
from rpm.experiments.common import derived_seed, fit_or_resume
from rpm.training.schedule import cosine_schedule
from rpm.training.trainer import Trainer

__all__ = ["sample_windows", "train_sequence_model"]

#: Fraction of the steps with a linear warm-up of the learning rates.
WARMUP = 0.05


def sample_windows(sequences: torch.Tensor, count: int, window: int, seed: int,
                   step: int) -> torch.Tensor:
    """``count`` windows of ``window`` consecutive frames of the training ``sequences``, drawn
    uniformly (sequence and start) from a generator seeded by ``(seed, step)`` alone.

    :param torch.Tensor sequences: (N, T, ...).
    :param int count: windows per batch.
    :param int window: frames per window, <= T.
    :return: (count, window, ...).
    """
    num, length = sequences.shape[:2]
    if not 2 <= window <= length:
        raise ValueError(f"window must lie in [2, {length}] (the sequences' length), got {window}")
    generator = torch.Generator().manual_seed(derived_seed(seed, "train", step))
    index = torch.randint(num, (count,), generator=generator)
    start = torch.randint(length - window + 1, (count,), generator=generator)
    frames = start[:, None] + torch.arange(window)  # (count, window)
    return sequences[index[:, None].to(sequences.device), frames.to(sequences.device)]


def train_sequence_model(model: rpm.RPM, sequences: torch.Tensor, *, steps: int,
                         batch_size: int, window: int, lr: float, prior_lr: float, seed: int,
                         out: Path, eval_fn: Callable[[int], dict] | None, eval_every: int,
                         checkpoint_every: int, progress: bool, resume: bool,
                         description: str, drop_frames: float = 0.0) -> dict:
    """Trains (or resumes, or reloads) ``model`` on windows of ``sequences`` (module docstring)
    with its checkpoint and history in ``out``; returns the trainer's history.

    :param rpm.RPM model: the model, on the device of ``sequences``.
    :param torch.Tensor sequences: the training sequences, (N, T, ...).
    :param int steps: optimiser steps.
    :param int batch_size: windows per step.
    :param int window: frames per window.
    :param float lr: peak learning rate of the encoder.
    :param float prior_lr: peak learning rate of the prior.
    :param int seed: the run seed (the windows' stream).
    :param Path out: folder of the checkpoint and history.
    :param eval_fn: ``eval_fn(step) -> dict`` of held-out scores, or None.
    :param int eval_every: steps between evaluations (0: at the end only).
    :param int checkpoint_every: steps between checkpoints (0: at the end only).
    :param bool progress: show a progress bar.
    :param bool resume: continue from the checkpoint in ``out``.
    :param str description: the progress bar's label.
    :param float drop_frames: the probability of dropping a frame of a window, in [0, 1)
        (module docstring, missing frames).
    """
    elbo = rpm.RPMELBO()
    frames = batch_size * window

    def loss_fn(step: int) -> torch.Tensor:
        x = sample_windows(sequences, batch_size, window, seed, step)
        if drop_frames > 0:
            generator = torch.Generator().manual_seed(derived_seed(seed, "drop", step))
            mask = drop_frames_mask((batch_size, window), drop_frames, generator,
                                    device=sequences.device)
            with pyro.validation_enabled(False):
                loss = elbo.differentiable_loss(model.model, model.guide, x, mask=mask)
            return loss / mask.sum().clamp(min=1)  # per observed frame
        with pyro.validation_enabled(False):  # our own tensors; validation would synchronise
            return elbo.differentiable_loss(model.model, model.guide, x) / frames

    prior_params = list(model.prior.parameters())
    others = [p for p in model.parameters() if all(p is not q for q in prior_params)]
    optimizer = torch.optim.Adam([{"params": others, "lr": lr},
                                  {"params": prior_params, "lr": prior_lr}])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_schedule(steps, WARMUP))
    trainer = Trainer(
        model, optimizer, loss_fn, out_dir=out, num_steps=steps, scheduler=scheduler,
        eval_fn=eval_fn, eval_every=eval_every if eval_fn is not None else 0,
        checkpoint_every=checkpoint_every, log_every=min(10, steps), progress=progress,
        description=description, eval_label="held-out",
    )
    return fit_or_resume(trainer, resume, description)
