r"""The base of the recognition parameterised models: the contract through which
:class:`~rpm.RPMELBO` evaluates a model, and its name, the prefix of its parameters in Pyro's
param store (:mod:`rpm.nn`).
"""

from __future__ import annotations

import torch

from rpm.nn import NamedModule

__all__ = ["RPMBase"]


class RPMBase(NamedModule):
    r"""Base class of models that :class:`~rpm.RPMELBO` evaluates directly.

    A subclass provides

    * ``model(*args)`` and ``guide(*args)``: the Pyro model and guide, each decorated with
      :func:`pyro.nn.pyro_method` so that it runs in the module's Pyro context (its
      parameters, and those of its plain ``torch.nn.Module`` attributes, are registered in
      Pyro's param store under the model's name);
    * :meth:`elbo`: the ELBO of the model with the recognition models as the guide (Eq. 15 of
      Aitchison & Ganev for a pair), as a differentiable scalar.

    ``RPMELBO().differentiable_loss(m.model, m.guide, *args)`` is then ``-m.elbo(*args, ...)``;
    :class:`~rpm.RPM` (pairs) implements it, and a model of sequences does the same without any
    change to :mod:`rpm.inference.elbo`.

    :param name: the prefix of the model's parameters in Pyro's param store (``"a"`` gives
        ``"a.prior.energy.lengthscale"``, ``"a.recognition.net$$$0.weight"``, ...); by default
        ``"rpm"``, ``"rpm_1"``, ... (:func:`rpm.nn.unique_name`), so that two models in one
        process never share an entry.
    """

    default_name = "rpm"

    def elbo(self, *args, num_particles: int = 1, global_batch: bool = False,
             block_size: int | None = None, **kwargs) -> torch.Tensor:
        r"""The ELBO summed over the batch, averaged over ``num_particles`` samples.

        It must equal ``-Trace_ELBO().differentiable_loss(self.model, self.guide, *args)``
        to floating-point accuracy, in value and gradient, when it draws the same random
        numbers: draw each particle's latents with ``rsample`` from the same recognition
        distributions and in the same order as ``guide`` does, and return the mean over the
        particles of :math:`\sum_i \log P(z_i, \dots) - \sum_{\text{views}} \log Q(z)` with the
        recognition log-densities cancelled analytically (they appear once in the model's
        likelihood and once, negated, in the guide). Evaluate each encoder once per call.

        :param args: the model's data arguments (for a pair, ``x`` and ``x2``).
        :param int num_particles: number of samples averaged.
        :param bool global_batch: under ``torch.distributed``, evaluate the recognition
            marginals over every rank's batch (gathered with gradients) and return this rank's
            share, so that the ranks' values sum to the ELBO of the concatenated batch.
        :param block_size: block edge for the O(N^2) kernels; None decides by size.
        :return: a scalar tensor.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement elbo(*args, ...)")

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
