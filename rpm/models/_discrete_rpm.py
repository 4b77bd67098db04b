r"""The recognition parameterised model with a discrete latent (Walker et al., 2023), whose
posterior and likelihood are exact (``docs/theory.md#discrete-latents``).

N instances, each with J >= 2 views :math:`x_1, \dots, x_J` that are conditionally independent
given one latent :math:`Z \in \{0, \dots, K-1\}`. Each view has a recognition factor
:math:`f_j(Z|x_j)` (:class:`~rpm.CategoricalRecognition`, a softmax over K classes) and the
normaliser of view j is the factor averaged over the data,

.. math::

    F_j(Z) = \frac1N \sum_{n=1}^N f_j(Z|x_j^n).                                    \quad (D1)

The model (Walker et al., Sec. 2) is

.. math::

    P(x_{1:J}, Z) = p(Z) \prod_{j=1}^J \frac{f_j(Z|x_j)}{F_j(Z)}\, p_{0,j}(x_j),     \quad (D2)

:math:`p_{0,j}` the empirical distribution of view j (constant in every parameter; left out, so
every log-likelihood here is up to :math:`\sum_j \log p_{0,j}(x_j^n) = -J \log N` per
instance). Z takes K values, so the marginal and the posterior are exact sums:

.. math::

    \log P(x^n_{1:J}) = \log \sum_{Z} p(Z) \prod_j \frac{f_j(Z|x_j^n)}{F_j(Z)},
    \qquad
    q(Z|x^n_{1:J}) = \frac{p(Z) \prod_j f_j(Z|x_j^n) / F_j(Z)}
                          {\sum_{Z'} p(Z') \prod_j f_j(Z'|x_j^n) / F_j(Z')}.      \quad (D3, D4)

(the first up to the constant :math:`-J \log N`). The ELBO at the exact posterior equals the log
marginal (D3; ``docs/theory.md``, D5), so maximising
:math:`\sum_n \log P(x^n_{1:J})` is Walker et al.'s maximum likelihood: exact EM, or gradient
ascent on (D3).

**Pyro.** :meth:`DiscreteRPM.model` samples ``"z" ~ p(Z)`` inside ``pyro.plate("instances",
N)``, marked ``infer={"enumerate": "parallel"}``, and adds one factor per view, ``"x"``,
``"x2"``, ..., ``"xJ"``, of log-density :math:`\log f_j(Z|x_j^n) - \log F_j(Z)`;
:meth:`DiscreteRPM.guide` is empty. ``pyro.infer.TraceEnum_ELBO(max_plate_nesting=1)`` sums Z
out exactly, so its loss is :math:`-\sum_n \log P(x^n_{1:J})`, the same number as
:meth:`DiscreteRPM.log_marginal` (a PyTorch loop), and
``TraceEnum_ELBO.compute_marginals`` gives :meth:`DiscreteRPM.posterior`.

**The normaliser.** By default :math:`F_j` is (D1) over the batch given (N its size), with
gradients: for a batch that is the whole data set this is Walker et al.'s objective exactly; for
a minibatch it is the RPM of the minibatch's empirical distribution. A normaliser over more data
is passed as ``log_normalisers`` (shape (J, K)), e.g. :meth:`DiscreteRPM.log_normalisers` of an
iterable of batches (streamed: one batch at a time; with gradients when called with them,
without under ``torch.no_grad()``, then a constant refreshed as often as the caller chooses).

References:
    W. I. Walker, H. Soulat, C. Yu, M. Sahani, "Unsupervised representation learning with
    recognition-parametrised probabilistic models", AISTATS 2023.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pyro
import torch
from pyro.distributions import Categorical
from pyro.nn import PyroParam
from pyro.ops.indexing import Vindex
from torch.distributions import constraints

from rpm._validation import check_int
from rpm.models._recognition import CategoricalRecognition
from rpm.models._views import call_encoder, check_inputs
from rpm.nn import NamedModule, NamedModuleList, pyro_method

__all__ = ["DiscreteRPM"]

_PLATE = "instances"


def _view_names(num_views: int) -> list[str]:
    """The views' names, also their factors' site names: ``"x"``, ``"x2"``, ..., ``"xJ"``."""
    return ["x"] + [f"x{j + 1}" for j in range(1, num_views)]


def _looks_like_labels(value, first) -> bool:
    """True for an integer tensor of shape (N,) given after the views (class labels)."""
    return (isinstance(value, torch.Tensor) and value.dim() == 1
            and not value.is_floating_point() and not value.is_complex()
            and isinstance(first, torch.Tensor) and first.dim() >= 1
            and value.shape[0] == first.shape[0])


def _prior_probs(prior, num_classes: int) -> torch.Tensor:
    """The prior's probabilities (K,) from ``prior`` (None: uniform; a probability tensor or a
    ``Categorical``), checked to be a distribution over exactly the K classes."""
    if prior is None:
        return torch.full((num_classes,), 1.0 / num_classes)
    if isinstance(prior, torch.distributions.Categorical):
        if prior.batch_shape != ():
            raise ValueError(f"prior must be one Categorical over the K = {num_classes} classes, "
                             f"got one with batch_shape {tuple(prior.batch_shape)}")
        prior = prior.probs
    if not isinstance(prior, torch.Tensor):
        raise TypeError(f"prior must be None (uniform), a tensor of K = {num_classes} "
                        f"probabilities or a Categorical, got {type(prior).__name__}")
    if prior.shape != (num_classes,):
        raise ValueError(
            f"the prior's support must be the recognition's K = {num_classes} classes, got a "
            f"prior of shape {tuple(prior.shape)}; give {num_classes} probabilities (or build "
            f"the recognition with num_classes={prior.shape[-1] if prior.dim() else '?'})")
    prior = prior.detach().clone()
    if not prior.is_floating_point() or not bool(torch.isfinite(prior).all()) or \
            not bool((prior > 0).all()) or abs(float(prior.sum()) - 1.0) > 1e-6:
        raise ValueError(f"prior must hold K = {num_classes} positive probabilities that sum to "
                         f"1, got {prior.tolist()}; e.g. torch.full(({num_classes},), "
                         f"1 / {num_classes})")
    return prior


class DiscreteRPM(NamedModule):
    r"""The RPM with a K-way categorical latent shared by J >= 2 views, with exact posterior and
    exact maximum likelihood (Walker et al., 2023; module docstring, Eq. D1-D4).

    .. code-block:: python

        model = rpm.DiscreteRPM(rpm.CategoricalRecognition(net, num_classes=10))  # J = 2
        svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 1e-3}),
                             pyro.infer.TraceEnum_ELBO(max_plate_nesting=1))
        svi.step(x, x2)                  # x, x2: (N, ...), two views of the same N instances
        model.posterior(x, x2).probs     # q(Z | x^n, x2^n), (N, K)

        # or a PyTorch loop: loss = -model.log_marginal(x, x2)

    **Calls.** ``model(x_1, ..., x_J)`` and ``model([x_1, ..., x_J])`` take the J views (tensors
    with one batch axis N); :meth:`guide`, :meth:`posterior` and :meth:`log_marginal` take the
    same. The keyword ``log_normalisers``, a tensor (J, K) of :math:`\log F_j(Z)`, replaces the
    batch's normaliser (D1) by the one given (:meth:`log_normalisers`).

    **Sites.** Inside ``pyro.plate("instances", N)``: ``"z" ~ Categorical(p)``, enumerated in
    parallel, and the factors ``"x"``, ``"x2"``, ... of log-density :math:`\log f_j(Z|x_j^n) -
    \log F_j(Z)` (the RPM likelihood (D2) without :math:`\log p_{0,j}`). The guide is empty: use
    ``TraceEnum_ELBO`` (any other ELBO would sample Z from the prior).

    :param recognition: :math:`f(Z|x)`, a :class:`~rpm.CategoricalRecognition` shared by the
        views, or a list of J of them (one per view), all over the same K classes.
    :param num_views: J >= 2; by default 2 for one shared recognition model, the list's length
        for a list.
    :param prior: :math:`p(Z)`: None (uniform), a tensor of K probabilities or a
        ``Categorical`` over K classes; it is the initial value when ``learn_prior``.
    :param bool learn_prior: learn :math:`p(Z)` (a :class:`~pyro.nn.PyroParam` on the simplex)
        or keep it fixed (a buffer).
    :param name: the prefix of the model's parameters in Pyro's param store (as
        :class:`~rpm.RPM`'s).
    """

    default_name = "discrete_rpm"
    #: :math:`p(Z)`, shape (K,): a :class:`~pyro.nn.PyroParam` on the simplex, or a buffer.
    prior_probs: torch.Tensor

    def __init__(self, recognition, num_views: int | None = None, *, prior=None,
                 learn_prior: bool = True, name: str | None = None):
        super().__init__(name)
        per_view = isinstance(recognition, (list, tuple, torch.nn.ModuleList))
        modules = list(recognition) if per_view else [recognition]
        for module in modules:
            if not isinstance(module, CategoricalRecognition):
                raise TypeError(
                    f"DiscreteRPM needs CategoricalRecognition models (softmax factors over K "
                    f"classes), got {type(module).__name__}; wrap the network that returns "
                    "logits (N, K): rpm.CategoricalRecognition(net, num_classes=K)")
        if num_views is None:
            num_views = len(modules) if per_view else 2
        num_views = check_int("num_views", num_views)
        if num_views < 2:
            raise ValueError(f"num_views must be J >= 2 (the views of one latent that the RPM "
                             f"contrasts), got {num_views}")
        if per_view and len(modules) != num_views:
            raise ValueError(f"got {len(modules)} recognition models for num_views={num_views}; "
                             "give one per view, or one shared model")
        classes = {module.num_classes for module in modules}
        if len(classes) != 1:
            raise ValueError(f"the recognition models disagree on K: {sorted(classes)}; build "
                             "them with one num_classes")
        num_classes = classes.pop()
        if not isinstance(learn_prior, bool):
            raise TypeError(f"learn_prior must be a bool, got {type(learn_prior).__name__}")
        probs = _prior_probs(prior, num_classes)
        self.recognition = NamedModuleList(modules) if per_view else recognition
        self.per_view = per_view
        self.num_views = num_views
        self.num_classes = num_classes
        if learn_prior:
            self.prior_probs = PyroParam(probs, constraints.simplex)  # type: ignore[assignment]
        else:
            self.register_buffer("prior_probs", probs)

    # -- the views and the factors ---------------------------------------------------------------

    def _views(self, args: tuple) -> list[torch.Tensor]:
        """The J views of a call, ``(x_1, ..., x_J)`` or ``([x_1, ..., x_J],)``, checked."""
        views = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        count = self.num_views
        if len(views) == count + 1 and _looks_like_labels(views[-1], views[0]):
            raise ValueError(
                f"DiscreteRPM is unsupervised and takes the {count} views only, got {len(views)} "
                "arguments whose last is an integer tensor of shape (N,) (labels?); drop the "
                "labels from the call and use them only to score the clusters afterwards")
        if len(views) != count:
            raise ValueError(f"this DiscreteRPM has num_views={count} but got {len(views)} "
                             f"views; pass the {count} views of the same N instances")
        check_inputs(_view_names(count), list(views))
        return list(views)

    def _recognition_models(self) -> list:
        """The J recognition models, view j's at index j."""
        if self.per_view:
            return list(self.recognition)
        return [self.recognition] * self.num_views

    def factor_log_probs(self, *views) -> torch.Tensor:
        r""":math:`\log f_j(Z|x_j^n)` of every view, instance and class: shape (J, N, K)."""
        rows = []
        for name, module, view in zip(_view_names(self.num_views), self._recognition_models(),
                                      self._views(views), strict=True):
            factor = call_encoder(module, view, name)
            rows.append(factor.logits)  # normalised: log f(Z | x), (N, K)
        return torch.stack(rows)

    def log_normalisers(self, batches: Iterable) -> torch.Tensor:
        r""":math:`\log F_j(Z) = \log \frac1M \sum_m f_j(Z|x_j^m)` (D1) over every instance of
        ``batches``: shape (J, K).

        Streamed: one batch is encoded at a time and only a (J, K) running log-sum is kept.
        Gradients flow through it when called with them enabled (the graph holds every batch);
        under ``torch.no_grad()`` it is a constant, e.g. a data-set normaliser refreshed once
        per epoch and passed to :meth:`model` as ``log_normalisers=``.

        :param batches: an iterable of batches, each the J views as :meth:`model` takes them
            (a tuple or list of J tensors (N_b, ...)); ``[(x, x2)]`` for one batch.
        """
        total, count = None, 0
        for batch in batches:
            views = tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)
            log_f = self.factor_log_probs(*views)  # (J, N_b, K)
            part = torch.logsumexp(log_f, dim=1)  # (J, K)
            total = part if total is None else torch.logaddexp(total, part)
            count += log_f.shape[1]
        if total is None:
            raise ValueError("log_normalisers got no batches; pass an iterable of batches of "
                             "views, e.g. [(x, x2)]")
        return total - math.log(count)

    def _log_ratios(self, views: tuple, log_normalisers: torch.Tensor | None) -> torch.Tensor:
        r""":math:`\log f_j(Z|x_j^n) - \log F_j(Z)`, shape (J, N, K)."""
        log_f = self.factor_log_probs(*views)
        if log_normalisers is None:
            log_normalisers = torch.logsumexp(log_f, dim=1) - math.log(log_f.shape[1])
        else:
            shape = (self.num_views, self.num_classes)
            if not isinstance(log_normalisers, torch.Tensor) or log_normalisers.shape != shape:
                got = (tuple(log_normalisers.shape) if isinstance(log_normalisers, torch.Tensor)
                       else type(log_normalisers).__name__)
                raise ValueError(f"log_normalisers must be a tensor of shape (J, K) = {shape}, "
                                 f"got {got}; compute it with model.log_normalisers(batches)")
        return log_f - log_normalisers.unsqueeze(1)

    def _joint_log_probs(self, views: tuple, log_normalisers) -> torch.Tensor:
        r""":math:`\log p(Z) + \sum_j [\log f_j(Z|x_j^n) - \log F_j(Z)]`, shape (N, K)."""
        return self.prior_probs.log() + self._log_ratios(views, log_normalisers).sum(0)

    # -- the Pyro program ------------------------------------------------------------------------

    @pyro_method
    def model(self, *views, log_normalisers: torch.Tensor | None = None) -> torch.Tensor:
        r"""``"z" ~ p(Z)`` (enumerated) and one factor per view, :math:`\log f_j(Z|x_j^n) -
        \log F_j(Z)` (class docstring)."""
        log_ratios = self._log_ratios(views, log_normalisers)  # (J, N, K)
        num_instances = log_ratios.shape[1]
        rows = torch.arange(num_instances, device=log_ratios.device)
        with pyro.plate(_PLATE, num_instances):
            z = pyro.sample("z", Categorical(probs=self.prior_probs),
                            infer={"enumerate": "parallel"})
            for name, log_ratio in zip(_view_names(self.num_views), log_ratios, strict=True):
                pyro.factor(name, Vindex(log_ratio)[rows, z])  # (N,), or (K, N) enumerated
        return z

    @pyro_method
    def guide(self, *views, log_normalisers: torch.Tensor | None = None) -> None:
        """Empty: Z is summed out in the model (``TraceEnum_ELBO``)."""

    @pyro_method
    def posterior(self, *views, log_normalisers: torch.Tensor | None = None) -> Categorical:
        r"""The exact posterior :math:`q(Z|x^n_{1:J}) \propto p(Z) \prod_j f_j(Z|x_j^n) / F_j(Z)`
        (D4): a ``Categorical`` with batch_shape (N,)."""
        return Categorical(logits=self._joint_log_probs(views, log_normalisers))

    @pyro_method
    def log_marginal(self, *views, log_normalisers: torch.Tensor | None = None) -> torch.Tensor:
        r""":math:`\sum_n \log \sum_Z p(Z) \prod_j f_j(Z|x_j^n) / F_j(Z)` (D3), the exact
        log-likelihood of the batch without the constant :math:`\sum_{n,j} \log p_{0,j}`; it
        equals the ELBO at the exact posterior and minus ``TraceEnum_ELBO``'s loss on
        :meth:`model` and :meth:`guide`. A scalar with gradients."""
        return torch.logsumexp(self._joint_log_probs(views, log_normalisers), dim=-1).sum()
