"""Models: recognition models Q(z|x), the RPM itself, and experiment encoders."""

from rpm.models.recognition import DeltaRecognition, GaussianRecognition
from rpm.models.rpm import RPM

__all__ = [
    "DeltaRecognition",
    "GaussianRecognition",
    "RPM",
]
