"""Models: recognition models Q(z|x), the RPM itself, and encoders."""

from rpm.models.base import RPMBase
from rpm.models.mlp import MLPEncoder
from rpm.models.recognition import DeltaRecognition, GaussianRecognition, ScaleFloorWarning
from rpm.models.rpm import RPM
from rpm.models.sequence import SequenceRPM

__all__ = [
    "DeltaRecognition",
    "GaussianRecognition",
    "MLPEncoder",
    "RPM",
    "RPMBase",
    "ScaleFloorWarning",
    "SequenceRPM",
]
