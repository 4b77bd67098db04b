"""The discrete-latent RPM (Walker et al., 2023): Pyro's exact enumeration against float64 loops
written from the equations (D1-D4 of ``rpm.models._discrete_rpm``), Walker et al.'s free
energy, gradients to the encoder and the prior, the data-set normaliser, and bad input."""

import math

import pyro
import pytest
import torch
from pyro.infer import SVI, TraceEnum_ELBO
from scipy.optimize import linear_sum_assignment

import rpm
from rpm.priors import ImplicitPrior, RBFEnergy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, X_DIM, K = 6, 4, 3


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def _softmax_loop(logits: torch.Tensor) -> list[list[float]]:
    """f(Z | x_n) = exp(g_Z) / sum_Z' exp(g_Z') per row, in Python floats."""
    rows = []
    for row in logits.tolist():
        total = sum(math.exp(value) for value in row)
        rows.append([math.exp(value) / total for value in row])
    return rows


def _factors(nets: list, views: list) -> list[list[list[float]]]:
    """f_j(Z | x_j^n) for each view j (its own network), [j][n][Z]."""
    with torch.no_grad():
        return [_softmax_loop(net(view)) for net, view in zip(nets, views, strict=True)]


def _joint_loop(prior: list[float], factors) -> list[list[float]]:
    """p(Z) prod_j f_j(Z|x_j^n) / F_j(Z), F_j(Z) = (1/N) sum_m f_j(Z|x_j^m) (D1-D2), [n][Z]."""
    count, classes = len(factors[0]), len(prior)
    normalisers = [[sum(f[m][z] for m in range(count)) / count for z in range(classes)]
                   for f in factors]
    joint = []
    for n in range(count):
        row = []
        for z in range(classes):
            value = prior[z]
            for f, normaliser in zip(factors, normalisers, strict=True):
                value *= f[n][z] / normaliser[z]
            row.append(value)
        joint.append(row)
    return joint


def _model(num_views: int, per_view: bool, learn_prior: bool, prior=None):
    nets = [torch.nn.Sequential(torch.nn.Linear(X_DIM, 5), torch.nn.Tanh(),
                                torch.nn.Linear(5, K)) for _ in range(num_views if per_view else 1)]
    recognitions = [rpm.CategoricalRecognition(net, K) for net in nets]
    model = rpm.DiscreteRPM(recognitions if per_view else recognitions[0], num_views,
                            prior=prior, learn_prior=learn_prior)
    return model, nets if per_view else nets * num_views


CASES = [(2, False, True, None), (3, True, False, [0.2, 0.3, 0.5]), (4, False, True, [0.6, 0.1, 0.3])]


@pytest.mark.parametrize("num_views,per_view,learn_prior,prior", CASES)
def test_trace_enum_elbo_is_the_exact_log_marginal_of_the_equations(num_views, per_view,
                                                                     learn_prior, prior):
    model, nets = _model(num_views, per_view, learn_prior, prior and torch.tensor(prior))
    views = [torch.randn(N, X_DIM) for _ in range(num_views)]
    prior_list = prior or [1 / K] * K
    joint = _joint_loop(prior_list, _factors(nets, views))
    expected = sum(math.log(sum(row)) for row in joint)

    loss = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(model.model, model.guide,
                                                                   *views)
    assert abs(-loss.item() - expected) < 1e-10
    assert abs(model.log_marginal(*views).item() - expected) < 1e-10
    assert abs(model.log_marginal(views).item() - expected) < 1e-10  # a list of views


def test_the_exact_posterior_is_the_loop_and_pyros_enumerated_marginal():
    model, nets = _model(3, True, True, torch.tensor([0.5, 0.25, 0.25]))
    views = [torch.randn(N, X_DIM) for _ in range(3)]
    joint = _joint_loop([0.5, 0.25, 0.25], _factors(nets, views))
    expected = torch.tensor([[value / sum(row) for value in row] for row in joint])
    posterior = model.posterior(*views)
    assert posterior.batch_shape == (N,)
    torch.testing.assert_close(posterior.probs.detach(), expected, rtol=0, atol=1e-12)
    marginals = TraceEnum_ELBO(max_plate_nesting=1).compute_marginals(model.model, model.guide,
                                                                       *views)
    torch.testing.assert_close(marginals["z"].probs.detach(), expected, rtol=0, atol=1e-12)


def test_walker_et_al_free_energy_at_the_exact_posterior_is_the_log_likelihood():
    """Their free energy: <log p0 + log p + sum_j (log f_j - log F_j) - log q>_q with p0 = 1/N
    per view; at the exact posterior it is the log-likelihood, and below it at any other q."""
    num_views = 2
    model, nets = _model(num_views, False, False, torch.tensor([0.3, 0.3, 0.4]))
    views = [torch.randn(N, X_DIM) for _ in range(num_views)]
    prior = [0.3, 0.3, 0.4]
    factors = _factors(nets, views)
    normalisers = [[sum(f[m][z] for m in range(N)) / N for z in range(K)] for f in factors]

    def free_energy(q):
        total = 0.0
        for n in range(N):
            for z in range(K):
                terms = math.log(prior[z]) - math.log(q[n][z]) + num_views * math.log(1 / N)
                terms += sum(math.log(f[n][z]) - math.log(normaliser[z])
                             for f, normaliser in zip(factors, normalisers, strict=True))
                total += q[n][z] * terms
        return total

    exact = model.posterior(*views).probs.tolist()
    log_likelihood = model.log_marginal(*views).item() - N * num_views * math.log(N)
    assert abs(free_energy(exact) - log_likelihood) < 1e-10
    other = torch.softmax(torch.randn(N, K), -1).tolist()
    assert free_energy(other) < log_likelihood - 1e-3


def test_gradients_of_trace_enum_reach_the_encoder_and_the_prior_and_match_the_closed_form():
    model, _ = _model(2, False, True, torch.tensor([0.2, 0.5, 0.3]))
    views = [torch.randn(N, X_DIM) for _ in range(2)]
    loss = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(model.model, model.guide,
                                                                   *views)
    names, params = zip(*model.named_parameters(), strict=True)
    assert any("prior_probs" in name for name in names) and any("net" in name for name in names)
    enumerated = torch.autograd.grad(loss, params)
    closed = torch.autograd.grad(-model.log_marginal(*views), params)
    for name, a, b in zip(names, enumerated, closed, strict=True):
        assert a.abs().sum() > 1e-6, f"no gradient reaches {name}"
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_gradient_to_the_encoder_is_the_derivative_of_the_loop_through_the_normaliser():
    """Central differences of the float64 loop (F_j moves with the encoder too) against the
    gradient of TraceEnum_ELBO's loss, for every weight of the last layer."""
    model, nets = _model(2, False, False, torch.tensor([0.2, 0.5, 0.3]))
    views = [torch.randn(N, X_DIM) for _ in range(2)]
    weight = nets[0][2].weight
    loss = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(model.model, model.guide,
                                                                   *views)
    (gradient,) = torch.autograd.grad(loss, [weight])

    def loop_value():
        joint = _joint_loop([0.2, 0.5, 0.3], _factors(nets, views))
        return sum(math.log(sum(row)) for row in joint)

    step = 1e-6
    for index in [(0, 0), (1, 3), (2, 4)]:
        with torch.no_grad():
            weight[index] += step
            up = loop_value()
            weight[index] -= 2 * step
            down = loop_value()
            weight[index] += step
        assert abs(-(up - down) / (2 * step) - gradient[index].item()) < 1e-7


def test_a_fixed_prior_is_a_buffer_and_stays_out_of_the_parameters():
    model, _ = _model(2, False, False, torch.tensor([0.2, 0.5, 0.3]))
    assert not any("prior" in name for name, _ in model.named_parameters())
    torch.testing.assert_close(model.prior_probs, torch.tensor([0.2, 0.5, 0.3]))


def test_the_streamed_data_set_normaliser_is_the_normaliser_of_all_the_data():
    model, nets = _model(2, False, True, None)
    views = [torch.randn(3 * N, X_DIM) for _ in range(2)]
    batches = [tuple(view[i * N:(i + 1) * N] for view in views) for i in range(3)]
    streamed = model.log_normalisers(batches)
    factors = _factors(nets, views)
    expected = torch.tensor([[math.log(sum(f[m][z] for m in range(3 * N)) / (3 * N))
                              for z in range(K)] for f in factors])
    torch.testing.assert_close(streamed.detach(), expected, rtol=0, atol=1e-12)
    # with it, a batch's log marginal uses F over all the data: the loop with that F
    batch = batches[1]
    value = model.log_marginal(*batch, log_normalisers=streamed)
    loss = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(
        model.model, model.guide, *batch, log_normalisers=streamed)
    batch_factors = _factors(nets, list(batch))
    expected_value = sum(
        math.log(sum(1 / K * math.prod(batch_factors[j][n][z] / math.exp(expected[j, z])
                                       for j in range(2)) for z in range(K)))
        for n in range(N))
    assert abs(value.item() - expected_value) < 1e-10
    assert abs(-loss.item() - expected_value) < 1e-10
    # and the batch's own normaliser is the default
    assert abs(model.log_marginal(*batch).item() - model.log_marginal(
        *batch, log_normalisers=model.log_normalisers([batch])).item()) < 1e-12


def test_maximum_likelihood_by_svi_clusters_two_views_of_three_classes():
    """Views of one class are noisy copies of its centre: exact ML with TraceEnum_ELBO learns
    a posterior that recovers the classes up to permutation."""
    torch.manual_seed(1)
    centres = torch.tensor([[3.0, 0.0], [-3.0, 0.0], [0.0, 3.0]])
    labels = torch.arange(90) % 3
    views = [centres[labels] + 0.5 * torch.randn(90, 2) for _ in range(2)]
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model = rpm.DiscreteRPM(rpm.CategoricalRecognition(net, 3), learn_prior=False)
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.05}),
              TraceEnum_ELBO(max_plate_nesting=1))
    first = svi.step(*views)
    for _ in range(150):
        last = svi.step(*views)
    assert last < first
    predicted = model.posterior(*views).probs.argmax(-1)
    counts = torch.zeros(3, 3)
    for p, y in zip(predicted.tolist(), labels.tolist(), strict=True):
        counts[p, y] += 1
    rows, cols = linear_sum_assignment(counts.numpy(), maximize=True)
    assert counts[rows, cols].sum() / 90 > 0.95


# -- bad input -----------------------------------------------------------------------------------

def test_fewer_than_two_classes_is_refused():
    with pytest.raises(ValueError, match="num_classes must be K >= 2"):
        rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, 1), 1)
    with pytest.raises(TypeError, match="num_classes must be an int"):
        rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, 2), 2.0)


def test_a_network_of_the_wrong_width_is_named():
    recognition = rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, 4), 3)
    with pytest.raises(ValueError, match=r"logits of shape \(N, 3\), got \(6, 4\).*output 3"):
        recognition(torch.randn(N, X_DIM))


def test_views_of_different_batch_sizes_are_refused():
    model, _ = _model(3, False, True, None)
    with pytest.raises(ValueError, match=r"same batch size N .*got \[6, 6, 5\]"):
        model.log_marginal(torch.randn(N, X_DIM), torch.randn(N, X_DIM), torch.randn(5, X_DIM))


def test_a_prior_over_another_number_of_classes_is_refused():
    recognition = rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, K), K)
    with pytest.raises(ValueError, match=r"support must be the recognition's K = 3 classes.*"
                                         r"shape \(4,\)"):
        rpm.DiscreteRPM(recognition, prior=torch.full((4,), 0.25))
    with pytest.raises(ValueError, match="support must be the recognition's K = 3"):
        rpm.DiscreteRPM(recognition, prior=torch.distributions.Categorical(torch.ones(2)))
    with pytest.raises(ValueError, match="sum to 1"):
        rpm.DiscreteRPM(recognition, prior=torch.tensor([0.5, 0.5, 0.5]))


def test_labels_passed_with_the_views_are_refused():
    model, _ = _model(2, False, True, None)
    x, x2 = torch.randn(N, X_DIM), torch.randn(N, X_DIM)
    labels = torch.arange(N) % K
    with pytest.raises(ValueError, match="unsupervised.*labels.*drop the labels"):
        model.log_marginal(x, x2, labels)
    with pytest.raises(ValueError, match="unsupervised.*drop the labels"):
        TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(model.model, model.guide, x, x2,
                                                                labels)
    with pytest.raises(ValueError, match="num_views=2 but got 3 views"):
        model.log_marginal(x, x2, x)


def test_other_recognition_models_and_the_continuous_rpm_are_told_apart():
    with pytest.raises(TypeError, match=r"rpm.CategoricalRecognition\(net, num_classes=K\)"):
        rpm.DiscreteRPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, K)))
    with pytest.raises(TypeError, match=r"use rpm.DiscreteRPM"):
        rpm.RPM(rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, K), K),
                ImplicitPrior(RBFEnergy()))
    with pytest.raises(ValueError, match="num_views must be J >= 2"):
        rpm.DiscreteRPM(rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, K), K), num_views=1)
    with pytest.raises(ValueError, match="disagree on K"):
        rpm.DiscreteRPM([rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, K), K),
                         rpm.CategoricalRecognition(torch.nn.Linear(X_DIM, 2), 2)])


def test_a_normaliser_of_the_wrong_shape_is_refused():
    model, _ = _model(2, False, True, None)
    views = [torch.randn(N, X_DIM) for _ in range(2)]
    with pytest.raises(ValueError, match=r"shape \(J, K\) = \(2, 3\), got \(3,\)"):
        model.log_marginal(*views, log_normalisers=torch.zeros(K))
