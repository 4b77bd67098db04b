r"""Synthetic identifiability data (Zimmermann et al., 2021; Rusak et al., 2024): latent spaces,
marginals :math:`p(z)`, positive-pair conditionals :math:`p(z' \mid z)` and an invertible mixing
:math:`g`, all sampled with torch on a chosen device and dtype, optionally from a
``torch.Generator``, without per-sample Python loops.

* :mod:`~rpm.data.synthetic.spaces`: sphere, box, unbounded; exact truncation to the box.
* :mod:`~rpm.data.synthetic.noise`: factorised normal / Laplace / generalised-normal noise.
* :mod:`~rpm.data.synthetic.vmf`: von Mises-Fisher sampling (Wood, 1994).
* :mod:`~rpm.data.synthetic.marginals`, :mod:`~rpm.data.synthetic.conditionals`: ``p(z)``, ``p(z'|z)``.
* :mod:`~rpm.data.synthetic.process`: :class:`LatentProcess`, the whole configuration.
* :mod:`~rpm.data.synthetic.mixing`: :class:`InvertibleMLP`, the mixing g.
* :mod:`~rpm.data.synthetic.content_style`: :class:`ContentStyleProcess`, content kept and style
  changed between the views (von Kügelgen et al., 2021).
"""

from rpm.data.synthetic.conditionals import CONDITIONALS, Conditional
from rpm.data.synthetic.content_style import ContentStyleProcess
from rpm.data.synthetic.marginals import MARGINALS, Marginal
from rpm.data.synthetic.mixing import InvertibleMLP
from rpm.data.synthetic.noise import FactorisedNoise
from rpm.data.synthetic.process import LatentProcess, parse_concentrations
from rpm.data.synthetic.spaces import SPACES, project_to_sphere, sample_uniform_sphere
from rpm.data.synthetic.vmf import VonMisesFisherSampler, sample_vmf

__all__ = [
    "CONDITIONALS",
    "Conditional",
    "ContentStyleProcess",
    "FactorisedNoise",
    "InvertibleMLP",
    "LatentProcess",
    "MARGINALS",
    "Marginal",
    "SPACES",
    "VonMisesFisherSampler",
    "parse_concentrations",
    "project_to_sphere",
    "sample_uniform_sphere",
    "sample_vmf",
]
