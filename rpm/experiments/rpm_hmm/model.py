r"""The RPM-HMM (Walker et al., 2023): the recognition parameterised model whose
discrete latents :math:`z_1, \dots, z_T \in \{0, \dots, K-1\}` form a hidden Markov chain, one
latent per frame :math:`x_t` of a chain of observations.

Each frame has a recognition factor, a softmax over the K states
(:class:`~rpm.CategoricalRecognition`), and its normaliser is the factor averaged over the M
frames the model is given (``docs/theory.md``, D1, with the frames as the instances),

.. math::

    F(z) = \frac1M \sum_{m=1}^{M} f(z \mid x_m).                                  \quad (H1)

The model is a Markov chain over the latents whose emission of frame t is the RPM's likelihood
:math:`P(x_t \mid z_t) = f(z_t \mid x_t)\, p_0(x_t) / F(z_t)` (:math:`p_0` the empirical
distribution of the M frames, normalised over them by (H1)):

.. math::

    P(x_{1:T}, z_{0:T}) = \pi(z_0) \prod_{t=1}^{T} A_{z_{t-1} z_t}\,
        \frac{f(z_t \mid x_t)}{F(z_t)}\, p_0(x_t),                                \quad (H2)

with Pyro's convention for :class:`~pyro.distributions.DiscreteHMM`: :math:`\pi` is the
distribution of :math:`z_0`, the state *before* the first frame. :math:`\pi` (``initial_logits``)
and A (``transition_logits``, rows old state -> new state) are learned with the encoder.
Summing (H2) over the :math:`K^{T+1}` paths is the forward algorithm, which
:class:`~pyro.distributions.DiscreteHMM` runs (in :math:`O(\log T)` parallel steps):

.. math::

    \log P(x_{1:T}) = \log \sum_{z_{0:T}} \pi(z_0) \prod_t A_{z_{t-1} z_t}\, e^{E_t(z_t)},
    \qquad E_t(z) = \log f(z \mid x_t) - \log F(z),                               \quad (H3)

here and everywhere in this module without the constant :math:`\sum_t \log p_0(x_t) = -T \log
M` (as :class:`~rpm.DiscreteRPM` leaves it out). The emissions enter (H3) as factors, Pyro's
:class:`~pyro.distributions.Unit` with ``log_factor`` :math:`E_t` (batch_shape (T, K)), the
observation distribution of the ``DiscreteHMM``. Maximising (H3) is the exact maximum
likelihood of Walker et al. (the ELBO at the exact posterior equals it, ``docs/theory.md`` D5).

**Posterior.** :math:`E_t(z)` enters (H3) linearly inside the log-sum-exp over paths, so the
exact smoothed marginals are its gradient,

.. math::

    q(z_t = k \mid x_{1:T}) = \frac{\partial \log P(x_{1:T})}{\partial E_t(k)},  \quad (H4)

which :meth:`RPMHMM.posterior_marginals` computes by differentiating ``DiscreteHMM.log_prob``
(autograd's backward pass through the forward algorithm is the backward algorithm; Pyro's
``DiscreteHMM.filter`` gives the last step's filtering distribution only).

**Pyro programs.** :meth:`RPMHMM.model` samples the observed site ``"chain"`` from the
``DiscreteHMM`` inside ``pyro.plate("windows", B)`` (a batch of B windows of W frames, each an
independent chain); its guide is empty, so ``Trace_ELBO``'s loss is :math:`-\log P`.
:meth:`RPMHMM.enumerated_model` writes the same joint (H2) for one chain with the latents as
sample sites ``"z_0"``, ..., ``"z_T"`` in ``pyro.markov``, enumerated in parallel, and the
emissions as ``pyro.factor`` sites ``"x_1"``, ..., ``"x_T"``: ``TraceEnum_ELBO`` sums the
paths out (its loss is the same :math:`-\log P`), ``TraceEnum_ELBO.compute_marginals`` gives
(H4) and ``pyro.infer.infer_discrete(temperature=0)`` the most probable path (Viterbi). It
costs a Python step per frame: use it on short chains.

References:
    W. I. Walker, H. Soulat, C. Yu, M. Sahani, "Unsupervised representation learning with
    recognition-parametrised probabilistic models", AISTATS 2023.
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro.distributions import Categorical, DiscreteHMM, Unit
from pyro.nn import PyroParam
from torch import nn
from torch.distributions import constraints

from rpm import CategoricalRecognition
from rpm._validation import check_int
from rpm.nn import NamedModule, pyro_method

__all__ = ["RPMHMM", "digits_mlp", "model_from_arguments"]

#: Pixels of one of scikit-learn's digits (8 x 8).
PIXELS = 64


def digits_mlp(num_states: int, hidden: int = 256) -> nn.Sequential:
    """The encoder's network: an 8x8 image, flattened, through two ReLU layers of ``hidden``
    units to K logits.

    Shape: input (N, 1, 8, 8); output (N, K)."""
    num_states = check_int("num_states", num_states, minimum=2)
    hidden = check_int("hidden", hidden, minimum=1)
    return nn.Sequential(nn.Flatten(), nn.Linear(PIXELS, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_states))


class RPMHMM(NamedModule):
    r"""The RPM-HMM (module docstring, Eq. H1-H4): a
    :class:`~rpm.CategoricalRecognition` factor per frame, a hidden Markov chain over its K
    states with learned initial and transition logits, and the normaliser (H1) over the frames
    given.

    .. code-block:: python

        model = RPMHMM(rpm.CategoricalRecognition(net, num_classes=K))
        loss = -model.log_likelihood(windows)         # windows: (B, W, ...), or Trace_ELBO
        q = model.posterior_marginals(chain[None])[0]  # (T, K), exact

    **Calls.** Every method takes ``frames`` of shape (B, W, ...): B windows of W consecutive
    frames (one chain: B = 1), ``...`` the frame's shape that the recognition network takes;
    the normaliser F is over all B * W frames. :meth:`enumerated_model` takes one chain
    (T, ...).

    :param recognition: :math:`f(z|x)`, a :class:`~rpm.CategoricalRecognition` over the K
        states.
    :param name: the prefix of the model's parameters in Pyro's param store.
    """

    default_name = "rpm_hmm"
    #: :math:`\log \pi` up to a constant (the state before the first frame). Shape: (K,).
    initial_logits: torch.Tensor
    #: :math:`\log A` up to a constant per row (old state, new state). Shape: (K, K).
    transition_logits: torch.Tensor

    def __init__(self, recognition: CategoricalRecognition, *, name: str | None = None):
        super().__init__(name)
        if not isinstance(recognition, CategoricalRecognition):
            raise TypeError(
                f"RPMHMM needs a CategoricalRecognition (softmax factors over K states), got "
                f"{type(recognition).__name__}; wrap the network that returns logits (N, K): "
                "rpm.CategoricalRecognition(net, num_classes=K)")
        num_states = recognition.num_classes
        self.recognition = recognition
        self.num_states = num_states
        self.initial_logits = PyroParam(  # type: ignore[assignment]
            torch.zeros(num_states), constraints.real)
        self.transition_logits = PyroParam(  # type: ignore[assignment]
            torch.zeros(num_states, num_states), constraints.real)

    @property
    def transition_matrix(self) -> torch.Tensor:
        """A, the learned transition probabilities (rows: old state; summing to 1), detached.
        Shape: (K, K)."""
        return torch.softmax(self.transition_logits.detach(), dim=-1)

    @property
    def initial_probs(self) -> torch.Tensor:
        r""":math:`\pi`, the learned distribution of the state before the first frame, detached.
        Shape: (K,)."""
        return torch.softmax(self.initial_logits.detach(), dim=-1)

    def _windows(self, frames: torch.Tensor) -> tuple[int, int]:
        if not isinstance(frames, torch.Tensor) or frames.dim() < 3:
            got = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
            raise ValueError(f"frames must be B windows of W frames, a tensor (B, W, ...), got "
                             f"{got}; one chain (T, ...) is frames[None]")
        if frames.shape[1] < 1 or frames.shape[0] < 1:
            raise ValueError(f"frames must hold at least one window of one frame, got shape "
                             f"{tuple(frames.shape)}")
        return frames.shape[0], frames.shape[1]

    @pyro_method
    def recognition_log_probs(self, frames: torch.Tensor) -> torch.Tensor:
        r""":math:`\log f(z \mid x)` of every frame. Shape: (B, W, K)."""
        num_windows, window = self._windows(frames)
        log_f = self.recognition(frames.reshape(num_windows * window, *frames.shape[2:])).logits
        return log_f.reshape(num_windows, window, self.num_states)

    @pyro_method
    def emission_log_factors(self, frames: torch.Tensor) -> torch.Tensor:
        r""":math:`E_t(z) = \log f(z \mid x_t) - \log F(z)` (H3), F over all B * W frames (H1).
        Shape: (B, W, K)."""
        log_f = self.recognition_log_probs(frames)  # (B, W, K)
        count = log_f.shape[0] * log_f.shape[1]
        log_normaliser = torch.logsumexp(log_f.reshape(count, -1), dim=0) - math.log(count)  # (K,)
        return log_f - log_normaliser

    def _chain(self, log_factors: torch.Tensor, detach: bool = False) -> DiscreteHMM:
        initial, transition = self.initial_logits, self.transition_logits
        if detach:
            initial, transition = initial.detach(), transition.detach()
        return DiscreteHMM(initial, transition, Unit(log_factors))  # batch (B,), event (W, 0)

    @pyro_method
    def model(self, frames: torch.Tensor) -> None:
        r"""The observed site ``"chain"`` ~ ``DiscreteHMM`` with the emission factors (H3),
        inside ``pyro.plate("windows", B)``: its log-density is (H3) of each window."""
        log_factors = self.emission_log_factors(frames)  # (B, W, K)
        num_windows, window = log_factors.shape[:2]
        with pyro.plate("windows", num_windows):
            pyro.sample("chain", self._chain(log_factors),
                        obs=log_factors.new_empty(num_windows, window, 0))

    @pyro_method
    def guide(self, frames: torch.Tensor) -> None:
        """Empty: :meth:`model` has no latent site (the ``DiscreteHMM`` sums the paths)."""

    @pyro_method
    def enumerated_model(self, frames: torch.Tensor) -> list[torch.Tensor]:
        r"""The joint (H2) of one chain with its latents as sample sites: ``"z_0"`` ~
        :math:`\pi`, ``"z_t"`` ~ :math:`A_{z_{t-1}, \cdot}` (enumerated in parallel, in
        ``pyro.markov``) and the factors ``"x_t"`` of log-density :math:`E_t(z_t)`, t = 1..T.

        :param torch.Tensor frames: one chain. Shape: (T, ...).
        :returns: the states :math:`z_0, \dots, z_T` (enumerated under ``TraceEnum_ELBO``).
        """
        log_factors = self.emission_log_factors(frames[None])[0]  # (T, K)
        state = pyro.sample("z_0", Categorical(logits=self.initial_logits),
                            infer={"enumerate": "parallel"})
        states = [state]
        for t in pyro.markov(range(1, log_factors.shape[0] + 1)):
            state = pyro.sample(f"z_{t}", Categorical(logits=self.transition_logits[state]),
                                infer={"enumerate": "parallel"})
            pyro.factor(f"x_{t}", log_factors[t - 1][state])
            states.append(state)
        return states

    @pyro_method
    def log_likelihood(self, frames: torch.Tensor) -> torch.Tensor:
        r""":math:`\sum_b \log P(x^b_{1:W})` (H3) of the B windows, without the constant
        :math:`-B W \log(B W)` of :math:`p_0`: a scalar with gradients, minus ``Trace_ELBO``'s
        loss on :meth:`model` and :meth:`guide`."""
        log_factors = self.emission_log_factors(frames)  # (B, W, K)
        num_windows, window = log_factors.shape[:2]
        empty = log_factors.new_empty(num_windows, window, 0)
        return self._chain(log_factors).log_prob(empty).sum()

    @pyro_method
    def posterior_marginals(self, frames: torch.Tensor) -> torch.Tensor:
        r"""The exact smoothed marginals :math:`q(z_t = k \mid x_{1:W})` of every window (H4):
        the gradient of ``DiscreteHMM.log_prob`` in the emission factors. Detached.
        Shape: (B, W, K), each row summing to 1."""
        with torch.enable_grad():
            log_factors = self.emission_log_factors(frames).detach().requires_grad_(True)
            empty = log_factors.new_empty(*log_factors.shape[:2], 0)
            log_p = self._chain(log_factors, detach=True).log_prob(empty).sum()
            (marginals,) = torch.autograd.grad(log_p, log_factors)
        return marginals

    def posterior_modes(self, frames: torch.Tensor) -> torch.Tensor:
        r"""The most probable state of each frame, :math:`\arg\max_k q(z_t = k \mid x_{1:W})`
        (the mode of each marginal (H4)). Shape: (B, W), int64."""
        return self.posterior_marginals(frames).argmax(-1)


def model_from_arguments(arguments: dict) -> RPMHMM:
    """The untrained model of ``rpm rpm-hmm`` from its model record
    (:mod:`rpm.experiments.trained`): :class:`RPMHMM` on the :func:`digits_mlp` ``(states,
    hidden)`` encoder.

    :param dict arguments: ``states`` (K), ``hidden``.
    """
    net = digits_mlp(arguments["states"], arguments["hidden"])
    return RPMHMM(CategoricalRecognition(net, num_classes=arguments["states"], validate=False))
