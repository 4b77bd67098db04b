"""Bad input gives a clear error naming the problem and the fix, never a silent wrong number.

One test per case of the "Reliability" issue: mismatched views, a batch of one, latent
dimensions that disagree, NaN/Inf in inputs or encoder outputs, non-positive
hyperparameters, deterministic encoders under an explicit density, custom priors that forget a
site or return the wrong thing, and command-line values out of range. Each asserts the
exception type and a fragment of the message (usually both the problem and the fix).
"""

import argparse
import math
import types

import pyro
import pyro.distributions as dist
import pytest
import torch

import rpm
import rpm.cli
from rpm.experiments import common
from rpm.marginals import MixtureMarginal
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    GaussianRandomWalkPrior,
    GeneralizedNormalRandomWalkPrior,
    ImplicitPrior,
    LaplaceRandomWalkPrior,
    LinearDynamicsPrior,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
)
from tests.helpers import GaussianHead

IN, DIM, N = 4, 3, 6


def loss_of(model, x, x2):
    return rpm.RPMELBO().loss(model.model, model.guide, x, x2)


def delta_rpm(prior=None, out_dim=DIM, noise_scale=0.0):
    recognition = rpm.DeltaRecognition(torch.nn.Linear(IN, out_dim), noise_scale=noise_scale)
    return rpm.RPM(recognition, prior or ImplicitPrior(RBFEnergy()))


def gaussian_rpm(prior, out_dim=DIM):
    return rpm.RPM(rpm.GaussianRecognition(GaussianHead(IN, out_dim)), prior)


# ----------------------------------------------------------------------------- batches
@pytest.mark.parametrize("entry", ["model", "guide", "RPMELBO", "Trace_ELBO"])
def test_views_with_different_batch_sizes(entry):
    model = delta_rpm() if entry != "Trace_ELBO" else gaussian_rpm(GaussianRandomWalkPrior(DIM))
    x, x2 = torch.randn(5, IN), torch.randn(4, IN)
    with pytest.raises(ValueError, match="same batch size, got 5 and 4") as info:
        if entry == "RPMELBO":
            loss_of(model, x, x2)
        elif entry == "Trace_ELBO":
            pyro.infer.Trace_ELBO().loss(model.model, model.guide, x, x2)
        else:
            getattr(model, entry)(x, x2)
    assert "x[i] and x2[i] form pair i" in str(info.value)


@pytest.mark.parametrize("validate", [True, False])
def test_a_batch_of_one_pair_has_nothing_to_contrast(validate):
    # checked always (it is free), not only under validation
    model = gaussian_rpm(GaussianRandomWalkPrior(DIM))
    with pyro.validation_enabled(validate), pytest.raises(ValueError, match="nothing to contrast") as info:
        loss_of(model, torch.randn(1, IN), torch.randn(1, IN))
    assert "at least 2 pairs" in str(info.value)


@pytest.mark.parametrize("entry", ["scalar x", "list x2"])
def test_views_must_be_batched_tensors(entry):
    model = delta_rpm()
    if entry == "scalar x":
        with pytest.raises(ValueError, match="x must have a batch dimension, got a scalar"):
            loss_of(model, torch.tensor(1.0), torch.tensor(1.0))
    else:
        with pytest.raises(TypeError, match="x2 must be a torch.Tensor, got list"):
            loss_of(model, torch.randn(N, IN), [[0.0] * IN] * N)


# ----------------------------------------------------------------------------- dimensions
@pytest.mark.parametrize(
    "build",
    [
        lambda: GaussianRandomWalkPrior(5),
        lambda: LinearDynamicsPrior(5),
        lambda: ImplicitPrior(BilinearEnergy(5)),
        lambda: ImplicitPrior(AnisotropicEnergy(5)),
        lambda: ImplicitPrior(NeuralEnergy(5, hidden=4)),
    ],
    ids=["random-walk", "linear-dynamics", "bilinear", "anisotropic", "neural"],
)
def test_encoder_output_dimension_disagrees_with_the_prior(build):
    model = gaussian_rpm(build(), out_dim=DIM)
    x = torch.randn(N, IN)
    with pytest.raises(ValueError, match="built for latent dimension 5 but the encoder outputs "
                                         "dimension 3") as info:
        loss_of(model, x, x)
    assert "dim=3" in str(info.value)


def test_the_two_views_encoders_disagree():
    model = rpm.RPM(
        rpm.DeltaRecognition(torch.nn.Linear(IN, 3)),
        ImplicitPrior(CosineEnergy()),
        rpm.DeltaRecognition(torch.nn.Linear(IN, 2)),
    )
    x = torch.randn(N, IN)
    with pytest.raises(ValueError, match="different dimensions 3 and 2") as info:
        loss_of(model, x, x)
    assert "same latent dimension" in str(info.value)


@pytest.mark.parametrize("energy", [BilinearEnergy(5), AnisotropicEnergy(5), NeuralEnergy(5)])
def test_energy_called_with_latents_of_the_wrong_dimension(energy):
    z = torch.randn(N, DIM)
    with pytest.raises(ValueError, match="built for latents of dimension 5 but the encoder "
                                         "produced dimension 3") as info:
        energy(z, z)
    assert "dim=3" in str(info.value)


# ----------------------------------------------------------------------------- NaN and Inf
class Overflow(torch.nn.Module):
    """A network with an unbounded exp: infinite outputs for moderately large inputs."""

    def __init__(self, gaussian: bool):
        super().__init__()
        self.linear = torch.nn.Linear(IN, DIM)
        self.gaussian = gaussian

    def forward(self, x):
        loc = torch.exp(1e3 * self.linear(x))
        return (loc, torch.ones_like(loc)) if self.gaussian else loc


class NaNScale(torch.nn.Module):
    def forward(self, x):
        loc = x[:, :DIM]
        return loc, torch.full_like(loc, float("nan"))


def _nonfinite_case(case):
    """(rpm, x, x2, message fragment) for each way a non-finite number can come in."""
    x, x2 = torch.randn(N, IN), torch.randn(N, IN)
    if case == "nan-in-x":
        x[2, 1] = float("nan")
        return delta_rpm(), x, x2, r"x has NaN or infinite entries in 1 of its 6 rows \(rows 2\)"
    if case == "inf-in-x2":
        x2[0, 0] = x2[4, 3] = -float("inf")
        return delta_rpm(), x, x2, r"x2 has NaN or infinite entries in 2 of its 6 rows \(rows 0, 4\)"
    if case == "nan-in-x2-gaussian":
        x2[5] = float("nan")
        model = gaussian_rpm(GaussianRandomWalkPrior(DIM))
        return model, x, x2, r"x2 has NaN or infinite entries .*rows 5\)"
    if case == "inf-from-delta-encoder":
        model = rpm.RPM(rpm.DeltaRecognition(Overflow(False)), ImplicitPrior(CosineEnergy()))
        return model, 10 + x.abs(), 10 + x2.abs(), "returned NaN or infinite latents"
    if case == "inf-from-gaussian-encoder":
        model = rpm.RPM(rpm.GaussianRecognition(Overflow(True)), GaussianRandomWalkPrior(DIM))
        return model, 10 + x.abs(), 10 + x2.abs(), "returned NaN or infinite loc"
    if case == "nan-scale-from-encoder":
        model = rpm.RPM(rpm.GaussianRecognition(NaNScale()), ImplicitPrior(RBFEnergy()))
        return model, x, x2, "returned NaN or infinite scale"
    raise AssertionError(case)


NONFINITE_CASES = [
    "nan-in-x",
    "inf-in-x2",
    "nan-in-x2-gaussian",
    "inf-from-delta-encoder",
    "inf-from-gaussian-encoder",
    "nan-scale-from-encoder",
]


@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_nonfinite_inputs_or_encoder_outputs_are_reported(case):
    model, x, x2, message = _nonfinite_case(case)
    with pytest.raises(ValueError, match=message) as info:
        loss_of(model, x, x2)
    text = str(info.value)
    assert ("clean or drop those pairs" in text) or ("check the inputs for NaN/Inf" in text)


@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_without_validation_nonfinite_input_gives_a_nonfinite_loss(case):
    # never a silent finite number: the Trainer stops on the NaN/Inf loss
    model, x, x2, _ = _nonfinite_case(case)
    with pyro.validation_enabled(False):
        assert not math.isfinite(loss_of(model, x, x2))


def test_mixture_marginal_rejects_nonfinite_values():
    marginal = MixtureMarginal(dist.Normal(torch.zeros(N, DIM), 1.0).to_event(1), validate_args=True)
    value = torch.randn(N, DIM)
    value[1, 1] = float("inf")
    with pytest.raises(ValueError, match="NaN or infinite entries; the recognition model or "
                                         "the prior produced non-finite latents"):
        marginal.log_prob(value)


# ----------------------------------------------------------------------------- parameters
POSITIVE_PARAMETERS = [
    ("kappa", lambda v: CosineEnergy(kappa=v)),
    ("kappa", lambda v: CosineEnergy(kappa=v, learn_kappa=True)),
    ("lengthscale", lambda v: RBFEnergy(lengthscale=v)),
    ("lengthscale", lambda v: RBFEnergy(lengthscale=v, learn_lengthscale=False)),
    ("init", lambda v: AnisotropicEnergy(DIM, init=v)),
    ("init", lambda v: AnisotropicEnergy(DIM, normalize=False, init=v)),
    ("tau", lambda v: LpEnergy(p=1.0, tau=v)),
    ("tau", lambda v: LpEnergy(p=3.0, tau=v, learn_tau=True)),
    ("p", lambda v: LpEnergy(p=v)),
    ("scale", lambda v: GaussianRandomWalkPrior(DIM, scale=v)),
    ("step", lambda v: GaussianRandomWalkPrior(DIM, step=v)),
    ("step", lambda v: LaplaceRandomWalkPrior(DIM, step=v)),
    ("step", lambda v: GeneralizedNormalRandomWalkPrior(DIM, step=v)),
    ("shape", lambda v: GeneralizedNormalRandomWalkPrior(DIM, shape=v)),
    ("shape", lambda v: GeneralizedNormalRandomWalkPrior(DIM, shape=v, learn_shape=False)),
    ("scale", lambda v: LinearDynamicsPrior(DIM, scale=v)),
    ("noise", lambda v: LinearDynamicsPrior(DIM, noise=v)),
]


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("name, build", POSITIVE_PARAMETERS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(POSITIVE_PARAMETERS)])
def test_nonpositive_hyperparameters_are_refused(name, build, value):
    with pytest.raises(ValueError, match=f"{name} must be a finite positive number, got "
                                         f"{value}; pass") as info:
        build(value)
    assert "> 0" in str(info.value)


@pytest.mark.parametrize("name, build", POSITIVE_PARAMETERS[:2] + POSITIVE_PARAMETERS[-2:])
def test_hyperparameters_that_are_not_numbers_are_refused(name, build):
    with pytest.raises(TypeError, match=f"{name} must be a number, got 'large'"):
        build("large")


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf")])
def test_negative_or_nonfinite_noise_scale(value):
    with pytest.raises(ValueError, match=f"noise_scale must be a finite number >= 0, got {value}"):
        rpm.DeltaRecognition(torch.nn.Linear(IN, DIM), noise_scale=value)


def test_nonfinite_bilinear_initialisation():
    with pytest.raises(ValueError, match="init_scale must be a finite number, got nan"):
        BilinearEnergy(DIM, init_scale=float("nan"))


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_nonpositive_scale_from_the_encoder(scale):
    class Head(torch.nn.Module):
        def forward(self, x):
            loc = x[:, :DIM]
            return loc, torch.full_like(loc, scale)

    model = rpm.RPM(rpm.GaussianRecognition(Head()), GaussianRandomWalkPrior(DIM))
    x = torch.randn(N, IN)
    with pytest.raises(ValueError, match="non-positive scale; map it through softplus"):
        loss_of(model, x, x)


# ----------------------------------------------------------------------------- Delta + density
class CustomNormalPrior(pyro.nn.PyroModule):
    """A user's explicit prior (a density, no ``accepts_delta_recognition``)."""

    def forward(self, q, q2):
        z = pyro.sample("z", dist.Normal(torch.zeros(DIM), 1.0).to_event(1))
        z2 = pyro.sample("z2", dist.Normal(z, 0.5).to_event(1))
        return z, z2


EXPLICIT_PRIORS = [
    lambda: GaussianRandomWalkPrior(DIM),
    lambda: LinearDynamicsPrior(DIM),
    lambda: CustomNormalPrior(),
]


@pytest.mark.parametrize("view", ["recognition", "recognition2"])
@pytest.mark.parametrize("build", EXPLICIT_PRIORS, ids=["random-walk", "linear-dynamics", "custom"])
def test_deterministic_encoder_with_an_explicit_density_is_refused(build, view):
    delta = rpm.DeltaRecognition(torch.nn.Linear(IN, DIM))
    gaussian = rpm.GaussianRecognition(GaussianHead(IN, DIM))
    first, second = (delta, None) if view == "recognition" else (gaussian, delta)
    with pytest.raises(ValueError, match=f"{view} is deterministic") as info:
        rpm.RPM(first, build(), second)
    message = str(info.value)
    assert "Appendix B" in message and "noise_scale=1e-2" in message
    # the fix the message names gives a finite ELBO
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(IN, DIM), noise_scale=1e-2), build())
    assert math.isfinite(loss_of(model, torch.randn(N, IN), torch.randn(N, IN)))


def test_deterministic_callable_recognition_is_caught_when_called():
    # a plain function has no ``is_deterministic``: the Delta is caught at the first call
    net = torch.nn.Linear(IN, DIM)
    model = rpm.RPM(lambda x: dist.Delta(net(x), event_dim=1), LinearDynamicsPrior(DIM))
    with pytest.raises(ValueError, match="recognition is deterministic .* ill-defined"):
        loss_of(model, torch.randn(N, IN), torch.randn(N, IN))


# ----------------------------------------------------------------------------- custom priors
def _forgetful_prior(declare):
    class Forgetful(pyro.nn.PyroModule):
        def forward(self, q, q2):
            values = {}
            for name in ("z", "z2"):
                sampler = pyro.sample if name in declare else (lambda _, d: d.sample())
                values[name] = sampler(name, dist.Normal(torch.zeros(DIM), 1.0).to_event(1))
            return values["z"], values["z2"]

    return Forgetful()


@pytest.mark.parametrize("missing", [["z"], ["z2"], ["z", "z2"]])
@pytest.mark.parametrize("entry", ["model", "RPMELBO", "Trace_ELBO"])
def test_custom_prior_that_forgets_a_sample_site(missing, entry):
    prior = _forgetful_prior({"z", "z2"} - set(missing))
    model = gaussian_rpm(prior)
    x = torch.randn(N, IN)
    expected = r"did not declare the sample site\(s\) " + repr(missing).replace("[", r"\[").replace(
        "]", r"\]"
    )
    with pytest.raises(ValueError, match=expected) as info:
        if entry == "model":
            model.model(x, x)
        elif entry == "RPMELBO":
            loss_of(model, x, x)
        else:
            pyro.infer.Trace_ELBO().loss(model.model, model.guide, x, x)
    assert "pyro.sample('z', ...) and pyro.sample('z2', ...)" in str(info.value)


@pytest.mark.parametrize(
    "returned, got",
    [
        (lambda z, z2: z2, "got Tensor"),
        (lambda z, z2: None, "got NoneType"),
        (lambda z, z2: (z, z2, z), "got tuple of length 3"),
        (lambda z, z2: [z, z2], "got list of length 2"),
    ],
)
@pytest.mark.parametrize("entry", ["model", "RPMELBO"])
def test_custom_prior_that_returns_the_wrong_thing(returned, got, entry):
    class Wrong(pyro.nn.PyroModule):
        def forward(self, q, q2):
            z = pyro.sample("z", dist.Normal(torch.zeros(DIM), 1.0).to_event(1))
            z2 = pyro.sample("z2", dist.Normal(z, 1.0).to_event(1))
            return returned(z, z2)

    model = gaussian_rpm(Wrong())
    x = torch.randn(N, IN)
    with pytest.raises(ValueError, match=f"must return the pair \\(z, z2\\), {got}") as info:
        model.model(x, x) if entry == "model" else loss_of(model, x, x)
    assert "return z, z2" in str(info.value)


class StudentTWalk(pyro.nn.PyroModule):
    """The README's custom prior: P(z) = N(0, I), P(z'|z) = StudentT(3, z, step), returning its
    sites' values as (z, z2), or (z2, z) with ``swap``; ``clone`` returns copies."""

    def __init__(self, dim, swap=False, clone=False):
        super().__init__()
        self.dim, self.swap, self.clone = dim, swap, clone
        self.step = pyro.nn.PyroParam(torch.tensor(0.5), dist.constraints.positive)

    def forward(self, q, q2):
        z = pyro.sample("z", dist.Normal(torch.zeros(self.dim), 1.0).to_event(1))
        z2 = pyro.sample("z2", dist.StudentT(3.0, z, self.step).to_event(1))
        if self.clone:
            z, z2 = z.clone(), z2.clone()
        return (z2, z) if self.swap else (z, z2)


def _run_entry(model, entry, x, x2):
    if entry == "model":
        model.model(x, x2)
    elif entry == "RPMELBO":
        loss_of(model, x, x2)
    elif entry == "Trace_ELBO":
        pyro.infer.Trace_ELBO().loss(model.model, model.guide, x, x2)
    else:  # one SVI step under RPMELBO
        svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 1e-2}),
                             rpm.RPMELBO())
        svi.step(x, x2)


@pytest.mark.parametrize("entry", ["model", "RPMELBO", "Trace_ELBO", "SVI"])
@pytest.mark.parametrize("clone", [False, True], ids=["same-tensors", "copies"])
def test_custom_prior_that_returns_its_sites_swapped(entry, clone):
    """A prior returning (z2, z) would pair each view's likelihood factor with the other view's
    latent; it is refused, naming the order."""
    model = gaussian_rpm(StudentTWalk(DIM, swap=True, clone=clone))
    x, x2 = torch.randn(N, IN), torch.randn(N, IN)
    expected = ("the prior StudentTWalk returned the value of site 'z2' in position 1" if not clone
                else "returned in position 1 a value that is not the sample of site 'z'")
    with pytest.raises(ValueError, match=expected) as info:
        _run_entry(model, entry, x, x2)
    assert "order (z, z2)" in str(info.value) and "`return z, z2`" in str(info.value)


def test_swapped_sites_are_caught_without_validation():
    """The identity check costs nothing, so it runs without pyro.enable_validation too."""
    model = gaussian_rpm(StudentTWalk(DIM, swap=True))
    x = torch.randn(N, IN)
    with pyro.validation_enabled(False), pytest.raises(ValueError, match=r"in the order \(z, z2\)"):
        model.model(x, x)


@pytest.mark.parametrize("entry", ["model", "RPMELBO", "Trace_ELBO"])
def test_a_correct_custom_prior_passes_the_order_check(entry):
    """The README's StudentTWalk, returning (z, z2) or copies of them, trains."""
    for clone in (False, True):
        _run_entry(gaussian_rpm(StudentTWalk(DIM, clone=clone)), entry, torch.randn(N, IN),
                   torch.randn(N, IN))


@pytest.mark.parametrize("entry", ["model", "RPMELBO", "Trace_ELBO", "SVI"])
def test_custom_prior_of_another_latent_size_names_both_sizes(entry):
    model = gaussian_rpm(StudentTWalk(5), out_dim=DIM)
    x = torch.randn(N, IN)
    with pytest.raises(ValueError, match="the prior StudentTWalk declares site 'z' with latents of "
                                         "size 5 but the encoder outputs latents of size 3") as info:
        _run_entry(model, entry, x, x)
    assert "build the prior for size 3, or the encoder with 5 outputs" in str(info.value)
    if entry != "Trace_ELBO":  # Pyro's Trace_ELBO appends its table of shapes to any error
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("energy", [RBFEnergy(), CosineEnergy(), BilinearEnergy(DIM)],
                         ids=["rbf", "cosine", "bilinear"])
@pytest.mark.parametrize("build", [delta_rpm, gaussian_rpm], ids=["delta", "gaussian"])
def test_an_energy_given_as_the_prior_is_told_to_wrap_it(energy, build):
    """An energy is callable on two latents, so it used to be run as a prior (and a Delta encoder
    was told to add noise, which then failed): the error says to wrap it."""
    with pytest.raises(TypeError, match="prior is an energy .* not a prior: wrap it in an "
                                        r"implicit prior, ImplicitPrior\(") as info:
        build(energy)
    assert "\n" not in str(info.value)
    if isinstance(energy, RBFEnergy):
        assert str(info.value).endswith("ImplicitPrior(RBFEnergy())")


@pytest.mark.parametrize(
    "build, error, message",
    [
        (lambda: rpm.RPM("encoder", ImplicitPrior(RBFEnergy())), TypeError,
         "recognition must be callable"),
        (lambda: rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(IN, DIM)), 3.0), TypeError,
         "prior must be callable as prior"),
        (lambda: ImplicitPrior(lambda z, z2: z @ z2.T), TypeError, "e.g. rpm.priors.RBFEnergy"),
        (lambda: rpm.GaussianRecognition(lambda x: x), TypeError, "must be a torch.nn.Module"),
        (lambda: rpm.RPMELBO(num_particles=0), ValueError, "num_particles must be a positive"),
    ],
)
def test_wrong_kinds_of_objects(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_global_batch_elbo_of_something_that_is_not_an_rpm():
    """Another program is evaluated by Trace_ELBO, which cannot gather a global batch."""
    def model(x, x2):
        pass

    with pytest.raises(NotImplementedError, match="global_batch=True.*model.model, model.guide"):
        rpm.RPMELBO(global_batch=True).loss(model, model, torch.randn(N, IN), torch.randn(N, IN))


def test_gaussian_network_that_returns_only_a_location():
    model = rpm.RPM(rpm.GaussianRecognition(torch.nn.Linear(IN, DIM)), GaussianRandomWalkPrior(DIM))
    x = torch.randn(N, IN)
    with pytest.raises(ValueError, match="expects the network to return a pair \\(loc, scale\\)"
                                         ".*DeltaRecognition\\(net, noise_scale=...\\)"):
        loss_of(model, x, x)


# ----------------------------------------------------------------------------- command line
#: An out-of-range value for each argparse type of rpm.experiments.common.
OUT_OF_RANGE = {
    common.positive_int: ("0", "expected a positive integer (>= 1), got '0'"),
    common.nonnegative_int: ("-1", "expected a non-negative integer (>= 0), got '-1'"),
    common.seed_value: ("-1", "expected a seed in [0, 2**32 - 1], got '-1'"),
    common.positive_float: ("0", "expected a positive number (> 0), got '0'"),
    common.nonnegative_float: ("-0.5", "expected a non-negative number (>= 0), got '-0.5'"),
    common.probability: ("1.5", "expected a probability in [0, 1], got '1.5'"),
    common.device_name: ("gpu", "expected auto, cpu, cuda or cuda:N, got 'gpu'"),
}


def _minimal_experiment() -> types.ModuleType:
    """An experiment module with one option of each range-checked type."""
    module = types.ModuleType("minimal_experiment")

    def add_parser(subparsers):
        parser = subparsers.add_parser("minimal")
        common.add_common_arguments(parser)
        parser.add_argument("--num-steps", type=common.positive_int, default=10)
        parser.add_argument("--lr", type=common.positive_float, default=1e-3)
        parser.add_argument("--weight-decay", type=common.nonnegative_float, default=0.0)
        parser.add_argument("--dropout", type=common.probability, default=0.0)
        parser.set_defaults(func=lambda args: 0)

    module.add_parser = add_parser
    module.run = lambda args: 0
    return module


def _range_checked_options(parser: argparse.ArgumentParser):
    """(sub-command, option, bad value, message) for every option with a range-checked type."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, subparser in action.choices.items():
                for option in subparser._actions:
                    if option.option_strings and option.type in OUT_OF_RANGE:
                        bad, message = OUT_OF_RANGE[option.type]
                        yield command, option.option_strings[-1], bad, message


def test_cli_arguments_out_of_range_are_argparse_errors(capsys, tmp_path):
    # every registered experiment sub-command (rpm.cli.SUBCOMMANDS), plus a minimal one so
    # that the test checks something before the experiments exist
    modules = [*rpm.cli.SUBCOMMANDS, _minimal_experiment()]
    cases = list(_range_checked_options(rpm.cli.build_parser(modules)))
    minimal = _range_checked_options(rpm.cli.build_parser([_minimal_experiment()]))
    assert {message for *_, message in minimal} == {message for _, message in OUT_OF_RANGE.values()}
    for command, option, bad, message in cases:
        out = tmp_path / f"{command}{option}"
        with pytest.raises(SystemExit) as exit:
            rpm.cli.main([command, "--out", str(out), option, bad], modules=modules)
        err = capsys.readouterr().err
        assert exit.value.code == 2, (command, option)
        assert f"argument {option}: {message}" in err, (command, option, err)
        assert "Traceback" not in err and err.startswith("usage: python -m rpm ")
        assert not out.exists()


def test_a_network_passed_as_recognition_model_is_told_to_wrap_it():
    net = torch.nn.Linear(6, 3)
    model = rpm.RPM(net, ImplicitPrior(RBFEnergy()))
    with pytest.raises(ValueError, match=r"got Tensor; .*rpm\.DeltaRecognition\(net\)"):
        model.model(torch.randn(8, 6), torch.randn(8, 6))


def test_an_explicit_prior_passed_as_an_energy_is_refused():
    from rpm.priors import GaussianRandomWalkPrior, LinearDynamicsPrior

    with pytest.raises(TypeError, match=r"got the prior GaussianRandomWalkPrior.*RandomWalkEnergy"):
        ImplicitPrior(GaussianRandomWalkPrior(3))
    with pytest.raises(TypeError, match=r"got the prior LinearDynamicsPrior: pass an explicit prior "
                                        r"to rpm.RPM directly$"):
        ImplicitPrior(LinearDynamicsPrior(3))
