"""FusedPyroOptim: one fused optimizer gives the same updates as Pyro's per-parameter Adam."""

import pyro
import torch
from pyro.infer import SVI

import rpm
from rpm.inference import FusedAdam
from rpm.priors import ImplicitPrior, RBFEnergy


def train(optim, steps=5):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, 3)), ImplicitPrior(RBFEnergy()))
    svi = SVI(model.model, model.guide, optim, rpm.RPMELBO())
    x = torch.randn(16, 4, dtype=torch.float64)
    model.double()
    for _ in range(steps):
        svi.step(x, x + 0.1 * torch.randn_like(x))
    return model, optim


def test_fused_adam_matches_pyro_adam():
    reference, _ = train(pyro.optim.Adam({"lr": 0.01}))
    fused, optim = train(FusedAdam({"lr": 0.01}))
    for (name, a), (_, b) in zip(reference.named_parameters(), fused.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
    state = optim.get_state()
    assert len(state["fused"]["param_names"]) == 3  # weight, bias, lengthscale
