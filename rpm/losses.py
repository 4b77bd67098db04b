r"""Contrastive losses for a plain PyTorch loop, in lightly's and info-nce-pytorch's conventions,
each the negative RPM ELBO of its prior minus a constant (``docs/theory.md``, sections "NT-Xent",
"Candidates: the batch, the global batch, a queue" and "J-view priors").

:class:`NTXentLoss` takes the arguments of ``lightly.loss.NTXentLoss`` (``temperature``,
``memory_bank_size``, ``gather_distributed``) and returns the same value from
``forward(out0, out1)``: the mean loss, positive, in nats. It also takes J views,
``forward(*views)`` or ``forward([views])``, for SupCon's multi-positive forms. Its
:meth:`NTXentLoss.elbo` returns the RPM ELBO per instance the loss comes from, and
:meth:`NTXentLoss.rpm_prior` the prior itself (for :class:`~rpm.RPM`). Every form computes
its ELBO :math:`\mathcal{L}` with :func:`rpm.inference.rpm_elbo` (Delta recognition at the
outputs) on the prior below, and its loss is the affine function of it stated there:

* two views, no memory bank: SimCLR's NT-Xent is the pooled implicit prior
  (:class:`~rpm.priors.PooledImplicitPrior`) with the cosine energy
  :math:`f(z, z') = \hat z^\top \hat z' / \tau`, and
  :math:`\mathcal{L}/N = -\text{NT-Xent} + \log(2N - 1)`;
* a memory bank of K latents (MoCo): the implicit conditional whose normaliser runs over the
  anchor's own positive and the K banked latents (:class:`~rpm.priors.StarImplicitPrior` with
  ``candidates="positives"``, ``centres=[0]``), and :math:`\mathcal{L}/N = -L_\text{MoCo} +
  \log(K + 1)`;
* J views: the star prior averaged over centres, :math:`\mathcal{L}/(N(J-1)) = -L_\text{out} +
  \log D`, or the mixture of partners, :math:`\mathcal{L}/N = -L_\text{in} + \log(D/(J-1))`.

:class:`InfoNCELoss` takes the arguments of info-nce-pytorch's ``InfoNCE`` and returns its value:
the one-directional, cross-view InfoNCE of :class:`~rpm.priors.ImplicitPrior`,
:math:`\mathcal{L}/N = -\text{InfoNCE} + \log N`, or with M explicit negatives that of MoCo's
prior (:class:`~rpm.priors.StarImplicitPrior`, the negatives its explicit candidates),
:math:`\mathcal{L}/N = -\text{InfoNCE} + \log(M + 1)`, each through
:func:`rpm.inference.rpm_elbo`.

Both take ``learn_temperature=True``: the temperature is then learned as CLIP learns its logit
scale (:class:`ScaledCosineEnergy`).

:func:`info_nce` is the same InfoNCE from a matrix of logits :math:`F_{ij} = f(z_i, z'_j)`, the
reference of the identity :math:`\mathcal{L}/N = -\text{InfoNCE} + \log N`.

lightly's other losses, with lightly 1.6.0's class names, arguments, defaults and values (each
docstring states its equation and how it reads as an RPM):

* :class:`VICRegLoss`, :class:`BarlowTwinsLoss`, :class:`LeJEPALoss` and its :class:`SIGReg`
  (the same random slices for the same state of torch's generator): redundancy reduction, whose
  terms approximate or stand in for the Gaussian RPM's (an explicit Gaussian prior with
  moment-matched Gaussian marginals, :math:`\mathcal L/N = \operatorname{mean}_n \log P(z_n,
  z'_n) - \operatorname{mean}_n \log \mathcal N(z_n; m, S) - \operatorname{mean}_n \log
  \mathcal N(z'_n; m', S')`, ``docs/theory.md#gaussian-rpm``): surrogates of that ELBO, not
  bounds. Their ``elbo`` returns the ELBO itself for the outputs
  (:class:`~rpm.priors.GaussianPairPrior`, :class:`~rpm.priors.GaussianStarPrior` with
  ``marginal="gaussian"``);
* :class:`DCLLoss`, :class:`DCLWLoss`: the implicit prior's log-ratio with the positive taken
  out of the normaliser's candidates;
* :class:`HypersphereLoss`: alignment and uniformity, the uniformity the log of the RBF implicit
  prior's normaliser.

**Several processes** (``gather_distributed=True`` under ``torch.distributed``). Each process
passes its own rows; what a loss needs of the other processes' rows is gathered with
:func:`rpm.distributed.all_gather_with_grad`, whose backward sums every process's gradient. Each
loss is a mean over this process's rows (anchors, pairs) of terms whose batch statistics run over
the global batch, so with equal batches per process ``DistributedDataParallel``'s average of the
processes' gradients is the gradient of one process on the concatenated batch, exactly:
:class:`NTXentLoss`, :class:`VICRegLoss`, :class:`LeJEPALoss` (its random directions are rank
0's, broadcast), :class:`DCLLoss`. Two follow lightly in keeping a per-process statistic, and their
gradient is that of the loss with the statistic of each process's rows: :class:`BarlowTwinsLoss`
(each process standardises its own outputs) and :class:`DCLWLoss` (the weights are a softmax over
each process's pairs). :class:`HypersphereLoss` gathers nothing (lightly's takes no
``gather_distributed``): each process's uniformity runs over its own rows.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch

from rpm._objective import rpm_elbo
from rpm._validation import (
    check_bool,
    check_int,
    check_nonnegative,
    check_positive,
    check_positive_int,
    check_real,
)
from rpm.distributed import all_gather_with_grad, collective_device, is_distributed
from rpm.marginals._candidates import Candidates, LatentQueue
from rpm.priors import (
    GaussianPairPrior,
    GaussianStarPrior,
    ImplicitPrior,
    PartnerMixturePrior,
    PooledImplicitPrior,
    StarImplicitPrior,
)
from rpm.priors._base import Energy
from rpm.priors._energies import CosineEnergy, unit_vectors
from rpm.priors._multiview import MultiViewImplicitPrior

__all__ = [
    "BarlowTwinsLoss",
    "DCLLoss",
    "DCLWLoss",
    "HypersphereLoss",
    "InfoNCELoss",
    "LeJEPALoss",
    "NTXentLoss",
    "SIGReg",
    "ScaledCosineEnergy",
    "VICRegLoss",
    "info_nce",
]

_FORMS = {"out": StarImplicitPrior, "in": PartnerMixturePrior}


def _check_temperature(temperature, hint: str) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0 ({hint}), got {temperature!r}")
    return float(temperature)


class ScaledCosineEnergy(CosineEnergy):
    r"""The cosine energy of the losses, :class:`~rpm.priors.CosineEnergy`
    :math:`f(u, v) = \kappa\, \hat u^\top \hat v` whose concentration is the logit scale
    :math:`\kappa = s = 1/\tau`, fixed or learned as CLIP learns it. Everything but the
    parametrisation of :math:`\kappa` is :class:`~rpm.priors.CosineEnergy`'s: the same
    normalisation (``rpm.priors._energies.unit_vectors``), the same matrix, factors and bound.

    **Learned** (``learn=True``), as CLIP (Radford et al. 2021, section 2.5): the scale is
    parametrised by its logarithm, :math:`s = \exp(\min(\theta, \log 100))`, :math:`\theta`
    initialised at :math:`\log(1/\tau)`; the clamp at :math:`\log 100` bounds the scale at 100,
    the temperature below at 0.01, so that it cannot collapse and make training unstable (CLIP
    clips the parameter after each step; here the clamp is in the forward pass, so the value is
    bounded whatever the optimiser does, and the gradient in :math:`\theta` is zero beyond the
    bound).

    :param float temperature: :math:`\tau > 0`, the (initial) temperature; with ``learn`` at
        least 0.01.
    :param bool learn: learn the scale (a ``torch.nn.Parameter`` ``log_scale``, float64).
    """

    #: The largest logit scale of a learned temperature (CLIP's: 100).
    MAX_SCALE = 100.0

    def __init__(self, temperature: float = 0.5, learn: bool = False):
        # Energy's initialiser, not CosineEnergy's: kappa is the property below, held as
        # ``scale`` or ``log_scale`` rather than CosineEnergy's ``kappa``
        Energy.__init__(self)
        temperature = _check_temperature(temperature, "the initial temperature")
        self.learn = check_bool("learn", learn)
        if learn:
            if 1.0 / temperature > self.MAX_SCALE:
                raise ValueError(f"a learned temperature is bounded below by 1/{self.MAX_SCALE:g} "
                                 f"(the logit scale is clipped at {self.MAX_SCALE:g}, as CLIP's); "
                                 f"start it at >= 0.01, got {temperature!r}")
            self.log_scale = torch.nn.Parameter(torch.tensor(-math.log(temperature),
                                                             dtype=torch.float64))
        else:
            self.register_buffer("scale", torch.tensor(1.0 / temperature, dtype=torch.float64))

    # read-only here (held as scale or log_scale); CosineEnergy's kappa is an attribute
    @property
    def kappa(self) -> torch.Tensor:  # type: ignore[override]
        r"""The concentration of :class:`~rpm.priors.CosineEnergy`, the logit scale
        :math:`s = 1/\tau` (:meth:`logit_scale`), a float64 scalar."""
        return self.logit_scale()

    def logit_scale(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        r"""The scale :math:`s = 1/\tau` (clamped at :attr:`MAX_SCALE` when learned), a scalar in
        ``dtype``."""
        if self.learn:
            scale = self.log_scale.clamp(max=math.log(self.MAX_SCALE)).exp()
        else:
            scale = self.scale
        return scale if dtype is None else scale.to(dtype)

    @property
    def temperature(self) -> float:
        r"""The current temperature :math:`\tau = 1/s`, a float."""
        return 1.0 / float(self.logit_scale().detach())

    def shared(self) -> ScaledCosineEnergy:
        """A new energy holding this one's parameter (or buffer) itself, so that both compute
        the same f and train together: what :meth:`NTXentLoss.rpm_prior` builds its priors on
        (Pyro cannot move a PyroModule that already ran into a model)."""
        new = ScaledCosineEnergy(1.0, learn=self.learn)
        if self.learn:
            new.log_scale = self.log_scale
        else:
            new.scale = self.scale
        return new


def _bank_shape(memory_bank_size) -> tuple[int, int | None]:
    """(K, D or None) from lightly's ``memory_bank_size``: an int K >= 0 or a tuple (K, D) (the
    warning of an int K > 0 is the caller's)."""
    if isinstance(memory_bank_size, bool):
        raise TypeError(f"memory_bank_size must be an int K >= 0 or a tuple (K, D), "
                        f"got {memory_bank_size!r}")
    if isinstance(memory_bank_size, int):
        size, dim = memory_bank_size, None
    elif (isinstance(memory_bank_size, (tuple, list)) and len(memory_bank_size) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in memory_bank_size)):
        size, dim = memory_bank_size
        if dim < 1:
            raise ValueError(f"memory_bank_size (K, D) needs a latent dimension D >= 1, "
                             f"got {memory_bank_size!r}")
    else:
        raise TypeError(f"memory_bank_size must be an int K >= 0 or a tuple (K, D), "
                        f"got {memory_bank_size!r}")
    if size < 0:
        raise ValueError(f"memory_bank_size must be >= 0 (0: no memory bank, SimCLR), got {size}")
    return size, dim


def _moco_prior(energy: Energy, queue: LatentQueue | None) -> StarImplicitPrior:
    """MoCo's prior: the star prior with centre view 0, whose normaliser runs over the anchor's
    own positive and the queue's K latents (without a queue: the step's explicit negatives,
    ``Candidates(negatives=...)``)."""
    return StarImplicitPrior(energy, candidates="positives", centres=[0], queue=queue)


def _check_outputs(views: list, names: list[str], what: str) -> None:
    for name, out in zip(names, views, strict=True):
        if not isinstance(out, torch.Tensor) or out.dim() != 2:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"{what} takes {name} of shape (N, D), one row per image; got {got}")
    written = ' and '.join(names) if len(names) == 2 else 'the views'
    if any(out.shape != views[0].shape for out in views[1:]):
        shapes = ", ".join(str(tuple(out.shape)) for out in views)
        raise ValueError(f"{what} needs {written} of the same shape (N, D), row i of each a view "
                         f"of image i; got {shapes}")
    if views[0].shape[0] == 0:
        raise ValueError(f"{what} needs at least one image: {written} have no rows (shape "
                         f"{tuple(views[0].shape)}); skip empty batches")


class NTXentLoss(torch.nn.Module):
    r"""SimCLR's NT-Xent, MoCo's loss with a memory bank, or SupCon's multi-positive losses over J
    views, as lightly's ``NTXentLoss`` computes the first two, and the RPM ELBO each one is
    (``docs/theory.md``, "NT-Xent" and "J-view priors").

    The outputs are normalised, :math:`\hat u = u / \lVert u \rVert`, and the energy is the
    cosine energy :math:`f(u, v) = \hat u^\top \hat v / \tau` (:class:`ScaledCosineEnergy`, the
    :class:`~rpm.priors.CosineEnergy` with :math:`\kappa = 1/\tau`).

    **Two views, no memory bank** (``memory_bank_size=0``). The 2N outputs are pooled,
    :math:`u = (z_1..z_N, z'_1..z'_N)`; each :math:`u_k` is an anchor whose positive is its
    partner :math:`u_{p(k)}` and whose candidates are the 2N - 1 others:

    .. math::

        \text{NT-Xent} = \frac{1}{2N} \sum_{k=1}^{2N}
            -\log \frac{e^{f(u_k, u_{p(k)})}}{\sum_{m \ne k} e^{f(u_k, u_m)}}.

    It is computed as the negative ELBO of :class:`~rpm.priors.PooledImplicitPrior`
    (through :func:`rpm.inference.rpm_elbo`, Delta recognition at the outputs),

    .. math::

        \mathcal{L}/N = -\text{NT-Xent} + \log(2N - 1),

    so the loss is :math:`-\mathcal{L}/N + \log(2N - 1)` by construction. With
    ``gather_distributed`` the candidates are the 2M - 1 other outputs of the global batch of M
    pairs (:func:`rpm.distributed.all_gather_with_grad`), each process averaging over its own
    anchors, as lightly does; without an initialised ``torch.distributed`` it changes nothing.

    **Memory bank** (``memory_bank_size = K > 0``, or lightly's ``(K, D)``; two views only).
    MoCo's form: the anchors are ``out0`` only, the positive of :math:`z_i` is :math:`z'_i` and
    the negatives are the bank's K latents :math:`c_{1:K}`:

    .. math::

        L_\text{MoCo} = \frac1N \sum_i -\log \frac{e^{f(z_i, z'_i)}}
            {e^{f(z_i, z'_i)} + \sum_{k=1}^K e^{f(z_i, c_k)}},
        \qquad \mathcal{L}/N = -L_\text{MoCo} + \log(K + 1),

    the ELBO of the implicit prior (Eq. 23-25 of Aitchison & Ganev) whose normaliser
    :math:`Z(z_i) = \mathbb{E}_{Q(z')} e^{f(z_i, z')}` is estimated from K + 1 samples of the
    marginal: the anchor's own positive and the banked latents
    (:class:`~rpm.priors.StarImplicitPrior` with ``candidates="positives"``, ``centres=[0]``
    and the bank as its queue: :meth:`rpm_prior`). The bank follows lightly's rules:

    * it starts as K random unit vectors and holds the normalised, detached ``out1`` of
      earlier calls (every process's, with ``gather_distributed``), oldest overwritten first;
      a batch that reaches the end of the bank fills it to the end, its remaining rows are
      dropped, and the next batch writes from the start;
    * the starting rows are drawn in the default dtype (``(K, D)``, at construction) or in
      the outputs' dtype (an int K, at the first call); the cosine energy normalises the rows
      it reads, lightly reads them as they are, so the two agree to the rounding of the dtype
      the rows were drawn in;
    * it takes a batch after the loss is computed, and only when ``out0`` requires a gradient:
      under ``torch.no_grad()`` (a validation pass) it stays as it is, in train or eval mode;
      :meth:`elbo` and evaluating the prior never push (the state rule of
      :mod:`rpm.marginals._candidates`: a loss class's ``forward`` is the one place besides the
      training loop that pushes);
    * it is a :class:`~rpm.marginals._candidates.LatentQueue` of non-persistent buffers:
      ``state_dict()`` and checkpoints do not carry it (a model restored from a checkpoint
      starts a new random bank), while ``.to()`` and ``.double()`` move it;
    * an int K (no dimension) gives lightly's ``UserWarning`` and the bank is made at the first
      call, from the outputs' dimension.

    The banked latents come from earlier versions of the encoder, so they estimate the
    normaliser under an older marginal; the bias vanishes as the encoder stops moving.

    Outputs are normalised as ``F.normalize`` does, so a row of zeros has logits 0 and the loss
    and its gradients stay finite (float32 and float64), as in lightly; a batch of no rows is a
    ``ValueError``.

    **J views** (``forward(*views)`` with J > 2, or ``candidates="cross_view"``). Every output is
    an anchor; its positives P(k) are the J - 1 other views of its image and its candidates C(k)
    all N J - 1 other outputs (``candidates="pooled"``) or the other views' N (J - 1)
    (``"cross_view"``); with ``global_views = G`` the first G views are global crops and a local
    crop's positives and candidates are the global crops only (SwAV, DINO). ``form`` chooses

    .. math::

        L_\text{out} = \operatorname*{mean}_{k,\ p \in P(k)}
            -\log \frac{e^{f(u_k, u_p)}}{\sum_{m \in C(k)} e^{f(u_k, u_m)}}
        \quad (\texttt{"out"}), \qquad
        L_\text{in} = \operatorname*{mean}_{k}
            -\log \frac{\sum_{p \in P(k)} e^{f(u_k, u_p)}}{\sum_{m \in C(k)} e^{f(u_k, u_m)}}
        \quad (\texttt{"in"}),

    the negative ELBOs of :class:`~rpm.priors.StarImplicitPrior` and
    :class:`~rpm.priors.PartnerMixturePrior`: with :math:`D = |C(k)|`,
    :math:`\mathcal{L}/(N(J-1)) = -L_\text{out} + \log D` and
    :math:`\mathcal{L}/N = -L_\text{in} + \log(D/(J-1))`. With J = 2 both are NT-Xent. With
    ``global_views`` the anchors differ in :math:`|P(k)|` and :math:`D_k`, and the loss is
    still affine in the ELBO, :math:`L = c - J \mathcal{L} / w` with
    :math:`w = \sum_k |P(k)|`, :math:`c = \frac1w \sum_k |P(k)| \log D_k` (``"out"``) or
    :math:`w = NJ`, :math:`c = \frac1w \sum_k \log(D_k / |P(k)|)` (``"in"``), constants of the
    batch's shape.

    .. code-block:: python

        loss_fn = rpm.losses.NTXentLoss(temperature=0.5)
        loss = loss_fn(head(backbone(x0)), head(backbone(x1)))              # SimCLR
        loss = loss_fn(*[head(backbone(v)) for v in views])                 # J views, L_out
        elbo_per_image = loss_fn.elbo(*[head(backbone(v)) for v in views])  # the RPM ELBO / N

    :param float temperature: :math:`\tau > 0` (the initial one when learned).
    :param memory_bank_size: K >= 0 (0: SimCLR, no bank), or a tuple (K, D); with an int K > 0
        the bank is created at the first call, from the outputs' dimension, with lightly's
        warning.
    :param bool gather_distributed: gather the candidates (or the bank's new entries) from every
        process of ``torch.distributed``.
    :param str form: over J views, ``"out"`` (:math:`L_\text{out}`, the star prior) or
        ``"in"`` (:math:`L_\text{in}`, the mixture of partners).
    :param str candidates: ``"pooled"`` (NT-Xent's) or ``"cross_view"``.
    :param global_views: G global crops first (the multi-crop rule), or None.
    :param bool learn_temperature: learn :math:`\tau` as CLIP does (log-parametrised logit scale
        clipped at 100, i.e. :math:`\tau \ge 0.01`: :class:`ScaledCosineEnergy`); its parameter
        is ``loss.energy.log_scale``, to give to the optimiser with the network's.
    """

    def __init__(self, temperature: float = 0.5, memory_bank_size: int | tuple[int, int] = 0,
                 gather_distributed: bool = False, form: str = "out", candidates: str = "pooled",
                 global_views: int | None = None, learn_temperature: bool = False):
        super().__init__()
        _check_temperature(temperature, "SimCLR uses 0.5, MoCo 0.07")
        self.gather_distributed = check_bool("gather_distributed", gather_distributed)
        self.memory_bank_size, dim = _bank_shape(memory_bank_size)
        if form not in _FORMS:
            raise ValueError(f"form must be 'out' (L_out, the star prior) or 'in' (L_in, the "
                             f"mixture of partners), got {form!r}")
        if candidates not in ("pooled", "cross_view"):
            raise ValueError(f"candidates must be 'pooled' or 'cross_view', got {candidates!r}")
        if self.memory_bank_size > 0 and (candidates != "pooled" or global_views is not None):
            raise ValueError("a memory bank is MoCo's two-view form; it takes no candidates= or "
                             "global_views= (use rpm.priors.StarImplicitPrior with a queue for J views)")
        self.form = form
        self.energy = ScaledCosineEnergy(temperature, learn=learn_temperature)
        self.prior = PooledImplicitPrior(self.energy)
        self.multiview_prior = _FORMS[form](self.energy, candidates=candidates,
                                            global_views=global_views)
        self.bank: LatentQueue | None = None
        # MoCo's prior on the bank, made with the bank; held outside the submodules (its energy
        # and bank are this loss's own); evaluating it never pushes: forward does, by lightly's
        # rule
        object.__setattr__(self, "_bank_prior", None)
        if self.memory_bank_size > 0 and dim is not None:
            self._init_bank(dim)
        if self.memory_bank_size > 0 and dim is None:  # lightly's warning, word for word
            warnings.warn(
                f"Memory bank size 'size={self.memory_bank_size}' does not specify feature "
                "dimension. It is recommended to set the feature dimension with 'size=(n, dim)' "
                "when creating the memory bank. Distributed training might fail if the feature "
                "dimension is not set.", UserWarning, stacklevel=2)

    @property
    def temperature(self) -> float:
        r"""The current temperature :math:`\tau` (learned or fixed), a float."""
        return self.energy.temperature

    def _init_bank(self, dim: int, like: torch.Tensor | None = None) -> None:
        """K random unit vectors, as lightly's bank starts (on ``like``'s device, in its dtype;
        without ``like``, in the default dtype), in non-persistent buffers (lightly's: outside
        ``state_dict()``)."""
        self.bank = LatentQueue(self.memory_bank_size, dim, persistent=False)
        if like is not None:
            self.bank.to(device=like.device, dtype=like.dtype)
        self.bank.push(unit_vectors(torch.randn(self.memory_bank_size, dim, dtype=self.bank.memory.dtype)))
        object.__setattr__(self, "_bank_prior", _moco_prior(self.energy, self.bank))

    def _views(self, views: tuple) -> list[torch.Tensor]:
        if len(views) == 1 and isinstance(views[0], (list, tuple)):
            views = tuple(views[0])
        if len(views) < 2:
            raise ValueError(f"NTXentLoss takes two outputs (out0, out1) or J >= 2 views, got "
                             f"{len(views)}")
        names = ["out0", "out1"] if len(views) == 2 else [f"views[{j}]" for j in range(len(views))]
        _check_outputs(list(views), names, "NTXentLoss")
        if self.memory_bank_size > 0 and len(views) != 2:
            raise ValueError(f"a memory bank is MoCo's two-view form (out0, out1); got J = "
                             f"{len(views)} views: build the loss with memory_bank_size=0")
        if self.bank is not None and views[0].shape[1] != self.bank.dim:
            raise ValueError(f"the memory bank holds latents of dimension {self.bank.dim}, the outputs "
                             f"have {views[0].shape[1]}; build the loss with memory_bank_size=(K, "
                             f"{views[0].shape[1]})")
        return list(views)

    def _pairwise(self, num_views: int) -> bool:
        """True when the loss is lightly's two-view NT-Xent (the pooled prior)."""
        return num_views == 2 and self.multiview_prior.candidates == "pooled" \
            and self.multiview_prior.global_views is None

    def _terms(self, views: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        r"""(ELBO summed over this process's instances, the loss): the ELBO from
        :func:`~rpm.inference.rpm_elbo` on the prior of the form, the loss the affine function
        of it in the class docstring (over J views: :meth:`_loss_constants`).
        The energy normalises the outputs (once: a second ``F.normalize`` would scale a zero
        row's gradient again)."""
        if self.memory_bank_size > 0 and self.bank is None:
            self._init_bank(views[0].shape[1], like=views[0])
        num = views[0].shape[0]
        if self.bank is not None:
            value = rpm_elbo(self._bank_prior, views)
            return value, math.log(len(self.bank) + 1) - value / num
        candidates = Candidates(global_batch=self.gather_distributed)
        if self._pairwise(len(views)):
            value = rpm_elbo(self.prior, views, candidates=candidates)
            num_pairs = candidates.gather(views[0]).shape[0]  # M: the global batch (gathered once)
            return value, math.log(2 * num_pairs - 1) - value / num
        latents = torch.stack(views, dim=1)                                   # (N, J, D)
        value = rpm_elbo(self.multiview_prior, latents, candidates=candidates)
        total = candidates.gather(latents).shape[0]  # M (gathered once, by the prior)
        constant, weight = self._loss_constants(num, total, len(views))
        return value, constant - len(views) * value / weight

    def _loss_constants(self, num: int, total: int, num_views: int) -> tuple[float, float]:
        r"""The constant c and the weight w of the J-view loss
        :math:`L = c - \frac{1}{w} \sum_k r_k = c - \frac{J}{w} \mathcal{L}` over this
        process's N J anchors (the prior's ELBO :math:`\mathcal{L}` is the mean over the J
        centres of the anchors' terms :math:`r_k`, ``rpm.priors._multiview_terms``), from the
        anchors' numbers of positives :math:`|P(k)|` and of candidates :math:`D_k`, M
        instances in the (global) batch:

        * a global view (every view without ``global_views``): :math:`|P| = J - 1`,
          :math:`D = MJ - 1` (pooled) or :math:`M (J - 1)` (cross-view);
        * a local crop (view :math:`\ge G`): :math:`|P| = G`, :math:`D = MG` (the global crops);

        :math:`L_\text{out}`: :math:`w = \sum_k |P(k)|`,
        :math:`c = \frac1w \sum_k |P(k)| \log D_k`; :math:`L_\text{in}`: :math:`w = NJ`,
        :math:`c = \frac1w \sum_k \log(D_k / |P(k)|)`.
        """
        prior = self.multiview_prior
        globals_ = num_views if prior.global_views is None else prior.global_views
        locals_ = num_views - globals_
        size_global = (total * num_views - 1 if prior.candidates == "pooled"
                       else total * (num_views - 1))
        size_local = total * globals_
        if self.form == "out":
            weight = num * (globals_ * (num_views - 1) + locals_ * globals_)
            constant = num * (globals_ * (num_views - 1) * math.log(size_global)
                              + locals_ * globals_ * math.log(size_local)) / weight
        else:
            weight = num * num_views
            constant = num * (globals_ * math.log(size_global / (num_views - 1))
                              + locals_ * math.log(size_local / globals_)) / weight
        return constant, weight

    def rpm_prior(self, num_views: int = 2) -> MultiViewImplicitPrior | PooledImplicitPrior:
        r"""The prior whose ELBO :meth:`elbo` returns for batches of ``num_views`` views, a new
        one each call (Pyro cannot move a PyroModule that already ran into a model) on an energy
        sharing this loss's temperature (:meth:`ScaledCosineEnergy.shared`, a learned one
        included): :class:`~rpm.priors.PooledImplicitPrior`
        (two views), the star or mixture prior (J views, or cross-view candidates), or, with a
        memory bank, :class:`~rpm.priors.StarImplicitPrior` with ``candidates="positives"``,
        ``centres=[0]`` and the bank as its queue (evaluating it never pushes; a loop that
        trains it pushes the keys itself, ``bank.push(keys)``, after the step). For
        ``rpm.RPM(rpm.DeltaRecognition(net), loss.rpm_prior(J))``, whose negative ELBO per
        instance under :class:`~rpm.RPMELBO` is ``-loss.elbo(*views)``.

        :param int num_views: J.
        """
        energy = self.energy.shared()
        if self.memory_bank_size > 0:
            if self.bank is None:
                raise ValueError("the memory bank is created at the first call (or give "
                                 "memory_bank_size=(K, D)); call the loss once before rpm_prior()")
            return _moco_prior(energy, self.bank)
        if self._pairwise(num_views):
            return PooledImplicitPrior(energy)
        return type(self.multiview_prior)(energy, candidates=self.multiview_prior.candidates,
                                          global_views=self.multiview_prior.global_views)

    def elbo(self, *views: torch.Tensor) -> torch.Tensor:
        r"""The RPM ELBO per instance, :math:`\mathcal{L}/N`: :math:`-\text{NT-Xent} + \log(2N - 1)`
        (two views), :math:`-L_\text{MoCo} + \log(K + 1)` (bank; leaves the bank unchanged), or
        over J views :math:`(J - 1)(-L_\text{out} + \log D)` (``form="out"``) and
        :math:`-L_\text{in} + \log(D/(J-1))` (``form="in"``).

        :param views: ``out0, out1`` or J outputs (or one list of them), each of shape (N, D).
        :return: a scalar tensor (nats).
        """
        outputs = self._views(views)
        value, _ = self._terms(outputs)
        return value / outputs[0].shape[0]

    def forward(self, *views: torch.Tensor) -> torch.Tensor:
        r"""The mean loss, :math:`-\mathcal{L}/N + \log(2N - 1)` (NT-Xent), :math:`-\mathcal{L}/N
        + \log(K + 1)` (MoCo), :math:`L_\text{out}` or :math:`L_\text{in}` (J views); then, when
        ``out0`` requires a gradient, a bank takes the normalised, detached ``out1`` (gathered
        from every process with ``gather_distributed``) by lightly's rules (class docstring).

        :param views: ``out0, out1`` (first and second views' outputs, each (N, D)), or J
            outputs (or one list of them).
        :return: a scalar tensor (nats), positive.
        """
        outputs = self._views(views)
        _, loss = self._terms(outputs)
        # lightly's rule: only a batch that will be back-propagated enters the bank
        if self.bank is not None and torch.is_grad_enabled() and outputs[0].requires_grad:
            keys = unit_vectors(outputs[1].detach())
            if self.gather_distributed:
                keys = all_gather_with_grad(keys)
            # lightly's pointer: fill to the end of the bank, drop the rest, restart at row 0
            self.bank.push(keys[: self.bank.size - int(self.bank.head)])
        return loss


class InfoNCELoss(torch.nn.Module):
    r"""The InfoNCE loss as info-nce-pytorch's ``InfoNCE`` computes it, and the RPM ELBO it is
    (``docs/theory.md``, "InfoNCE identity" and "J-view priors").

    ``forward(query, positive_key)``: the outputs are normalised and the logits are
    :math:`F_{ij} = \hat q_i^\top \hat k_j / \tau` (:class:`ScaledCosineEnergy`); each query's
    candidates are the N positive keys of the batch, its own among them (cross-view, one
    direction):

    .. math::

        \text{InfoNCE} = \frac1N \sum_i -\log \frac{e^{F_{ii}}}{\sum_j e^{F_{ij}}},
        \qquad \mathcal{L}/N = -\text{InfoNCE} + \log N,

    the ELBO of :class:`~rpm.priors.ImplicitPrior` (Eq. 23-25 of Aitchison & Ganev).
    ``forward(query, positive_key, negative_keys)`` with M unpaired negatives (M, D): each
    query's candidates are its own positive and the M negatives,

    .. math::

        \text{InfoNCE} = \frac1N \sum_i -\log \frac{e^{F_{ii}}}
            {e^{F_{ii}} + \sum_m e^{\hat q_i^\top \hat n_m / \tau}},
        \qquad \mathcal{L}/N = -\text{InfoNCE} + \log(M + 1),

    the ELBO of :class:`~rpm.priors.StarImplicitPrior` with ``candidates="positives"``,
    ``centres=[0]`` and the negatives as the step's explicit candidates
    (``rpm.inference.Candidates(negatives=negative_keys)``, with their gradient; MoCo's form,
    :meth:`rpm_prior`).

    .. code-block:: python

        loss_fn = rpm.losses.InfoNCELoss(temperature=0.1)
        loss = loss_fn(head(backbone(x0)), head(backbone(x1)))      # info-nce-pytorch's value
        elbo_per_pair = loss_fn.elbo(head(backbone(x0)), head(backbone(x1)))  # = -loss + log N

    :param float temperature: :math:`\tau > 0` (info-nce-pytorch's default 0.1; the initial
        one when learned).
    :param str reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (the N per-query losses).
    :param str negative_mode: ``"unpaired"``: negative keys (M, D) shared by every query (the
        one mode with an RPM prior here).
    :param bool learn_temperature: learn :math:`\tau` as CLIP does (log-parametrised logit
        scale clipped at 100: :class:`ScaledCosineEnergy`).
    """

    def __init__(self, temperature: float = 0.1, reduction: str = "mean",
                 negative_mode: str = "unpaired", learn_temperature: bool = False):
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if negative_mode != "unpaired":
            raise ValueError(f"negative_mode must be 'unpaired' (negative keys (M, D) shared by "
                             f"every query), got {negative_mode!r}")
        self.reduction = reduction
        self.negative_mode = negative_mode
        self.energy = ScaledCosineEnergy(temperature, learn=learn_temperature)
        self.prior = ImplicitPrior(self.energy)
        # MoCo's prior without a queue: a call's negatives are its explicit candidates;
        # outside the submodules (its energy is this loss's own)
        object.__setattr__(self, "_negatives_prior", _moco_prior(self.energy, None))

    @property
    def temperature(self) -> float:
        r"""The current temperature :math:`\tau`, a float."""
        return self.energy.temperature

    def _check(self, query, positive_key, negative_keys) -> None:
        _check_outputs([query, positive_key], ["query", "positive_key"], "InfoNCELoss")
        if negative_keys is not None:
            if not isinstance(negative_keys, torch.Tensor) or negative_keys.dim() != 2 \
                    or negative_keys.shape[1] != query.shape[1]:
                got = (tuple(negative_keys.shape) if isinstance(negative_keys, torch.Tensor)
                       else type(negative_keys).__name__)
                raise ValueError(f"InfoNCELoss takes unpaired negative_keys of shape (M, "
                                 f"{query.shape[1]}); got {got}")

    def _ratio(self, query, positive_key, negative_keys) -> tuple[torch.Tensor, float]:
        """Per-query ELBO terms (N,) (:func:`~rpm.inference.rpm_elbo` on :class:`ImplicitPrior`,
        or on MoCo's prior with the negatives as the step's explicit candidates,
        ``Candidates(negatives=...)``, as given, with their gradient) and the constant log N or
        log(M + 1)."""
        self._check(query, positive_key, negative_keys)
        if negative_keys is None:
            ratio = rpm_elbo(self.prior, [query, positive_key], per_instance=True)
            return ratio, math.log(query.shape[0])
        ratio = rpm_elbo(self._negatives_prior, [query, positive_key],
                         candidates=Candidates(negatives=negative_keys), per_instance=True)
        return ratio, math.log(negative_keys.shape[0] + 1)

    def rpm_prior(self, negative_keys: torch.Tensor | None = None):
        r"""The prior whose ELBO :meth:`elbo` returns: :class:`~rpm.priors.ImplicitPrior` (no
        negatives), or a :class:`~rpm.priors.StarImplicitPrior` (``candidates="positives"``,
        ``centres=[0]``) whose queue holds a detached copy of ``negative_keys`` (a model's
        queue: the same ELBO as :meth:`elbo`, without a gradient in the negatives; evaluating
        it leaves the queue as it is). A new prior each call, on an energy sharing
        this loss's temperature (:meth:`ScaledCosineEnergy.shared`).

        :param negative_keys: shape (M, D), or None.
        """
        energy = self.energy.shared()
        if negative_keys is None:
            return ImplicitPrior(energy)
        queue = LatentQueue(negative_keys.shape[0], negative_keys.shape[1]).to(negative_keys)
        queue.push(negative_keys)
        return _moco_prior(energy, queue)

    def elbo(self, query: torch.Tensor, positive_key: torch.Tensor,
             negative_keys: torch.Tensor | None = None) -> torch.Tensor:
        r"""The RPM ELBO per pair, :math:`\mathcal{L}/N = -\text{InfoNCE} + \log N` (or
        :math:`+ \log(M + 1)` with negatives).

        :param torch.Tensor query: shape (N, D).
        :param torch.Tensor positive_key: shape (N, D), row i the positive of query i.
        :param negative_keys: shape (M, D), or None.
        :return: a scalar tensor (nats).
        """
        ratio, _ = self._ratio(query, positive_key, negative_keys)
        return ratio.mean()

    def forward(self, query: torch.Tensor, positive_key: torch.Tensor,
                negative_keys: torch.Tensor | None = None) -> torch.Tensor:
        r"""info-nce-pytorch's value: the cross-entropy of each query's logits against its
        positive, reduced by ``reduction``; per query it is :math:`-r_i + \log N` (or
        :math:`\log(M + 1)`), :math:`r_i` the query's ELBO term.

        :param torch.Tensor query: shape (N, D).
        :param torch.Tensor positive_key: shape (N, D).
        :param negative_keys: unpaired negatives, shape (M, D), or None.
        :return: a scalar (``"mean"``, ``"sum"``) or shape (N,) (``"none"``).
        """
        ratio, constant = self._ratio(query, positive_key, negative_keys)
        losses = constant - ratio
        if self.reduction == "mean":
            return losses.mean()
        if self.reduction == "sum":
            return losses.sum()
        return losses


def info_nce(logits: torch.Tensor) -> torch.Tensor:
    r"""The InfoNCE loss (CPC, Oord et al. 2018) of a batch of N positive pairs (i, i) from its
    logits :math:`F_{ij} = f(z_i, z'_j)`: the mean cross-entropy of row i against label i,

    .. math::

        \text{InfoNCE} = \frac1N \sum_i -\log \frac{e^{F_{ii}}}{\sum_j e^{F_{ij}}}.

    The per-pair RPM ELBO under the implicit prior with energy f (Eq. 23-25 of Aitchison &
    Ganev) is :math:`\mathcal{L}_i = F_{ii} - \log \frac1N \sum_j e^{F_{ij}}`, so
    :math:`\frac1N \sum_i \mathcal{L}_i = -\text{InfoNCE} + \log N`.

    :param torch.Tensor logits: :math:`F_{ij}`, shape (N, N); the positives on the diagonal.
    :return: a scalar.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 \
            or logits.shape[0] != logits.shape[1]:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(
            "logits must be the square matrix F_ij = f(z_i, z'_j) of a batch of positive pairs, "
            f"shape (N, N); got {shape}")
    labels = torch.arange(logits.shape[0], device=logits.device)
    return torch.nn.functional.cross_entropy(logits, labels)


# ---------------------------------------------------------------------------------------------
# lightly's other losses: redundancy reduction (VICReg, Barlow Twins, LeJEPA's SIGReg), the
# decoupled contrastive loss (DCL, DCLW) and alignment-uniformity (Hypersphere)
# ---------------------------------------------------------------------------------------------


def _check_gather(gather_distributed) -> bool:
    """``gather_distributed`` as a bool, refused (as lightly refuses it) when this torch has no
    ``torch.distributed``."""
    gather_distributed = check_bool("gather_distributed", gather_distributed)
    if gather_distributed and not torch.distributed.is_available():
        raise ValueError("gather_distributed is True but torch.distributed is not available: "
                         "pass gather_distributed=False or install a torch with distributed "
                         "support")
    return gather_distributed


def _check_pair(z_a, z_b, names: tuple[str, str], what: str, min_batch: int,
                any_rank: bool = False) -> None:
    """Two tensors of one shape (N, D) (or (N, ..., D) with ``any_rank``) with N >= min_batch."""
    shape = "(N, ..., D)" if any_rank else "(N, D)"
    for name, z in zip(names, (z_a, z_b), strict=True):
        if not isinstance(z, torch.Tensor) or z.dim() < 2 or (not any_rank and z.dim() != 2):
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise ValueError(f"{what} takes {name} of shape {shape}, one row per image; got {got}")
    if z_a.shape != z_b.shape:
        raise ValueError(f"{what} needs {names[0]} and {names[1]} of the same shape, row i of "
                         f"each a view of image i; got {tuple(z_a.shape)} and {tuple(z_b.shape)}")
    if z_a.shape[0] < min_batch:
        raise ValueError(f"{what} needs a batch of at least {min_batch} images, got "
                         f"{z_a.shape[0]} ({names[0]} of shape {tuple(z_a.shape)})")


#: The correlation :math:`\rho` of the Gaussian pair prior in the losses' ``elbo`` by default:
#: each coordinate of one view's output correlated 0.9 with the other view's.
_DEFAULT_CORRELATION = 0.9
#: The star prior's scale s in :meth:`LeJEPALoss.elbo` by default: :math:`1/(1 + s^2) = 0.9`,
#: the same correlation between any two views.
_DEFAULT_STAR_SCALE = 1.0 / 3.0


def _gaussian_pair_elbo(z_a: torch.Tensor, z_b: torch.Tensor,
                       correlation: float = _DEFAULT_CORRELATION,
                       what: str = "_gaussian_pair_elbo") -> torch.Tensor:
    r"""The ELBO per pair of the Gaussian pair RPM on two views' outputs (``docs/theory.md``,
    Gaussian RPM): Delta recognition at the outputs, :class:`~rpm.priors.GaussianPairPrior`
    :math:`P(z) = \mathcal N(0, I)`, :math:`P(z'|z) = \mathcal N(\rho z, (1 - \rho^2) I)`,
    and each view's moment-matched Gaussian marginal (batch mean, 1/N covariance),

    .. math::

        \frac{\mathcal L}{N} = \operatorname{mean}_n \log P_\rho(z_n, z'_n)
            - \operatorname{mean}_n \log \mathcal N(z_n; m, S)
            - \operatorname{mean}_n \log \mathcal N(z'_n; m', S'),

    computed by :func:`rpm.inference.rpm_elbo` with ``marginal="gaussian"``; the ELBO that
    :class:`VICRegLoss` and :class:`BarlowTwinsLoss` are surrogates of.

    :param torch.Tensor z_a: the first views' outputs, shape (N, D), N >= D + 1 (a
        nonsingular S).
    :param torch.Tensor z_b: the second views', the same shape.
    :param float correlation: :math:`\rho \in (-1, 1)`.
    :param str what: the caller's name in error messages.
    :return: a scalar tensor (nats).
    """
    _check_pair(z_a, z_b, ("z_a", "z_b"), what, 2)
    prior = GaussianPairPrior(z_a.shape[1], correlation=correlation)
    return rpm_elbo(prior, [z_a, z_b], marginal="gaussian") / z_a.shape[0]


class VICRegLoss(torch.nn.Module):
    r"""VICReg's loss (Bardes, Ponce & LeCun 2022) as lightly's ``VICRegLoss`` computes it, with
    its arguments, defaults and value.

    For outputs :math:`Z, Z'` of shape (N, D) (or (N, ..., D): every leading index after the
    batch is a separate set of N latents, VICRegL's form),

    .. math::

        L = \lambda\, \frac{1}{ND} \sum_{n,d} (z_{nd} - z'_{nd})^2
            + \mu\, \tfrac12 \big(v(Z) + v(Z')\big) + \nu\, \big(c(Z) + c(Z')\big),

    .. math::

        v(Z) = \frac1D \sum_d \max\big(0,\ 1 - \sqrt{S_{dd} + \epsilon}\big), \qquad
        c(Z) = \frac1D \sum_{d \ne e} S_{de}^2, \qquad
        S = \frac{1}{N - 1} \sum_n (z_n - \bar z)(z_n - \bar z)^\top,

    the unbiased batch covariance :math:`S`; with leading indices every term is averaged over
    them. With ``gather_distributed`` :math:`v` and :math:`c` run over the global batch (the
    outputs of every process, :func:`rpm.distributed.all_gather_with_grad`), the invariance over
    this process's pairs; without an initialised ``torch.distributed`` nothing is gathered.

    **Probabilistic reading.** The Gaussian RPM (an explicit Gaussian prior :math:`P(z, z')`,
    each view's marginal moment-matched to :math:`\mathcal N(m, S)`) has, per pair,
    :math:`\mathcal L/N = \operatorname{mean}_n \log P(z_n, z'_n)
    - \operatorname{mean}_n \log \mathcal N(z_n; m, S) - \operatorname{mean}_n \log
    \mathcal N(z'_n; m', S')`, and for Delta recognition each of the last two terms is
    :math:`\tfrac D2 (1 + \log 2\pi) + \tfrac12 \log\det S`. The invariance term is the pair
    prior's :math:`-\log P(z' | z)` up to scale (:math:`\rho \to 1`); the variance and covariance
    terms approximate the anti-collapse :math:`\tfrac12 \log\det S = \tfrac12 \sum_d \log S_{dd}
    + \tfrac12 \log\det R` (R the correlation matrix): the hinge raises each
    :math:`S_{dd}`, the covariance penalty drives R to I, where :math:`\log\det R \le 0` is
    largest. So the loss is a **surrogate** of the Gaussian pair RPM's ELBO, not a bound on
    anything; :meth:`elbo` returns that ELBO for the same outputs.

    .. code-block:: python

        loss_fn = rpm.losses.VICRegLoss()
        loss = loss_fn(head(backbone(x0)), head(backbone(x1)))

    :param float lambda_param: :math:`\lambda \ge 0`, the weight of the invariance term.
    :param float mu_param: :math:`\mu \ge 0`, the weight of the variance term.
    :param float nu_param: :math:`\nu \ge 0`, the weight of the covariance term.
    :param bool gather_distributed: compute the variance and covariance over the global batch.
    :param float eps: :math:`\epsilon \ge 0` inside the square root of the variance term.
    """

    def __init__(self, lambda_param: float = 25.0, mu_param: float = 25.0, nu_param: float = 1.0,
                 gather_distributed: bool = False, eps: float = 0.0001):
        super().__init__()
        self.lambda_param = check_nonnegative("lambda_param", lambda_param)
        self.mu_param = check_nonnegative("mu_param", mu_param)
        self.nu_param = check_nonnegative("nu_param", nu_param)
        self.gather_distributed = _check_gather(gather_distributed)
        self.eps = check_nonnegative("eps", eps)

    def forward(self, z_a: torch.Tensor, z_b: torch.Tensor) -> torch.Tensor:
        r"""The loss :math:`L` (class docstring).

        :param torch.Tensor z_a: the first views' outputs, shape (N, ..., D), N >= 2.
        :param torch.Tensor z_b: the second views', the same shape.
        :return: a scalar tensor.
        """
        _check_pair(z_a, z_b, ("z_a", "z_b"), "VICRegLoss", 2, any_rank=True)
        invariance = (z_a - z_b).square().mean()
        if self.gather_distributed:
            z_a, z_b = all_gather_with_grad(z_a), all_gather_with_grad(z_b)
        variance = 0.5 * (self._variance(z_a) + self._variance(z_b))
        covariance = self._covariance(z_a) + self._covariance(z_b)
        return self.lambda_param * invariance + self.mu_param * variance \
            + self.nu_param * covariance

    def _variance(self, z: torch.Tensor) -> torch.Tensor:
        """v(Z): the hinge on each dimension's batch standard deviation, averaged."""
        std = (z.var(dim=0) + self.eps).sqrt()                                # (..., D)
        return torch.relu(1.0 - std).mean()

    @staticmethod
    def _covariance(z: torch.Tensor) -> torch.Tensor:
        """c(Z): the squared off-diagonal entries of the batch covariance over D."""
        centred = z - z.mean(dim=0)
        dim = z.shape[-1]
        # b: batch, c and d: latent dimensions, ...: VICRegL's leading indices
        cov = torch.einsum("b...c,b...d->...cd", centred, centred) / (z.shape[0] - 1)
        off_diagonal = cov.square().sum((-2, -1)) - cov.diagonal(dim1=-2, dim2=-1).square().sum(-1)
        return (off_diagonal / dim).mean()

    def elbo(self, z_a: torch.Tensor, z_b: torch.Tensor,
             correlation: float = _DEFAULT_CORRELATION) -> torch.Tensor:
        r"""The ELBO per pair of the Gaussian pair RPM whose surrogate the loss is: Delta
        recognition at the outputs, :class:`~rpm.priors.GaussianPairPrior` with correlation
        :math:`\rho` and the moment-matched marginals (``rpm.inference.rpm_elbo(...,
        marginal="gaussian")``),

        .. math::

            \frac{\mathcal L}{N} = \operatorname{mean}_n \log P_\rho(z_n, z'_n)
                + D (1 + \log 2\pi) + \tfrac12 \log\det S + \tfrac12 \log\det S'.

        Over this process's batch (``gather_distributed`` does not apply).

        :param torch.Tensor z_a: the first views' outputs, shape (N, D), N >= D + 1.
        :param torch.Tensor z_b: the second views', the same shape.
        :param float correlation: :math:`\rho \in (-1, 1)` (default 0.9).
        :return: a scalar tensor (nats).
        """
        return _gaussian_pair_elbo(z_a, z_b, correlation, "VICRegLoss.elbo")


class BarlowTwinsLoss(torch.nn.Module):
    r"""Barlow Twins' loss (Zbontar et al. 2021, Algorithm 1) as lightly's ``BarlowTwinsLoss``
    computes it, with its arguments, defaults and value.

    Each column of the outputs :math:`Z, Z'` (N, D) is standardised over the batch,
    :math:`\tilde z_{nd} = (z_{nd} - \bar z_d) / \sqrt{\sigma_d^2 + 10^{-5}}` with the biased
    batch variance :math:`\sigma_d^2` (``F.batch_norm`` in training mode, without its affine
    parameters), and with the cross-correlation :math:`C = \tilde Z^\top \tilde Z' / N`

    .. math::

        L = \sum_d (1 - C_{dd})^2 + \lambda \sum_{d \ne e} C_{de}^2.

    With ``gather_distributed`` :math:`C` runs over the global batch (each process standardises
    its own outputs, as lightly does; the standardised rows of every process are gathered with
    :func:`rpm.distributed.all_gather_with_grad`, which for batches of equal size is lightly's
    average of the processes' matrices); without an initialised ``torch.distributed`` nothing
    is gathered. It is therefore not the loss of one process on the concatenated batch, which
    standardises over all its rows: ``DistributedDataParallel``'s gradient is that of
    :math:`L` with :math:`\tilde z` standardised per process's rows.

    **Probabilistic reading.** A **surrogate** of the Gaussian pair RPM's ELBO (see
    :class:`VICRegLoss`; :meth:`elbo` returns it), not a bound: standardising pins the
    moment-matched marginals to unit variance, the diagonal term is the Gaussian pair prior's
    invariance as :math:`\rho \to 1`
    (for unit variances :math:`1 - C_{dd} = \tfrac12 \operatorname{mean}_n (\tilde z_{nd} -
    \tilde z'_{nd})^2`), and the off-diagonal term drives the cross-correlation, and with it the
    correlation R of each view, to I, where the anti-collapse :math:`\tfrac12 \log\det R` is
    largest.

    :param float lambda_param: :math:`\lambda \ge 0`, the weight of the redundancy-reduction
        term.
    :param bool gather_distributed: compute C over the global batch.
    """

    def __init__(self, lambda_param: float = 5e-3, gather_distributed: bool = False):
        super().__init__()
        self.lambda_param = check_nonnegative("lambda_param", lambda_param)
        self.gather_distributed = _check_gather(gather_distributed)

    def forward(self, z_a: torch.Tensor, z_b: torch.Tensor) -> torch.Tensor:
        r"""The loss :math:`L` (class docstring).

        :param torch.Tensor z_a: the first views' outputs, shape (N, D), N >= 2.
        :param torch.Tensor z_b: the second views', the same shape.
        :return: a scalar tensor.
        """
        _check_pair(z_a, z_b, ("z_a", "z_b"), "BarlowTwinsLoss", 2)
        standard_a, standard_b = (torch.nn.functional.batch_norm(
            z, running_mean=None, running_var=None, training=True, eps=1e-5) for z in (z_a, z_b))
        if self.gather_distributed:
            standard_a = all_gather_with_grad(standard_a)
            standard_b = all_gather_with_grad(standard_b)
        cross = standard_a.T @ standard_b / standard_a.shape[0]                # (D, D)
        diagonal = cross.diagonal()
        invariance = (1.0 - diagonal).square().sum()
        redundancy = cross.square().sum() - diagonal.square().sum()
        return invariance + self.lambda_param * redundancy

    def elbo(self, z_a: torch.Tensor, z_b: torch.Tensor,
             correlation: float = _DEFAULT_CORRELATION) -> torch.Tensor:
        r"""The ELBO per pair of the Gaussian pair RPM whose surrogate the loss is, for the
        outputs as given (not standardised), the same as :meth:`VICRegLoss.elbo`. Over this
        process's batch.

        :param torch.Tensor z_a: the first views' outputs, shape (N, D), N >= D + 1.
        :param torch.Tensor z_b: the second views', the same shape.
        :param float correlation: :math:`\rho \in (-1, 1)` (default 0.9).
        :return: a scalar tensor (nats).
        """
        return _gaussian_pair_elbo(z_a, z_b, correlation, "BarlowTwinsLoss.elbo")


class SIGReg(torch.nn.Module):
    r"""LeJEPA's Sketched Isotropic Gaussian Regularisation (Balestriero & LeCun 2025) as
    lightly's ``SIGReg`` computes it, with its arguments, defaults, value and random
    projections: for the same state of torch's default generator, the same slices.

    Each call draws K = ``num_vectors`` directions, the columns of ``torch.randn(D, K)``
    normalised to unit length, :math:`a_k`, and projects the N outputs onto them,
    :math:`x_{nk} = a_k^\top z_n`. For each slice it compares the empirical characteristic
    function with the standard Gaussian's, :math:`\phi(t) = e^{-t^2/2}`, by the Epps-Pulley
    statistic

    .. math::

        T_k = N \int_{-t_\text{max}}^{t_\text{max}} \phi(t)\, \Big|\frac1N \sum_n e^{i t x_{nk}}
            - \phi(t)\Big|^2 dt
            \approx N \sum_{m} w_m \phi(t_m) \Big[\big(\tfrac1N \textstyle\sum_n \cos t_m x_{nk}
            - \phi(t_m)\big)^2 + \big(\tfrac1N \sum_n \sin t_m x_{nk}\big)^2\Big],

    the integrand even in t, so evaluated on ``knots`` points :math:`t_m` evenly spaced on
    :math:`[0, t_\text{max}]` with twice the trapezoidal weights (:math:`w = (\Delta, 2\Delta,
    \dots, 2\Delta, \Delta)`, :math:`\Delta = t_\text{max} / (\text{knots} - 1)`). The loss is the
    mean of :math:`T_k` over the K slices (and over any leading index of the outputs).

    With ``gather_distributed`` the directions are rank 0's (broadcast) and N and the sums
    over n run over the global batch (gathered with
    :func:`rpm.distributed.all_gather_with_grad`); without an initialised
    ``torch.distributed`` nothing is gathered.

    **Probabilistic reading.** For the Gaussian RPM with the pair prior's marginal
    :math:`\mathcal N(0, I)` (see :class:`VICRegLoss`), each view's marginal terms are
    :math:`\operatorname{mean}_n \log \mathcal N(z_n; 0, I) - \operatorname{mean}_n \log
    \mathcal N(z_n; m, S) = -\mathrm{KL}(\mathcal N(m, S) \,\|\, \mathcal N(0, I))`, the
    anti-collapse :math:`\tfrac12 \log\det S` balanced by the prior's norm term, zero exactly
    when the moment-matched marginal is :math:`\mathcal N(0, I)`. SIGReg approximates it by a
    sliced test of the whole marginal (not its first two moments) against the isotropic
    Gaussian, zero at the same place.

    :param int knots: the number of frequencies :math:`t_m`, >= 2.
    :param float t_max: the largest frequency, > 0.
    :param int num_vectors: K, the number of random directions per call, >= 1.
    :param bool gather_distributed: run the statistic over the global batch.
    """

    def __init__(self, *, knots: int = 17, t_max: float = 3.0, num_vectors: int = 1024,
                 gather_distributed: bool = False):
        super().__init__()
        knots = check_int("knots", knots)
        if knots < 2:
            raise ValueError(f"knots must be an integer greater than one (the trapezoidal rule "
                             f"needs two frequencies), got {knots}")
        t_max = check_real("t_max", t_max)
        if t_max <= 0:
            raise ValueError(f"t_max must be greater than zero, got {t_max}")
        self.num_vectors = check_positive_int("num_vectors", num_vectors)
        self.gather_distributed = _check_gather(gather_distributed)
        # float64 buffers under lightly's names; each call reads them in the outputs' dtype
        t = torch.linspace(0.0, t_max, knots, dtype=torch.float64)
        step = t_max / (knots - 1)
        weights = torch.full((knots,), 2.0 * step, dtype=torch.float64)
        weights[[0, -1]] = step
        phi = torch.exp(-t.square() / 2.0)
        self.register_buffer("t", t)                    # (knots,) the frequencies t_m
        self.register_buffer("phi", phi)                # (knots,) phi(t_m)
        self.register_buffer("weights", weights * phi)  # (knots,) w_m phi(t_m)

    def forward(self, proj: torch.Tensor) -> torch.Tensor:
        r"""The mean Epps-Pulley statistic of the outputs' random slices (class docstring).

        :param torch.Tensor proj: the outputs, shape (..., N, D).
        :return: a scalar tensor.
        """
        if not isinstance(proj, torch.Tensor) or proj.dim() < 2 or proj.shape[-2] < 1 \
                or not proj.is_floating_point():
            got = tuple(proj.shape) if isinstance(proj, torch.Tensor) else type(proj).__name__
            raise ValueError(f"SIGReg takes floating-point projections of shape (..., N, D) with "
                             f"N >= 1; got {got}")
        gather = self.gather_distributed and is_distributed()
        num = proj.shape[-2]
        if gather:
            num = int(all_gather_with_grad(torch.tensor([num], device=collective_device())).sum())
        # lightly's draw, in the outputs' dtype, from torch's default generator
        directions = torch.randn(proj.shape[-1], self.num_vectors, device=proj.device,
                                 dtype=proj.dtype)                             # (D, K)
        if gather:
            torch.distributed.broadcast(directions, src=0)
        directions = directions / torch.linalg.vector_norm(directions, dim=0)
        # (..., N, K, knots): t_m a_k^T z_n
        phases = (proj @ directions).unsqueeze(-1) * self.t.to(proj.dtype)
        cos_sum, sin_sum = phases.cos().sum(-3), phases.sin().sum(-3)         # (..., K, knots)
        if gather:  # the sums over every process's outputs
            cos_sum = all_gather_with_grad(cos_sum.unsqueeze(0)).sum(0)
            sin_sum = all_gather_with_grad(sin_sum.unsqueeze(0)).sum(0)
        error = (cos_sum / num - self.phi.to(proj.dtype)).square() + (sin_sum / num).square()
        return (num * (error @ self.weights.to(proj.dtype))).mean()


class LeJEPALoss(torch.nn.Module):
    r"""LeJEPA's loss (Balestriero & LeCun 2025) as lightly's ``LeJEPALoss`` computes it, with
    its arguments, defaults and value: SIGReg on every view's outputs and the invariance of
    every view to the centroid of the global views,

    .. math::

        L = \lambda\, \mathrm{SIGReg}(Z_{1:V}) + (1 - \lambda)\, \frac{1}{VND} \sum_{v,n,d}
            (\bar z_{nd} - z_{vnd})^2, \qquad
        \bar z_n = \frac{1}{V_g} \sum_{g=1}^{V_g} z_{gn},

    the V views the :math:`V_g` global ones followed by the local ones, and SIGReg
    (:class:`SIGReg`, attribute ``sigreg``) averaged over the V views, one draw of directions
    for all of them.

    **Probabilistic reading.** The invariance term is, up to scale, the star prior's
    (SimVAE's: :math:`z_v = y + s\, \epsilon_v`, :math:`y \sim \mathcal N(0, I)`) conditional
    :math:`-\log \mathcal N(z_v; y, s^2 I)` with the shared latent y estimated by the global
    views' centroid; SIGReg stands for the marginal terms of the Gaussian RPM (see
    :class:`SIGReg`). So the loss is a **surrogate** of the Gaussian star RPM's ELBO, not a
    bound; :meth:`elbo` returns that ELBO (:class:`~rpm.priors.GaussianStarPrior`, y
    integrated out) for the same outputs.

    :param float lambda_param: :math:`\lambda \in [0, 1]`, the weight of SIGReg.
    :param bool gather_distributed: SIGReg over the global batch.
    :param int sigreg_knots: SIGReg's ``knots``.
    :param float sigreg_t_max: SIGReg's ``t_max``.
    :param int sigreg_num_vectors: SIGReg's ``num_vectors``.
    """

    def __init__(self, lambda_param: float = 0.05, gather_distributed: bool = False,
                 sigreg_knots: int = 17, sigreg_t_max: float = 3.0,
                 sigreg_num_vectors: int = 1024):
        super().__init__()
        lambda_param = check_real("lambda_param", lambda_param)
        if not 0.0 <= lambda_param <= 1.0:
            raise ValueError(f"lambda_param must be in the unit interval [0, 1] (the weight of "
                             f"SIGReg; the invariance term takes 1 - lambda_param), got "
                             f"{lambda_param}")
        self.lambda_param = lambda_param
        self.sigreg = SIGReg(knots=sigreg_knots, t_max=sigreg_t_max,
                             num_vectors=sigreg_num_vectors, gather_distributed=gather_distributed)

    def forward(self, *, local_proj: torch.Tensor, global_proj: torch.Tensor) -> torch.Tensor:
        r"""The loss :math:`L` (class docstring); both arguments keyword-only, as lightly's.

        :param torch.Tensor local_proj: the local views' outputs, shape (V_l, N, D), V_l >= 1.
        :param torch.Tensor global_proj: the global views' outputs, shape (V_g, N, D), V_g >= 1.
        :return: a scalar tensor.
        """
        views = self._views(local_proj, global_proj)                            # (V, N, D)
        invariance = (global_proj.mean(0) - views).square().mean()
        return self.lambda_param * self.sigreg(views) + (1.0 - self.lambda_param) * invariance

    @staticmethod
    def _views(local_proj: torch.Tensor, global_proj: torch.Tensor) -> torch.Tensor:
        """The V views, global then local, (V, N, D), after checking the shapes."""
        for name, proj in (("local_proj", local_proj), ("global_proj", global_proj)):
            if not isinstance(proj, torch.Tensor) or proj.dim() != 3 or proj.shape[0] < 1:
                got = tuple(proj.shape) if isinstance(proj, torch.Tensor) else type(proj).__name__
                raise ValueError(f"LeJEPALoss takes {name} of shape (V, N, D) with at least one "
                                 f"view; got {got}")
        if local_proj.shape[1:] != global_proj.shape[1:]:
            raise ValueError(f"LeJEPALoss needs local_proj and global_proj with the same batch "
                             f"and feature dimensions (N, D); got {tuple(local_proj.shape)} and "
                             f"{tuple(global_proj.shape)}")
        return torch.cat([global_proj, local_proj])

    def elbo(self, *, local_proj: torch.Tensor, global_proj: torch.Tensor,
             scale: float = _DEFAULT_STAR_SCALE) -> torch.Tensor:
        r"""The ELBO per instance of the Gaussian star RPM whose surrogate the loss is: Delta
        recognition at the V outputs of each instance, :class:`~rpm.priors.GaussianStarPrior`
        with scale s (the content y integrated out) and each view's moment-matched marginal,

        .. math::

            \frac{\mathcal L}{N} = \operatorname{mean}_n \log \mathcal N\big(\operatorname{vec}
                z_{n,1:V};\ 0,\ \mathbf 1 \mathbf 1^\top \otimes I + s^2 I\big)
                + \sum_v \Big[\tfrac D2 (1 + \log 2\pi) + \tfrac12 \log\det S_v\Big].

        Over this process's batch; V = V_g + V_l >= 2.

        :param torch.Tensor local_proj: the local views' outputs, shape (V_l, N, D).
        :param torch.Tensor global_proj: the global views' outputs, shape (V_g, N, D).
        :param float scale: s > 0 (default 1/3: any two views correlated 0.9, as
            :meth:`VICRegLoss.elbo`'s default).
        :return: a scalar tensor (nats).
        """
        views = self._views(local_proj, global_proj)                            # (V, N, D)
        latents = views.transpose(0, 1)                                         # (N, V, D)
        prior = GaussianStarPrior(latents.shape[-1], scale=scale)
        return rpm_elbo(prior, latents, marginal="gaussian") / latents.shape[0]


def _negative_von_mises_fisher_weights(out0: torch.Tensor, out1: torch.Tensor,
                                       sigma: float) -> torch.Tensor:
    r"""DCLW's weights :math:`w_i = 2 - N \operatorname{softmax}_i(\hat z_i^\top \hat z'_i /
    \sigma)`, shape (N,), without a gradient (lightly's ``negative_mises_fisher_weights``)."""
    similarity = (out0.detach() * out1.detach()).sum(1) / sigma
    return 2.0 - out0.shape[0] * torch.softmax(similarity, dim=0)


class DCLLoss(torch.nn.Module):
    r"""The decoupled contrastive loss (Yeh et al. 2022, Eq. 6) as lightly's ``DCLLoss``
    computes it, with its arguments, defaults and value.

    The outputs are normalised, :math:`\hat u = u / \lVert u \rVert`, and
    :math:`f(u, v) = \hat u^\top \hat v / \tau`. Each :math:`z_i` is an anchor whose positive is
    :math:`z'_i` and whose candidates are the 2N - 2 latents of the other images,
    :math:`C(i) = \{z_j, z'_j : j \ne i\}` (NT-Xent's without the positive); the loss is
    symmetric in the views,

    .. math::

        L = \tfrac12 \big(\ell(Z, Z') + \ell(Z', Z)\big), \qquad
        \ell(Z, Z') = \frac1N \sum_i \Big[-w_i f(z_i, z'_i)
            + \log \sum_{u \in C(i)} e^{f(z_i, u)}\Big],

    with :math:`w_i = 1`, or ``weight_fn(out0, out1)`` of the normalised outputs (``(out1,
    out0)`` for the second direction). With ``gather_distributed`` the candidates are every
    process's latents but the anchor's own pair (:func:`rpm.distributed.all_gather_with_grad`),
    each process averaging over its own anchors; without an initialised ``torch.distributed``
    nothing is gathered.

    **Probabilistic reading.** With :math:`w = 1`, :math:`-\ell` is the implicit prior's
    log-ratio with its normaliser estimated from candidates that exclude the positive,
    :math:`r_i = f(z_i, z'_i) - \log \frac{1}{2N - 2} \sum_{u \in C(i)} e^{f(z_i, u)}`:
    :math:`L = -\frac{1}{2N} \sum_i (r_i + r'_i) + \log(2N - 2)`, the pooled prior's ELBO per
    pair (:class:`~rpm.priors.PooledImplicitPrior`) with the positive taken out of
    :math:`\hat Z`. rpm's candidate sets (``"pooled"``, ``"cross_view"``, ``"positives"``)
    all keep the positive, so this loss has no ``elbo`` method.

    :param float temperature: :math:`\tau > 0`.
    :param weight_fn: None, or a function of the normalised ``(out0, out1)`` (N, D) returning
        the weights :math:`w` of the positives, shape (N,).
    :param bool gather_distributed: take the candidates from every process.
    """

    def __init__(self, temperature: float = 0.1, weight_fn=None,
                 gather_distributed: bool = False):
        super().__init__()
        self.temperature = _check_temperature(temperature, "DCL uses 0.1")
        if weight_fn is not None and not callable(weight_fn):
            raise TypeError(f"weight_fn must be None or a function (out0, out1) -> weights of "
                            f"shape (N,), got {weight_fn!r}")
        self.weight_fn = weight_fn
        self.gather_distributed = _check_gather(gather_distributed)

    def forward(self, out0: torch.Tensor, out1: torch.Tensor) -> torch.Tensor:
        r"""The mean loss :math:`L` (class docstring).

        :param torch.Tensor out0: the first views' outputs, shape (N, D).
        :param torch.Tensor out1: the second views', the same shape.
        :return: a scalar tensor.
        """
        _check_pair(out0, out1, ("out0", "out1"), type(self).__name__, 1)
        out0, out1 = unit_vectors(out0), unit_vectors(out1)
        candidates = Candidates(global_batch=self.gather_distributed)
        all0, all1 = candidates.gather(out0), candidates.gather(out1)
        if all0.shape[0] < 2:
            raise ValueError(f"{type(self).__name__} needs a batch of at least 2 images (the "
                             f"negatives of an image are the others' views); got 1")
        # the column of each anchor's own image in the (gathered) batch
        own = torch.arange(out0.shape[0], device=out0.device) + candidates.offset(out0.shape[0])
        return 0.5 * (self._direction(out0, out1, all0, all1, own)
                      + self._direction(out1, out0, all1, all0, own))

    def _direction(self, anchors, positives, same_view, other_view, own) -> torch.Tensor:
        """:math:`\\ell` of one direction: anchors (N, D), their positives (N, D), the
        (gathered) candidates of the anchors' view and of the other view (M, D)."""
        positive = (anchors * positives).sum(1) / self.temperature                   # (N,)
        if self.weight_fn is not None:
            positive = positive * self._weights(anchors, positives)
        logits = torch.cat([anchors @ same_view.T, anchors @ other_view.T], 1) / self.temperature
        rows = torch.arange(anchors.shape[0], device=anchors.device)
        mask = torch.zeros_like(logits, dtype=torch.bool)                              # (N, 2M)
        mask[rows, own] = True                           # the anchor itself
        mask[rows, own + same_view.shape[0]] = True      # its positive
        negative = torch.logsumexp(logits.masked_fill(mask, -math.inf), dim=1)
        return (negative - positive).mean()

    def _weights(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        weights = self.weight_fn(anchors, positives)
        num = anchors.shape[0]
        if not isinstance(weights, torch.Tensor) or weights.shape not in ((num,), ()):
            got = tuple(weights.shape) if isinstance(weights, torch.Tensor) else repr(weights)
            raise ValueError(f"weight_fn must return the weights of the N = {num} positives, a "
                             f"tensor of shape ({num},); got {got}")
        return weights


class DCLWLoss(DCLLoss):
    r"""The weighted decoupled contrastive loss (Yeh et al. 2022) as lightly's ``DCLWLoss``
    computes it: :class:`DCLLoss` with the negative von Mises-Fisher weights

    .. math::

        w_i = 2 - N \frac{e^{\hat z_i^\top \hat z'_i / \sigma}}
            {\sum_j e^{\hat z_j^\top \hat z'_j / \sigma}},

    over this process's N pairs, held without a gradient (they average to 1 and are larger for
    the pairs whose views agree least). With ``gather_distributed`` the candidates are gathered
    but the weights stay each process's (as lightly's): ``DistributedDataParallel``'s gradient
    is that of :class:`DCLLoss` over the global batch weighted by each process's softmax, not
    that of this loss on the concatenated batch.

    **Probabilistic reading.** With the weights, the positive term is no longer the implicit
    prior's energy: a reweighted surrogate of :class:`DCLLoss`'s log-ratio.

    :param float temperature: :math:`\tau > 0`.
    :param float sigma: :math:`\sigma > 0`, the temperature of the weights.
    :param bool gather_distributed: take the candidates from every process.
    """

    def __init__(self, temperature: float = 0.1, sigma: float = 0.5,
                 gather_distributed: bool = False):
        sigma = check_positive("sigma", sigma)
        super().__init__(temperature=temperature,
                         weight_fn=functools.partial(_negative_von_mises_fisher_weights,
                                                     sigma=sigma),
                         gather_distributed=gather_distributed)
        self.sigma = sigma


class HypersphereLoss(torch.nn.Module):
    r"""Wang & Isola's (2020) alignment and uniformity on the hypersphere as lightly's
    ``HypersphereLoss`` computes it, with its arguments, defaults and value.

    The outputs are normalised, :math:`x_i = \hat z_i`, :math:`y_i = \hat z'_i`, and

    .. math::

        L = \frac1N \sum_i \lVert x_i - y_i \rVert^\alpha
            + \frac{\lambda}{2} \big(U(x) + U(y)\big), \qquad
        U(x) = \log \frac{2}{N(N - 1)} \sum_{i < j} e^{-t \lVert x_i - x_j \rVert^2}

    (computed as a log-sum-exp, so a large t gives a finite U where lightly's may be
    :math:`-\infty`). Like lightly's it takes no ``gather_distributed``: under
    ``torch.distributed`` each process's uniformity runs over its own N rows.

    **Probabilistic reading.** :math:`U(x)` is the log of the batch mean of the RBF implicit
    prior's normaliser :math:`\hat Z(x_i) = \frac{1}{N - 1} \sum_{j \ne i} e^{f(x_i, x_j)}`,
    :math:`f(u, v) = -t \lVert u - v \rVert^2`, estimated from the other latents of the
    anchor's view. With :math:`\alpha = 2` and :math:`\lambda = 1/t` (the defaults are such a
    pair), :math:`t L` is therefore, by Jensen's inequality, an upper bound on the negative
    log-ratio of that prior per pair,
    :math:`\frac{1}{2N} \sum_i [-f(x_i, y_i) + \log \hat Z(x_i) - f(y_i, x_i) + \log
    \hat Z(y_i)]`.

    :param float t: :math:`t > 0`, the RBF's inverse scale in the uniformity.
    :param float lam: :math:`\lambda \ge 0`, the weight of the uniformity.
    :param float alpha: :math:`\alpha > 0`, the power of the alignment distances.
    """

    def __init__(self, t: float = 1.0, lam: float = 1.0, alpha: float = 2.0):
        super().__init__()
        self.t = check_positive("t", t)
        self.lam = check_nonnegative("lam", lam)
        self.alpha = check_positive("alpha", alpha)

    def forward(self, z_a: torch.Tensor, z_b: torch.Tensor) -> torch.Tensor:
        r"""The loss :math:`L` (class docstring).

        :param torch.Tensor z_a: the first views' outputs, shape (N, D), N >= 2.
        :param torch.Tensor z_b: the second views', the same shape.
        :return: a scalar tensor.
        """
        _check_pair(z_a, z_b, ("z_a", "z_b"), "HypersphereLoss", 2)
        x, y = unit_vectors(z_a), unit_vectors(z_b)
        alignment = torch.linalg.vector_norm(x - y, dim=1).pow(self.alpha).mean()
        return alignment + self.lam * (self._uniformity(x) + self._uniformity(y)) / 2.0

    def _uniformity(self, x: torch.Tensor) -> torch.Tensor:
        """U(x): the log of the mean of exp(-t |x_i - x_j|^2) over the pairs i < j."""
        exponents = -self.t * torch.pdist(x).square()                       # (N (N - 1) / 2,)
        return torch.logsumexp(exponents, 0) - math.log(exponents.shape[0])
