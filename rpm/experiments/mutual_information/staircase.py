r"""The training loops of the MI staircase (Poole et al. 2019, section 4; ``python -m rpm
mutual-information``).

A staircase is a sequence of stages; stage s draws batches of the correlated Gaussian pair
(:class:`~rpm.mi.CorrelatedGaussian`, optionally the cubic variant) whose MI is ``mis[s]``, for
``steps`` steps, while the estimators keep training from where the previous stage left them.
Every critic-based estimator has its own critic (one module with ``copies``, one Adam on all:
Adam is elementwise, so this is one optimiser per critic) and maximises its own objective:

========================== =================================================================
estimator                  trained with / reported value
========================== =================================================================
``infonce``                :func:`~rpm.mi.info_nce_bound` / the same
``nwj``                    :func:`~rpm.mi.nwj` / the same
``mine``                   :class:`~rpm.mi.MINE` (moving-average gradient) / DV
``js``                     :func:`~rpm.mi.js`: JS f-GAN / NWJ at 1 + f
``smile``                  :func:`~rpm.mi.smile`: JS f-GAN / DV with the clip tau
``interpolated``           :func:`~rpm.mi.interpolated`, a learned constant baseline / the same
========================== =================================================================

The RPM ELBO (:class:`~rpm.mi.RPMEstimator`) needs no critic: it runs once per staircase on the
same batches, its encoders at ``lr`` and its prior at ``prior_lr``.

Each stage's batches come from a generator seeded by (seed, variant, stage) alone, so every
estimator (and every critic family) sees the same data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rpm.experiments.common import derived_seed, seed_everything
from rpm.mi import (
    MINE,
    CorrelatedGaussian,
    JointCritic,
    RPMEstimator,
    SeparableCritic,
    info_nce_bound,
    interpolated,
    js,
    nwj,
    smile,
)

__all__ = ["CRITIC_ESTIMATORS", "StaircaseConfig", "cubic_matrix", "pair_for", "train_critics",
           "train_rpm"]

#: The critic-based estimators, in the order of the critic's copies.
CRITIC_ESTIMATORS = ("infonce", "nwj", "mine", "js", "smile", "interpolated")
#: Index of the cubic variant's stream (the Gaussian staircase is 0).
_VARIANTS = {"gaussian": 0, "cubic": 1}


@dataclass
class StaircaseConfig:
    """The settings of one staircase."""

    mis: Sequence[float]    # true MI of each stage, nats
    steps: int              # optimiser steps per stage
    batch_size: int         # pairs per batch, N
    dim: int                # dimension of x and y
    lr: float               # Adam learning rate of the critics and the RPM's encoders
    prior_lr: float         # Adam learning rate of the RPM's prior
    hidden: int             # hidden width of the separable critic's MLPs
    joint_hidden: int       # hidden width of the joint critic's MLP
    layers: int             # hidden layers of the critics' MLPs
    embed_dim: int          # output dimension of the separable critic's networks
    tau: float              # SMILE's clip
    alpha: float            # I_alpha's interpolation
    momentum: float         # MINE's moving average
    rpm_hidden: int         # tanh units of the RPM encoders' MLPs
    seed: int               # the run seed


def cubic_matrix(dim: int, seed: int) -> torch.Tensor:
    """The cubic variant's orthogonal W, shape (D, D): Q of the QR decomposition of a standard
    normal matrix (signs fixed by R's diagonal), from the run seed."""
    gen = torch.Generator().manual_seed(derived_seed(seed, "mixing"))
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def pair_for(config: StaircaseConfig, variant: str, stage: int) -> CorrelatedGaussian:
    """The data of ``stage`` of the ``variant`` staircase."""
    cubic = cubic_matrix(config.dim, config.seed) if variant == "cubic" else None
    return CorrelatedGaussian.with_mi(config.mis[stage], config.dim, cubic)


def _batches(config: StaircaseConfig, variant: str, stage: int, device):
    """The stage's batches, drawn on the CPU from the stage's generator (the same numbers on
    every device) and moved to ``device``."""
    pair = pair_for(config, variant, stage)
    gen = torch.Generator().manual_seed(
        derived_seed(config.seed, "data", _VARIANTS[variant] * 1000 + stage))
    for _ in range(config.steps):
        yield pair.sample(config.batch_size, gen, device=device)


def _critic(name: str, config: StaircaseConfig) -> torch.nn.Module:
    copies = len(CRITIC_ESTIMATORS)
    if name == "separable":
        return SeparableCritic(config.dim, config.dim, config.embed_dim, config.hidden,
                               config.layers, copies=copies)
    if name == "joint":
        return JointCritic(config.dim, config.dim, config.joint_hidden, config.layers,
                           copies=copies)
    raise ValueError(f"critic must be 'separable' or 'joint', got {name!r}")


def train_critics(critic_name: str, variant: str, config: StaircaseConfig,
                  tick: Callable[[], None] = lambda: None, device=None) -> np.ndarray:
    """Trains the six critic-based estimators with one ``critic_name`` critic each over the
    staircase; returns their estimate at every step, shape (stages, steps, 6), in the order of
    :data:`CRITIC_ESTIMATORS`. ``tick()`` is called after each step (progress); the estimates
    are read back to the host once per stage."""
    seed_everything(config.seed)
    critic = _critic(critic_name, config).to(device)
    log_baseline = torch.nn.Parameter(torch.zeros((), device=device))
    mine = MINE(config.momentum)
    optimizer = torch.optim.Adam([*critic.parameters(), log_baseline], lr=config.lr)
    out = np.empty((len(config.mis), config.steps, len(CRITIC_ESTIMATORS)), dtype=np.float64)
    for stage in range(len(config.mis)):
        stage_values = []
        for x, y in _batches(config, variant, stage, device):
            scores = critic(x, y)                                           # (6, N, N)
            values = torch.stack([
                info_nce_bound(scores[0]), nwj(scores[1]), mine(scores[2]), js(scores[3]),
                smile(scores[4], config.tau),
                interpolated(scores[5], log_baseline, config.alpha)])
            optimizer.zero_grad(set_to_none=True)
            (-values.sum()).backward()
            optimizer.step()
            stage_values.append(values.detach())
            tick()
        out[stage] = torch.stack(stage_values).cpu().double().numpy()
    return out


def train_rpm(variant: str, config: StaircaseConfig,
              tick: Callable[[], None] = lambda: None, device=None) -> np.ndarray:
    """Trains the RPM ELBO estimator over the staircase; returns its ELBO per pair at every
    step, shape (stages, steps)."""
    seed_everything(config.seed)
    estimator = RPMEstimator(config.dim, config.dim, config.dim,
                             hidden=config.rpm_hidden).to(device)
    prior = list(estimator.prior.parameters())
    others = [p for p in estimator.parameters() if all(p is not q for q in prior)]
    optimizer = torch.optim.Adam([{"params": others, "lr": config.lr},
                                  {"params": prior, "lr": config.prior_lr}])
    out = np.empty((len(config.mis), config.steps), dtype=np.float64)
    for stage in range(len(config.mis)):
        stage_values = []
        for x, y in _batches(config, variant, stage, device):
            elbo = estimator(x, y)
            optimizer.zero_grad(set_to_none=True)
            (-elbo).backward()
            optimizer.step()
            stage_values.append(elbo.detach())
            tick()
        out[stage] = torch.stack(stage_values).cpu().double().numpy()
    return out
