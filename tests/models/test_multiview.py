"""One RPM over J views: J = 2 under a prior over J views is the pair model for every prior kind;
views of different shapes through one encoder and through per-group encoders against float64
loops; one call per view or one per group; RPMELBO == Trace_ELBO; the errors of "What is wrong"
6 of issue 22, each one line naming the fix."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO

import rpm
from rpm.priors import (
    BilinearEnergy,
    CosineEnergy,
    GaussianRandomWalkPrior,
    ImplicitPrior,
    LinearDynamicsPrior,
    MarkovImplicitPrior,
    MarkovPrior,
    RBFEnergy,
    StateSpacePrior,
)
from tests.helpers import GaussianHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, D, X_DIM = 6, 2, 5


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def grads(loss, params):
    return torch.autograd.grad(loss, params, allow_unused=True)


def assert_same(loss_a, loss_b, params, rtol=1e-12):
    assert torch.allclose(loss_a, loss_b, rtol=rtol, atol=1e-12), (loss_a, loss_b)
    for a, b in zip(grads(loss_a, params), grads(loss_b, params), strict=True):
        assert (a is None and b is None) or torch.allclose(a, b, rtol=1e-10, atol=1e-12)


PAIR_AND_JOINT = {
    # name: (pair prior, the same prior over J views, recognition kind)
    "implicit-rbf": (lambda e: ImplicitPrior(e), lambda e: MarkovImplicitPrior(e), "delta",
                     lambda: RBFEnergy(0.7)),
    "implicit-cosine": (lambda e: ImplicitPrior(e), lambda e: MarkovImplicitPrior(e), "delta",
                        lambda: CosineEnergy(kappa=2.0, learn_kappa=True)),
    "implicit-bilinear": (lambda e: ImplicitPrior(e), lambda e: MarkovImplicitPrior(e), "delta",
                          lambda: BilinearEnergy(D)),
    "random-walk": (lambda e: e, lambda e: MarkovPrior(e), "gaussian",
                    lambda: GaussianRandomWalkPrior(D)),
    "linear-dynamics": (lambda e: e, lambda e: MarkovPrior(e), "gaussian",
                        lambda: LinearDynamicsPrior(D)),
}


@pytest.mark.parametrize("kind", sorted(PAIR_AND_JOINT))
def test_two_views_under_a_prior_over_j_views_is_the_pair_model(kind):
    """RPM([x, x2]) with the prior over J views (site "z" of event (2, D)) against RPM(x, x2)
    with the pair prior (sites "z", "z2"): RPMELBO and Trace_ELBO, values and gradients."""
    pair_prior, joint_prior, recognition, part = PAIR_AND_JOINT[kind]
    net = torch.nn.Linear(X_DIM, D) if recognition == "delta" else GaussianHead(X_DIM, D)
    wrap = rpm.DeltaRecognition if recognition == "delta" else rpm.GaussianRecognition
    shared = part()
    joint = rpm.RPM(wrap(net), joint_prior(shared))
    pair = rpm.RPM(wrap(net), pair_prior(shared))
    x, x2 = torch.randn(N, X_DIM), torch.randn(N, X_DIM)
    params = list(net.parameters()) + list(shared.parameters())
    for elbo in (rpm.RPMELBO(), Trace_ELBO()):
        torch.manual_seed(4)
        joint_loss = elbo.differentiable_loss(joint.model, joint.guide, [x, x2])
        torch.manual_seed(4)
        pair_loss = elbo.differentiable_loss(pair.model, pair.guide, x, x2)
        if recognition == "delta":
            assert_same(joint_loss, pair_loss, params)
        else:  # the same draws in a different order (one site (N, 2, D) against two (N, D))
            q, q2 = pair.recognise(x, x2)
            torch.manual_seed(4)
            z = joint.guide_distribution(joint.recognise([x, x2])).rsample()
            expected = -rpm.inference.rpm_elbo(pair.prior, [z[:, 0], z[:, 1]], [q, q2])
            assert_same(joint_loss, expected, params)
    # the two forms of the call are one model: (x, x2) and [x, x2]
    torch.manual_seed(5)
    listed = rpm.RPMELBO().loss(joint.model, joint.guide, [x, x2])
    torch.manual_seed(5)
    assert rpm.RPMELBO().loss(joint.model, joint.guide, x, x2) == listed


class PoolThenLinear(torch.nn.Module):
    """One encoder for views of different sizes: mean over the last axis, then a linear map."""

    def __init__(self, channels: int, dim: int):
        super().__init__()
        self.linear = torch.nn.Linear(channels, dim)

    def forward(self, x):               # (B, C, L) with any L
        return self.linear(x.mean(-1))


def chain_infonce_loop(latents, lengthscale):
    """sum over consecutive views t, t+1 and instances i of
    f(z_{i,t}, z_{i,t+1}) - log (1/N) sum_j e^{f(z_{i,t}, z_{j,t+1})}, f the RBF energy."""
    total = 0.0
    for t in range(len(latents) - 1):
        a, b = latents[t].tolist(), latents[t + 1].tolist()
        for i in range(len(a)):
            f = [-sum((u - v) ** 2 for u, v in zip(a[i], b[j], strict=True)) / (2 * lengthscale**2)
                 for j in range(len(b))]
            total += f[i] - math.log(sum(math.exp(v) for v in f) / len(f))
    return total


@pytest.mark.parametrize("encoder_calls", ["per_view", "concat"])
def test_views_of_different_shapes_through_one_encoder(encoder_calls):
    """2 global crops of length 8 and 3 local crops of length 3, one encoder for all: each view
    is encoded alone (per_view) or with the views of its shape (concat, one group per shape)."""
    net = PoolThenLinear(3, D)
    groups = None if encoder_calls == "per_view" else [0, 0, 1, 1, 1]
    recognition = rpm.DeltaRecognition(net)
    modules = recognition if groups is None else [recognition, recognition]
    model = rpm.RPM(modules, MarkovImplicitPrior(RBFEnergy(0.9)), groups=groups,
                    encoder_calls=encoder_calls)
    views = [torch.randn(N, 3, 8), torch.randn(N, 3, 8)] + [torch.randn(N, 3, 3) for _ in range(3)]
    loss = rpm.RPMELBO().loss(model.model, model.guide, views)
    with torch.no_grad():
        expected = chain_infonce_loop([net(v) for v in views], 0.9)
    assert -loss == pytest.approx(expected, rel=1e-12)
    assert Trace_ELBO().loss(model.model, model.guide, views) == pytest.approx(loss, rel=1e-12)


def test_per_group_encoders_for_global_and_local_crops():
    global_net, local_net = torch.nn.Linear(8, D), torch.nn.Linear(3, D)
    model = rpm.RPM([rpm.DeltaRecognition(global_net), rpm.DeltaRecognition(local_net)],
                    MarkovImplicitPrior(RBFEnergy(0.9)), groups=[0, 0, 1, 1])
    views = [torch.randn(N, 8), torch.randn(N, 8), torch.randn(N, 3), torch.randn(N, 3)]
    params = list(model.parameters())
    fast = rpm.RPMELBO().differentiable_loss(model.model, model.guide, views)
    slow = Trace_ELBO().differentiable_loss(model.model, model.guide, views)
    assert_same(fast, slow, params)
    with torch.no_grad():
        latents = [global_net(v) for v in views[:2]] + [local_net(v) for v in views[2:]]
    assert -fast.item() == pytest.approx(chain_infonce_loop(latents, 0.9), rel=1e-12)
    assert model.encode_views(views).shape == (N, 4, D)
    with pytest.raises(ValueError, match="groups names a recognition model for 4 views"):
        model.guide(views[:3])



def test_positional_views_and_a_list_of_views_are_the_same_call():
    """model(x_1, ..., x_J) and model([x_1, ..., x_J]) give the same ELBO (the chain InfoNCE
    loop) and gradients for J = 2, 3, 4, through RPMELBO and Trace_ELBO; guide and encode_views
    agree too."""
    global_net, local_net = torch.nn.Linear(8, D), torch.nn.Linear(3, D)
    for groups in ([0, 1], [0, 0, 1], [0, 0, 1, 1]):
        model = rpm.RPM([rpm.DeltaRecognition(global_net), rpm.DeltaRecognition(local_net)],
                        MarkovImplicitPrior(RBFEnergy(0.9)), groups=groups)
        views = [torch.randn(N, 8 if g == 0 else 3) for g in groups]
        params = list(model.parameters())
        for elbo in (rpm.RPMELBO(), Trace_ELBO()):
            listed = elbo.differentiable_loss(model.model, model.guide, views)
            positional = elbo.differentiable_loss(model.model, model.guide, *views)
            assert_same(listed, positional, params, rtol=0)
        with torch.no_grad():
            latents = [(global_net if g == 0 else local_net)(v) for g, v in zip(groups, views, strict=True)]
        assert -positional.item() == pytest.approx(chain_infonce_loop(latents, 0.9), rel=1e-12)
        torch.testing.assert_close(model.guide(*views), model.guide(views), rtol=0, atol=0)
        torch.testing.assert_close(model.encode_views(*views), torch.stack(latents, 1), rtol=0,
                                   atol=1e-12)


def test_one_tensor_is_stacked_views_only_under_a_prior_over_j_views():
    """A pair prior takes its two views as (x, x2) or [x, x2]; one tensor (N, 2, ...) is
    refused, naming the call to make; under a prior over J views the same tensor is the
    stacked views, the same ELBO as the list of its slices."""
    net = torch.nn.Linear(X_DIM, D)
    x = torch.randn(N, 2, X_DIM)
    pair = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy(0.9)))
    with pytest.raises(ValueError, match=r"ImplicitPrior is a pair prior: call it with the two "
                                         r"views \(x, x2\)"):
        rpm.RPMELBO().loss(pair.model, pair.guide, x)
    joint = rpm.RPM(rpm.DeltaRecognition(net), MarkovImplicitPrior(RBFEnergy(0.9)))
    stacked = rpm.RPMELBO().loss(joint.model, joint.guide, x)
    assert stacked == pytest.approx(rpm.RPMELBO().loss(joint.model, joint.guide, x[:, 0], x[:, 1]),
                                    rel=1e-12)
    assert stacked == pytest.approx(rpm.RPMELBO().loss(pair.model, pair.guide, x[:, 0], x[:, 1]),
                                    rel=1e-12)

def test_per_view_and_concatenated_encoder_calls_agree_without_batch_norm_and_differ_with_it():
    net = torch.nn.Linear(X_DIM, D)
    views = [torch.randn(N, X_DIM) for _ in range(3)]
    losses = {}
    for calls in ("per_view", "concat"):
        model = rpm.RPM(rpm.DeltaRecognition(net), MarkovImplicitPrior(RBFEnergy()),
                        encoder_calls=calls)
        losses[calls] = rpm.RPMELBO().loss(model.model, model.guide, views)
    assert losses["per_view"] == pytest.approx(losses["concat"], rel=1e-13)
    # pairs too: the default keeps one call per view
    pair = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy()))
    concat = rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy()), encoder_calls="concat")
    assert pair.encoder_calls == "per_view"
    assert rpm.RPMELBO().loss(pair.model, pair.guide, *views[:2]) == pytest.approx(
        rpm.RPMELBO().loss(concat.model, concat.guide, *views[:2]), rel=1e-13)
    # batch normalisation in training mode: the statistics of each view, or of all views
    normed = torch.nn.Sequential(torch.nn.Linear(X_DIM, D), torch.nn.BatchNorm1d(D))
    got = {}
    for calls in ("per_view", "concat"):
        model = rpm.RPM(rpm.DeltaRecognition(normed), MarkovImplicitPrior(RBFEnergy()),
                        encoder_calls=calls)
        got[calls] = model.recognise(views).mean          # (N, J, D)
    per_view = torch.stack([normed(v) for v in views], 1)
    concatenated = normed(torch.cat(views)).reshape(3, N, D).transpose(0, 1)
    assert torch.allclose(got["per_view"], per_view.detach(), atol=1e-12)
    assert torch.allclose(got["concat"], concatenated.detach(), atol=1e-12)
    assert not torch.allclose(got["per_view"], got["concat"], atol=1e-6)


@pytest.mark.parametrize("guide", ["recognition", "structured"])
def test_rpmelbo_equals_trace_elbo_for_the_state_space_prior_over_j_views(guide):
    head = GaussianHead(X_DIM, D)
    model = rpm.RPM(rpm.GaussianRecognition(head), StateSpacePrior(D), guide=guide)
    views = [torch.randn(N, X_DIM) for _ in range(4)]
    params = list(model.parameters())
    torch.manual_seed(1)
    fast = rpm.RPMELBO().differentiable_loss(model.model, model.guide, views)
    torch.manual_seed(1)
    slow = Trace_ELBO().differentiable_loss(model.model, model.guide, views)
    assert_same(fast, slow, params, rtol=1e-11)


@pytest.mark.parametrize("energy", [lambda: RBFEnergy(0.8), lambda: CosineEnergy(kappa=3.0),
                                    lambda: BilinearEnergy(D)], ids=["rbf", "cosine", "bilinear"])
def test_the_stacked_small_batch_path_of_the_markov_implicit_prior_equals_the_steps(energy):
    """Small batches evaluate all T - 1 steps from one energy matrix; a block size forces the
    step-by-step path: values and gradients agree."""
    prior = MarkovImplicitPrior(energy())
    z = torch.randn(N, 5, D, requires_grad=True)
    q = dist.Delta(z, event_dim=1)
    marginal = rpm.marginals.SequenceMixtureMarginal(q)
    stacked = prior.sequence_log_ratio(z, q, marginal)
    stepwise = prior.sequence_log_ratio(z, q, marginal, block_size=10**6)
    assert torch.allclose(stacked, stepwise, rtol=1e-12, atol=1e-12)
    params = [z, *prior.parameters()]
    for a, b in zip(grads(stacked.sum(), params), grads(stepwise.sum(), params), strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_the_implicit_chain_is_a_whole_batch_site_in_model_and_guide():
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)), MarkovImplicitPrior(RBFEnergy()))
    views = [torch.randn(N, X_DIM) for _ in range(3)]
    guide_trace = pyro.poutine.trace(model.guide).get_trace(views)
    model_trace = pyro.poutine.trace(pyro.poutine.replay(model.model, trace=guide_trace)).get_trace(views)
    for trace in (guide_trace, model_trace):
        site = trace.nodes["z"]
        assert site["fn"].batch_shape == () and site["fn"].event_shape == (N, 3, D)
    assert model_trace.nodes["x"]["fn"].batch_shape == (N,)


# -- the errors of "What is wrong" 6 ------------------------------------------------------------

def test_a_sequence_without_its_view_axis_names_the_missing_axis():
    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), StateSpacePrior(D),
                    encoder_calls="concat")
    with pytest.raises(ValueError, match=r"the view axis is missing. For two paired views call "
                                         r"it with \(x, x2\).*\(N, T, features\)"):
        rpm.RPMELBO().loss(model.model, model.guide, torch.randn(N, X_DIM))


def test_two_stacked_sequences_are_read_as_two_views_and_refused_by_shape():
    """Positional arguments are views: two tensors (N, T, ...) are two views whose frames are
    (T, ...), which the encoder's output shape check names."""
    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), StateSpacePrior(D),
                    encoder_calls="concat")
    x = torch.randn(N, 4, X_DIM)
    with pytest.raises(ValueError, match=rf"loc of shape \(N, D\).*got \(\d+, 4, {D}\)"):
        rpm.RPMELBO().loss(model.model, model.guide, x, x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_inputs_of_another_dtype_than_the_encoder_name_the_conversion(dtype):
    torch.set_default_dtype(torch.float32)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)), ImplicitPrior(RBFEnergy()))
    x = torch.randint(0, 5, (N, X_DIM)).to(dtype)
    with pytest.raises(TypeError, match=rf"x has dtype {dtype} but the encoder's parameters are "
                                        r"torch.float32.*x.to\(torch.float32\)") as info:
        rpm.RPMELBO().loss(model.model, model.guide, x, x.float())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("encoder_calls", ["per_view", "concat"])
def test_inputs_of_a_shape_the_encoder_refuses_name_the_input_and_its_shape(encoder_calls):
    linear = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(X_DIM, D)), ImplicitPrior(RBFEnergy()),
                     encoder_calls=encoder_calls)
    x = torch.randn(N, X_DIM - 1)
    refused = r"refused (x|the views x, x2) of shape \(\d+, "
    with pytest.raises(ValueError, match=refused + rf"{X_DIM - 1}\) \(torch: mat1 and mat2 shapes "
                                                   r"cannot be multiplied") as info:
        rpm.RPMELBO().loss(linear.model, linear.guide, x, x)
    assert "\n" not in str(info.value)
    convolution = rpm.RPM(rpm.DeltaRecognition(torch.nn.Sequential(
        torch.nn.Conv2d(3, D, 3), torch.nn.Flatten())), ImplicitPrior(RBFEnergy()),
        encoder_calls=encoder_calls)
    images = torch.randn(N, 1, 5, 5)
    with pytest.raises(ValueError, match=refused + r"1, 5, 5\).*3 channels"):
        rpm.RPMELBO().loss(convolution.model, convolution.guide, images, images)


def test_a_prior_without_to_event_names_the_fix():
    class Forgetful(rpm.priors.Prior):
        def forward(self, q, q2):
            z = pyro.sample("z", dist.Normal(torch.zeros(N, D), 1.0))          # no .to_event(1)
            z2 = pyro.sample("z2", dist.Normal(z, 0.1).to_event(1))
            return z, z2

    model = rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D)), Forgetful())
    x = torch.randn(N, X_DIM)
    for elbo in (rpm.RPMELBO(), Trace_ELBO()):
        with pytest.raises(ValueError, match=r"declare it with \.to_event\(1\)") as info:
            elbo.loss(model.model, model.guide, x, x)
        # one line from rpm (Pyro's Trace_ELBO appends the trace's shapes below it)
        assert ".to_event(1)" in str(info.value).splitlines()[0]


def test_encode_reads_one_tensor_as_single_inputs_under_a_j_view_prior():
    """Under a prior over J views encode reads a batch of images (N, 1, 8, 8) as N inputs and
    returns each one's recognition mean, which equals the network applied image by image;
    encode_views gives every view's, and a second model by group."""
    from rpm.priors import CosineEnergy, StarImplicitPrior
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 8))
    net2 = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 8))
    model = rpm.RPM([rpm.DeltaRecognition(net), rpm.DeltaRecognition(net2)],
                    StarImplicitPrior(CosineEnergy(2.0)), groups=[0, 1, 0])
    images = torch.randn(5, 1, 8, 8)
    means = model.encode(images)
    expected = torch.stack([net(images[n:n + 1])[0] for n in range(5)])
    assert means.shape == (5, 8)
    torch.testing.assert_close(means, expected, rtol=0, atol=1e-6)
    expected2 = torch.stack([net2(images[n:n + 1])[0] for n in range(5)])
    torch.testing.assert_close(model.encode(images, group=1), expected2, rtol=0, atol=1e-6)
    views = model.encode_views([images, images.flip(-1), images])
    torch.testing.assert_close(views[:, 0], means, rtol=0, atol=1e-6)
    torch.testing.assert_close(views[:, 1], model.encode(images.flip(-1), group=1), rtol=0,
                               atol=1e-6)
    torch.testing.assert_close(model.encode_views(images, images.flip(-1), images), views,
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="group must be an integer in"):
        model.encode(images, group=2)
    with pytest.raises(TypeError, match="encode takes one tensor"):
        model.encode([images])
