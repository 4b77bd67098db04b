r"""A global batch across processes: gather the mixture components and the negatives.

With W processes (ranks) holding batches :math:`B_1, \dots, B_W` of pairs, the RPM ELBO of the
global batch :math:`B = \bigcup_r B_r` (Eq. 15 of Aitchison & Ganev; ``docs/theory.md``) is

.. math::

    \mathcal{L} = \sum_r \mathcal{L}_r, \qquad
    \mathcal{L}_r = \sum_{i \in B_r} \big[\log P(z_i, z'_i) - \log Q_B(z_i) - \log Q_B(z'_i)\big],

where the minibatch-mixture marginal :math:`Q_B` (and, for the implicit prior, the InfoNCE
normaliser :math:`\frac1{|B|}\sum_{j \in B} e^{f(z_i, z'_j)}`) runs over the global batch. Rank
r evaluates only its own rows :math:`\mathcal{L}_r`, against components gathered from every
rank with :func:`all_gather_with_grad`.

The gradient. :math:`\mathcal{L}_s` depends on rank r's components through the gather, so
the gradient of the global objective with respect to rank r's slice :math:`X_r` is
:math:`\sum_s \partial \mathcal{L}_s / \partial X_r`: a sum over all ranks. The backward of
:func:`all_gather_with_grad` therefore all-reduces (sums) the gradient of the gathered tensor
and returns each rank the rows of its own slice. Returning only the local rank's
:math:`\partial \mathcal{L}_r / \partial X_r` (what ``torch.distributed.all_gather`` without
autograd, or a gather whose backward just slices, gives) drops the other ranks' terms: a known
bug of several self-supervised learning libraries.

After ``loss_r.backward()`` on every rank, the sum over ranks of the parameter gradients is
the gradient of the global objective, exactly; ``DistributedDataParallel`` averages them, so
it yields that gradient divided by W (the usual DDP convention: each rank's loss is its share).
:func:`all_reduce_gradients` sums them instead, so that a loss normalised by the global batch
size gives each rank the gradient of the single-process loss; :class:`rpm.training.Trainer`
(``distributed=True``) uses it, and :func:`process_group` starts the processes of ``torchrun``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

__all__ = [
    "all_gather_with_grad",
    "all_reduce_gradients",
    "barrier",
    "broadcast_buffers",
    "collective_device",
    "global_rank",
    "global_world_size",
    "is_distributed",
    "is_main_process",
    "launched_by_torchrun",
    "local_slice",
    "process_group",
]


def is_distributed(group=None) -> bool:
    """True when ``torch.distributed`` is initialised and the group has more than one rank.

    :param group: a process group; ``None`` is the default (world) group.
    """
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def global_world_size(group=None) -> int:
    """The number of ranks of the group, 1 without ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def global_rank(group=None) -> int:
    """This process's rank in the group, 0 without ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group)
    return 0


def _gather_sizes(size: int, device: torch.device, group) -> list[int]:
    local = torch.tensor([size], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, local, group=group)
    return [int(s.item()) for s in sizes]


class _AllGatherWithGrad(torch.autograd.Function):
    """Concatenates every rank's tensor along dim 0; backward sums over ranks, then slices."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group):
        tensor = tensor.contiguous()
        sizes = _gather_sizes(tensor.shape[0], tensor.device, group)
        largest = max(sizes)
        padded = tensor
        if tensor.shape[0] < largest:  # all_gather needs equal shapes: pad, then trim
            padded = torch.cat([tensor, tensor.new_zeros((largest - tensor.shape[0],)
                                                          + tensor.shape[1:])])
        pieces = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(pieces, padded, group=group)
        rank = dist.get_rank(group)
        ctx.group = group
        ctx.start, ctx.stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
        return torch.cat([piece[:size] for piece, size in zip(pieces, sizes, strict=True)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        # d(sum_s L_s)/dX_r = sum_s dL_s/dX_r: every rank holds dL_s/d(all X); sum them.
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[ctx.start:ctx.stop], None


def all_gather_with_grad(tensor: torch.Tensor, group=None) -> torch.Tensor:
    r"""Concatenation of every rank's ``tensor`` along dim 0, differentiable for every rank.

    .. math::

        X = [X_1; X_2; \dots; X_W], \qquad
        \frac{\partial}{\partial X_r} \sum_s \mathcal{L}_s
        = \Big[\sum_s \frac{\partial \mathcal{L}_s}{\partial X}\Big]_{\text{rows of } r}

    The forward is an ``all_gather`` (ranks may hold different numbers of rows; the sizes are
    gathered first); the backward all-reduces the gradient and returns this rank's rows, so
    that each rank's slice receives the gradient of every rank's loss (see the module
    docstring). Without ``torch.distributed`` (or with one rank) it returns ``tensor`` itself.
    Every rank of the group must call it, in the same order, with tensors that agree in all
    dimensions but the first.

    :param torch.Tensor tensor: this rank's rows, shape (N_r, ...).
    :param group: a process group; ``None`` is the default (world) group.
    :return: the global tensor, shape (sum_r N_r, ...), rows in rank order.
    :rtype: torch.Tensor
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dim() < 1:
        raise ValueError(
            "all_gather_with_grad concatenates along dim 0 and needs a tensor with at least one "
            f"dimension, got {tensor!r}"
        )
    if not is_distributed(group):
        return tensor
    return _AllGatherWithGrad.apply(tensor, group)


def launched_by_torchrun() -> bool:
    """True in a process started by ``torchrun`` (its environment names ``RANK``,
    ``WORLD_SIZE`` and ``MASTER_ADDR``)."""
    return all(key in os.environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def is_main_process() -> bool:
    """True in rank 0 (or without ``torch.distributed``); only it writes files and prints.
    Read from ``torch.distributed`` when it is initialised, else from torchrun's ``RANK``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


@contextlib.contextmanager
def process_group(device: torch.device | str | None = None) -> Iterator[None]:
    """Join the processes of ``torchrun`` for the block: NCCL when ``device`` is a CUDA
    device, gloo otherwise (CPU), with the rendezvous torchrun sets in the environment; the
    group is destroyed at the end. Outside torchrun, or when ``torch.distributed`` is already
    initialised (by the caller, who then owns it), it does nothing.

    :param device: the training device of this process (under torchrun, ``cuda:LOCAL_RANK``).
    """
    if not launched_by_torchrun() or (dist.is_available() and dist.is_initialized()):
        yield
        return
    if not dist.is_available():
        raise RuntimeError("this torch was built without torch.distributed; run one process")
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def barrier(group=None) -> None:
    """Wait until every rank of the group arrives here; without ``torch.distributed`` it does
    nothing."""
    if is_distributed(group):
        dist.barrier(group)


def collective_device(group=None) -> torch.device:
    """Where a tensor must live for a collective of the group: the current CUDA device under
    NCCL, the CPU otherwise (gloo)."""
    if is_distributed(group) and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def local_slice(size: int, group=None) -> slice:
    """The rows of a global batch of ``size`` rows that this rank computes: rank r of W takes
    rows ``[r size / W, (r + 1) size / W)``; ``size`` must be a multiple of W.

    :param int size: the global batch size.
    :param group: a process group; ``None`` is the default (world) group.
    """
    world, rank = global_world_size(group), global_rank(group)
    if size % world:
        raise ValueError(f"a global batch of {size} rows does not split evenly over {world} "
                         f"processes; use a multiple of {world}")
    share = size // world
    return slice(rank * share, (rank + 1) * share)


def all_reduce_gradients(parameters: Iterable[torch.Tensor], group=None) -> None:
    r"""Sum the gradients of ``parameters`` over the ranks, in place:
    :math:`g \leftarrow \sum_r g_r`. With each rank's loss its share of a global loss (e.g. its
    rows of the negative ELBO of the global batch divided by the global batch size), every rank
    then holds the gradient of the global loss, and identical optimiser steps keep the
    parameters identical. Parameters without a gradient on this rank contribute zeros (every
    rank must call it with the same parameters in the same order). Without
    ``torch.distributed`` it does nothing.

    :param parameters: the trained parameters.
    :param group: a process group; ``None`` is the default (world) group.
    """
    if not is_distributed(group):
        return
    parameters = [p for p in parameters if p.requires_grad]
    if not parameters:
        return
    buckets: dict[tuple, list[torch.Tensor]] = {}  # one collective per dtype and device
    for parameter in parameters:
        buckets.setdefault((parameter.dtype, parameter.device), []).append(parameter)
    for bucket in buckets.values():
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for parameter, grad in zip(bucket, grads, strict=True):
            parameter.grad = flat[offset:offset + grad.numel()].view_as(grad).clone()
            offset += grad.numel()


def broadcast_buffers(module: torch.nn.Module, group=None) -> None:
    """Copy rank 0's buffers (e.g. batch-norm running statistics) to every rank, as
    ``DistributedDataParallel`` does, so that every rank evaluates the same model. Without
    ``torch.distributed`` it does nothing.

    :param torch.nn.Module module: the trained module.
    :param group: a process group; ``None`` is the default (world) group.
    """
    if not is_distributed(group):
        return
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0, group=group)
