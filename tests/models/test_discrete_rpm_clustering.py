"""The clustering reading of the discrete RPM (``docs/theory.md``, D7-D12): each identity checked
in float64 on random factors, the entropies and KLs written as Python loops from their
definitions, the objective taken from ``rpm.DiscreteRPM``."""

import math

import pytest
import torch

import rpm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, X_DIM, K = 7, 3, 4
TOLERANCE = 1e-10


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def _model(num_views: int, prior: list[float], *, constant_view: int | None = None):
    """A DiscreteRPM with one network per view; view ``constant_view``'s network ignores its
    input (a bias only), so that its factor is the same for every instance."""
    nets = []
    for j in range(num_views):
        if j == constant_view:
            net = torch.nn.Linear(X_DIM, K)
            with torch.no_grad():
                net.weight.zero_()
                net.bias.copy_(torch.randn(K))
        else:
            net = torch.nn.Sequential(torch.nn.Linear(X_DIM, 6), torch.nn.Tanh(),
                                      torch.nn.Linear(6, K))
            with torch.no_grad():  # confident factors, far from uniform
                net[2].weight.mul_(4.0)
        nets.append(rpm.CategoricalRecognition(net, K))
    model = rpm.DiscreteRPM(nets, num_views, prior=torch.tensor(prior), learn_prior=False)
    views = [torch.randn(N, X_DIM) for _ in range(num_views)]
    return model, views


def _factors(model, views) -> list[list[list[float]]]:
    """f_j(Z | x_j^n), [j][n][Z]."""
    with torch.no_grad():
        return model.factor_log_probs(*views).exp().tolist()


def _entropy(q: list[float]) -> float:
    return -sum(v * math.log(v) for v in q)


def _kl(q: list[float], r: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(q, r, strict=True))


def _mean(rows: list[list[float]]) -> list[float]:
    """The batch average over the rows (instances) of an (N, K) table."""
    return [sum(row[z] for row in rows) / len(rows) for z in range(len(rows[0]))]


def _random_assignment() -> list[list[float]]:
    return torch.softmax(3 * torch.randn(N, K), -1).tolist()


def _information(q: list[list[float]]) -> float:
    """I_q(Z; n) of the joint q(n, Z) = q_n(Z) / N from its definition,
    sum_{n,Z} q(n,Z) log(q(n,Z) / (q(n) qbar(Z)))."""
    qbar = _mean(q)
    return sum(q[n][z] / N * math.log((q[n][z] / N) / ((1 / N) * qbar[z]))
               for n in range(N) for z in range(K))


def _cluster_term(q: list[list[float]], f: list[list[float]]) -> float:
    """E_qbar(Z) KL(q(n|Z) || P_j(n|Z)): q(n|Z) = q_n(Z) / (N qbar(Z)),
    P_j(n|Z) = f_j(Z|x^n) / (N F_j(Z))."""
    qbar, normaliser = _mean(q), _mean(f)
    total = 0.0
    for z in range(K):
        given_q = [q[n][z] / (N * qbar[z]) for n in range(N)]
        given_f = [f[n][z] / (N * normaliser[z]) for n in range(N)]
        total += qbar[z] * _kl(given_q, given_f)
    return total


def test_the_mutual_information_is_the_entropy_of_the_clusters_use_minus_the_mean_entropy():
    """(D7) against the definition of the mutual information of q(n, Z)."""
    q = _random_assignment()
    expected = _entropy(_mean(q)) - sum(_entropy(row) for row in q) / N
    assert abs(_information(q) - expected) < TOLERANCE
    assert expected > 0.1  # a real test: the assignment is informative


def test_one_views_factor_terms_are_the_entropy_of_F_minus_the_mean_entropy_of_f():
    """(D8): (1/N) sum_n sum_Z f log f - f log F = H(F) - mean_n H(f_n) = I_f(Z; n), with
    f and F from the model's factors and normaliser."""
    model, views = _model(2, [0.25] * K)
    with torch.no_grad():
        log_f = model.factor_log_probs(*views)[0]  # view 1, (N, K)
        log_normaliser = model.log_normalisers([tuple(views)])[0]  # (K,)
    both_terms = float((log_f.exp() * (log_f - log_normaliser)).sum()) / N
    f = log_f.exp().tolist()
    normaliser = _mean(f)
    assert max(abs(a - b) for a, b in zip(normaliser, log_normaliser.exp().tolist(),
                                        strict=True)) < 1e-12
    entropy_part = _entropy(normaliser)  # the -log F term alone
    sharpness_part = -sum(_entropy(row) for row in f) / N  # the log f term alone
    assert abs(-float((log_f.exp() * log_normaliser).sum()) / N - entropy_part) < TOLERANCE
    assert abs(both_terms - (entropy_part + sharpness_part)) < TOLERANCE
    assert abs(both_terms - _information(f)) < TOLERANCE
    assert 0 < both_terms <= math.log(K)


@pytest.mark.parametrize("view", [0, 1, 2])
def test_the_expected_minus_log_F_term_is_the_entropy_of_the_batch_marginal_plus_a_kl(view):
    """(D9) for a random assignment and for the exact posterior."""
    model, views = _model(3, [0.1, 0.2, 0.3, 0.4])
    f = _factors(model, views)[view]
    normaliser = _mean(f)
    for q in (_random_assignment(), model.posterior(*views).probs.tolist()):
        qbar = _mean(q)
        term = -sum(q[n][z] * math.log(normaliser[z]) for n in range(N) for z in range(K)) / N
        assert abs(term - (_entropy(qbar) + _kl(qbar, normaliser))) < TOLERANCE
        assert _kl(qbar, normaliser) > 1e-4  # the KL is there: qbar is not F_j


@pytest.mark.parametrize("view", [0, 1])
def test_a_views_two_terms_are_the_information_minus_the_kl_of_the_clusters_instances(view):
    """(D10), and the joint convexity that makes its last term non-negative:
    mean_n KL(q_n || f_n) - KL(qbar || F) = E_qbar KL(q(n|Z) || P_j(n|Z)) >= 0."""
    model, views = _model(2, [0.25] * K)
    f = _factors(model, views)[view]
    normaliser = _mean(f)
    q = _random_assignment()
    terms = sum(q[n][z] * (math.log(f[n][z]) - math.log(normaliser[z]))
                for n in range(N) for z in range(K)) / N
    cluster_term = _cluster_term(q, f)
    assert abs(terms - (_information(q) - cluster_term)) < TOLERANCE
    convexity_gap = sum(_kl(q[n], f[n]) for n in range(N)) / N - _kl(_mean(q), normaliser)
    assert abs(convexity_gap - cluster_term) < TOLERANCE
    assert cluster_term > 1e-3


@pytest.mark.parametrize("num_views,prior", [(2, [0.25, 0.25, 0.25, 0.25]),
                                             (3, [0.1, 0.2, 0.3, 0.4])])
def test_the_elbo_is_the_information_minus_the_prior_kl_minus_the_views_kls(num_views, prior):
    """(D11) for a random assignment (the ELBO (D5) as a loop) and at the exact posterior, where
    its left side is DiscreteRPM.log_marginal / N."""
    model, views = _model(num_views, prior)
    factors = _factors(model, views)
    normalisers = [_mean(f) for f in factors]

    def right_side(q):
        return ((num_views - 1) * _information(q) - _kl(_mean(q), prior)
                - sum(_cluster_term(q, f) for f in factors))

    def elbo_plus_constant(q):  # (1/N) sum_n [L_n(q_n) + J log N], (D5)
        total = 0.0
        for n in range(N):
            for z in range(K):
                ratio = sum(math.log(f[n][z] / normaliser[z])
                            for f, normaliser in zip(factors, normalisers, strict=True))
                total += q[n][z] * (math.log(prior[z]) + ratio - math.log(q[n][z]))
        return total / N

    q = _random_assignment()
    assert abs(elbo_plus_constant(q) - right_side(q)) < TOLERANCE
    exact = model.posterior(*views).probs.tolist()
    log_marginal = model.log_marginal(*views).item() / N
    assert abs(log_marginal - right_side(exact)) < TOLERANCE
    assert log_marginal <= (num_views - 1) * _information(exact) <= (num_views - 1) * math.log(K)


def test_the_log_likelihood_is_at_most_J_minus_one_log_K_and_zero_when_the_factors_ignore_x():
    """The ceiling (J - 1) log min(K, N) of (D11) over random confident models, and the score 0 of
    factors that are the same for every instance."""
    for seed in range(20):
        torch.manual_seed(seed)
        model, views = _model(3, [0.25] * K)
        assert model.log_marginal(*views).item() / N <= 2 * math.log(K)
    nets = [rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, K), K) for _ in range(2)]
    for recognition in nets:
        with torch.no_grad():
            recognition.net.weight.zero_()
            recognition.net.bias.copy_(torch.randn(K))
    model = rpm.DiscreteRPM(nets, prior=torch.tensor([0.1, 0.2, 0.3, 0.4]), learn_prior=False)
    views = [torch.randn(N, X_DIM) for _ in range(2)]
    assert abs(model.log_marginal(*views).item()) < TOLERANCE
    torch.testing.assert_close(model.posterior(*views).probs,
                               torch.tensor([[0.1, 0.2, 0.3, 0.4]] * N), rtol=0, atol=1e-12)


def test_the_posterior_of_one_view_is_one_sinkhorn_knopp_iteration():
    """(D12): scale each cluster's column of f to the mass N p(Z), then each row to 1 (one
    Sinkhorn-Knopp iteration, written as loops); a second view whose factor ignores its input
    has f_2 / F_2 = 1, so the model's posterior (D4) is the posterior of view 1 alone."""
    prior = [0.1, 0.2, 0.3, 0.4]
    model, views = _model(2, prior, constant_view=1)
    f = _factors(model, views)[0]
    matrix = [row[:] for row in f]
    for z in range(K):  # columns
        mass = sum(matrix[n][z] for n in range(N))
        for n in range(N):
            matrix[n][z] *= N * prior[z] / mass
    for n in range(N):  # rows
        total = sum(matrix[n])
        matrix[n] = [value / total for value in matrix[n]]
    posterior = model.posterior(*views).probs.detach()
    torch.testing.assert_close(posterior, torch.tensor(matrix), rtol=0, atol=1e-12)
    assert float((posterior - torch.tensor(f)).abs().max()) > 1e-2  # the step did something
