r"""The base of the recognition parameterised models: the contract through which
:class:`~rpm.RPMELBO` evaluates a model, and its name, the prefix of its parameters in Pyro's
param store (:mod:`rpm.nn`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import InferDict

from rpm.nn import NamedModule

if TYPE_CHECKING:
    from rpm._objective import ObjectiveInputs

__all__ = ["GuideOwnerCheck", "RPMBase", "guide_site_infer", "mismatched_model_and_guide"]

#: The key of a guide's sample sites' ``infer`` dict that names the model the guide belongs to:
#: ``(id(model), type name, name)``. Pyro's replay (``Trace_ELBO``, ``TraceMeanField_ELBO``,
#: ``JitTrace_ELBO``) copies a guide site's ``infer`` onto the model's site of the same name.
GUIDE_OWNER = "rpm_guide_of"


def guide_site_infer(owner: RPMBase) -> InferDict:
    """The ``infer`` dict of a sample site of ``owner``'s guide: :data:`GUIDE_OWNER` names
    ``owner`` (a fresh dict per site, as Pyro's inference algorithms may add keys; a key of its
    own, which Pyro's typed dict does not list)."""
    return cast(InferDict, {GUIDE_OWNER: (id(owner), type(owner).__name__, owner.name)})


def mismatched_model_and_guide(model_owner: RPMBase, guide_owner: tuple[int, str, str]
                               ) -> ValueError:
    """The error of a model run with the guide of another model: ``guide_owner`` is the
    :data:`GUIDE_OWNER` record of the guide's sites (or of the guide's model itself)."""
    _, kind, name = guide_owner
    own = f"{type(model_owner).__name__} {model_owner.name!r}"
    other = f"{kind} {name!r}"
    if name == model_owner.name:
        other += " (another model of the same name)"
    return ValueError(
        f"the model of {own} is paired with the guide of {other}: a model scores latents drawn "
        "from its own recognition models, so a guide from another model gives a meaningless "
        f"(nan or infinite) ELBO; pass the model and the guide of one model, e.g. "
        f"SVI(m.model, m.guide, ...) with m the {own} (or both of the {other})")


class GuideOwnerCheck(Messenger):
    """Refuses, in the model of ``owner``, a sample site replayed from the guide of another
    model (its ``infer`` carries another :data:`GUIDE_OWNER`): entered inside the model, it
    looks after the replay has copied the guide site's ``infer`` (post-processing). A guide
    that is not a model's (a hand-written or automatic guide) carries no owner and passes."""

    def __init__(self, owner: RPMBase):
        super().__init__()
        self.owner = owner

    def _pyro_post_sample(self, msg: dict) -> None:
        guide_owner = (msg.get("infer") or {}).get(GUIDE_OWNER)
        if guide_owner is not None and guide_owner[0] != id(self.owner):
            raise mismatched_model_and_guide(self.owner, guide_owner)


class RPMBase(NamedModule):
    r"""Base class of models that :class:`~rpm.RPMELBO` evaluates directly.

    A subclass provides

    * ``model(*args)`` and ``guide(*args)``: the Pyro model and guide, each decorated with
      :func:`pyro.nn.pyro_method` so that it runs in the module's Pyro context (its
      parameters, and those of its plain ``torch.nn.Module`` attributes, are registered in
      Pyro's param store under the model's name);
    * :meth:`objective_inputs`: the recognition distributions, the guide's distributions and
      the candidates of a batch, from which ``rpm._objective`` computes the ELBO
      (Eq. 15 of Aitchison & Ganev) as a differentiable scalar.

    ``RPMELBO().differentiable_loss(m.model, m.guide, *args)`` is then minus that ELBO;
    :class:`~rpm.RPM` implements it for pairs and J views. A subclass that redefines ``model``
    or ``guide`` without redefining :meth:`objective_inputs` is evaluated by Pyro's
    ``Trace_ELBO`` on its own model and guide.

    :param name: the prefix of the model's parameters in Pyro's param store (``"a"`` gives
        ``"a.prior.energy.lengthscale"``, ``"a.recognition.net$$$0.weight"``, ...); by default
        ``"rpm"``, ``"rpm_1"``, ... (``rpm.nn._unique_name``), so that two models in one
        process never share an entry.
    """

    default_name = "rpm"
    # the Pyro program of the contract above, defined by each subclass (declared here for type
    # checkers only: rpm.inference._elbo looks up which class defines them)
    model: Callable[..., Any]
    guide: Callable[..., Any]

    def objective_inputs(self, *args, global_batch: bool = False,
                         block_size: int | None = None) -> ObjectiveInputs:
        r"""The inputs of the ELBO of the batch ``args`` (the model's data arguments).

        The ELBO computed from them must equal ``-Trace_ELBO().differentiable_loss(self.model,
        self.guide, *args)`` to floating-point accuracy, in value and gradient, when it draws
        the same random numbers: the guide's distributions are listed in the order in which
        ``guide`` samples them.

        :param args: the model's data arguments (for a pair, ``x`` and ``x2``).
        :param bool global_batch: under ``torch.distributed``, evaluate the recognition
            marginals and the normalisers over every rank's batch (gathered with gradients).
        :param block_size: block edge for the O(N^2) kernels; None decides by size.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement objective_inputs(*args, ...)")

    def adopt(self, **modules) -> None:
        """Sets the given modules (recognition models, priors) as attributes of this model.

        :raises ValueError: when Pyro refuses to re-parent one of them: a
            :class:`~pyro.nn.PyroModule` that already ran inside another PyroModule cannot move
            to a second model (Pyro's ``AssertionError`` says only that), so the error names
            the way out.
        """
        try:
            for name, module in modules.items():
                setattr(self, name, module)
        except AssertionError as error:  # Pyro's check when re-parenting a used PyroModule
            raise ValueError(
                f"a module of this {type(self).__name__} already ran inside another PyroModule "
                f"and holds a PyroModule of its own ({error}); Pyro cannot move such a module "
                "to a second model. Share a recognition model between models with a plain "
                "torch.nn.Module network (rpm.DeltaRecognition(net) and "
                "rpm.GaussianRecognition(net) do not convert it), or build a new one"
            ) from None
