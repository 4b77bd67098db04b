r"""Training an RPM with PyTorch Lightning, on one process or several (``strategy="ddp"``).

Lightning is an optional dependency (``pip install 'rpm-pyro[lightning]'``); the core of rpm
does not import this module.

:class:`RPMLightningModule` wraps any :class:`~rpm.RPM` (pairs or J views, any prior and
``marginal``) and minimises the negative RPM ELBO per instance of the **global** batch. With W
processes holding :math:`N_r` instances each, :math:`M = \sum_r N_r`, and the ELBO evaluated by
``RPMELBO(global_batch=True)`` (the minibatch-mixture marginals, the implicit prior's negatives
and the moment-matched marginal's moments gathered from every process with
:func:`rpm.distributed.all_gather_with_grad`), process r's loss is

.. math::

    \ell_r = -\frac{W}{M}\, \mathcal{L}_r, \qquad
    \mathcal{L}_r = \sum_{i \in B_r} \big[\log P(z_i, z'_i) - \log Q_B(z_i) - \log Q_B(z'_i)\big],

its share of the global ELBO :math:`\mathcal{L} = \sum_r \mathcal{L}_r` scaled by W.
``DistributedDataParallel`` averages the processes' gradients, and the gather's backward sums
each process's gradient of every :math:`\mathcal{L}_s`, so each process steps with

.. math::

    \frac1W \sum_r \nabla \ell_r = -\frac1M \nabla \mathcal{L},

the gradient of one process minimising :math:`-\mathcal{L}/M` on the concatenated batch,
whatever the :math:`N_r` (a last batch of another size included). With one process it is the
per-instance negative ELBO of the batch. The logged ``loss`` is :math:`-\mathcal{L}/M`
(averaged over the processes: ``sync_dist``).

.. code-block:: python

    import lightning.pytorch as pl
    module = RPMLightningModule(rpm.RPM(rpm.DeltaRecognition(net), prior))
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=100)
    trainer.fit(module, torch.utils.data.DataLoader(TensorDataset(x, x2), batch_size=128))

Each process's DataLoader gets Lightning's ``DistributedSampler`` (for training it shuffles,
with seed 0 and the epoch: ``Trainer(use_distributed_sampler=...)``), so ``batch_size`` is the
batch of one process: the global batch has W times as many instances. The ELBO is a sum over
the instances and its marginals are symmetric in them, so the order in which the sampler deals
the rows to the processes does not change it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import torch

from rpm.distributed import all_gather_with_grad, collective_device, global_world_size, is_distributed
from rpm.inference import RPMELBO
from rpm.models._base import RPMBase

try:
    import lightning.pytorch as pl
except ModuleNotFoundError as error:  # pragma: no cover - the message names the extra
    raise ModuleNotFoundError(
        "rpm.lightning needs PyTorch Lightning: pip install 'rpm-pyro[lightning]'"
    ) from error

__all__ = ["RPMLightningModule"]


class RPMLightningModule(pl.LightningModule):
    r"""A ``LightningModule`` that trains an RPM on the per-instance negative ELBO of the global
    batch (module docstring: :math:`\ell_r = -W \mathcal{L}_r / M`).

    A batch is what the model's ``model`` takes: ``(x, x2)`` for pairs, ``(x_1, ..., x_J)`` or
    one tensor (N, J, ...) for J views, as a ``TensorDataset``'s DataLoader yields them (a list
    of tensors), or one tensor.

    :param model: the :class:`~rpm.RPM` (any :class:`~rpm.models._base.RPMBase`) to train; its
        parameters are the module's.
    :param elbo: the :class:`~rpm.RPMELBO` to minimise (default ``RPMELBO(global_batch=True)``,
        which with one process is ``RPMELBO()``). With ``global_batch=False`` every process's
        marginals and normalisers run over its own rows only (a per-process contrastive batch).
    :param optimiser: a function of the parameters returning a ``torch.optim.Optimizer``
        (default Adam with learning rate 1e-3).
    :raises TypeError: for a model that is not an RPM, an ELBO that is not an ``RPMELBO``, or an
        optimiser that is not callable.
    """

    def __init__(self, model: RPMBase, elbo: RPMELBO | None = None,
                 optimiser: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
                 | None = None):
        super().__init__()
        if not isinstance(model, RPMBase):
            raise TypeError(f"model must be an rpm.RPM (an rpm.models RPMBase), got {model!r}")
        if elbo is not None and not isinstance(elbo, RPMELBO):
            raise TypeError(f"elbo must be an rpm.RPMELBO, e.g. RPMELBO(global_batch=True), "
                            f"got {elbo!r}")
        if optimiser is not None and not callable(optimiser):
            raise TypeError(f"optimiser must be a function of the parameters returning a "
                            f"torch.optim.Optimizer, e.g. functools.partial(torch.optim.Adam, "
                            f"lr=1e-3); got {optimiser!r}")
        self.model = model
        self.elbo = RPMELBO(global_batch=True) if elbo is None else elbo
        self.optimiser = (functools.partial(torch.optim.Adam, lr=1e-3) if optimiser is None
                          else optimiser)

    def loss(self, batch) -> torch.Tensor:
        r"""This process's loss :math:`\ell_r = -W \mathcal{L}_r / M` of a batch (module
        docstring); :math:`-\mathcal{L}/M` itself with one process."""
        views = tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)
        negative_elbo = self.elbo.differentiable_loss(self.model.model, self.model.guide, *views)
        local = views[0].shape[0]
        if not is_distributed():
            return negative_elbo / local
        sizes = all_gather_with_grad(torch.tensor([local], device=collective_device()))
        return negative_elbo * global_world_size() / int(sizes.sum())

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        """The loss of the step's batch (:meth:`loss`), logged as ``loss``: the global batch's
        per-instance negative ELBO."""
        loss = self.loss(batch)
        self.log("loss", loss.detach(), sync_dist=True, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The ``optimiser`` of the constructor over the model's parameters."""
        return self.optimiser(self.model.parameters())
