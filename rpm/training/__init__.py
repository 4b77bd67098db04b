"""Training machinery: the :class:`Trainer` loop (periodic evaluation, NaN stop, Ctrl-C), its
atomic, checksummed, exactly resumable checkpoints, which hold only tensors, numbers, strings,
lists and dicts, so that ``torch.load(path, weights_only=True)`` reads them, and the run-folder
contract (:mod:`rpm.training.run_folder`: lock, run record, configuration integrity).

The names are imported on first use, so that importing :mod:`rpm.training.run_folder` (the
``rpm`` command's parser) does not import torch."""

import importlib

__all__ = [
    "CheckpointError",
    "NonFiniteLossError",
    "RunFolderError",
    "RunLock",
    "Trainer",
    "TrainingInterrupted",
    "cosine_schedule",
    "load_checkpoint",
    "save_checkpoint",
]

_WHERE = {
    "CheckpointError": "rpm.training.checkpoint",
    "load_checkpoint": "rpm.training.checkpoint",
    "save_checkpoint": "rpm.training.checkpoint",
    "NonFiniteLossError": "rpm.training.trainer",
    "Trainer": "rpm.training.trainer",
    "TrainingInterrupted": "rpm.training.trainer",
    "RunFolderError": "rpm.training.run_folder",
    "RunLock": "rpm.training.run_folder",
    "cosine_schedule": "rpm.training.schedule",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'rpm.training' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
