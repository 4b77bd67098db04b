r"""Model of the ``rpm content-style`` experiment: the RPM whose prior keeps the content,
:math:`P(z' \mid z) = \delta(c' - c)\, p(s' \mid s)` (von Kügelgen et al., 2021, as a prior of
Aitchison & Ganev's recognition parameterised model), on a representation
:math:`\hat c = h(x) \in \mathbb R^{m}` of the content alone.

The style is not represented, so the prior on :math:`\hat c` is the content factor
:math:`P(\hat c' \mid \hat c)`, a narrow kernel standing for the delta. Two forms, both
existing priors of :mod:`rpm.priors` (``--prior``):

* ``rbf``: the implicit prior with the RBF energy :math:`f(\hat c, \hat c') = -\lVert \hat c -
  \hat c' \rVert^2 / (2 l^2)` (Eq. 21-22 and 27 of Aitchison & Ganev), Delta encoders
  :math:`Q(\hat c \mid x) = \delta(\hat c - h(x))`. Its ELBO per pair is InfoNCE with the
  negative squared distance as critic, minus :math:`\log N` (Eq. 23-25); with :math:`2 l^2 = 1`
  it is the loss the paper trains (``LpSimCLRLoss`` with p = 2, tau = 1, the positive counted
  among the negatives).
* ``gaussian``: the explicit Gaussian transition :math:`P(\hat c) = \mathcal N(0, s^2 I)`,
  :math:`P(\hat c' \mid \hat c) = \mathcal N(\hat c, l^2 I)` with s and l learned
  (:class:`~rpm.priors.GaussianRandomWalkPrior`), and :math:`Q(\hat c \mid x) = \mathcal N(h(x),
  \epsilon^2 I)` (Appendix B: the marginal must have a density). Its ELBO (Eq. 15) per pair is

  .. math::

      \mathcal L_i = -\frac{\lVert \hat c_i - \hat c'_i \rVert^2}{2 l^2}
      - \log \hat Q(\hat c_i) - \log \hat Q(\hat c'_i)
      + \log \mathcal N(\hat c_i; 0, s^2 I) - m \log l - \tfrac m2 \log 2\pi,

  with :math:`\hat Q(u) = \frac1N \sum_j \mathcal N(u; h(x_j), \epsilon^2 I)` the minibatch
  mixture: the paper's AlignMaxEnt functional (alignment plus the entropy of the recognition
  marginal, here its kernel estimate, for both views), whose learned :math:`P(\hat c)` makes it
  invariant to the scale of :math:`\hat c` (the alignment, the prior's and the entropies'
  :math:`\log` scale terms cancel at the optimal s and l).
"""

from __future__ import annotations

import math

from torch import nn

import rpm
from rpm._validation import check_choice, check_positive
from rpm.priors import GaussianRandomWalkPrior, ImplicitPrior, RBFEnergy

__all__ = ["PRIORS", "build_model", "model_from_arguments"]

#: The forms of the content prior (module docstring).
PRIORS = ("rbf", "gaussian")


def model_from_arguments(arguments: dict) -> rpm.RPM:
    """The untrained model of ``rpm content-style`` from its model record
    (:mod:`rpm.experiments.trained`): :func:`build_model` of the
    :class:`~rpm.experiments.identifiability.encoder.MLPEncoder` ``(content_dims, hidden, depth, "unbounded",
    in_dim=dim)``.

    :param dict arguments: ``dim`` (n, the observations), ``content_dims`` (m, the
        representation), ``hidden``, ``depth``, ``prior``, ``lengthscale``, ``noise_scale``.
    """
    from rpm.experiments.identifiability.encoder import MLPEncoder

    encoder = MLPEncoder(arguments["content_dims"], arguments["hidden"], arguments["depth"],
                         "unbounded", in_dim=arguments["dim"])
    return build_model(encoder, arguments["content_dims"], arguments["prior"],
                       lengthscale=arguments["lengthscale"], noise_scale=arguments["noise_scale"])


def build_model(encoder: nn.Module, content_dim: int, prior: str = "rbf",
                lengthscale: float = math.sqrt(0.5), noise_scale: float = 0.05) -> rpm.RPM:
    r"""The RPM of ``prior`` on the encoder's content representation (module docstring).

    :param torch.nn.Module encoder: h, a batch (N, n) to the representation (N, m).
    :param int content_dim: m, the representation's dimension.
    :param str prior: ``"rbf"`` (implicit) or ``"gaussian"`` (explicit, AlignMaxEnt).
    :param float lengthscale: l of the RBF energy (fixed), or the initial l of the Gaussian
        transition (learned).
    :param float noise_scale: :math:`\epsilon` of the Gaussian form's recognition model.
    :return: the RPM, recognition-output validation off (it would synchronise every step).
    """
    check_choice("prior", prior, PRIORS)
    lengthscale = check_positive("lengthscale", lengthscale)
    if prior == "rbf":
        return rpm.RPM(rpm.DeltaRecognition(encoder, validate=False),
                       ImplicitPrior(RBFEnergy(lengthscale=lengthscale)))
    noise_scale = check_positive("noise_scale", noise_scale)
    return rpm.RPM(rpm.DeltaRecognition(encoder, noise_scale=noise_scale, validate=False),
                   GaussianRandomWalkPrior(content_dim, scale=1.0, step=lengthscale))
