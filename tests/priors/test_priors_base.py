"""The two prior protocols (Prior over a pair, SequencePrior over J views) and the Energy hooks:
their defaults, the refusal of classes that mix the protocols or keep rpm 0.1's flag, a
subclass of a built-in energy that keeps the streamed normaliser, and a custom energy that gets
it from its own factorisation."""

import math

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO

import rpm
import rpm.priors._implicit as implicit
from rpm._objective import prior_log_ratio
from rpm.priors import (
    Energy,
    ImplicitPrior,
    MarkovPrior,
    Prior,
    PriorBase,
    RBFEnergy,
    SequencePrior,
)
from rpm.priors._base import is_sequence_prior

N, D = 9, 3


@pytest.fixture
def latents():
    torch.set_default_dtype(torch.float64)
    z = torch.randn(N, D)
    return z, z + 0.3 * torch.randn(N, D)


@pytest.fixture
def streamed_calls(monkeypatch):
    """Counts the calls of the streamed log-sum-exp kernel made by the implicit prior."""
    calls = []
    kernel = implicit.streaming_matmul_logsumexp

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(implicit, "streaming_matmul_logsumexp", counting)
    return calls


def log_ratio_loop(energy, z, z2):
    """f(z_i, z2_i) - log (1/N) sum_j exp f(z_i, z2_j), one pair at a time, from the matrix."""
    matrix = energy(z, z2)
    rows = [matrix[i, i] - (torch.logsumexp(matrix[i], 0) - math.log(N)) for i in range(N)]
    return torch.stack(rows)


def test_prior_defaults():
    prior = Prior()
    assert prior.accepts_delta_recognition is False
    assert prior.dim is None
    z = torch.zeros(2, D)
    assert prior.log_ratio(z, z, None, None) is None
    with pytest.raises(NotImplementedError, match="forward"):
        prior(None, None)
    q = pyro.distributions.Normal(torch.randn(4, D), 1.0).to_event(1)
    q2 = pyro.distributions.Delta(torch.randn(4, D), event_dim=1)
    marginal, marginal2 = prior.likelihood_marginals(q, q2)
    value = torch.randn(4, D)
    torch.testing.assert_close(
        marginal.log_prob(value),
        torch.stack([torch.logsumexp(q.log_prob(v), 0) - math.log(4) for v in value]))
    assert marginal2.is_discrete and torch.equal(marginal2.loc, q2.v)


def test_energy_defaults(latents):
    class Dot(Energy):
        def forward(self, z, z2):
            return z @ z2.T

    energy = Dot()
    z, z2 = latents
    assert energy.dim is None
    assert energy.logit_factors(z, z2) is None
    torch.testing.assert_close(energy.paired(z, z2), (z * z2).sum(-1), rtol=0, atol=1e-12)
    with pytest.raises(NotImplementedError, match="forward"):
        Energy()(z, z2)


def test_subclass_of_a_builtin_energy_keeps_the_streamed_path(latents, streamed_calls):
    class MyRBF(RBFEnergy):
        """A user's RBF that only adds a method."""

        def bandwidth(self):
            return self.lengthscale

    prior = ImplicitPrior(MyRBF(lengthscale=0.7))
    z, z2 = latents
    streamed = prior.log_ratio(z, z2, block_size=4)
    assert streamed_calls, "the subclass lost the streamed normaliser"
    torch.testing.assert_close(streamed, log_ratio_loop(prior.energy, z, z2), rtol=0, atol=1e-12)


def test_a_custom_energy_streams_through_its_own_factors(latents, streamed_calls):
    class ScaledDot(Energy):
        """f(z, z') = z . z' / tau, written in a few lines with its factorisation."""

        def __init__(self, tau):
            super().__init__()
            self.tau = tau

        def forward(self, z, z2):
            return z @ z2.T / self.tau

        def logit_factors(self, z, z2):
            return z / self.tau, z2, None

    prior = ImplicitPrior(ScaledDot(tau=0.5))
    z, z2 = latents
    streamed = prior.log_ratio(z, z2, block_size=4)
    assert len(streamed_calls) == 1 and streamed_calls[0] == (N, D)
    expected = []
    for i in range(N):
        logits = [float(z[i] @ z2[j]) / 0.5 for j in range(N)]
        expected.append(logits[i] - math.log(sum(math.exp(v) for v in logits) / N))
    torch.testing.assert_close(streamed, torch.tensor(expected), rtol=0, atol=1e-12)


def test_a_custom_prior_with_an_analytic_log_ratio_is_used_by_the_elbo():
    """A prior that says it cancels analytically: RPMELBO uses its log_ratio, Trace_ELBO its
    sites, and the two agree (here the implicit prior's log-ratio, rewritten as a subclass)."""
    torch.set_default_dtype(torch.float64)
    used = []

    class Recorded(ImplicitPrior):
        def log_ratio(self, z, z2, q=None, q2=None, candidates=None, block_size=None):
            used.append(True)
            return super().log_ratio(z, z2, q, q2, candidates=candidates, block_size=block_size)

    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, D)), Recorded(RBFEnergy()))
    x, x2 = torch.randn(N, 4), torch.randn(N, 4)
    fast = rpm.RPMELBO().loss(model.model, model.guide, x, x2)
    assert used
    assert fast == pytest.approx(Trace_ELBO().loss(model.model, model.guide, x, x2), rel=1e-12)


def test_sequence_prior_defaults():
    """The prior over J views shares PriorBase's attributes and none of Prior's methods."""
    prior = SequencePrior()
    assert isinstance(prior, PriorBase) and not isinstance(prior, Prior)
    assert not isinstance(Prior(), SequencePrior)
    assert (prior.accepts_delta_recognition, prior.dim, prior.joint_over_batch,
            prior.accepts_queue, prior.accepts_mask) == (False, None, False, False, False)
    assert not hasattr(prior, "log_ratio") and not hasattr(Prior(), "sequence_log_ratio")
    q = pyro.distributions.Normal(torch.randn(4, 3, D), 1.0).to_event(1)
    z = torch.randn(4, 3, D)
    assert prior.sequence_log_ratio(z, q, None) is None
    assert prior.posterior(q) is None and prior.posterior_log_ratio(z, q, None) is None
    with pytest.raises(NotImplementedError, match=r"forward\(q, marginal\)"):
        prior(q, None)
    assert is_sequence_prior(prior) and not is_sequence_prior(Prior())
    assert not is_sequence_prior(lambda q, q2: None)   # a plain callable is a pair prior


class _IndependentViews(SequencePrior):
    """z_{1:J} ~ N(0, I) per instance (event (J, D)), traced: no analytic term."""

    def forward(self, q, marginal):
        num_views = q.batch_shape[-1]
        standard = pyro.distributions.Normal(torch.zeros(num_views, D), 1.0).to_event(2)
        return pyro.sample("z", standard)


def test_a_custom_sequence_prior_with_an_analytic_term_is_used_by_the_elbo():
    """A prior over J = 3 views with Gaussian recognition: RPMELBO calls its sequence_log_ratio,
    and with or without it RPMELBO equals Trace_ELBO and the float64 loop of
    -sum_i [log N(z_i; 0, I) - sum_j log (1/N) sum_n Q(z_ij|x_nj)] at the guide's draw."""
    torch.set_default_dtype(torch.float64)
    used = []

    class Analytic(_IndependentViews):
        def sequence_log_ratio(self, z, q, marginal, candidates=None, block_size=None):
            used.append(True)
            log_prior = pyro.distributions.Normal(0.0, 1.0).log_prob(z).sum((-1, -2))
            return log_prior - marginal.log_prob(z)

    net = _Head()
    xs = [torch.randn(N, 4) for _ in range(3)]
    for prior, analytic in ((Analytic(), True), (_IndependentViews(), False)):
        used.clear()
        model = rpm.RPM(rpm.GaussianRecognition(net), prior)
        pyro.set_rng_seed(3)
        fast = rpm.RPMELBO().loss(model.model, model.guide, xs)
        assert bool(used) is analytic
        pyro.set_rng_seed(3)
        assert fast == pytest.approx(Trace_ELBO().loss(model.model, model.guide, xs), rel=1e-12)
        pyro.set_rng_seed(3)
        z = pyro.poutine.trace(model.guide).get_trace(xs).nodes["z"]["value"].detach()
        loc, scale = (p.detach() for p in net(torch.stack(xs, 1)))    # each (N, J, D), as z
        total = 0.0
        for i in range(N):
            total += sum(-0.5 * float(v) ** 2 - 0.5 * math.log(2 * math.pi) for v in z[i].flatten())
            for j in range(3):
                components = [float(pyro.distributions.Normal(loc[n, j], scale[n, j])
                                    .log_prob(z[i, j]).sum()) for n in range(N)]
                total -= math.log(sum(math.exp(c) for c in components) / N)
        assert fast == pytest.approx(-total, rel=1e-10)


def test_a_prior_that_mixes_the_protocols_is_refused():
    """rpm 0.1's joint_views flag, a class deriving from both protocols and a SequencePrior
    whose analytic term still has the pair's name are refused where the RPM meets them: at
    construction, at the next call after an assignment, and in rpm_elbo."""

    class OldJointViews(Prior):                        # a 0.1 prior over J views
        joint_views = True

        def forward(self, q, marginal):
            raise AssertionError("not reached")

    class Both(Prior, SequencePrior):
        pass

    class OldName(_IndependentViews):
        def log_ratio(self, z, q, marginal, candidates=None, block_size=None):
            raise AssertionError("not reached")

    class FlagOnSequence(_IndependentViews):
        joint_views = True

    cases = [(OldJointViews, r"subclass rpm.priors.SequencePrior instead of rpm.priors.Prior "
                             r"and rename its log_ratio to sequence_log_ratio"),
             (Both, "derives from both rpm.priors.Prior .* and rpm.priors.SequencePrior"),
             (OldName, "rename it sequence_log_ratio"),
             (FlagOnSequence, "joint_views, which rpm no longer reads: remove it")]
    recognition = rpm.GaussianRecognition(_Head())
    for cls, message in cases:
        with pytest.raises(TypeError, match=message):
            rpm.RPM(recognition, cls())
        model = rpm.RPM(recognition, _IndependentViews())
        model.prior = cls()
        with pytest.raises(TypeError, match=message):
            model.model([torch.randn(N, 4) for _ in range(3)])
        with pytest.raises(TypeError, match=message):
            rpm.inference.rpm_elbo(cls(), torch.randn(N, 3, D),
                                   pyro.distributions.Normal(torch.zeros(N, 3, D), 1.0).to_event(1))


def test_markov_prior_takes_a_pair_prior_only():
    with pytest.raises(TypeError, match="already a prior over J views"):
        MarkovPrior(_IndependentViews())


def test_the_terms_of_j_views_refuse_a_pair_prior():
    q = pyro.distributions.Normal(torch.zeros(N, 3, D), 1.0).to_event(1)
    with pytest.raises(TypeError, match=r"need a prior over J views .* got ImplicitPrior"):
        prior_log_ratio(ImplicitPrior(RBFEnergy()), q.sample(), (q, None), "instances",
                        sequence=True)


def test_a_prior_that_accepts_delta_recognition_is_allowed():
    class Tied(Prior):
        """P(z) = Q(z), z2 = z: relative to the recognition marginal, so Delta is fine."""

        accepts_delta_recognition = True

        def forward(self, q, q2):
            z = pyro.sample("z", rpm.MixtureMarginal(q))
            z2 = pyro.sample("z2", rpm.MixtureMarginal(q2))
            return z, z2

    class Density(Tied):
        accepts_delta_recognition = False

    rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, D)), Tied())
    with pytest.raises(ValueError, match="noise_scale"):
        rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, D)), Density())


class _Independent(Prior):
    """z ~ N(0, I), z2 ~ N(z, 0.5^2 I) per pair, with the likelihood marginals swapped
    (view 1's likelihood divides by the second view's mixture and vice versa)."""

    def forward(self, q, q2):
        z = pyro.sample("z", pyro.distributions.Normal(torch.zeros(D), 1.0).to_event(1))
        z2 = pyro.sample("z2", pyro.distributions.Normal(z, 0.5).to_event(1))
        return z, z2

    def likelihood_marginals(self, q, q2):
        first, second = super().likelihood_marginals(q, q2)
        return second, first


def test_the_likelihood_factors_and_the_traced_elbo_use_the_likelihood_marginals():
    """The factor "x" is log Q(z_i|x_i) - log (1/N) sum_n Q(z_i|x'_n) (a loop), and RPMELBO's
    traced route (no analytic log-ratio) subtracts the same marginals as Trace_ELBO sees."""
    torch.set_default_dtype(torch.float64)
    model = rpm.RPM(rpm.GaussianRecognition(_Head()), _Independent())
    x, x2 = torch.randn(N, 4), torch.randn(N, 4)
    trace = pyro.poutine.trace(model.model).get_trace(x, x2)
    trace.compute_log_prob()
    q, q2 = model.recognise(x, x2)
    z = trace.nodes["z"]["value"]
    expected = torch.stack([q.log_prob(z)[i] - torch.logsumexp(q2.log_prob(z[i]), 0) + math.log(N)
                            for i in range(N)])
    torch.testing.assert_close(trace.nodes["x"]["log_prob"], expected, rtol=1e-12, atol=1e-12)
    for block_size in (None, 4):
        pyro.set_rng_seed(0)
        traced = rpm.RPMELBO(block_size=block_size).loss(model.model, model.guide, x, x2)
        pyro.set_rng_seed(0)
        reference = Trace_ELBO().loss(model.model, model.guide, x, x2)
        assert traced == pytest.approx(reference, rel=1e-12)


def test_likelihood_marginals_of_the_wrong_kind_are_refused():
    class Wrong(_Independent):
        def likelihood_marginals(self, q, q2):
            return q, q2

    model = rpm.RPM(rpm.GaussianRecognition(_Head()), Wrong())
    with pytest.raises(TypeError, match="pair of rpm.MixtureMarginal"):
        model.model(torch.randn(N, 4), torch.randn(N, 4))


def test_prior_dimension_hook_is_checked():
    class Sized(Prior):
        dim = 5

        def forward(self, q, q2):
            raise AssertionError("not reached")

    model = rpm.RPM(rpm.GaussianRecognition(_Head()), Sized())
    with pytest.raises(ValueError, match="dimension 5 but the encoder outputs dimension 3"):
        model.guide(torch.randn(N, 4), torch.randn(N, 4))


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2 * D)

    def forward(self, x):
        loc, raw = self.linear(x).chunk(2, -1)
        return loc, torch.nn.functional.softplus(raw) + 0.1
