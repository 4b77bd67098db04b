"""Models: recognition models Q(z|x), the RPM itself, and the contract through which
:class:`~rpm.RPMELBO` evaluates a model (:class:`RPMBase`, :class:`ObjectiveInputs`)."""

from rpm._objective import ObjectiveInputs
from rpm.models._base import RPMBase
from rpm.models._recognition import DeltaRecognition, GaussianRecognition, ScaleFloorWarning
from rpm.models._rpm import RPM

__all__ = [
    "DeltaRecognition",
    "GaussianRecognition",
    "ObjectiveInputs",
    "RPM",
    "RPMBase",
    "ScaleFloorWarning",
]
