r"""rpm: recognition parameterised models in Pyro.

Contrastive learning as variational inference (Aitchison & Ganev, "InfoNCE is variational
inference in a recognition parameterised model"): the likelihood is built from the encoder,
:math:`P(x|z) = Q(z|x) P_\text{true}(x) / Q(z)`, the prior over a pair of latents chooses the
objective, and the ELBO of the implicit prior with energy f is InfoNCE with critic f.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: Where each public name lives: imported at first use (PEP 562), so that ``import rpm`` and
#: ``python -m rpm`` do not pay for torch and Pyro until a model is needed.
_LAZY = {
    "CategoricalRecognition": "rpm.models",
    "DeltaRecognition": "rpm.models",
    "DiscreteRPM": "rpm.models",
    "GaussianRecognition": "rpm.models",
    "MixtureMarginal": "rpm.marginals",
    "RPM": "rpm.models",
    "RPMELBO": "rpm.inference",
    "ScaleFloorWarning": "rpm.models",
    "VonMisesFisherRecognition": "rpm.models",
    "load": "rpm.experiments.trained",
}
_SUBPACKAGES = frozenset({"data", "distributed", "distributions", "evaluation", "experiments",
                          "inference", "lightning", "losses", "marginals", "metrics", "mi", "models",
                          "nn", "ops", "priors", "training"})

__all__ = [
    "CategoricalRecognition",
    "DeltaRecognition",
    "DiscreteRPM",
    "GaussianRecognition",
    "MixtureMarginal",
    "RPM",
    "RPMELBO",
    "ScaleFloorWarning",
    "VonMisesFisherRecognition",
    "load",
    "marginals",
    "priors",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"rpm.{name}")
    else:
        raise AttributeError(f"module 'rpm' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBPACKAGES)


if TYPE_CHECKING:  # for type checkers and IDEs
    from rpm import marginals, priors
    from rpm.experiments.trained import load
    from rpm.inference import RPMELBO
    from rpm.marginals import MixtureMarginal
    from rpm.models import (
        RPM,
        CategoricalRecognition,
        DeltaRecognition,
        DiscreteRPM,
        GaussianRecognition,
        ScaleFloorWarning,
        VonMisesFisherRecognition,
    )
