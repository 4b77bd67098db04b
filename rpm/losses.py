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
"""

from __future__ import annotations

import math
import warnings

import torch

from rpm._objective import rpm_elbo
from rpm._validation import check_bool
from rpm.distributed import all_gather_with_grad
from rpm.marginals._candidates import Candidates, LatentQueue
from rpm.priors import ImplicitPrior, PartnerMixturePrior, PooledImplicitPrior, StarImplicitPrior
from rpm.priors._base import Energy
from rpm.priors._energies import CosineEnergy, unit_vectors
from rpm.priors._multiview import MultiViewImplicitPrior

__all__ = ["InfoNCELoss", "NTXentLoss", "ScaledCosineEnergy", "info_nce"]

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

    @property
    def kappa(self) -> torch.Tensor:
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
        views = self._views(views)
        value, _ = self._terms(views)
        return value / views[0].shape[0]

    def forward(self, *views: torch.Tensor) -> torch.Tensor:
        r"""The mean loss, :math:`-\mathcal{L}/N + \log(2N - 1)` (NT-Xent), :math:`-\mathcal{L}/N
        + \log(K + 1)` (MoCo), :math:`L_\text{out}` or :math:`L_\text{in}` (J views); then, when
        ``out0`` requires a gradient, a bank takes the normalised, detached ``out1`` (gathered
        from every process with ``gather_distributed``) by lightly's rules (class docstring).

        :param views: ``out0, out1`` (first and second views' outputs, each (N, D)), or J
            outputs (or one list of them).
        :return: a scalar tensor (nats), positive.
        """
        views = self._views(views)
        _, loss = self._terms(views)
        # lightly's rule: only a batch that will be back-propagated enters the bank
        if self.bank is not None and torch.is_grad_enabled() and views[0].requires_grad:
            keys = unit_vectors(views[1].detach())
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
