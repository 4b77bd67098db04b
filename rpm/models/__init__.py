"""Models: recognition models Q(z|x) (Gaussian, Delta, von Mises-Fisher, categorical), the RPM
itself, the RPM with a discrete latent (:class:`DiscreteRPM`), and the contract through which
:class:`~rpm.RPMELBO` evaluates a model (:class:`RPMBase`, :class:`ObjectiveInputs`)."""

from rpm._objective import ObjectiveInputs
from rpm.models._base import RPMBase
from rpm.models._discrete_rpm import DiscreteRPM
from rpm.models._recognition import (
    CategoricalRecognition,
    DeltaRecognition,
    GaussianRecognition,
    ScaleFloorWarning,
    VonMisesFisherRecognition,
)
from rpm.models._rpm import RPM

__all__ = [
    "CategoricalRecognition",
    "DeltaRecognition",
    "DiscreteRPM",
    "GaussianRecognition",
    "ObjectiveInputs",
    "RPM",
    "RPMBase",
    "ScaleFloorWarning",
    "VonMisesFisherRecognition",
]
