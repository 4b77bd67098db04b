r"""The extension points of the package: :class:`Prior`, a prior over the latents of a pair, and
:class:`Energy`, the coupling function of the uniform-implicit prior.

Each hook is a method or attribute with a documented default; :class:`~rpm.RPM` and
:class:`~rpm.RPMELBO` call the hooks and never probe for them, so a subclass states what it can
do by overriding them.

**Prior** :math:`P(z, z')` (Eq. 9 of Aitchison & Ganev). The ELBO of the RPM (Eq. 15) is

.. math::

    \mathcal{L} = \sum_i \mathbb{E}\big[\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)\big]
    + \text{const},

with Q the minibatch-mixture recognition marginal. A prior must declare the sample sites
``"z"`` and ``"z2"`` (:meth:`Prior.forward`); the ELBO then traces it and subtracts the mixture
marginals. A prior whose log-density cancels against the marginals analytically (the implicit
prior, Eq. 23-25) also returns the per-pair remainder from :meth:`Prior.log_ratio`, which the
ELBO then uses instead of tracing. The marginals that the likelihood :math:`P(x|z) = Q(z|x)
P_\text{true}(x) / Q(z)` (Eq. 10) divides by are the prior's to choose
(:meth:`Prior.likelihood_marginals`): by default each view's own mixture.

**Energy** :math:`f(z, z')` of the implicit prior :math:`P(z'|z) = Q(z') e^{f(z, z')} / Z(z)`
(Eq. 21-22). It returns the whole matrix :math:`F_{ij} = f(z_i, z'_j)`; its diagonal
:meth:`Energy.paired` and, when f is a matrix product plus a row offset, the factors of
:meth:`Energy.logit_factors` let the InfoNCE normaliser be evaluated without the matrix
(streamed in blocks of O((N + M) D) memory).
"""

from __future__ import annotations

import torch
from pyro.distributions import TorchDistribution

from rpm.marginals import MixtureMarginal
from rpm.nn import NamedModule

__all__ = ["Energy", "Prior", "positive_hyperparameter"]


def positive_hyperparameter(name: str, value) -> torch.Tensor:
    """A positive hyperparameter (or the initial value of a positive parameter) given as a
    number, as a float64 scalar tensor.

    Held in float64 whatever the default dtype, a Python float keeps its full value (``1/0.07``
    stays 14.285714285714286 after ``module.double()``); the priors and energies cast it to the
    latents' dtype where they use it.

    :raises TypeError: if ``value`` is not a number.
    :raises ValueError: if it is not finite and > 0.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not 0.0 < number < float("inf"):
        raise ValueError(
            f"{name} must be a finite positive number, got {number}; pass a value > 0 (for a "
            "learned parameter, its initial value)"
        )
    return torch.tensor(number, dtype=torch.float64)


class Prior(NamedModule):
    r"""Base class of priors :math:`P(z, z')` over the latents of a pair (Eq. 9 of Aitchison &
    Ganev).

    Implement :meth:`forward`; override the other hooks when their defaults do not fit:

    ==============================  =========================================================
    hook                            default
    ==============================  =========================================================
    :meth:`forward` (required)      declares ``"z"`` and ``"z2"`` and returns their values
    :meth:`log_ratio`               ``None``: no analytic cancellation, the ELBO traces
                                    :meth:`forward` and subtracts the mixture marginals
    :attr:`accepts_delta_recognition`  ``False``: the prior is a density on
                                    :math:`\mathbb{R}^D \times \mathbb{R}^D`, so Delta
                                    encoders are refused (Appendix B)
    :attr:`dim`                     ``None``: any latent dimension
    :attr:`joint_over_batch`        ``False``: the sites are per pair, declared inside the
                                    model's plate over the pairs
    :meth:`likelihood_marginals`    each view's own minibatch mixture, ``MixtureMarginal(q)``
                                    and ``MixtureMarginal(q2)``
    ==============================  =========================================================

    A plain callable ``prior(q, q2)`` (not a :class:`Prior`) is accepted by :class:`~rpm.RPM`
    with all the defaults.
    """

    #: True when :math:`P(z, z')` is defined relative to the recognition marginals (as the
    #: implicit prior's :math:`P(z) = Q(z)`, :math:`P(z'|z) \propto Q(z') e^{f}`), so that
    #: deterministic (Delta) encoders give a well-defined ELBO. False for densities on
    #: :math:`\mathbb{R}^D`, which need Q(z) to have a density too (Appendix B of Aitchison &
    #: Ganev): :class:`~rpm.RPM` then refuses ``DeltaRecognition`` without noise.
    accepts_delta_recognition: bool = False

    #: The latent dimension D the prior was built for, or None for any; :class:`~rpm.RPM`
    #: checks the encoders' output against it.
    dim: int | None = None

    #: False (the default): the pairs are independent under the prior, and :meth:`forward` is
    #: called inside the model's ``pyro.plate("pairs", N)``, declaring per-pair sites (batch
    #: (N,), event (D,)). True when the prior couples the pairs of a batch (the implicit
    #: prior's conditional is normalised over the batch's own latents): :meth:`forward` is then
    #: called outside the plate and declares ``"z"`` and ``"z2"`` each as one event of shape
    #: (N, D), and the :class:`~rpm.RPM`'s guide declares its two sites the same way, so that
    #: model and guide agree on every site's shape and Pyro's batch semantics hold.
    joint_over_batch: bool = False

    def forward(self, q: TorchDistribution, q2: TorchDistribution):
        r"""Declares the sample sites ``"z"`` and ``"z2"`` inside the model's plate over the N
        pairs and returns their values ``(z, z2)``, each of shape (N, D).

        :param q: the first view's recognition distributions, batch_shape (N,), event_shape
            (D,) (the implicit prior's marginal is built from them; explicit priors ignore them).
        :param q2: the second view's, likewise.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement forward(q, q2), declaring the sample sites "
            "'z' and 'z2' and returning (z, z2)"
        )

    def log_ratio(
        self, z: torch.Tensor, z2: torch.Tensor, q: TorchDistribution, q2: TorchDistribution,
        negatives: torch.Tensor | None = None, block_size: int | None = None,
    ) -> torch.Tensor | None:
        r"""The per-pair ELBO term after analytic cancellation, or None (the default).

        .. math::

            \log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)

        (Eq. 15 of Aitchison & Ganev, the terms inside the expectation), for a prior whose
        log-density cancels the recognition marginals in closed form: the implicit prior
        returns :math:`f(z_i, z'_i) - \log \frac1M \sum_j e^{f(z_i, z'_j)}` (Eq. 23-25)
        without evaluating any mixture. Returning None makes :class:`~rpm.RPMELBO` trace
        :meth:`forward` with ``"z"``, ``"z2"`` conditioned on the samples and subtract the
        minibatch-mixture marginals; both routes must agree with ``Trace_ELBO``.

        :param torch.Tensor z: first-view latents, shape (N, D).
        :param torch.Tensor z2: second-view latents, shape (N, D), paired with z.
        :param q: first-view recognition distributions, batch_shape (N,).
        :param q2: second-view recognition distributions, batch_shape (N,).
        :param negatives: the candidates :math:`z'_{1:M}` of a normaliser over a global batch
            (every rank's z2, gathered by :class:`~rpm.RPMELBO` with ``global_batch=True``),
            shape (M, D); None means the batch's own z2.
        :param block_size: stream the O(N M) parts in blocks of this many rows; None decides by
            size.
        :return: shape (N,), or None.
        """
        return None

    def likelihood_marginals(
        self, q: TorchDistribution, q2: TorchDistribution
    ) -> tuple[MixtureMarginal, MixtureMarginal]:
        r"""The recognition marginals :math:`(Q_1, Q_2)` that the likelihood factors divide by.

        .. math::

            P(x_i|z_i) = \frac{Q(z_i|x_i)\, P_\text{true}(x_i)}{Q_1(z_i)}, \qquad
            P(x'_i|z'_i) = \frac{Q(z'_i|x'_i)\, P_\text{true}(x'_i)}{Q_2(z'_i)}

        (Eq. 10 of Aitchison & Ganev): the :class:`~rpm.RPM`'s factors ``"x"`` and ``"x2"`` are
        :math:`\log Q(z_i|x_i) - \log Q_1(z_i)` and :math:`\log Q(z'_i|x'_i) - \log Q_2(z'_i)`,
        and the traced ELBO (when :meth:`log_ratio` returns None) subtracts
        :math:`\log Q_1(z_i) + \log Q_2(z'_i)`. The default is each view's own minibatch mixture,
        :math:`Q_1 = \frac1N \sum_n Q(z|x_n)` and :math:`Q_2 = \frac1N \sum_n Q(z'|x'_n)`
        (Eq. 11). A prior built on another estimate of the recognition marginal returns that one
        (the pooled prior of NT-Xent: the mixture over both views, for both).

        :param q: first-view recognition distributions, batch_shape (N,), event_shape (D,).
        :param q2: second-view recognition distributions, likewise.
        :return: two :class:`~rpm.marginals.MixtureMarginal` with batch_shape (N,) and
            event_shape (D,), whose log-densities at the N latents of a view are that view's
            :math:`\log Q_v(z_i)`.
        """
        return MixtureMarginal(q), MixtureMarginal(q2)


class Energy(NamedModule):
    r"""Base class of energies :math:`f(z, z')` of the implicit prior (Eq. 21-22 of Aitchison &
    Ganev).

    Implement :meth:`forward`; override the other hooks when their defaults do not fit:

    ==========================  =============================================================
    hook                        default
    ==========================  =============================================================
    :meth:`forward` (required)  the matrix :math:`F_{ij} = f(z_i, z'_j)`, shape (N, M)
    :meth:`paired`              the diagonal of :meth:`forward` (builds the N x N matrix)
    :meth:`logit_factors`       ``None``: f is not written as a matrix product, the
                                normaliser is ``logsumexp`` of the full matrix
    :meth:`logit_bound`         ``None``: no bound on f is known (the valid range of latent
                                norms is not checked, a non-finite loss is still diagnosed)
    :attr:`dim`                 ``None``: any latent dimension
    ==========================  =============================================================

    :meth:`forward` is the definition of the energy: the hooks are shortcuts for what it
    computes, and the ELBO uses a hook only where it describes *this* class's :meth:`forward`
    (:mod:`rpm.priors.energy_paths`; the rule is decided once per class from its MRO):

    * a hook defined in the same class as :meth:`forward` is trusted;
    * a hook defined in a subclass of the class that defines :meth:`forward` (a subclass that
      overrides the factorisation only) is checked against :meth:`forward` on a few rows and
      columns of the first batch that uses it (once per class): a disagreement raises
      ValueError;
    * a hook inherited from above the class that defines :meth:`forward` is ignored: a
      subclass that overrides :meth:`forward` only (``class ScaledRBF(RBFEnergy)`` with a new
      ``forward``) gets the generic path, which evaluates :meth:`forward` on tiles of
      ``block_size`` rows and columns (O(N M / block) memory plus one tile, so large batches
      still work). To get the factorised fast path back, override :meth:`paired` and
      :meth:`logit_factors` in the same class as :meth:`forward`.

    :meth:`forward` must be pairwise: entry (i, j) depends on :math:`z_i` and :math:`z'_j`
    only (no statistics of the batch), since the streamed paths evaluate it on blocks.
    """

    #: The latent dimension D the energy was built for (its parameters' size), or None.
    dim: int | None = None

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        r""":math:`F_{ij} = f(z_i, z'_j)`.

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (M, D).
        :return: shape (N, M).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement forward(z, z2) returning the (N, M) matrix "
            "f(z_i, z2_j)"
        )

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        r""":math:`f(z_i, z'_i)` for aligned pairs (the positives of InfoNCE).

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (N, D).
        :return: shape (N,).
        """
        if z.shape != z2.shape:
            raise ValueError(
                f"paired energies need z and z2 of equal shapes, got {tuple(z.shape)} and "
                f"{tuple(z2.shape)}"
            )
        return torch.diagonal(self(z, z2))

    def logit_factors(
        self, z: torch.Tensor, z2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        r"""Factors of the energy matrix as a matrix product plus a row offset, or None.

        .. math::

            f(z_i, z'_j) = a_i^\top b_j + c_i,

        so that the InfoNCE normaliser :math:`\log \sum_j e^{f(z_i, z'_j)} = c_i +
        \log \sum_j e^{a_i^\top b_j}` is streamed in blocks
        (:func:`~rpm.ops.streaming_matmul_logsumexp`) without the (N, M) matrix. Return None
        when f has no such form or when the factors would be inaccurate for these inputs (the
        normaliser then uses :meth:`forward`).

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (M, D).
        :return: ``(a (N, K), b (M, K), c (N,) or None)``, or None.
        """
        return None

    def logit_bound(self, radius: torch.Tensor) -> torch.Tensor | None:
        r"""An upper bound on the size of the energy and of its gradients for latents of
        Euclidean norm R, or None (unknown, the default).

        .. math::

            B(R) \ge \max\big(|f(z, z')|,\ \lVert \nabla_z f \rVert,\
            \lVert \nabla_\theta f \rVert\big) \quad \text{for } \lVert z \rVert,
            \lVert z' \rVert \le R

        (the gradient in the unconstrained parameters :math:`\theta`), and for latents whose
        norms lie between two values, the larger of B at those values bounds them (true of a
        B monotone in R, or of one like :math:`\kappa \max(1, 1/R)`). The implicit priors
        check, under Pyro's validation, that the loss of N pairs and its gradients (at most
        :math:`16 N B` in size) fit the latents' dtype, and raise a ValueError that names the
        valid range of latent norms otherwise (:mod:`rpm.priors.energy_range`); with None only
        a non-finite loss is diagnosed.

        :param torch.Tensor radius: latent norms R, float64, any shape.
        :return: B(R), float64, the shape of ``radius``; or None.
        """
        return None

    def check_latents(self, z: torch.Tensor, z2: torch.Tensor) -> None:
        """Raises ValueError unless z is (N, D) and z2 is (M, D), with D equal to :attr:`dim`
        when it is set. For use at the top of :meth:`forward` and the other hooks."""
        if not isinstance(z, torch.Tensor) or not isinstance(z2, torch.Tensor):
            raise TypeError(
                f"an energy takes tensors z and z2, got {type(z).__name__} and "
                f"{type(z2).__name__}"
            )
        if z.dim() != 2 or z2.dim() != 2 or z.shape[1] != z2.shape[1]:
            raise ValueError(
                "an energy takes latents z of shape (N, D) and z2 of shape (M, D), got "
                f"{tuple(z.shape)} and {tuple(z2.shape)}"
            )
        if self.dim is not None and z.shape[1] != self.dim:
            raise ValueError(
                f"this energy was built for latents of dimension {self.dim} but the encoder "
                f"produced dimension {z.shape[1]}; build the energy with dim={z.shape[1]} or "
                "change the encoder's output size"
            )
