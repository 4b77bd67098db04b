r"""Training and scoring of one energy in the ``rpm identifiability`` experiment.

:func:`train_energy` minimises the negative RPM ELBO per pair (Eq. 15 of Aitchison & Ganev; with
the implicit prior, InfoNCE minus :math:`\log N`, Eq. 23-25),

.. math::

    \ell_s = -\frac1N \mathcal{L}(x_{1:N}, x'_{1:N})
    = \frac1N \sum_i \Big[\log \sum_j e^{f(h(x_i), h(x'_j))} - f(h(x_i), h(x'_i))\Big] - \log N,

with Adam (the encoder at ``--lr``, the energy's parameters at ``--energy-lr``) and the schedule
of :func:`cosine_schedule`, through :class:`~rpm.training.trainer.Trainer` (checkpoints, exact
resumption, a progress bar with the latest held-out score). It then scores the encoder on a
fresh held-out set. :func:`oracle_concentrations` fits the anisotropic energy to the true latent
pairs, the best :math:`\Lambda` the energy family can reach on the data, against which the
learned one is compared.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import pyro
import torch

import rpm
from rpm import distributed
from rpm.data.synthetic import LatentProcess
from rpm.experiments.common import derived_seed, fit_with_cosine_schedule, seed_everything
from rpm.experiments.identifiability.model import (
    build_rpm,
    energy_parameters,
    model_from_arguments,
)
from rpm.experiments.trained import write_model_record
from rpm.metrics import mcc, mcc_per_dimension, r2, r2_per_dimension
from rpm.priors import AnisotropicEnergy
from rpm.training.schedule import cosine_schedule

__all__ = ["R2_LEVELS", "cosine_schedule", "oracle_concentrations", "train_energy"]

#: R^2 levels whose first crossing time is reported.
R2_LEVELS = (0.9, 0.95, 0.99)


def _scores(z: torch.Tensor, h: torch.Tensor) -> dict:
    return {"r2": r2(z, h), "mcc": mcc(z, h)}


def _identity_scores(z: torch.Tensor, x: torch.Tensor) -> dict:
    """The identity encoder's scores; its MCC needs at least as many coordinates as latents."""
    return {"r2": r2(z, x), "mcc": mcc(z, x) if x.shape[-1] >= z.shape[-1] else None}


def _encoder_outputs(model: rpm.RPM, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model.encode(x)


def _time_to(evaluations: list, level: float) -> float | None:
    for evaluation in evaluations:
        if evaluation.get("r2", -math.inf) >= level:
            return evaluation["wall_time"]
    return None


def _group_ratio(values: torch.Tensor) -> float:
    half = len(values) // 2
    return float(values[half:].mean() / values[:half].mean())


def _concentration_report(energy_params: dict, matched: torch.Tensor,
                          truth: torch.Tensor | None, oracle: list | None = None) -> dict:
    """Learned Lambda of the recovered dimension matched to each true dimension, and the ratio
    of the group means (second half over first half) against the truth's (and the oracle's)."""
    if "concentration" not in energy_params:
        return {}
    learned = torch.tensor(energy_params["concentration"], dtype=torch.float64)[matched]
    report = {"concentration_matched": learned.tolist()}
    if truth is not None:
        ratio_learned = _group_ratio(learned)
        ratio_true = _group_ratio(truth)
        report.update(concentration_true=truth.tolist(), group_ratio_true=ratio_true,
                      group_ratio_learned=ratio_learned,
                      group_ratio_error=abs(ratio_learned / ratio_true - 1.0))
        if oracle is not None:
            ratio_oracle = _group_ratio(torch.tensor(oracle, dtype=torch.float64))
            report.update(concentration_oracle=oracle, group_ratio_oracle=ratio_oracle,
                          group_ratio_error_oracle=abs(ratio_learned / ratio_oracle - 1.0))
    return report


def train_energy(name: str, args: argparse.Namespace, stream: Callable, held_out: dict | None,
                 out: Path, device: torch.device, in_dim: int | None = None,
                 process: LatentProcess | None = None) -> tuple[dict, rpm.RPM]:
    """Trains (or resumes, or reloads) the RPM with energy ``name`` in ``out`` and scores it.

    Under ``torchrun`` (``torch.distributed`` initialised with W > 1 processes) every process
    draws the same global minibatch of ``args.batch_size`` pairs (a pure function of the seed
    and the step), encodes only its own slice of W (:func:`rpm.distributed.local_slice`), and
    evaluates its rows of the ELBO with the marginals and the normaliser over the global batch
    (``RPMELBO(global_batch=True)``); the gradients are summed over the processes, so the
    parameters follow those of one process on the whole batch.

    :param str name: one of :data:`~rpm.experiments.identifiability.model.ENERGIES`.
    :param argparse.Namespace args: the resolved flags (``args.dim``: the latents n).
    :param stream: ``stream(step) -> (x, x2)``, the global minibatch of a step, each (B, P) on
        the training device (:class:`~rpm.experiments.identifiability.data.PairStream`, or
        :class:`~rpm.experiments.identifiability.data.ArrayPairStream` for given pairs).
    :param held_out: ``{"eval": (z, x), "test": (z, x)}``, the held-out latents (M, K) and
        observations (M, P) for the validation and the test scores; or None: nothing to score
        (the scores, baselines and trajectories of R^2 and MCC are None).
    :param Path out: the run folder of this energy (checkpoint, history).
    :param torch.device device: the training device.
    :param int in_dim: P, the dimension of an observation (default n).
    :param process: the latent process of generated data (its anisotropic concentrations are
        reported against the learned ones), or None.
    :return: the JSON-ready result (scores, baselines, trajectories, energy parameters) and the
        trained model, in evaluation mode.
    """
    seed_everything(args.seed)  # same encoder initialisation whichever energies run together
    arguments = {"energy": name, "dim": args.dim, "in_dim": int(in_dim or args.dim),
                 "hidden": args.hidden, "depth": args.depth, "encoder_space": args.encoder_space,
                 "tau": args.tau, "p": args.p, "learn_temperature": args.learn_temperature}
    model = model_from_arguments(arguments, compile=args.compile).to(device)
    energy = model.prior.energy
    if distributed.is_main_process():  # what rpm.load rebuilds the model from
        write_model_record(out, "identifiability", arguments, (arguments["in_dim"],))
    if held_out is not None:
        z_eval, x_eval = held_out["eval"]
        z_test, x_test = held_out["test"]
        untrained = _scores(z_test, _encoder_outputs(model, x_test))
    parallel = distributed.is_distributed()
    rows = distributed.local_slice(args.batch_size)  # all rows in one process
    elbo = rpm.RPMELBO(global_batch=parallel)

    def loss_fn(step: int) -> torch.Tensor:
        x, x2 = stream(step)  # (N, n) each, the global batch
        # The pairs come from our own sampler; Pyro's input validation would synchronise with
        # the device at every step.
        with pyro.validation_enabled(False):
            return elbo.differentiable_loss(model.model, model.guide, x[rows],
                                            x2[rows]) / args.batch_size

    def eval_fn(step: int) -> dict:
        scores = {} if held_out is None else _scores(z_eval, _encoder_outputs(model, x_eval))
        scalars = {k: v for k, v in energy_parameters(energy).items() if isinstance(v, float)}
        return {**scores, **scalars}

    energy_params = list(energy.parameters())
    encoder_params = [p for p in model.parameters() if all(p is not q for q in energy_params)]
    groups = [{"params": encoder_params, "lr": args.lr}]
    if energy_params:
        groups.append({"params": energy_params, "lr": args.energy_lr})
    optimizer = torch.optim.Adam(groups, fused=device.type == "cuda" or None)
    history = fit_with_cosine_schedule(model, optimizer, loss_fn, args, out, name, eval_fn,
                                       log_every=min(100, args.steps), distributed=parallel)
    model.eval()

    params = energy_parameters(energy)
    evaluations = history["evaluations"]
    if held_out is None:
        scores = {"r2": None, "mcc": None, "r2_per_dimension": None, "mcc_per_dimension": None,
                  "baseline": None}
        matched_index, truth = None, None
    else:
        h_test = _encoder_outputs(model, x_test)
        matched = mcc_per_dimension(z_test, h_test)
        matched_index = matched.index
        scores = {**_scores(z_test, h_test),
                  "r2_per_dimension": r2_per_dimension(z_test, h_test).tolist(),
                  "mcc_per_dimension": matched.abs_correlation.tolist(),
                  "baseline": {"identity": _identity_scores(z_test, x_test),
                               "untrained": untrained}}
        truth = None if process is None else process.concentrations
    oracle = None
    if truth is not None and isinstance(energy, AnisotropicEnergy):
        oracle = oracle_concentrations(process, min(args.steps, 2000), max(args.batch_size, 1024),
                                       args.seed, args.energy_lr, energy.normalize)
    result = {
        "energy": name,
        **scores,
        "energy_parameters": params,
        **(_concentration_report(params, matched_index, truth, oracle)
           if matched_index is not None else {}),
        "trajectory": {key: [e.get(key) for e in evaluations]
                       for key in ("step", "r2", "mcc", "wall_time", *(
                           k for k in evaluations[-1] if k not in ("step", "r2", "mcc",
                                                                   "wall_time")))},
        "losses": history["losses"],
        "time_to_r2": {str(level): _time_to(evaluations, level) for level in R2_LEVELS},
        "train_seconds": evaluations[-1]["wall_time"],
        "steps": args.steps,
        "pairs_per_second": args.steps * args.batch_size / evaluations[-1]["wall_time"],
    }
    return result, model


def oracle_concentrations(process: LatentProcess, num_steps: int, batch_size: int, seed: int,
                          lr: float, normalize: bool = True,
                          init: torch.Tensor | None = None) -> list[float]:
    r"""The concentrations :math:`\Lambda` of the anisotropic energy fitted with the true
    latents as the encoder's outputs (:math:`h(x) = z`), minimising the same negative ELBO:
    the best the energy family can do on this data. On the sphere it differs from the
    concentrations of the ambient noise (the noise is added before the projection), so the
    learned :math:`\Lambda` is compared with both.

    :param LatentProcess process: the latent process (anisotropic conditional).
    :param int num_steps: Adam steps (cosine-decayed learning rate, no warm-up).
    :param int batch_size: pairs per step.
    :param int seed: the run seed (the pairs are drawn from its ``"oracle"`` stream).
    :param float lr: peak learning rate.
    :param bool normalize: project the latents on the sphere inside the energy.
    :param init: the starting :math:`\Lambda`, shape (n,); default the process's
        concentrations (Adam moves a softplus-constrained parameter by about ``lr`` per step,
        so a start far from the optimum needs many steps).
    :return: :math:`\Lambda`, n floats.
    """
    return _fit_oracle(process, num_steps, batch_size, seed, lr, normalize, init)


def _fit_oracle(process: LatentProcess, num_steps: int, batch_size: int, seed: int, lr: float,
                normalize: bool, init: torch.Tensor | None) -> list[float]:
    energy = AnisotropicEnergy(process.dim, normalize=normalize).to(process.device)
    start = process.concentrations if init is None else init
    energy.concentration = start.to(process.device, torch.get_default_dtype())
    model = build_rpm(torch.nn.Identity(), energy)
    optimizer = torch.optim.Adam(energy.parameters(), lr=lr)
    schedule = cosine_schedule(num_steps, 0.0)
    generator = torch.Generator(process.device).manual_seed(derived_seed(seed, "oracle"))
    elbo = rpm.RPMELBO()
    for step in range(num_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * schedule(step)
        z, z2 = process.sample_pairs(batch_size, generator)
        with pyro.validation_enabled(False):
            loss = elbo.differentiable_loss(model.model, model.guide, z, z2) / batch_size
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return energy.concentration.detach().cpu().tolist()
