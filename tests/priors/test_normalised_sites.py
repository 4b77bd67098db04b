"""Every sample site a built-in prior declares is a normalised distribution whose ``sample``
draws from the density its ``log_prob`` defines, and the Pyro tools that assume so give the
RPM's numbers (``docs/theory.md#normalised-sample-sites``).

* Delta recognition (finite support): each latent site's ``log_prob`` is enumerated over every
  assignment of the batch's atoms to its rows; the probabilities sum to 1 (1e-12) and 20000
  draws of ``sample`` match them (each frequency within 5 standard errors plus 1e-3).
* Gaussian recognition and the explicit and state-space priors (densities): 40000 draws of a
  Student-t proposal estimate the normaliser, which is 1 within 5 standard errors; and 40000
  draws of ``sample`` give each coordinate's mean and second moment within 5 standard errors of
  the self-normalised importance estimate under ``log_prob``.
* ``Importance``'s log evidence against an exact enumeration of a tiny finite problem (Delta
  encoders, N = 2, D = 1); ``Predictive`` then ``log_prob`` against the exact entropy;
  ``trace.log_prob_sum()`` against a float64 loop of the ELBO's terms; vectorised particles on
  the priors over J views against particles drawn by hand; ``TraceMeanField_ELBO`` and
  ``RenyiELBO`` against ``Trace_ELBO``.
"""

import itertools
import math
import warnings

import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions import StudentT
from pyro.infer import Importance, Predictive
from pyro.infer.importance import vectorized_importance_weights
from pyro.poutine.util import site_is_subsample

import rpm
from rpm.priors import (
    GaussianRandomWalkPrior,
    GeneralizedNormalRandomWalkPrior,
    ImplicitPrior,
    LaplaceRandomWalkPrior,
    LinearDynamicsPrior,
    MarkovImplicitPrior,
    MarkovPrior,
    PartnerMixturePrior,
    PooledImplicitPrior,
    RBFEnergy,
    StarImplicitPrior,
    StateSpacePrior,
    StationaryStateSpacePrior,
)
from rpm.priors._sequence import MarkovChain
from tests.helpers import GaussianHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, X_DIM, D = 2, 3, 1


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def energy():
    return RBFEnergy(lengthscale=0.7, learn_lengthscale=False)


#: The implicit priors (they accept Delta encoders): name -> (prior, RPM keyword arguments,
#: number of views). Pair priors take two views, the priors over J views a list of J.
IMPLICIT = {
    "implicit": (lambda: ImplicitPrior(energy()), {}, 2),
    "pooled": (lambda: PooledImplicitPrior(energy()), {}, 2),
    "pooled-forward": (lambda: PooledImplicitPrior(energy(), direction="forward"), {}, 2),
    "pooled-backward": (lambda: PooledImplicitPrior(energy(), direction="backward"), {}, 2),
    "markov": (lambda: MarkovImplicitPrior(energy()), {}, 2),
    "markov-pooled-marginal": (lambda: MarkovImplicitPrior(energy()),
                               {"pooled_marginal": True}, 2),
    "star": (lambda: StarImplicitPrior(energy()), {}, 2),
    "partners-cross-view": (lambda: PartnerMixturePrior(energy(), candidates="cross_view"), {}, 2),
}

#: The priors with a density (Gaussian encoders): name -> (prior, number of views).
EXPLICIT = {
    "gaussian-walk": (lambda: GaussianRandomWalkPrior(D, scale=1.0, step=0.4), 2),
    "laplace-walk": (lambda: LaplaceRandomWalkPrior(D, scale=1.0, step=0.4), 2),
    "generalized-normal-walk": (
        lambda: GeneralizedNormalRandomWalkPrior(D, scale=1.0, step=0.4, shape=1.5), 2),
    "linear-dynamics": (lambda: LinearDynamicsPrior(D, scale=1.0, noise=0.5), 2),
    "state-space": (lambda: StateSpacePrior(D), 3),
    "stationary-state-space": (lambda: StationaryStateSpacePrior(D), 3),
}


def views(count: int, num: int = N) -> list[torch.Tensor]:
    x = torch.randn(num, X_DIM)
    return [x + 0.5 * torch.randn(num, X_DIM) for _ in range(count)]


def call(model, fn, inputs):
    """``fn`` (model.model or model.guide) on the views: two positionally, else a list."""
    return fn(*inputs) if len(inputs) == 2 and not model_is_joint(model) else fn(inputs)


def model_is_joint(model) -> bool:
    return isinstance(model.prior, rpm.priors.SequencePrior)


def implicit_rpm(name: str, recognition: str = "delta"):
    build, kwargs, count = IMPLICIT[name]
    if recognition == "delta":
        encoder = rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D))
    else:
        encoder = rpm.GaussianRecognition(GaussianHead(X_DIM, D))
    return rpm.RPM(encoder, build(), **kwargs), views(count)


def latent_sites(trace) -> dict:
    """The sample sites that are not observed (the factors are observed sites), plates left
    out."""
    return {name: site for name, site in trace.nodes.items()
            if site["type"] == "sample" and not site["is_observed"]
            and not site_is_subsample(site)}


# -- sites on a finite support (Delta recognition) ----------------------------------------------

def assignments(fn, atoms: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every value of a whole-batch site whose rows are atoms: (K^R, *event_shape), in the
    order of ``itertools.product`` (row 0 slowest), and R."""
    rows = fn.event_shape[:-1].numel()
    index = torch.tensor(list(itertools.product(range(atoms.shape[0]), repeat=rows)))
    return atoms[index].reshape((-1,) + fn.event_shape), rows


def assignment_codes(draws: torch.Tensor, atoms: torch.Tensor, rows: int) -> torch.Tensor:
    """The index in :func:`assignments` of each draw (S, *event_shape)."""
    matches = (draws.reshape(len(draws), rows, 1, -1) == atoms[None, None]).all(-1)  # (S, R, K)
    assert bool((matches.sum(-1) == 1).all()), "a draw off the atoms"
    digits = matches.to(torch.int64).argmax(-1)
    powers = atoms.shape[0] ** torch.arange(rows - 1, -1, -1)
    return (digits * powers).sum(-1)


@pytest.mark.parametrize("name", sorted(IMPLICIT))
def test_delta_sites_sum_to_one_and_sample_what_log_prob_says(name):
    model, inputs = implicit_rpm(name)
    trace = poutine.trace(lambda: call(model, model.model, inputs)).get_trace()
    sites = latent_sites(trace)
    assert sorted(sites) == (["z"] if model_is_joint(model) else ["z", "z2"])
    with torch.no_grad():
        atoms = torch.cat([model.recognition(x).mean for x in inputs]).unique(dim=0)      # (K, D)
    assert atoms.shape[0] == N * len(inputs)
    draws = 20000
    for site in sites.values():
        fn = site["fn"]
        assert fn.batch_shape == () and fn.support.is_discrete
        values, rows = assignments(fn, atoms)
        probabilities = fn.log_prob(values).exp()
        assert probabilities.sum().item() == pytest.approx(1.0, abs=1e-12)
        frequencies = torch.bincount(assignment_codes(fn.sample((draws,)), atoms, rows),
                                     minlength=len(values)).double() / draws
        tolerance = 5 * (probabilities * (1 - probabilities) / draws).sqrt() + 1e-3
        assert bool(((frequencies - probabilities).abs() < tolerance).all())


# -- sites with a density ----------------------------------------------------------------------

def check_density_site(fn, draws: int = 40000) -> None:
    """The normaliser of ``fn`` (each batch element) is 1, and its samples' first and second
    moments per coordinate are those of its log-density (module docstring)."""
    samples = fn.sample((draws,))                                             # (S, *B, *E)
    event_dims = len(fn.event_shape)
    flat = samples.reshape(samples.shape[:1 + len(fn.batch_shape)] + (-1,))   # (S, *B, C)
    centre, spread = flat.mean(0), flat.std(0)
    proposal = StudentT(3.0, centre, 1.5 * spread)
    points = proposal.sample((draws,))                                       # (S, *B, C)
    log_weight = (fn.log_prob(points.reshape(points.shape[:-1] + fn.event_shape))
                  - proposal.log_prob(points).sum(-1))                        # (S, *B)
    weight = log_weight.exp()
    normaliser = weight.mean(0)
    error = weight.std(0) / math.sqrt(draws)
    assert bool(((normaliser - 1).abs() < 5 * error).all()), (normaliser, error)
    assert bool((error < 0.05).all())
    for power in (1, 2):
        g_points, g_samples = points ** power, flat ** power                  # (S, *B, C)
        w = weight.unsqueeze(-1)
        estimate = (w * g_points).sum(0) / w.sum(0)
        estimate_error = ((w * (g_points - estimate)) ** 2).sum(0).sqrt() / w.sum(0)
        sample_mean = g_samples.mean(0)
        sample_error = g_samples.std(0) / math.sqrt(draws)
        limit = 5 * (estimate_error ** 2 + sample_error ** 2).sqrt()
        assert bool(((sample_mean - estimate).abs() < limit).all()), (power, sample_mean, estimate)
    assert event_dims >= 1


@pytest.mark.parametrize("name", ["implicit", "pooled", "pooled-forward", "markov",
                                  "markov-pooled-marginal", "star"])
def test_gaussian_sites_of_the_implicit_priors_are_normalised_and_sample_their_density(name):
    model, inputs = implicit_rpm(name, recognition="gaussian")
    trace = poutine.trace(lambda: call(model, model.model, inputs)).get_trace()
    sites = latent_sites(trace)
    assert sites
    for site in sites.values():
        check_density_site(site["fn"])


@pytest.mark.parametrize("name", sorted(EXPLICIT))
def test_sites_of_the_explicit_and_state_space_priors_are_normalised_and_sample_their_density(
        name):
    build, count = EXPLICIT[name]
    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), build())
    inputs = views(count)
    trace = poutine.trace(lambda: call(model, model.model, inputs)).get_trace()
    sites = latent_sites(trace)
    assert sorted(sites) == (["z"] if model_is_joint(model) else ["z", "z2"])
    for site in sites.values():  # z2's distribution given the traced z
        check_density_site(site["fn"])


def test_markov_chain_of_a_pair_prior_samples_the_chain_its_log_prob_is():
    """MarkovPrior's site, a MarkovChain (log_prob pinned to the product of the pair prior's
    factors in tests/models/test_sequence.py): 4000 sequences of T = 3 drawn in one batch have the
    closed-form moments of z_1 ~ N(0, s^2), z_{t+1} = a z_t + N(0, sigma^2), each within 5
    standard errors."""
    pair = LinearDynamicsPrior(1, scale=1.2, noise=0.5)
    num, steps = 4000, 3
    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), MarkovPrior(pair))
    inputs = views(steps, num)
    site = poutine.trace(model.model).get_trace(inputs).nodes["z"]
    assert isinstance(site["fn"], MarkovChain) and site["fn"].batch_shape == (num,)
    draws = site["fn"].sample()[..., 0]                                        # (num, T)
    a = pair.transition.item()
    s2 = (pair.initial_scale_tril ** 2).item()
    sigma2 = (pair.noise_scale_tril ** 2).item()
    variances = [s2]
    for _ in range(steps - 1):
        variances.append(a * a * variances[-1] + sigma2)
    covariance = torch.tensor([[variances[min(i, j)] * a ** abs(i - j) for j in range(steps)]
                               for i in range(steps)])
    empirical = draws.T @ draws / num
    error = ((covariance.diagonal()[:, None] * covariance.diagonal()[None, :] + covariance ** 2)
             / num).sqrt()
    assert bool(((empirical - covariance).abs() < 5 * error).all())
    assert bool((draws.mean(0).abs() < 5 * covariance.diagonal().sqrt() / math.sqrt(num)).all())


# -- Pyro's tools on an RPM --------------------------------------------------------------------

def exact_log_evidence(model, inputs) -> float:
    """log sum over every assignment of the batch's atoms to the latent sites' rows of
    exp(trace.log_prob_sum()): the model's evidence, enumerated."""
    trace = poutine.trace(lambda: call(model, model.model, inputs)).get_trace()
    sites = latent_sites(trace)
    with torch.no_grad():
        atoms = torch.cat([model.recognition(x).mean for x in inputs]).unique(dim=0)
    spaces = {name: assignments(site["fn"], atoms)[0] for name, site in sites.items()}
    terms = []
    for choice in itertools.product(*(range(len(values)) for values in spaces.values())):
        data = {name: spaces[name][i] for name, i in zip(spaces, choice, strict=True)}
        conditioned = poutine.condition(lambda: call(model, model.model, inputs), data=data)
        with torch.no_grad():
            terms.append(poutine.trace(conditioned).get_trace().log_prob_sum())
    return torch.logsumexp(torch.stack(terms), 0).item()


@pytest.mark.parametrize("name", ["implicit", "pooled-forward", "markov"])
def test_importance_log_evidence_matches_the_exact_enumeration(name):
    """Delta encoders, N = 2, D = 1: the evidence of the model (sites and factors) by
    enumeration; Importance with the recognition guide is exact (the guide is a point mass),
    and the vectorised importance weights with the model's own sites as the proposal (which
    needs each site's sample to draw from its log_prob) are within 5 standard errors."""
    pyro.enable_validation(False)  # off-atom assignments: log-density -inf, not an error
    model, inputs = implicit_rpm(name)
    exact = exact_log_evidence(model, inputs)
    with torch.no_grad():
        elbo = -rpm.RPMELBO().loss(model.model, model.guide, *(
            inputs if not model_is_joint(model) else [inputs]))
    assert elbo == pytest.approx(exact, abs=1e-10)   # Appendix C: tight with Delta encoders
    importance = Importance(lambda: call(model, model.model, inputs),
                            lambda: call(model, model.guide, inputs), num_samples=3).run()
    assert importance.get_log_normalizer().item() == pytest.approx(exact, abs=1e-10)
    draws = 4000
    prior_proposal = poutine.block(lambda: call(model, model.model, inputs),
                                   hide_types=["observe"])
    with torch.no_grad():
        log_weights, _, _ = vectorized_importance_weights(
            lambda: call(model, model.model, inputs), prior_proposal, num_samples=draws,
            max_plate_nesting=1)
    weights = log_weights.exp()
    evidence = weights.mean().item()
    error = weights.std().item() / math.sqrt(draws)
    assert abs(evidence - math.exp(exact)) < 5 * error


def test_predictive_draws_then_log_prob_give_the_sites_entropy():
    """Predictive (no guide) draws the sites; their log_prob at the draws averages to minus
    the exact entropy sum_v p(v) log p(v) of each site (enumerated), within 5 standard errors."""
    model, inputs = implicit_rpm("implicit")
    draws = 3000
    samples = Predictive(model.model, num_samples=draws, parallel=True,
                         return_sites=["z", "z2"])(*inputs)
    trace = poutine.trace(model.model).get_trace(*inputs)
    with torch.no_grad():
        atoms = torch.cat([model.recognition(x).mean for x in inputs]).unique(dim=0)
    for name in ("z", "z2"):
        fn = trace.nodes[name]["fn"]
        assert samples[name].shape == (draws, 1, N, D)
        log_probs = fn.log_prob(samples[name][:, 0])                               # (S,)
        values, _ = assignments(fn, atoms)
        exact = fn.log_prob(values)
        exact = (exact.exp() * exact.nan_to_num(neginf=0.0)).sum().item()          # -entropy
        error = log_probs.std().item() / math.sqrt(draws)
        assert torch.isfinite(log_probs).all()
        assert abs(log_probs.mean().item() - exact) < 5 * error + 1e-12


def loop_log_joint(model, x, x2, z, z2) -> float:
    """log P(z, z2) + the likelihood factors at (z, z2) for the implicit prior with Gaussian
    encoders, written out with math: sum_i log Q(z_i|x_i) + log Q(z'_i|x'_i) + f(z_i, z'_i)
    - log (1/N) sum_j exp f(z_i, z'_j) (the mixtures cancel against the factors' marginals)."""
    loc, scale = (t.tolist() for t in model.recognition.net(x))
    loc2, scale2 = (t.tolist() for t in model.recognition.net(x2))
    lengthscale = model.prior.energy.lengthscale.item()

    def normal(v, m, s):
        return sum(-0.5 * ((v[d] - m[d]) / s[d]) ** 2 - math.log(s[d] * math.sqrt(2 * math.pi))
                   for d in range(D))

    def f(a, b):
        return -sum((a[d] - b[d]) ** 2 for d in range(D)) / (2 * lengthscale ** 2)

    total = 0.0
    for i in range(len(z)):
        total += normal(z[i], loc[i], scale[i]) + normal(z2[i], loc2[i], scale2[i])
        total += f(z[i], z2[i]) - math.log(sum(math.exp(f(z[i], z2[j])) for j in range(len(z)))
                                           / len(z))
    return total


def test_log_prob_sum_of_the_model_trace_is_the_loop_and_the_elbo():
    """Gaussian encoders, N = 5: the model trace replayed on a guide trace has log_prob_sum
    equal to the float64 loop, and minus the guide's log_prob_sum it is RPMELBO's single-particle
    ELBO at the same random numbers."""
    num = 5
    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), ImplicitPrior(energy()))
    x, x2 = views(2, num)
    guide_trace = poutine.trace(model.guide).get_trace(x, x2)
    model_trace = poutine.trace(poutine.replay(model.model, trace=guide_trace)).get_trace(x, x2)
    z, z2 = guide_trace.nodes["z"]["value"], guide_trace.nodes["z2"]["value"]
    with torch.no_grad():
        expected = loop_log_joint(model, x, x2, z.tolist(), z2.tolist())
    assert model_trace.log_prob_sum().item() == pytest.approx(expected, rel=1e-12)
    elbo = model_trace.log_prob_sum() - guide_trace.log_prob_sum()
    q, q2 = model.recognise(x, x2)
    with torch.no_grad():
        ratio = rpm.inference.rpm_elbo(model.prior, [z, z2], [q, q2])
    assert elbo.item() == pytest.approx(ratio.item(), rel=1e-12)


@pytest.mark.parametrize("name", ["markov", "markov-pooled-marginal", "star",
                                  "partners-cross-view"])
def test_vectorised_particles_on_the_priors_over_j_views_average_the_particles(name):
    """Trace_ELBO with 3 vectorised particles (the sites' leading dimensions) against the same
    random numbers drawn by hand: minus the mean over the particles of the model's
    log_prob_sum at each particle's latents less the guide's log-density there."""
    model, inputs = implicit_rpm(name, recognition="gaussian")
    inputs = inputs + views(1)                                                  # J = 3
    particles = 3
    torch.manual_seed(5)
    loss = pyro.infer.Trace_ELBO(num_particles=particles, vectorize_particles=True,
                                 max_plate_nesting=1).loss(model.model, model.guide, inputs)
    q = model.recognise(inputs)
    torch.manual_seed(5)
    z = q.rsample((particles,)).detach()                                        # (P, N, J, D)
    elbos = []
    with torch.no_grad():
        for latents in z:
            conditioned = poutine.condition(model.model, data={"z": latents})
            log_joint = poutine.trace(conditioned).get_trace(inputs).log_prob_sum()
            elbos.append(log_joint - q.log_prob(latents).sum())
    assert loss == pytest.approx(-torch.stack(elbos).mean().item(), rel=1e-10)
    delta, inputs = implicit_rpm(name)
    single = pyro.infer.Trace_ELBO().loss(delta.model, delta.guide, inputs)
    vectorised = pyro.infer.Trace_ELBO(num_particles=particles, vectorize_particles=True,
                                       max_plate_nesting=1).loss(delta.model, delta.guide, inputs)
    assert vectorised == pytest.approx(single, rel=1e-12)


@pytest.mark.parametrize("name", ["implicit", "pooled-backward", "markov", "star"])
@pytest.mark.parametrize("recognition", ["delta", "gaussian"])
def test_mean_field_and_renyi_elbos_run_on_the_rpm_and_agree_with_trace_elbo(name, recognition):
    """TraceMeanField_ELBO (no closed-form KL between a recognition and a mixture site: the
    Monte Carlo terms) and RenyiELBO with alpha = 0 and one particle are Trace_ELBO's value at
    the same random numbers, with warnings as errors."""
    model, inputs = implicit_rpm(name, recognition)
    args = inputs if not model_is_joint(model) else [inputs]
    values = []
    for elbo in (pyro.infer.Trace_ELBO(), pyro.infer.TraceMeanField_ELBO(),
                 pyro.infer.RenyiELBO(alpha=0.0, num_particles=1)):
        pyro.set_rng_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            values.append(elbo.loss(model.model, model.guide, *args))
    assert values[1] == pytest.approx(values[0], rel=1e-12)
    assert values[2] == pytest.approx(values[0], rel=1e-12)
