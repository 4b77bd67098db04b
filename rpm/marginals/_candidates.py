r"""The candidates of a step: the latents over which a prior's normaliser and the recognition
marginals are estimated (``docs/theory.md``, queues and the global batch).

The implicit prior's conditional :math:`P(z'|z) = Q(z') e^{f(z, z')} / Z(z)` needs its normaliser
:math:`Z(z) = \mathbb{E}_{Q(z')} e^{f(z, z')}` (Eq. 21-22 of Aitchison & Ganev), and the
likelihood :math:`P(x|z) = Q(z|x) P_\text{true}(x) / Q(z)` (Eq. 10) the recognition marginal Q.
Both are expectations under Q, estimated from samples of it. Which samples is a choice of the
step, not of the prior:

* **the batch** (the default): the N latents of the other view,
  :math:`\hat Z(z_i) = \frac1N \sum_j e^{f(z_i, z'_j)}` (InfoNCE, Eq. 23-25);
* **the global batch**: the latents of every process of a ``torch.distributed`` group,
  gathered with gradients (:func:`~rpm.distributed.all_gather_with_grad`), so the estimate
  runs over :math:`M = \sum_r N_r` latents while each process keeps its own rows;
* **a queue of earlier latents** (:class:`LatentQueue`, MoCo's memory bank): K detached
  latents of earlier batches appended to the batch's,
  :math:`\hat Z(z_i) = \frac{1}{M + K} \big(\sum_j e^{f(z_i, z'_j)} + \sum_k e^{f(z_i, q_k)}\big)`.

:class:`Candidates` is the one object a prior receives for all three; a prior never asks
whether the process is distributed. It lives here, below the models and the inference code,
because the priors take it (the package's layering is ops -> marginals -> priors -> models ->
inference); :mod:`rpm.inference` re-exports it.

**The queue's bias.** The queued latents were computed by earlier versions of the encoder: they
are samples of the marginal of an older Q, so the normaliser they estimate is
:math:`\mathbb{E}_{Q_\text{old}(z')} e^{f(z, z')}`, not the current one's. The bias vanishes as
the encoder stops moving (and is small when it moves slowly, the reason MoCo uses a momentum
encoder); no gradient flows into the queued latents.
"""

from __future__ import annotations

import torch

from rpm._validation import check_bool, check_positive_int
from rpm.distributed import all_gather_with_grad, collective_device, global_rank, is_distributed

__all__ = ["Candidates", "LatentQueue"]


class LatentQueue(torch.nn.Module):
    r"""A first-in first-out queue of K latents of earlier batches (MoCo's memory bank), held
    detached, as a buffer of the module that owns it (so ``state_dict()`` and checkpoints carry
    it, unless ``persistent=False``).

    .. code-block:: python

        queue = LatentQueue(size=4096, dim=128)
        model = rpm.RPM(rpm.DeltaRecognition(encoder), ImplicitPrior(CosineEnergy()), queue=queue)
        loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
        loss.backward()
        queue.push(model.encode(x2))    # enqueue the keys after the step

    :meth:`latents` returns the filled rows, oldest first; :meth:`push` appends a batch and drops
    the oldest rows beyond K. The latents are stored without gradient (``detach``): they are a
    second sample of the recognition marginal, from earlier versions of the encoder (module
    docstring: the bias).

    :param int size: K, the number of latents kept.
    :param int dim: D, the latent dimension.
    :param bool persistent: whether ``state_dict()`` holds the queue (``.to()`` moves it either
        way); :class:`rpm.losses.NTXentLoss` keeps its bank out, as lightly does.
    """

    def __init__(self, size: int, dim: int, persistent: bool = True):
        super().__init__()
        self.size = check_positive_int("size", size)
        self.dim = check_positive_int("dim", dim)
        persistent = check_bool("persistent", persistent)
        self.register_buffer("memory", torch.zeros(self.size, self.dim),  # (K, D), a ring
                             persistent=persistent)
        self.register_buffer("filled", torch.zeros((), dtype=torch.long),  # rows in use
                             persistent=persistent)
        self.register_buffer("head", torch.zeros((), dtype=torch.long),    # next row to write
                             persistent=persistent)

    def __len__(self) -> int:
        return int(self.filled)

    def latents(self) -> torch.Tensor:
        """The queued latents, oldest first, shape (min(pushed, K), D); no gradient."""
        filled, head = int(self.filled), int(self.head)
        if filled < self.size:
            return self.memory[:filled]
        return torch.cat([self.memory[head:], self.memory[:head]])

    @torch.no_grad()
    def push(self, latents: torch.Tensor) -> None:
        """Appends a batch of latents (detached), dropping the oldest beyond K.

        :param torch.Tensor latents: shape (B, D).
        :raises ValueError: for a tensor that is not (B, D).
        """
        if not isinstance(latents, torch.Tensor) or latents.dim() != 2 or latents.shape[1] != self.dim:
            shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
            raise ValueError(f"LatentQueue.push takes latents of shape (B, {self.dim}), got {shape}")
        latents = latents.detach()[-self.size:].to(self.memory)        # the newest K at most
        rows = (int(self.head) + torch.arange(latents.shape[0])) % self.size
        self.memory[rows.to(self.memory.device)] = latents
        self.head.fill_((int(self.head) + latents.shape[0]) % self.size)
        self.filled.fill_(min(self.size, int(self.filled) + latents.shape[0]))


class Candidates:
    r"""The latents a step's normalisers and marginals run over: the batch, the global batch of
    every process, and the latents of a queue (module docstring).

    Built per step (by :class:`~rpm.RPM` and :class:`~rpm.RPMELBO`, or by hand for
    :func:`rpm.inference.rpm_elbo`) and passed to the prior's hooks. Gathers are made once per
    tensor and step; without ``global_batch`` (or outside ``torch.distributed``) nothing is
    gathered and :meth:`gather` returns its argument.

    :param bool global_batch: gather the batch from every process of ``group``.
    :param queue: a :class:`LatentQueue` whose latents extend the candidates of the
        normaliser, or None.
    :param group: the ``torch.distributed`` process group (None: the world).
    """

    def __init__(self, global_batch: bool = False, queue: LatentQueue | None = None, group=None):
        self.global_batch = check_bool("global_batch", global_batch)
        if queue is not None and not isinstance(queue, LatentQueue):
            raise TypeError(f"queue must be an rpm.inference.LatentQueue or None, got {queue!r}")
        self.queue = queue
        self.group = group
        self._gathered: list[tuple[torch.Tensor, torch.Tensor]] = []  # (local, gathered)

    @property
    def is_global(self) -> bool:
        """True when the batch is gathered from more than one process."""
        return self.global_batch and is_distributed(self.group)

    @property
    def is_local(self) -> bool:
        """True when the candidates are exactly the batch's own latents (no gather, no queue):
        a prior may then take its dense fast path."""
        return not self.is_global and self.queued() is None

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's rows of ``tensor`` (N_r, ...) in rank order, differentiable for
        every rank (:func:`~rpm.distributed.all_gather_with_grad`); ``tensor`` itself for a
        local batch. Each tensor is gathered once per step."""
        if not self.is_global:
            return tensor
        for local, gathered in self._gathered:  # held, so an id is never reused
            if local is tensor:
                return gathered
        gathered = all_gather_with_grad(tensor, self.group)
        self._gathered.append((tensor, gathered))
        return gathered

    def offset(self, num_rows: int) -> int:
        """The row of this process's first latent in the gathered batch (0 for a local batch).

        :param int num_rows: this process's batch size N_r.
        """
        if not self.is_global:
            return 0
        sizes = all_gather_with_grad(
            torch.tensor([num_rows], device=collective_device(self.group)), self.group)
        return int(sizes[:global_rank(self.group)].sum())

    def queued(self) -> torch.Tensor | None:
        """The queue's latents (K, D), detached, or None without a queue (or while it is empty)."""
        if self.queue is None or len(self.queue) == 0:
            return None
        return self.queue.latents()

    def negatives(self, partners: torch.Tensor) -> torch.Tensor:
        r"""The candidates :math:`z'_{1:M'}` of a normaliser whose positives are ``partners``:
        the gathered partners, then the queue's latents.

        :param torch.Tensor partners: this process's latents of the partner view, (N, D).
        :return: shape (M + K, D).
        """
        gathered = self.gather(partners)
        queued = self.queued()
        if queued is None:
            return gathered
        return torch.cat([gathered, queued.to(gathered)])
