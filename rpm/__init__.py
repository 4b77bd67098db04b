r"""rpm: recognition parameterised models in Pyro.

Contrastive learning as variational inference (Aitchison & Ganev, "InfoNCE is variational
inference in a recognition parameterised model"): the likelihood is built from the encoder,
:math:`P(x|z) = Q(z|x) P_\text{true}(x) / Q(z)`, the prior over a pair of latents chooses the
objective, and the ELBO of the implicit prior with energy f is InfoNCE with critic f.
"""

from rpm import marginals, priors
from rpm.inference import RPMELBO, info_nce
from rpm.marginals import MixtureMarginal
from rpm.models import RPM, DeltaRecognition, GaussianRecognition, SequenceRPM

__version__ = "0.1.0"

__all__ = [
    "DeltaRecognition",
    "GaussianRecognition",
    "MixtureMarginal",
    "RPM",
    "RPMELBO",
    "SequenceRPM",
    "info_nce",
    "marginals",
    "priors",
]
