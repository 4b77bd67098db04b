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

**Explicit negatives** (``Candidates(negatives=n)``): M latents of the current step, given by
the caller as a tensor (info-nce-pytorch's unpaired ``negative_keys``), appended to the
candidates as the queue's would be, but used as given: not copied, not detached (the gradient
reaches them), and not gathered over a global batch. A step has a queue or explicit
negatives, not both.

**The queue's bias.** The queued latents were computed by earlier versions of the encoder: they
are samples of the marginal of an older Q, so the normaliser they estimate is
:math:`\mathbb{E}_{Q_\text{old}(z')} e^{f(z, z')}`, not the current one's. The bias vanishes as
the encoder stops moving (and is small when it moves slowly, the reason MoCo uses a momentum
encoder); no gradient flows into the queued latents.

**The state rule.** Evaluating a density never changes state: no ``forward``, log-ratio or
ELBO of a prior, model or inference algorithm pushes into a queue, in training or evaluation
mode, with or without gradients, however many times Pyro runs the model (particles,
``Predictive``, a validation pass). A queue is pushed by one of two owners:

* **the training loop**, after the optimiser step, with the latents of that step's forward:
  :meth:`LatentQueue.push` for the queue of :class:`~rpm.RPM` (``RPM(..., queue=...)``),
  :meth:`rpm.priors.MultiViewImplicitPrior.push`
  (``prior.push(z)``, the partner views of z (N, J, D)) for the queue a prior over J views
  holds; :class:`~rpm.training.trainer.Trainer` calls ``after_step(step)`` at that point;
* **a loss class's** ``forward`` **under lightly's rule**: a memory-bank loss
  (:class:`rpm.losses.NTXentLoss` with ``memory_bank_size``) takes the batch into its bank
  after computing the loss, only when its input requires a gradient (never under
  ``torch.no_grad()``, a validation pass), as ``lightly.loss.NTXentLoss`` does.

The queue a step's loss reads is therefore exactly the one the loop left, and a loss evaluated
twice (two particles, a validation pass, ``Predictive``) reads the same queue both times.
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
        with torch.no_grad():
            keys = momentum_encoder(x2)  # this step's keys
        loss.backward()
        optimiser.step()
        queue.push(keys)                 # enqueue them after the step: the loop's, not the loss's

    :meth:`latents` returns the filled rows, oldest first; :meth:`push` appends a batch and drops
    the oldest rows beyond K. Only the training loop (or a memory-bank loss's ``forward``, by
    lightly's rule) pushes; reading the queue in a loss changes nothing (module docstring, the
    state rule). The latents are stored without gradient (``detach``): they are a
    second sample of the recognition marginal, from earlier versions of the encoder (module
    docstring: the bias).

    :param int size: K, the number of latents kept.
    :param int dim: D, the latent dimension.
    :param bool persistent: whether ``state_dict()`` holds the queue (``.to()`` moves it either
        way); :class:`rpm.losses.NTXentLoss` keeps its bank out, as lightly does.
    """

    memory: torch.Tensor  # buffers, registered below
    filled: torch.Tensor
    head: torch.Tensor

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
    every process, and the latents appended to them, a queue's or explicit negatives (module
    docstring).

    Built per step (by :class:`~rpm.RPM` and :class:`~rpm.RPMELBO`, or by hand for
    :func:`rpm.inference.rpm_elbo`) and passed to the prior's hooks. Gathers are made once per
    tensor and step; without ``global_batch`` (or outside ``torch.distributed``) nothing is
    gathered and :meth:`gather` returns its argument. Reading the candidates changes nothing:
    a queue is pushed by the training loop (module docstring, the state rule).

    .. code-block:: python

        # info-nce-pytorch's unpaired negatives: M latents of this step, with their gradient
        prior = rpm.priors.StarImplicitPrior(energy, candidates="positives", centres=[0])
        elbo = rpm.inference.rpm_elbo(prior, [query, key],
                                      candidates=Candidates(negatives=negative_keys))

    :param bool global_batch: gather the batch from every process of ``group``.
    :param queue: a :class:`LatentQueue` whose latents extend the candidates of the
        normaliser, or None.
    :param group: the ``torch.distributed`` process group (None: the world).
    :param negatives: explicit negatives, a tensor (M, D) appended to the candidates as given
        (not detached, not gathered), or None; not with a queue.
    :raises ValueError: for negatives that are not a 2-D tensor, or a queue and negatives both.
    """

    def __init__(self, global_batch: bool = False, queue: LatentQueue | None = None, group=None,
                 negatives: torch.Tensor | None = None):
        self.global_batch = check_bool("global_batch", global_batch)
        if queue is not None and not isinstance(queue, LatentQueue):
            raise TypeError(f"queue must be an rpm.inference.LatentQueue or None, got {queue!r}")
        if negatives is not None:
            if not isinstance(negatives, torch.Tensor) or negatives.dim() != 2:
                got = (tuple(negatives.shape) if isinstance(negatives, torch.Tensor)
                       else type(negatives).__name__)
                raise ValueError(f"negatives must be a tensor of shape (M, D), one latent a row; "
                                 f"got {got}")
            if queue is not None:
                raise ValueError("the candidates take a queue or explicit negatives, not both: "
                                 "pass queue=LatentQueue(K, D) for earlier latents, or "
                                 "negatives=tensor (M, D) for this step's")
        self.queue = queue
        self.group = group
        self.explicit_negatives = negatives
        self._gathered: list[tuple[torch.Tensor, torch.Tensor]] = []  # (local, gathered)

    @property
    def is_global(self) -> bool:
        """True when the batch is gathered from more than one process."""
        return self.global_batch and is_distributed(self.group)

    @property
    def is_local(self) -> bool:
        """True when the candidates are exactly the batch's own latents (no gather, no queue,
        no explicit negatives): a prior may then take its dense fast path."""
        return not self.is_global and self.appended() is None

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

    def appended(self) -> torch.Tensor | None:
        """The latents appended after the batch's: the queue's (K, D), detached, or the explicit
        negatives (M, D), as given; None when there are neither (or the queue is empty)."""
        if self.explicit_negatives is not None:
            return self.explicit_negatives
        if self.queue is None or len(self.queue) == 0:
            return None
        return self.queue.latents()

    def negatives(self, partners: torch.Tensor) -> torch.Tensor:
        r"""The candidates :math:`z'_{1:M'}` of a normaliser whose positives are ``partners``:
        the gathered partners, then the queue's latents or the explicit negatives.

        :param torch.Tensor partners: this process's latents of the partner view, (N, D).
        :return: shape (M + K, D).
        """
        gathered = self.gather(partners)
        appended = self.appended()
        if appended is None:
            return gathered
        return torch.cat([gathered, appended.to(gathered)])
