"""Models: recognition models Q(z|x) and the RPM itself."""

from rpm.models.base import RPMBase
from rpm.models.recognition import DeltaRecognition, GaussianRecognition, ScaleFloorWarning
from rpm.models.rpm import RPM

__all__ = [
    "DeltaRecognition",
    "GaussianRecognition",
    "RPM",
    "RPMBase",
    "ScaleFloorWarning",
]
