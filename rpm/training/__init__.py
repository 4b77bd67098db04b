"""Training machinery: the :class:`Trainer` loop (periodic evaluation, NaN stop, Ctrl-C) and its
atomic, exactly resumable checkpoints, which hold only tensors, numbers, strings, lists and
dicts, so that ``torch.load(path, weights_only=True)`` reads them."""

from rpm.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rpm.training.trainer import NonFiniteLossError, Trainer, TrainingInterrupted

__all__ = [
    "CheckpointError",
    "NonFiniteLossError",
    "Trainer",
    "TrainingInterrupted",
    "load_checkpoint",
    "save_checkpoint",
]
