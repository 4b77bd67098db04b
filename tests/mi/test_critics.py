"""The critics of rpm.mi against loops over the pairs, and the Gaussian pair's closed forms."""

import math

import pytest
import torch

from rpm.mi import BilinearCritic, CorrelatedGaussian, JointCritic, SeparableCritic, rho_for_mi


def layers_of(sequential, k):
    """The (weight, bias) of copy k of each stacked linear layer of a Sequential."""
    return [(m.weight[k], None if m.bias is None else m.bias[k, 0])
            for m in sequential if hasattr(m, "weight")]


def mlp_apply(params, v):
    for index, (w, b) in enumerate(params):
        v = v @ w + (0 if b is None else b)
        if index < len(params) - 1:
            v = torch.relu(v)
    return v


def test_joint_critic_is_an_mlp_on_every_concatenated_pair():
    torch.set_default_dtype(torch.float64)
    critic = JointCritic(3, 2, hidden=8, layers=2, copies=2)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    scores = critic(x, y)
    for k in range(2):
        first_w = torch.cat([critic.first_x.weight[k], critic.first_y.weight[k]])  # (5, 8)
        params = [(first_w, critic.first_x.bias[k, 0]), *layers_of(critic.rest, k)]
        for i in range(4):
            for j in range(4):
                expected = mlp_apply(params, torch.cat([x[i], y[j]]))
                assert scores[k, i, j].item() == pytest.approx(expected.item(), abs=1e-12)


def test_separable_and_bilinear_critics_against_loops():
    torch.set_default_dtype(torch.float64)
    x, y = torch.randn(5, 3), torch.randn(5, 4)
    critic = SeparableCritic(3, 4, embed_dim=6, hidden=7, layers=1)
    scores = critic(x, y)
    g, h = layers_of(critic.g, 0), layers_of(critic.h, 0)
    for i in range(5):
        for j in range(5):
            expected = mlp_apply(g, x[i]) @ mlp_apply(h, y[j])
            assert scores[i, j].item() == pytest.approx(expected.item(), abs=1e-12)
    bilinear = BilinearCritic(3, 4)
    assert torch.equal(bilinear(x, y), torch.zeros(5, 5))
    with torch.no_grad():
        bilinear.weight.normal_()
    torch.testing.assert_close(bilinear(x, y), x @ bilinear.weight[0] @ y.T)


def test_copies_are_independent():
    critic = SeparableCritic(2, 2, embed_dim=3, hidden=4, copies=3)
    x, y = torch.randn(6, 2), torch.randn(6, 2)
    critic(x, y)[1].sum().backward()
    assert critic.g[0].weight.grad[1].abs().sum() > 0
    assert critic.g[0].weight.grad[[0, 2]].abs().sum() == 0


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="dimension 3"):
        JointCritic(3, 2)(torch.zeros(4, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="batches of N pairs"):
        SeparableCritic(2, 2)(torch.zeros(4, 2), torch.zeros(5, 2))


def test_gaussian_pair_mi_and_log_ratio_against_multivariate_normals():
    torch.set_default_dtype(torch.float64)
    assert CorrelatedGaussian.with_mi(6.0, 20).mutual_information == pytest.approx(6.0)
    rho = rho_for_mi(1.5, 3)
    pair = CorrelatedGaussian(3, rho)
    joint = torch.distributions.MultivariateNormal(
        torch.zeros(2), torch.tensor([[1.0, rho], [rho, 1.0]]))
    x, y = torch.randn(7, 3), torch.randn(7, 3)
    expected = (joint.log_prob(torch.stack([x, y], -1)).sum(-1)
                - torch.distributions.Normal(0.0, 1.0).log_prob(x).sum(-1)
                - torch.distributions.Normal(0.0, 1.0).log_prob(y).sum(-1))
    torch.testing.assert_close(pair.log_ratio(x, y), expected)
    samples = pair.sample(20000, torch.Generator().manual_seed(0))
    correlation = torch.corrcoef(torch.stack([samples[0][:, 0], samples[1][:, 0]]))[0, 1]
    assert abs(correlation.item() - rho) < 4 * (1 - rho**2) / math.sqrt(20000)
    with pytest.raises(ValueError, match="rho"):
        CorrelatedGaussian(3, 1.0)


def test_cubic_observations_have_unit_variance():
    w = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))[0]
    _, y = CorrelatedGaussian(4, 0.5, cubic=w).sample(200000, torch.Generator().manual_seed(0),
                                                      dtype=torch.float64)
    # Var[u^3] = 15 for a standard normal u; the sample variance's standard error is
    # sqrt((E[u^12] / 15^2 - 1) / n) = sqrt((10395 / 225 - 1) / n), about 0.015
    torch.testing.assert_close(y.var(0), torch.ones(4, dtype=torch.float64), atol=0.08, rtol=0)
