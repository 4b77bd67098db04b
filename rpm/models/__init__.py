"""Models: recognition models Q(z|x), the RPM itself, and the contract through which
:class:`~rpm.RPMELBO` evaluates a model (:class:`RPMBase`, :class:`ObjectiveInputs`)."""

from rpm._objective import ObjectiveInputs
from rpm.models.base import RPMBase
from rpm.models.recognition import DeltaRecognition, GaussianRecognition, ScaleFloorWarning
from rpm.models.rpm import RPM

__all__ = [
    "DeltaRecognition",
    "GaussianRecognition",
    "ObjectiveInputs",
    "RPM",
    "RPMBase",
    "ScaleFloorWarning",
]
