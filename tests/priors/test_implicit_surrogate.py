"""What the implicit conditional is, pinned so that the words of docs/theory.md#implicit-prior
and of rpm.priors.implicit cannot drift from the code.

``ImplicitConditional.log_prob`` is the InfoNCE surrogate: its normaliser is estimated over the
evaluated partners, so for finite N it is not a normalised distribution of the batch (with
Delta recognition its probabilities over its own support do not sum to 1). ``sample`` draws,
independently for each anchor i, the atom j with probability softmax_j f(z_i, z'_j): the
categorical of Eq. 34, whose probabilities agree with ``log_prob`` exactly at the permutations
of the atoms (the guide's own value among them) and nowhere else. Every number below is checked
against a closed form or a float64 loop written from those equations."""

import itertools
import math

import pytest
import torch
from pyro.distributions import Delta, Normal

from rpm.priors import RBFEnergy
from rpm.priors.implicit import ImplicitConditional

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def issue_example():
    """N = 2, D = 1, f(z, z') = -(z - z')^2 / 2 (RBF, l = 1): anchors z = (-4.2, 4.8), the
    second view's Delta atoms z' = (0, 1). Row softmaxes: a = s_11 = sigmoid(4.7),
    b = s_22 = sigmoid(4.3)."""
    z = torch.tensor([[-4.2], [4.8]], dtype=torch.float64)
    atoms = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    energy = RBFEnergy(lengthscale=1.0, learn_lengthscale=False)
    return ImplicitConditional(z, Delta(atoms, event_dim=1), energy), z, atoms, energy


def assignment_log_prob_loop(z, atoms, energy, assignment):
    """The conditional's equation in float64, one row at a time, for distinct atoms and
    v_i = z'_{a(i)}: sum_i [log Q(v_i) + f(z_i, v_i) - log (1/N) sum_k exp f(z_i, v_k)] with
    Q(v_i) = 1/N, the empirical mixture of the atoms."""
    n = len(assignment)
    f = energy(z, atoms).tolist()  # f[i][j] = f(z_i, z'_j)
    total = 0.0
    for i in range(n):
        normaliser = sum(math.exp(f[i][assignment[k]]) for k in range(n)) / n
        total += math.log(1 / n) + f[i][assignment[i]] - math.log(normaliser)
    return total


def sampler_probability(z, atoms, energy, assignment):
    """The closed form of what ``sample`` draws: prod_i softmax_j f(z_i, z'_j) at j = a(i)."""
    f = energy(z, atoms).tolist()
    return math.prod(math.exp(f[i][j]) / sum(math.exp(v) for v in f[i])
                     for i, j in enumerate(assignment))


def test_the_issue_numbers_sum_1_478_and_sampler_0_013_against_log_prob_0_25():
    conditional, z, atoms, energy = issue_example()
    a, b = torch.sigmoid(torch.tensor(4.7, dtype=torch.float64)).item(), \
        torch.sigmoid(torch.tensor(4.3, dtype=torch.float64)).item()
    probabilities = {
        assignment: conditional.log_prob(atoms[list(assignment)]).exp().item()
        for assignment in itertools.product(range(2), repeat=2)}
    # Closed forms: 1/4 at (0, 0) and (1, 1) whatever the energy (the normaliser runs over the
    # evaluated partners, which are then equal), a b and (1 - a)(1 - b) at the permutations.
    assert probabilities[(0, 0)] == pytest.approx(0.25, abs=1e-14)
    assert probabilities[(1, 1)] == pytest.approx(0.25, abs=1e-14)
    assert probabilities[(0, 1)] == pytest.approx(a * b, abs=1e-14)
    assert probabilities[(1, 0)] == pytest.approx((1 - a) * (1 - b), abs=1e-14)
    total = sum(probabilities.values())
    assert total == pytest.approx(0.5 + a * b + (1 - a) * (1 - b), abs=1e-14)
    assert round(total, 3) == 1.478
    # The sampler: (0, 0) with probability a (1 - b) = 0.0133. 6000 draws: standard error
    # sqrt(p (1 - p) / 6000) = 0.0015; tolerance 5 standard errors (far from 0.25).
    draws = conditional.sample((6000,))  # (S, 2, 1), each row one of the atoms
    index = draws[..., 0].round().long()  # atom j has value j
    frequency = ((index[:, 0] == 0) & (index[:, 1] == 0)).double().mean().item()
    expected = a * (1 - b)
    assert round(expected, 3) == 0.013
    assert abs(frequency - expected) < 5 * math.sqrt(expected * (1 - expected) / 6000)


def test_probabilities_over_the_support_against_the_loop_at_n_3():
    """All 27 assignments of 3 atoms to 3 anchors: log_prob equals the equation's loop; the total
    is not 1; at the 6 permutations log_prob equals the sampler's probability, elsewhere not."""
    torch.manual_seed(1)
    z = torch.randn(3, 2, dtype=torch.float64)
    atoms = z + 0.5 * torch.randn(3, 2, dtype=torch.float64)
    energy = RBFEnergy(lengthscale=0.7, learn_lengthscale=False)
    conditional = ImplicitConditional(z, Delta(atoms, event_dim=1), energy)
    total = 0.0
    for assignment in itertools.product(range(3), repeat=3):
        log_prob = conditional.log_prob(atoms[list(assignment)]).item()
        assert log_prob == pytest.approx(
            assignment_log_prob_loop(z, atoms, energy, assignment), abs=1e-12)
        total += math.exp(log_prob)
        sampler = sampler_probability(z, atoms, energy, assignment)
        if sorted(assignment) == [0, 1, 2]:
            assert math.exp(log_prob) == pytest.approx(sampler, rel=1e-12)
        else:
            assert abs(math.exp(log_prob) - sampler) > 1e-3
    assert abs(total - 1.0) > 0.05
    # The sampler's own probabilities do sum to one (a product of N categoricals).
    assert sum(sampler_probability(z, atoms, energy, a)
               for a in itertools.product(range(3), repeat=3)) == pytest.approx(1.0, abs=1e-12)


def test_sampler_frequencies_match_the_product_of_row_softmaxes():
    """4000 draws at N = 3 (27 assignments): every frequency within 5 standard errors
    (plus 1e-3) of prod_i softmax_j f(z_i, z'_j)."""
    torch.manual_seed(2)
    z = torch.randn(3, 2, dtype=torch.float64)
    atoms = torch.randn(3, 2, dtype=torch.float64)
    energy = RBFEnergy(lengthscale=1.0, learn_lengthscale=False)
    conditional = ImplicitConditional(z, Delta(atoms, event_dim=1), energy)
    draws = conditional.sample((4000,))  # (S, 3, 2)
    index = torch.cdist(draws.reshape(-1, 2), atoms).argmin(-1).reshape(4000, 3)
    code = index[:, 0] * 9 + index[:, 1] * 3 + index[:, 2]
    frequency = torch.bincount(code, minlength=27).double() / 4000
    for assignment in itertools.product(range(3), repeat=3):
        p = sampler_probability(z, atoms, energy, assignment)
        observed = frequency[assignment[0] * 9 + assignment[1] * 3 + assignment[2]].item()
        assert abs(observed - p) < 5 * math.sqrt(p * (1 - p) / 4000) + 1e-3


def test_with_gaussian_recognition_the_density_does_not_integrate_to_one():
    """N = 2, D = 1, Gaussian recognition N(0, 0.5^2) and N(1, 0.5^2), anchors (-1, 1.5), RBF
    energy l = 1: the equation, written with torch.distributions in float64, agrees with
    log_prob at 12 random partners, and its integral over R^2 (a Riemann sum on a 321 x 321
    grid over [-4.5, 5.5]^2, error far below 1e-6 for these Gaussians) is 1.197, not 1."""
    torch.set_default_dtype(torch.float64)
    z = torch.tensor([[-1.0], [1.5]])
    loc = torch.tensor([[0.0], [1.0]])
    energy = RBFEnergy(lengthscale=1.0, learn_lengthscale=False)
    conditional = ImplicitConditional(z, Normal(loc, 0.5).to_event(1), energy)

    def equation(v):  # v: (..., 2) partners v_1, v_2 (D = 1)
        components = torch.distributions.Normal(loc[:, 0], 0.5)  # the two Q(z'|x'_j)
        log_mixture = torch.logsumexp(components.log_prob(v[..., None]), -1) - math.log(2)
        f = -0.5 * (z[:, 0] - v[..., None, :].transpose(-1, -2)) ** 2  # (..., k, i): f(z_i, v_k)
        log_normaliser = torch.logsumexp(f, dim=-2) - math.log(2)  # (..., i)
        f_own = -0.5 * (z[:, 0] - v) ** 2  # (..., i): f(z_i, v_i)
        return (log_mixture + f_own - log_normaliser).sum(-1)

    points = 1.5 * torch.randn(12, 2) + 0.5
    with torch.no_grad():
        got = torch.stack([conditional.log_prob(p.reshape(2, 1)) for p in points])
    torch.testing.assert_close(got, equation(points), rtol=0, atol=1e-12)
    grid = torch.linspace(-4.5, 5.5, 321)
    step = (grid[1] - grid[0]).item()
    values = torch.stack(torch.meshgrid(grid, grid, indexing="ij"), -1)  # (321, 321, 2)
    total = equation(values).exp().sum().item() * step * step
    assert round(total, 3) == 1.197
