"""ContentStyleProcess: the content is copied, each style coordinate changes with probability
p_change, and the moments of z and of z' - z match their closed forms under every dependence."""

import pytest
import torch

from rpm.data.synthetic import ContentStyleProcess
from rpm.data.synthetic.content_style import sample_wishart

NC, NS = 3, 4


def _process(**kwargs):
    return ContentStyleProcess(NC, NS, dtype=torch.float64, **kwargs)


def _covariances(p):
    sigma_c = p.content_scale_tril @ p.content_scale_tril.T
    sigma_s = p.style_scale_tril @ p.style_scale_tril.T
    sigma_a = p.change_scale_tril @ p.change_scale_tril.T
    return sigma_c, sigma_s, sigma_a


def test_content_is_copied_and_style_changes_with_probability_p_change():
    process = _process(p_change=0.75, statistical=True, causal=True, seed=3)
    z, z2 = process.sample_pairs(40000, torch.Generator().manual_seed(0))
    assert torch.equal(z[:, :NC], z2[:, :NC])
    changed = (z[:, NC:] != z2[:, NC:]).double()
    # binomial standard error of the fraction: sqrt(p (1 - p) / M) = 0.0011 per coordinate
    assert torch.allclose(changed.mean(dim=0), torch.full((NS,), 0.75, dtype=torch.float64),
                          atol=0.01)
    # independent coins: the pairwise co-change frequency is p^2
    co = (changed.T @ changed) / changed.shape[0]
    off = ~torch.eye(NS, dtype=torch.bool)
    assert torch.allclose(co[off], torch.full_like(co[off], 0.75 ** 2), atol=0.015)


@pytest.mark.parametrize("statistical, causal", [(False, False), (True, False), (True, True),
                                                 (False, True)])
def test_moments_match_the_closed_form(statistical, causal):
    process = _process(p_change=0.5, statistical=statistical, causal=causal, seed=1)
    p = process.parameters
    sigma_c, sigma_s, sigma_a = _covariances(p)
    b = p.coupling.double()
    # z = (c, s): mean (0, a), covariance [[S_c, S_c B^T], [B S_c, B S_c B^T + S_s]]
    mean = torch.cat([torch.zeros(NC, dtype=torch.float64), p.shift])
    cov = torch.cat([torch.cat([sigma_c, sigma_c @ b.T], 1),
                     torch.cat([b @ sigma_c, b @ sigma_c @ b.T + sigma_s], 1)], 0)
    z, z2 = process.sample_pairs(200000, torch.Generator().manual_seed(2))
    scale = cov.diagonal().sqrt()
    # standard error of a mean ~ scale / sqrt(M) = 0.0022 scale; of a covariance ~ 0.003 scale^2
    assert torch.allclose(z.mean(0) / scale, mean / scale, atol=0.015)
    emp = torch.cov(z.T)
    assert torch.allclose(emp / torch.outer(scale, scale), cov / torch.outer(scale, scale),
                          atol=0.02)
    # d = s' - s = m * eps: E[d d^T] = Sigma_A * (p on the diagonal, p^2 off it)
    d = z2[:, NC:] - z[:, NC:]
    rates = torch.full((NS, NS), 0.25, dtype=torch.float64).fill_diagonal_(0.5)
    expected = sigma_a * rates
    a_scale = sigma_a.diagonal().sqrt()
    got = d.T @ d / d.shape[0]
    assert torch.allclose(got / torch.outer(a_scale, a_scale),
                          expected / torch.outer(a_scale, a_scale), atol=0.02)


def test_independent_process_has_identity_covariances_and_no_coupling():
    p = _process(seed=5).parameters
    for matrix in _covariances(p):
        assert torch.equal(matrix, torch.eye(matrix.shape[0], dtype=torch.float64))
    assert not p.shift.any() and not p.coupling.any()


def test_wishart_mean_is_n_times_identity():
    draws = torch.stack([sample_wishart(4, torch.Generator().manual_seed(k)) for k in range(4000)])
    # Var(Sigma_ij) = n (1 + delta_ij) = 4..8, standard error of the mean <= 0.045
    assert torch.allclose(draws.mean(0), 4.0 * torch.eye(4, dtype=torch.float64), atol=0.2)
    assert bool((torch.linalg.eigvalsh(draws) > 0).all())


def test_one_draw_is_a_function_of_the_seed_and_redraw_draws_per_call():
    a, b, c = (_process(statistical=True, causal=True, seed=s).parameters for s in (7, 7, 8))
    assert torch.equal(a.coupling, b.coupling) and not torch.equal(a.coupling, c.coupling)
    redraw = _process(statistical=True, causal=True, redraw_every_batch=True)
    gen = torch.Generator().manual_seed(0)
    first = redraw.sample_marginal(3, gen)
    # each call draws its own parameters: the shift of a second call differs from the first's
    z = redraw.sample_marginal(50000, gen)
    z_again = redraw.sample_marginal(50000, gen)
    assert not torch.allclose(z[:, NC:].mean(0), z_again[:, NC:].mean(0), atol=0.1)
    assert first.shape == (3, NC + NS)
    with pytest.raises(ValueError, match="pass a torch.Generator"):
        redraw.sample_pairs(4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(p_change=1.5), "p_change"),
    (dict(content_dim=0), "content_dim"),
    (dict(statistical="yes"), "statistical"),
    (dict(seed=-1), "seed"),
])
def test_bad_arguments_raise_one_line_errors(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ContentStyleProcess(**kwargs)
