r"""Contrastive losses for a plain PyTorch loop, in lightly's conventions, each the negative RPM
ELBO of its prior minus a constant (``docs/theory.md``, sections "NT-Xent" and "Candidates: the
batch, the global batch, a queue").

:class:`NTXentLoss` takes the arguments of ``lightly.loss.NTXentLoss`` (``temperature``,
``memory_bank_size``, ``gather_distributed``) and returns the same value from
``forward(out0, out1)``: the mean loss, positive, in nats. Its :meth:`NTXentLoss.elbo` returns
the RPM ELBO per pair the loss comes from:

* without a memory bank, SimCLR's NT-Xent is the pooled implicit prior
  (:class:`~rpm.priors.PooledImplicitPrior`) with the cosine energy
  :math:`f(z, z') = \hat z^\top \hat z' / \tau`, and
  :math:`\mathcal{L}/N = -\text{NT-Xent} + \log(2N - 1)`;
* with a memory bank of K latents (MoCo), the implicit conditional whose normaliser runs over
  the anchor's own positive and the K banked latents, and
  :math:`\mathcal{L}/N = -L_\text{MoCo} + \log(K + 1)`.
"""

from __future__ import annotations

import math

import torch

from rpm._validation import check_bool
from rpm.distributed import all_gather_with_grad
from rpm.inference.objective import rpm_elbo
from rpm.marginals.candidates import Candidates, LatentQueue
from rpm.ops import safe_logsumexp
from rpm.priors import CosineEnergy, PooledImplicitPrior

__all__ = ["NTXentLoss"]


def _bank_shape(memory_bank_size) -> tuple[int, int | None]:
    """(K, D or None) from lightly's ``memory_bank_size``: an int K >= 0 or a tuple (K, D)."""
    if isinstance(memory_bank_size, bool):
        raise TypeError(f"memory_bank_size must be an int K >= 0 or a tuple (K, D), "
                        f"got {memory_bank_size!r}")
    if isinstance(memory_bank_size, int):
        size, dim = memory_bank_size, None
    elif (isinstance(memory_bank_size, (tuple, list)) and len(memory_bank_size) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in memory_bank_size)):
        size, dim = memory_bank_size
        if dim < 1:
            raise ValueError(f"memory_bank_size (K, D) needs a latent dimension D >= 1, "
                             f"got {memory_bank_size!r}")
    else:
        raise TypeError(f"memory_bank_size must be an int K >= 0 or a tuple (K, D), "
                        f"got {memory_bank_size!r}")
    if size < 0:
        raise ValueError(f"memory_bank_size must be >= 0 (0: no memory bank, SimCLR), got {size}")
    return size, dim


class NTXentLoss(torch.nn.Module):
    r"""SimCLR's NT-Xent, or MoCo's loss with a memory bank, as lightly's ``NTXentLoss`` computes
    them, and the RPM ELBO each one is (``docs/theory.md``, "NT-Xent").

    Both outputs are normalised, :math:`\hat u = u / \lVert u \rVert`, and the energy is the
    cosine energy :math:`f(u, v) = \hat u^\top \hat v / \tau` (:class:`~rpm.priors.CosineEnergy`
    with :math:`\kappa = 1/\tau`).

    **No memory bank** (``memory_bank_size=0``). The 2N outputs are pooled,
    :math:`u = (z_1..z_N, z'_1..z'_N)`; each :math:`u_k` is an anchor whose positive is its
    partner :math:`u_{p(k)}` and whose candidates are the 2N - 1 others:

    .. math::

        \text{NT-Xent} = \frac{1}{2N} \sum_{k=1}^{2N}
            -\log \frac{e^{f(u_k, u_{p(k)})}}{\sum_{m \ne k} e^{f(u_k, u_m)}}.

    It is computed as the negative ELBO of :class:`~rpm.priors.PooledImplicitPrior`
    (through :func:`rpm.inference.rpm_elbo`, Delta recognition at the outputs),

    .. math::

        \mathcal{L}/N = -\text{NT-Xent} + \log(2N - 1),

    so the loss is :math:`-\mathcal{L}/N + \log(2N - 1)` by construction. With
    ``gather_distributed`` the candidates are the 2M - 1 other outputs of the global batch of M
    pairs (:func:`rpm.distributed.all_gather_with_grad`), each process averaging over its own
    anchors, as lightly does; without an initialised ``torch.distributed`` it changes nothing.

    **Memory bank** (``memory_bank_size = K > 0``, or lightly's ``(K, D)``). MoCo's form:
    the anchors are ``out0`` only, the positive of :math:`z_i` is :math:`z'_i` and the
    negatives are the bank's K latents :math:`c_{1:K}`:

    .. math::

        L_\text{MoCo} = \frac1N \sum_i -\log \frac{e^{f(z_i, z'_i)}}
            {e^{f(z_i, z'_i)} + \sum_{k=1}^K e^{f(z_i, c_k)}},
        \qquad \mathcal{L}/N = -L_\text{MoCo} + \log(K + 1),

    the ELBO of the implicit prior (Eq. 23-25 of Aitchison & Ganev) whose normaliser
    :math:`Z(z_i) = \mathbb{E}_{Q(z')} e^{f(z_i, z')}` is estimated from K + 1 samples of the
    marginal: the anchor's own positive and the banked latents. The bank is a
    :class:`~rpm.marginals.candidates.LatentQueue` (a buffer: ``state_dict()`` carries it); as
    in lightly it starts full of random unit vectors and holds the normalised, detached ``out1``
    of earlier calls (every process's, with ``gather_distributed``), first in first out. It is
    updated after the loss, only in training mode (``loss.train()``; ``loss.eval()`` keeps it,
    e.g. for a validation set). The banked latents come from earlier versions of the encoder,
    so they estimate the normaliser under an older marginal; the bias vanishes as the encoder
    stops moving. Where a batch does not divide K, lightly drops the rows of a batch that
    would wrap around the end of its bank; this queue wraps them around (a true FIFO), so the
    two banks then differ in which old rows they hold.

    :param float temperature: :math:`\tau > 0`.
    :param memory_bank_size: K >= 0 (0: SimCLR, no bank), or a tuple (K, D); with an int the
        bank is created at the first call, from the outputs' dimension.
    :param bool gather_distributed: gather the candidates (or the bank's new entries) from every
        process of ``torch.distributed``.
    """

    def __init__(self, temperature: float = 0.5, memory_bank_size: int | tuple[int, int] = 0,
                 gather_distributed: bool = False):
        super().__init__()
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0 (SimCLR uses 0.5, MoCo 0.07), "
                             f"got {temperature!r}")
        self.temperature = float(temperature)
        self.gather_distributed = check_bool("gather_distributed", gather_distributed)
        self.memory_bank_size, dim = _bank_shape(memory_bank_size)
        self.prior = PooledImplicitPrior(CosineEnergy(kappa=1.0 / self.temperature))
        self.bank: LatentQueue | None = None
        if self.memory_bank_size > 0 and dim is not None:
            self._init_bank(dim)

    def _init_bank(self, dim: int, like: torch.Tensor | None = None) -> None:
        """K random unit vectors, as lightly's bank starts (on ``like``'s device, in its dtype)."""
        self.bank = LatentQueue(self.memory_bank_size, dim)
        if like is not None:
            self.bank.to(device=like.device, dtype=like.dtype)
        self.bank.push(torch.nn.functional.normalize(
            torch.randn(self.memory_bank_size, dim, dtype=self.bank.memory.dtype), dim=1))

    def _check(self, out0: torch.Tensor, out1: torch.Tensor) -> None:
        for name, out in (("out0", out0), ("out1", out1)):
            if not isinstance(out, torch.Tensor) or out.dim() != 2:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"NTXentLoss takes {name} of shape (N, D), one row per image; got {got}")
        if out0.shape != out1.shape:
            raise ValueError(f"NTXentLoss needs out0 and out1 of the same shape (N, D), row i of each "
                             f"the two views of image i; got {tuple(out0.shape)} and {tuple(out1.shape)}")
        if self.bank is not None and out0.shape[1] != self.bank.dim:
            raise ValueError(f"the memory bank holds latents of dimension {self.bank.dim}, the outputs "
                             f"have {out0.shape[1]}; build the loss with memory_bank_size=(K, "
                             f"{out0.shape[1]})")

    def _bank_ratio(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        r"""Per-pair :math:`f(z_i, z'_i) - \log \frac{1}{K+1}(e^{f(z_i, z'_i)} + \sum_k e^{f(z_i, c_k)})`."""
        bank = self.bank.latents().to(z)  # unit rows, as lightly's bank: used as they are
        positive = (z * z2).sum(-1, keepdim=True) / self.temperature  # f(z_i, z'_i), unit rows
        logits = torch.cat([positive, z @ bank.T / self.temperature], dim=-1)  # (N, K + 1)
        return positive.squeeze(-1) - safe_logsumexp(logits, dim=-1) + math.log(logits.shape[-1])

    def _terms(self, out0: torch.Tensor, out1: torch.Tensor):
        """(ELBO summed over this process's pairs, the loss's constant, normalised out1)."""
        self._check(out0, out1)
        if self.memory_bank_size > 0 and self.bank is None:
            self._init_bank(out0.shape[1], like=out0)
        z = torch.nn.functional.normalize(out0, dim=1)
        z2 = torch.nn.functional.normalize(out1, dim=1)
        if self.bank is not None:
            return self._bank_ratio(z, z2).sum(), math.log(self.memory_bank_size + 1), z2
        candidates = Candidates(global_batch=self.gather_distributed)
        value = rpm_elbo(self.prior, [z, z2], candidates=candidates)
        num_pairs = candidates.gather(z).shape[0]  # M: the global batch (gathered once, cached)
        return value, math.log(2 * num_pairs - 1), z2

    def elbo(self, out0: torch.Tensor, out1: torch.Tensor) -> torch.Tensor:
        r"""The RPM ELBO per pair, :math:`\mathcal{L}/N`: :math:`-\text{NT-Xent} + \log(2N - 1)`
        (no bank) or :math:`-L_\text{MoCo} + \log(K + 1)` (bank). Leaves the bank unchanged.

        :param torch.Tensor out0: first views' outputs, shape (N, D).
        :param torch.Tensor out1: second views' outputs, shape (N, D).
        :return: a scalar tensor (nats).
        """
        value, _, _ = self._terms(out0, out1)
        return value / out0.shape[0]

    def forward(self, out0: torch.Tensor, out1: torch.Tensor) -> torch.Tensor:
        r"""The mean loss, :math:`-\mathcal{L}/N + \log(2N - 1)` (NT-Xent) or
        :math:`-\mathcal{L}/N + \log(K + 1)` (MoCo); in training mode a bank then takes the
        normalised, detached ``out1`` (gathered from every process with ``gather_distributed``).

        :param torch.Tensor out0: first views' outputs, shape (N, D).
        :param torch.Tensor out1: second views' outputs, shape (N, D).
        :return: a scalar tensor (nats), positive.
        """
        value, constant, z2 = self._terms(out0, out1)
        loss = constant - value / out0.shape[0]
        if self.bank is not None and self.training:
            keys = z2.detach()
            if self.gather_distributed:
                keys = all_gather_with_grad(keys)
            self.bank.push(keys)
        return loss
