r"""The controlled generative process of Kirchhof, Kasneci and Oh (ICML 2023): inputs whose true
posterior over a latent on the sphere is a von Mises-Fisher distribution of known, input-dependent
concentration, and positive pairs of inputs whose latents are close.

**Inputs and posteriors.** An input is :math:`x \sim \mathcal U[0, 1]^P` (P = ``obs_dim``). Two
fixed random networks (:func:`leaky_mlp`, LeakyReLU, ``hidden`` units, torch's default
initialisation) give its posterior over the latent :math:`z \in S^{D-1}`,

.. math::

    P(z \mid x) = \mathrm{vMF}\big(z;\ \mu(x), \kappa(x)\big), \qquad
    \mu(x) = \frac{m(x)}{\lVert m(x) \rVert}, \qquad
    \log \kappa(x) = a\, \operatorname{softplus}(c(x)) + b,                      \quad (U1)

with m: P -> hidden -> hidden -> D and c: P -> hidden -> 1. The joint is
:math:`P(x)\, P(z \mid x)`: a latent is drawn *given* its input, so (U1) is the exact posterior
by construction, and :math:`\kappa(x)` is the true posterior concentration of x (the reference
code draws the latent from the input the same way). a and b are set once so that the
concentrations of 1000 reference inputs span exactly ``[kappa_min, kappa_max]`` (16 to 32 in
the reference run); fresh inputs may fall slightly outside.

**Smoothing.** m is then trained for ``smoothing_steps`` Adam steps (learning rate 0.01, 64
fresh inputs a step) so that nearby inputs get nearby means: the loss over the pairs
:math:`i \ge j` of the 64 (the diagonal included) is

.. math::

    \operatorname{mean}_{i \ge j} \big(\lVert x_i - x_j \rVert - d_{ij}\big)^2
    \big(\sqrt 2 - d_{ij}\big)^4, \qquad d_{ij} = 1 - \tfrac12 \mu(x_i)^\top \mu(x_j), \quad (U2)

the weight held constant in the gradient. :math:`d_{ij}` is written as the reference code
evaluates it (its ``1 - cos / 2`` parses as :math:`1 - \cos/2`). The reference code takes 5000
steps; 1000 give the same spread of the means. c and the rescaling are not changed. A
generator whose means do not spread over the sphere, i.e. whose smallest pairwise cosine among
1000 reference inputs' means is ``min_spread`` (0.5) or more, is drawn again.

**Positive pairs.** A reference input x and its latent :math:`z \sim P(z \mid x)`; candidates
:math:`x_c \sim P(x)` with latents :math:`z_c \sim P(z \mid x_c)`; a candidate is a positive
with probability

.. math::

    P(\text{pos} \mid z, z_c) = \sigma\big(\kappa_+ z^\top z_c - \ell\big), \qquad
    \ell = \log \frac{C_D(0)}{C_D(\kappa_+)},                                     \quad (U3)

the posterior probability that :math:`z_c` came from :math:`\mathrm{vMF}(z, \kappa_+)` rather
than from the uniform distribution on the sphere, at even prior odds (:math:`C_D` the vMF
normaliser, :math:`C_D(0)` the inverse area of the sphere). The partner :math:`x'` of x is a
candidate drawn uniformly among the accepted ones, so :math:`z' \mid z` has density
:math:`\propto P(z')\, \sigma(\kappa_+ z^\top z' - \ell)`. :math:`\ell` is computed exactly
here (11.15 for D = 10, :math:`\kappa_+ = 20`); the reference code uses a fitted polynomial
(9.50 there). The reference code draws ``oversampling_factor`` fresh candidates per reference
input and repeats for the inputs without a positive; :func:`ControlledProcess.sample_pairs`
draws one pool of ``pool_factor`` x N candidates for the N reference inputs of a batch and
gives each candidate to at most one of them (so no two pairs of a batch share an input),
drawing a new pool for the inputs left without one.

**The positive concentration a vMF prior should use.** (U3) is not a vMF conditional: the
acceptance saturates at 1 once :math:`\kappa_+ z^\top z' > \ell`, so the positive pairs are
spread more widely than :math:`\mathrm{vMF}(z, \kappa_+)` would spread them. Under a uniform
marginal the cosine :math:`c = z^\top z'` of a positive pair has density
:math:`\propto (1 - c^2)^{(D-3)/2}\, \sigma(\kappa_+ c - \ell)`, and
:func:`effective_concentration` is the concentration :math:`\bar\kappa` of the vMF
conditional with the same mean cosine,

.. math::

    A_D(\bar\kappa) = \mathbb E[c] = \frac{\int_0^\pi \cos\theta\, \sin^{D-2}\theta\,
    \sigma(\kappa_+ \cos\theta - \ell)\, d\theta}{\int_0^\pi \sin^{D-2}\theta\,
    \sigma(\kappa_+ \cos\theta - \ell)\, d\theta},                         \quad (U4)

:math:`A_D(\kappa) = I_{D/2}(\kappa) / I_{D/2-1}(\kappa)` the vMF's mean resultant length
(8.94 for D = 10, :math:`\kappa_+ = 20`).

References:
    M. Kirchhof, E. Kasneci and S. J. Oh, "Probabilistic contrastive learning recovers the
    correct aleatoric uncertainty of ambiguous inputs", ICML 2023 (the reference code:
    github.com/mkirchhof/Probabilistic_Contrastive_Learning, ``models/generator.py``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rpm._random import global_rng_from
from rpm._validation import check_int, check_positive, check_positive_int
from rpm.distributions import VonMisesFisher
from rpm.distributions._von_mises_fisher import (
    log_normaliser_plus_concentration,
    uniform_log_density,
)

__all__ = ["ControlledProcess", "effective_concentration", "leaky_mlp", "log_normaliser_ratio"]

#: Reference inputs that fix the concentration's range and check the means' spread.
REFERENCE_INPUTS = 1000
#: Inputs per smoothing step, and its learning rate.
SMOOTHING_BATCH = 64
SMOOTHING_LR = 0.01
#: Generators drawn at most before giving up on the spread.
MAX_DRAWS = 20


def leaky_mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers of the given sizes with a LeakyReLU between consecutive ones (none after
    the last): ``leaky_mlp([10, 10, 1])`` is Linear(10, 10), LeakyReLU, Linear(10, 1)."""
    layers: list[nn.Module] = []
    for index, (size_in, size_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        if index:
            layers.append(nn.LeakyReLU())
        layers.append(nn.Linear(size_in, size_out))
    return nn.Sequential(*layers)


def log_normaliser_ratio(kappa: float, dim: int) -> float:
    r""":math:`\log C_D(0) / C_D(\kappa)` (U3) in float64: :math:`\log C_D(0) = \log
    \Gamma(D/2) - \log 2 - (D/2) \log \pi` (the inverse area of :math:`S^{D-1}`) and
    :math:`\log C_D(\kappa)` from
    :func:`~rpm.distributions._von_mises_fisher.log_normaliser_plus_concentration`."""
    kappa = check_positive("kappa", kappa)
    dim = check_int("dim", dim, minimum=2)
    log_normaliser = log_normaliser_plus_concentration(
        dim, torch.tensor(kappa, dtype=torch.float64))
    return uniform_log_density(dim) - (float(log_normaliser) - kappa)


def effective_concentration(kappa_pos: float, threshold: float, dim: int,
                            grid: int = 20001) -> float:
    r""":math:`\bar\kappa` of (U4): the concentration of the vMF conditional whose mean
    cosine equals that of the positive rule :math:`\sigma(\kappa_+ c - \ell)` (U3) under a
    uniform marginal on :math:`S^{D-1}`. The integrals are trapezoid sums over ``grid``
    angles in float64; :math:`\bar\kappa` is found by bisection on
    :math:`A_D`, which increases from 0 to 1."""
    kappa_pos = check_positive("kappa_pos", kappa_pos)
    dim = check_int("dim", dim, minimum=2)
    theta = torch.linspace(0.0, math.pi, check_int("grid", grid, minimum=3), dtype=torch.float64)
    weight = torch.sin(theta) ** (dim - 2) * torch.sigmoid(kappa_pos * torch.cos(theta)
                                                           - float(threshold))
    target = float(torch.trapezoid(torch.cos(theta) * weight, theta)
                   / torch.trapezoid(weight, theta))
    if not 0.0 < target < 1.0:
        raise ValueError(f"the positive rule's mean cosine is {target:.3g}, not in (0, 1): "
                         "no vMF conditional matches it; raise kappa_pos or lower the threshold")
    loc = torch.zeros(dim, dtype=torch.float64)
    loc[0] = 1.0
    low, high = 1e-6, 1e6
    for _ in range(200):  # bisection in log kappa
        middle = math.sqrt(low * high)
        length = VonMisesFisher(loc, torch.tensor(middle, dtype=torch.float64))\
            .mean_resultant_length
        low, high = (middle, high) if float(length) < target else (low, middle)
        if high / low < 1 + 1e-12:
            break
    return math.sqrt(low * high)


class ControlledProcess(nn.Module):
    r"""The generative process of the module docstring (U1-U3), drawn from ``seed``.

    :param int dim: D, the latent sphere :math:`S^{D-1}` (10 in the reference run).
    :param int obs_dim: P, the inputs' dimension (10).
    :param int hidden: the generator networks' width (10).
    :param float kappa_pos: :math:`\kappa_+` of the positive pairs (20).
    :param float kappa_min: the smallest true posterior concentration (16).
    :param float kappa_max: the largest (32).
    :param int smoothing_steps: Adam steps of (U2) (reference code: 5000).
    :param int seed: the seed of the networks' initialisation and the smoothing inputs.
    :param float min_spread: redraw the networks while the smallest pairwise cosine of the
        reference inputs' means is at least this.
    """

    def __init__(self, dim: int = 10, obs_dim: int = 10, hidden: int = 10,
                 kappa_pos: float = 20.0, kappa_min: float = 16.0, kappa_max: float = 32.0,
                 smoothing_steps: int = 1000, seed: int = 0, min_spread: float = 0.5) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, minimum=2)
        self.obs_dim = check_positive_int("obs_dim", obs_dim)
        hidden = check_positive_int("hidden", hidden)
        self.kappa_pos = check_positive("kappa_pos", kappa_pos)
        kappa_min = check_positive("kappa_min", kappa_min)
        kappa_max = check_positive("kappa_max", kappa_max)
        if not kappa_min < kappa_max:
            raise ValueError(f"kappa_min must be below kappa_max, got {kappa_min} and "
                             f"{kappa_max}")
        smoothing_steps = check_int("smoothing_steps", smoothing_steps, minimum=0)
        self.threshold = log_normaliser_ratio(self.kappa_pos, self.dim)
        #: (U4): the positive concentration of the vMF prior that matches (U3).
        self.effective_kappa_pos = effective_concentration(self.kappa_pos, self.threshold,
                                                           self.dim)
        generator = torch.Generator().manual_seed(int(seed))
        for _ in range(MAX_DRAWS):
            with global_rng_from(generator):
                self.mean_net = leaky_mlp([self.obs_dim, hidden, hidden, self.dim])
                self.concentration_net = leaky_mlp([self.obs_dim, hidden, 1])
            self.requires_grad_(False)
            reference = self.sample_inputs(REFERENCE_INPUTS, generator)
            raw = nn.functional.softplus(self.concentration_net(reference))
            self.scale = (math.log(kappa_max) - math.log(kappa_min)) / float(raw.max() - raw.min())
            self.shift = math.log(kappa_max) - self.scale * float(raw.max())
            self._smooth(smoothing_steps, generator)
            means, _ = self.posterior(reference)
            if float((means @ means.T).min()) < min_spread:
                break
        else:
            raise RuntimeError(f"no generator of {MAX_DRAWS} spread its means (smallest pairwise "
                               f"cosine below {min_spread}): lower min_spread")
        self.requires_grad_(False)

    def _smooth(self, steps: int, generator: torch.Generator) -> None:
        """(U2) on the mean network."""
        parameters = list(self.mean_net.parameters())
        for parameter in parameters:
            parameter.requires_grad_(True)
        optimizer = torch.optim.Adam(parameters, lr=SMOOTHING_LR)
        rows, cols = torch.tril_indices(SMOOTHING_BATCH, SMOOTHING_BATCH)
        for _ in range(steps):
            x = self.sample_inputs(SMOOTHING_BATCH, generator)
            mu = nn.functional.normalize(self.mean_net(x), dim=-1)
            input_distance = torch.cdist(x, x)[rows, cols]
            distance = 1 - (mu @ mu.T)[rows, cols] / 2
            weight = (math.sqrt(2) - distance.detach()) ** 4
            loss = ((input_distance - distance) ** 2 * weight).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        for parameter in parameters:
            parameter.requires_grad_(False)

    def sample_inputs(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n inputs :math:`x \\sim \\mathcal U[0, 1]^P`. Shape: (n, P)."""
        return torch.rand(n, self.obs_dim, generator=generator)

    def posterior(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The true posterior (U1) of each input: :math:`\mu(x)` (n, D), unit vectors, and
        :math:`\kappa(x)` (n,)."""
        mu = nn.functional.normalize(self.mean_net(x), dim=-1)
        raw = nn.functional.softplus(self.concentration_net(x))[:, 0]
        return mu, torch.exp(self.scale * raw + self.shift)

    def sample_latents(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One latent :math:`z \\sim P(z \\mid x)` per input, drawn from ``generator`` alone (the
        global generator is left as it was). Shape: (n, D)."""
        mu, kappa = self.posterior(x)
        loc = nn.functional.normalize(mu.double(), dim=-1)
        with global_rng_from(generator):
            z = VonMisesFisher(loc, kappa.double()).sample()
        return z.to(x.dtype)

    def positive_probability(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        r"""(U3) for every pair of rows: :math:`\sigma(\kappa_+ z_i^\top z'_j - \ell)`.
        Shape: (n, m)."""
        return torch.sigmoid(self.kappa_pos * z @ z2.T - self.threshold)

    @torch.no_grad()
    def sample_pairs(self, n: int, generator: torch.Generator, pool_factor: int = 4,
                     return_latents: bool = False) -> tuple[torch.Tensor, ...]:
        r"""n positive pairs :math:`(x_i, x'_i)` (module docstring): a pool of ``pool_factor``
        x n candidates; each candidate accepted for each reference input with probability
        (U3); each reference input takes one of its accepted candidates at random, a candidate
        going to at most one of them; a new pool for those left without.

        :return: ``(x, x2)``, and with ``return_latents`` the latents ``(z, z2)`` they were
            paired by. Shape: (n, P) and (n, D) each.
        """
        n = check_positive_int("n", n)
        pool_factor = check_positive_int("pool_factor", pool_factor)
        x = self.sample_inputs(n, generator)
        z = self.sample_latents(x, generator)
        x2 = torch.empty_like(x)
        z2 = torch.empty_like(z)
        waiting = torch.arange(n)
        while len(waiting):
            candidates = self.sample_inputs(pool_factor * n, generator)
            z_candidates = self.sample_latents(candidates, generator)
            probability = self.positive_probability(z[waiting], z_candidates)
            uniform = torch.rand(probability.shape, generator=generator)
            accepted = uniform < probability
            # a random order of each row's accepted candidates (given u < p, u / p is uniform on
            # [0, 1) and independent of the other entries); taken candidates drop out
            priority = torch.where(accepted, uniform / probability, torch.tensor(-1.0))
            served = torch.zeros(len(waiting), dtype=torch.bool)
            while True:
                best, choice = priority.max(1)
                open_rows = (best >= 0) & ~served
                if not open_rows.any():
                    break
                rows = open_rows.nonzero()[:, 0]
                # the first row to claim a candidate gets it
                first = torch.full((len(candidates),), len(waiting), dtype=torch.long)
                first.scatter_reduce_(0, choice[rows], rows, reduce="amin")
                winners = rows[first[choice[rows]] == rows]
                x2[waiting[winners]] = candidates[choice[winners]]
                z2[waiting[winners]] = z_candidates[choice[winners]]
                served[winners] = True
                priority[:, choice[winners]] = -1.0
                priority[winners] = -1.0
            waiting = waiting[~served]
        return (x, x2, z, z2) if return_latents else (x, x2)
