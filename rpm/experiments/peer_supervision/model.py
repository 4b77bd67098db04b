r"""The model of the ``rpm peer-supervision`` experiment: a small MLP whose K outputs are the
logits of the recognition factor :math:`f(Z|x) = \operatorname{softmax}(g(x))_Z`
(:class:`rpm.CategoricalRecognition`), shared by the J views of a
:class:`rpm.DiscreteRPM` with a learned prior :math:`p(Z)`.

The network is :math:`g(x) = W_2 \operatorname{ReLU}(W_1 \operatorname{vec}(x) + b_1) + b_2`
on the 64 pixels of an 8 x 8 digit: no batch normalisation, so that a factor does not depend on
the other images of its batch (the normaliser :math:`F_j` is the only coupling, and the
model's own). The output layer starts at :data:`OUTPUT_INIT_SCALE` times PyTorch's default
initialisation, so that the untrained factors are already confident: a random partition of the
images into K regions, from which maximum likelihood falls less often into the optima that
merge two digits than from the nearly uniform factors of the default (the spread starts of
k-means++ play the same part for k-means).
"""

from __future__ import annotations

import math

import torch
from torch import nn

import rpm
from rpm._validation import check_int, check_positive_int

__all__ = ["OUTPUT_INIT_SCALE", "model_from_arguments", "one_view_log_posterior",
           "recognition_network", "setting_name"]


def setting_name(views: int) -> str:
    """The name of the setting with ``views`` images per instance (``--views``): ``"views{J}"``
    for J >= 2 images of one digit, ``"augmentations"`` for 1 (two augmentations of it)."""
    views = check_int("views", views, minimum=1)
    return "augmentations" if views == 1 else f"views{views}"


#: The output layer's initial weights and bias, as a multiple of PyTorch's default (module
#: docstring).
OUTPUT_INIT_SCALE = 10.0


def recognition_network(in_features: int, hidden: int, num_classes: int) -> nn.Sequential:
    """The MLP :math:`g` (module docstring): flatten, ``in_features`` -> ``hidden`` -> ReLU ->
    ``num_classes`` logits, the last layer initialised at :data:`OUTPUT_INIT_SCALE` times
    PyTorch's default."""
    net = nn.Sequential(
        nn.Flatten(),  # (N, in_features)
        nn.Linear(check_positive_int("in_features", in_features),
                  check_positive_int("hidden", hidden)),
        nn.ReLU(),
        nn.Linear(hidden, check_int("num_classes", num_classes, minimum=2)),  # (N, K) logits
    )
    with torch.no_grad():
        for parameter in net[-1].parameters():
            parameter.mul_(OUTPUT_INIT_SCALE)
    return net


def model_from_arguments(arguments: dict) -> rpm.DiscreteRPM:
    """The untrained model of ``rpm peer-supervision`` from its model record
    (:mod:`rpm.experiments.trained`): a :class:`rpm.DiscreteRPM` over ``num_views`` views with
    a learned prior, its :class:`rpm.CategoricalRecognition` on :func:`recognition_network`.

    :param dict arguments: ``in_features`` (64 for the digits), ``hidden``, ``num_classes``
        (K), ``num_views`` (J >= 2 images, or 2 for two augmentations of one).
    """
    net = recognition_network(arguments["in_features"], arguments["hidden"],
                              arguments["num_classes"])
    recognition = rpm.CategoricalRecognition(net, arguments["num_classes"])
    return rpm.DiscreteRPM(recognition, num_views=arguments["num_views"], learn_prior=True)


@torch.no_grad()
def one_view_log_posterior(model: rpm.DiscreteRPM, images: torch.Tensor,
                           reference: torch.Tensor) -> torch.Tensor:
    r"""The log-posterior of Z given one image, :math:`\log q(Z|x) = \log p(Z) + \log f(Z|x) -
    \log F(Z) - \log \sum_{Z'}(\cdot)`, with :math:`F(Z) = \frac1M \sum_m f(Z|x^m)` over the
    ``reference`` images (the training images: the data of every view).

    Marginalising the other views of (D2) (``docs/theory.md#discrete-latents``) out over the
    data leaves :math:`P(x_1, Z) = p(Z) f(Z|x_1) p_0(x_1) / F(Z)`, since each other view's
    likelihood :math:`f_j p_{0,j} / F_j` sums to 1 over the data; Bayes' rule gives the
    posterior above, the cluster of one image.

    :param model: the trained :class:`rpm.DiscreteRPM` (one recognition model shared by the
        views).
    :param torch.Tensor images: Shape: (N, ...).
    :param torch.Tensor reference: the images :math:`F` averages over. Shape: (M, ...).
    :returns: Shape: (N, K), each row normalised.
    """
    log_f = model.recognition(images).logits  # (N, K), normalised
    reference_log_f = model.recognition(reference).logits  # (M, K)
    log_normaliser = torch.logsumexp(reference_log_f, 0) - math.log(reference_log_f.shape[0])
    joint = model.prior_probs.log() + log_f - log_normaliser
    return torch.log_softmax(joint, dim=-1)
