r"""``SequenceRPM``: the :class:`~rpm.RPM` of ordered views, the T frames of N sequences given as
one tensor (``docs/theory.md``, sequences).

The pair (x, x') is the case T = 2 of a sequence of views :math:`x_{1:T}`; with one latent per
view the generative model is (Eq. 9-10 of Aitchison & Ganev, per view)

.. math::

    P(x_{1:T}, z_{1:T}) = P(z_{1:T}) \prod_t P(x_t|z_t), \qquad
    P(x_t|z_t) = \frac{Q(z_t|x_t)\, P_\text{true}(x_t)}{Q_t(z_t)}.

It is :class:`~rpm.RPM` with a prior over the T views (the joint form of
:class:`~rpm.priors.base.Prior`, e.g. :class:`~rpm.priors.StateSpacePrior`), called with one
tensor x of shape (N, T, ...); this name keeps the defaults of sequences: one encoder call on
all N T frames (``encoder_calls="concat"``).
"""

from __future__ import annotations

import torch

from rpm.models.rpm import RPM
from rpm.priors.base import hook

__all__ = ["SequenceRPM"]


class SequenceRPM(RPM):
    r"""A recognition parameterised model of N sequences of T views with a prior over
    :math:`z_{1:T}`: :class:`~rpm.RPM` taking the views stacked, x of shape (N, T, ...).

    .. code-block:: python

        model = SequenceRPM(GaussianRecognition(net), StateSpacePrior(dim=6), guide="structured")
        svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 1e-3}), RPMELBO())
        svi.step(x)   # x: (N, T, ...), N sequences of T views

    ``model(x)`` declares the prior's site ``"z"`` (event_shape (T, D)) and, inside
    ``pyro.plate("instances", N)``, the likelihood factor ``"x"``,
    :math:`\sum_t [\log Q(z_t|x_t) - \log Q_t(z_t)]` (Eq. 10 per view); ``guide(x)`` samples
    ``"z"`` from the recognition distributions or, with ``guide="structured"``, the prior's
    posterior. Everything else (marginals per view or pooled, the global batch, the encoder
    rule) is :class:`~rpm.RPM`'s.

    :param recognition: :math:`Q(z_t|x_t)`, shared over the views (called once on all N T
        frames), or a list of T, one per view.
    :param prior: a prior over the T views (:class:`~rpm.priors.SequencePrior`, e.g.
        :class:`~rpm.priors.StateSpacePrior` or :class:`~rpm.priors.MarkovImplicitPrior`).
    :param bool pooled_marginal: pool the marginals over all frames.
    :param str guide: ``"recognition"`` (Eq. 14) or ``"structured"`` (the prior's posterior).
    :param str encoder_calls: ``"concat"`` (default: one call on the N T frames) or
        ``"per_view"``.
    :param name: the prefix of the model's parameters in Pyro's param store; by default
        ``"rpm"``, ``"rpm_1"``, ... (unique in the process, :class:`~rpm.models.base.RPMBase`).
    """

    def __init__(self, recognition, prior, pooled_marginal: bool = False,
                 guide: str = "recognition", encoder_calls: str = "concat", queue=None,
                 name: str | None = None):
        if not hook(prior, "joint_views"):
            raise TypeError(
                "prior must be a sequence prior over the T views (rpm.priors.SequencePrior, e.g. "
                "StateSpacePrior, MarkovImplicitPrior or MarkovPrior(pair_prior)), got "
                f"{type(prior).__name__}")
        if isinstance(recognition, (list, tuple, torch.nn.ModuleList)) and len(recognition) < 2:
            raise ValueError("a list of recognition models needs one per view (T >= 2), "
                             f"got {len(recognition)}; pass a single module to share it")
        super().__init__(recognition, prior, encoder_calls=encoder_calls,
                         pooled_marginal=pooled_marginal, guide=guide, queue=queue, name=name)

    def model(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        r"""Prior site ``"z"`` (event (T, D)); likelihood factor ``"x"`` (Eq. 10 per view).

        :param torch.Tensor x: N sequences of T views, shape (N, T, ...).
        :param mask: missing frames: None, or a bool tensor (N, T), True where the frame is
            observed (:class:`~rpm.RPM`, "Missing frames"; needs a prior that accepts it, e.g.
            :class:`~rpm.priors.StateSpacePrior`)."""
        return super().model(x, mask=mask)

    def guide(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Samples ``"z"`` (N, T, D) from the recognition models or the structured posterior.

        :param torch.Tensor x: N sequences of T views, shape (N, T, ...).
        :param mask: as for :meth:`model`."""
        return super().guide(x, mask=mask)

    def objective_inputs(self, x: torch.Tensor, *, global_batch: bool = False,
                         block_size: int | None = None, mask: torch.Tensor | None = None):
        """The inputs of the ELBO of :meth:`model` and :meth:`guide` on x (N, T, ...)
        (:meth:`rpm.RPM.objective_inputs`)."""
        return super().objective_inputs(x, global_batch=global_batch, block_size=block_size,
                                        mask=mask)

    def recognise(self, x: torch.Tensor, *, mask: torch.Tensor | None = None):
        """The recognition distributions of x (N, T, ...): batch_shape (N, T), event_shape
        (D,), masked over the frames by ``mask`` when given."""
        return super().recognise(x, mask=mask)

    def encode(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The recognition means of every view, shape (N, T, D); with ``mask``, the missing
        frames imputed by the prior's structured posterior (:meth:`rpm.RPM.encode`)."""
        return super().encode(x, mask=mask)
