"""The global batch of the lightly-style losses and of the Gaussian RPM over W = 2 and W = 4
gloo processes (CPU, float64) equals one process on the concatenated batch.

Each rank holds a shard of the batch and gathers what the loss needs with
``rpm.distributed.all_gather_with_grad``. The losses are means over this process's rows, so they
are trained under ``DistributedDataParallel``, whose averaged gradient must be the gradient of
the single-process loss of the whole batch (equal shards: 12 pairs, 6 or 3 per rank). The RPM
ELBO is a sum over the pairs: the sum over ranks of the gradients (uneven shards) must be the
single-process gradient. To 1e-12 for the losses and 1e-10 for the ELBOs, sums of 12 terms
whose gradients reach tens (measured: about 1e-16 and 1e-13).

Where the global-batch form is not the single-process loss, the test checks what it is instead,
computed in one process from the equations, and that it differs from the single-process
gradient: Barlow Twins (each rank standardises its own rows, as lightly's does) and DCLW (the
weights are a softmax over each rank's pairs, as lightly's are). ``HypersphereLoss`` has no
``gather_distributed`` (lightly's neither): nothing of it is checked here.
"""

import datetime
import json

import pyro
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import rpm
from rpm._objective import prior_log_ratio
from rpm.inference import Candidates
from rpm.losses import (
    BarlowTwinsLoss,
    DCLLoss,
    DCLWLoss,
    LeJEPALoss,
    NTXentLoss,
    VICRegLoss,
)
from rpm.marginals import MomentMatchedMarginal
from rpm.priors import GaussianPairPrior, GaussianStarPrior
from tests.helpers import GaussianHead

X_DIM, D = 4, 3
NUM = 12                                       # pairs of the losses' global batch: equal shards
UNEVEN = {2: (5, 7), 4: (2, 3, 3, 4)}          # pairs per rank of the RPMs' global batch
TOLERANCES = {"mean": 1e-12, "sum": 1e-10}
#: What the worker measures, by name: the max abs error of the gradients.
MEAN_LOSSES = ("ntxent", "vicreg", "barlow_twins", "lejepa", "dcl", "dclw")
SUMMED_ELBOS = ("gaussian_pair_delta", "gaussian_pair_gaussian_recognition", "gaussian_star",
                "gaussian_star_pooled", "moment_matched_masked", "moment_matched_masked_pooled")


def _inputs(num: int, views: int = 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(num, X_DIM, generator=generator, dtype=torch.float64)
    return [x + 0.4 * torch.randn(num, X_DIM, generator=generator, dtype=torch.float64)
            for _ in range(views)]


def _encoder() -> torch.nn.Module:
    torch.manual_seed(2)
    return torch.nn.Sequential(torch.nn.Linear(X_DIM, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, D)).double()


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.grad.clone() for name, param in module.named_parameters()}


def _max_error(grads: dict, reference: dict) -> float:
    assert grads.keys() == reference.keys()
    return max(float((grads[name] - reference[name]).abs().max()) for name in reference)


# -- the lightly-style losses: DDP's mean over ranks of mean-reduced losses -----------------------

def _lejepa(loss_fn, outputs):
    return loss_fn(global_proj=torch.stack(outputs[:2]), local_proj=torch.stack(outputs[2:]))


#: name -> (the loss on every rank's shard, with its gather; the single-process loss).
def _losses(name):
    if name == "ntxent":
        return (lambda o: NTXentLoss(0.5, gather_distributed=True)(o[0], o[1]),
                lambda o: NTXentLoss(0.5)(o[0], o[1]))
    if name == "vicreg":
        return (lambda o: VICRegLoss(gather_distributed=True)(o[0], o[1]),
                lambda o: VICRegLoss()(o[0], o[1]))
    if name == "barlow_twins":
        return (lambda o: BarlowTwinsLoss(lambda_param=0.3, gather_distributed=True)(o[0], o[1]),
                lambda o: BarlowTwinsLoss(lambda_param=0.3)(o[0], o[1]))
    if name == "lejepa":
        kwargs = {"lambda_param": 0.4, "sigreg_knots": 5, "sigreg_num_vectors": 8}
        return (lambda o: _lejepa(LeJEPALoss(gather_distributed=True, **kwargs), o),
                lambda o: _lejepa(LeJEPALoss(**kwargs), o))
    if name == "dcl":
        return (lambda o: DCLLoss(0.5, gather_distributed=True)(o[0], o[1]),
                lambda o: DCLLoss(0.5)(o[0], o[1]))
    if name == "dclw":
        return (lambda o: DCLWLoss(0.5, sigma=0.7, gather_distributed=True)(o[0], o[1]),
                lambda o: DCLWLoss(0.5, sigma=0.7)(o[0], o[1]))
    raise AssertionError(name)


def _barlow_twins_of_shards(outputs, world: int, lambda_param: float = 0.3) -> torch.Tensor:
    """Barlow Twins with each shard standardised on its own (biased variance, eps 1e-5) and the
    cross-correlation over the whole batch, written from the equations."""
    def standardise(z):
        shards = z.chunk(world)
        return torch.cat([(s - s.mean(0)) / (s.var(0, unbiased=False) + 1e-5).sqrt()
                          for s in shards])
    a, b = standardise(outputs[0]), standardise(outputs[1])
    cross = a.T @ b / a.shape[0]
    off = cross - torch.diag(cross.diagonal())
    return (1 - cross.diagonal()).square().sum() + lambda_param * off.square().sum()


def _dclw_of_shards(outputs, world: int, sigma: float = 0.7) -> torch.Tensor:
    """DCL over the whole batch with the weights w_i = 2 - n softmax_i(<u_i, v_i> / sigma) of
    each shard of n pairs (no gradient), the normalised outputs' weights."""
    def weights(u, v):
        similarity = (u.detach() * v.detach()).sum(1) / sigma
        return torch.cat([2 - s.shape[0] * torch.softmax(s, 0) for s in similarity.chunk(world)])
    return DCLLoss(0.5, weight_fn=weights)(outputs[0], outputs[1])


def _check_mean_loss(rank: int, world: int, name: str) -> dict:
    """Every rank: DDP over its shard of the global batch with the loss's gather; the averaged
    gradient against one process on all rows."""
    views = _inputs(NUM)
    share = NUM // world
    rows = slice(rank * share, (rank + 1) * share)
    distributed_loss, single_loss = _losses(name)
    encoder = _encoder()
    ddp = DistributedDataParallel(encoder)
    outputs = ddp(torch.cat([v[rows] for v in views])).split(share)  # one forward per backward
    torch.manual_seed(100 + rank)  # SIGReg's directions: rank 0's must reach every rank
    distributed_loss(list(outputs)).backward()
    grads = _grads(encoder)

    reference = _encoder()
    full = list(reference(torch.cat(views)).split(NUM))
    torch.manual_seed(100)
    single_loss(full).backward()
    measured = {name: _max_error(grads, _grads(reference))}
    if name in ("barlow_twins", "dclw"):  # what the shards' form is instead
        expected = _encoder()
        full = list(expected(torch.cat(views)).split(NUM))
        of_shards = _barlow_twins_of_shards if name == "barlow_twins" else _dclw_of_shards
        of_shards(full, world).backward()
        measured[name + "_of_shards"] = _max_error(grads, _grads(expected))
    return measured


# -- the Gaussian RPM: the sum over ranks of the summed ELBO ----------------------------------------

def _rows(rank: int, sizes: tuple) -> slice:
    return slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))


def _gaussian_model(name: str):
    pyro.clear_param_store()
    torch.manual_seed(3)
    if name == "gaussian_pair_delta":
        return rpm.RPM(rpm.DeltaRecognition(_encoder()),
                       GaussianPairPrior(D, correlation=0.6, learn_correlation=True),
                       marginal="gaussian")
    if name == "gaussian_pair_gaussian_recognition":
        return rpm.RPM(rpm.GaussianRecognition(GaussianHead(X_DIM, D).double()),
                       GaussianPairPrior(D, correlation=0.6, learn_correlation=True),
                       marginal="gaussian")
    return rpm.RPM(rpm.DeltaRecognition(_encoder()), GaussianStarPrior(D, learn_scale=True),
                   marginal="gaussian", pooled_marginal=name == "gaussian_star_pooled")


def _gaussian_loss(model, name: str, views: list, noise: torch.Tensor, global_batch: bool):
    """The negative ELBO summed over the shard's instances: RPMELBO for Delta recognition, the
    objective's terms at z = loc + scale * fixed noise for Gaussian recognition."""
    if name == "gaussian_pair_gaussian_recognition":
        inputs = model.objective_inputs(views[0], views[1], global_batch=global_batch)
        q, q2 = inputs.recognitions
        z = [r.base_dist.loc + r.base_dist.scale * e for r, e in zip((q, q2), noise, strict=True)]
        return -prior_log_ratio(inputs.prior, z, inputs.recognitions, inputs.plate,
                                inputs.candidates, sequence=False, marginals=inputs.marginals)
    data = views[:2] if name == "gaussian_pair_delta" else [torch.stack(views, 1)]
    return rpm.RPMELBO(global_batch=global_batch).differentiable_loss(model.model, model.guide,
                                                                      *data)


def _check_gaussian_rpm(rank: int, world: int, name: str) -> dict:
    sizes = UNEVEN[world]
    views = _inputs(sum(sizes))
    noise = torch.randn(2, sum(sizes), D, generator=torch.Generator().manual_seed(4),
                        dtype=torch.float64)
    rows = _rows(rank, sizes)
    model = _gaussian_model(name)
    local = _gaussian_loss(model, name, [v[rows] for v in views], noise[:, rows], True)
    local.backward()
    total = local.detach().clone()
    dist.all_reduce(total)
    grads = _grads(model)
    for grad in grads.values():
        dist.all_reduce(grad)
    reference = _gaussian_model(name)
    single = _gaussian_loss(reference, name, views, noise, False)
    single.backward()
    assert abs(total.item() - single.item()) < 1e-10, (name, total.item(), single.item())
    return {name: _max_error(grads, _grads(reference))}


def _check_masked_marginal(rank: int, world: int, pooled: bool) -> dict:
    """MomentMatchedMarginal over J = 3 views with missing views, gathered: the moments run
    over every rank's observed rows. The sum over ranks of sum_n log N(z_n; m, S) at the ranks'
    own rows, and its gradient in the recognition parameters, equal one process's."""
    sizes = UNEVEN[world]
    total = sum(sizes)
    generator = torch.Generator().manual_seed(5)
    loc = torch.randn(total, 3, D, generator=generator, dtype=torch.float64)
    raw = torch.randn(total, 3, D, generator=generator, dtype=torch.float64)
    value = torch.randn(total, 3, D, generator=generator, dtype=torch.float64)
    mask = torch.rand(total, 3, generator=generator) < 0.7
    mask[:, 0] = True                                     # every view observed somewhere
    mask[1] = torch.tensor([False, True, False])          # a row of rank 0 with one view

    def log_prob(rows, candidates):
        leaves = (loc.clone().requires_grad_(), raw.clone().requires_grad_())
        q = pyro.distributions.Normal(leaves[0][rows], torch.nn.functional.softplus(
            leaves[1][rows]) + 0.1).to_event(1).mask(mask[rows])
        marginal = MomentMatchedMarginal(q, pooled=pooled, candidates=candidates)
        marginal.log_prob(value[rows]).sum().backward()
        return torch.cat([leaf.grad.reshape(-1) for leaf in leaves])

    grads = log_prob(_rows(rank, sizes), Candidates(global_batch=True))
    dist.all_reduce(grads)
    reference = log_prob(slice(None), None)
    name = "moment_matched_masked" + ("_pooled" if pooled else "")
    return {name: float((grads - reference).abs().max())}


def _worker(rank: int, world: int, store_path: str, results_path: str) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    pyro.enable_validation(True)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        measured: dict = {}
        for name in MEAN_LOSSES:
            measured.update(_check_mean_loss(rank, world, name))
        for name in SUMMED_ELBOS[:4]:
            measured.update(_check_gaussian_rpm(rank, world, name))
        measured.update(_check_masked_marginal(rank, world, pooled=False))
        measured.update(_check_masked_marginal(rank, world, pooled=True))
        errors = torch.tensor(list(measured.values()))
        dist.all_reduce(errors, op=dist.ReduceOp.MAX)
        if rank == 0:
            with open(results_path, "w") as file:
                json.dump(dict(zip(measured, errors.tolist(), strict=True)), file)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
@pytest.mark.parametrize("world", [2, 4])
def test_the_global_batch_of_w_processes_is_one_process_on_the_whole_batch(tmp_path, world):
    # warm the lazy imports of assert_close and DistributedDataParallel before forking
    import torch.distributed._functional_collectives  # noqa: F401

    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))
    results = tmp_path / "errors.json"
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(_worker, args=(world, str(tmp_path / "store"), str(results)),
                       nprocs=world, join=True, start_method=method)
    errors = json.loads(results.read_text())
    print(f"W = {world}: max abs gradient error",
          {name: f"{error:.1e}" for name, error in errors.items()})
    exact = {name: "mean" for name in MEAN_LOSSES if name not in ("barlow_twins", "dclw")}
    exact.update({"barlow_twins_of_shards": "mean", "dclw_of_shards": "mean"})
    exact.update(dict.fromkeys(SUMMED_ELBOS, "sum"))
    assert sorted(errors) == sorted([*exact, "barlow_twins", "dclw"])
    for name, reduction in exact.items():
        assert errors[name] < TOLERANCES[reduction], (name, errors[name])
    # the shards' form is not the single-process loss: per-rank statistics change the gradient
    assert errors["barlow_twins"] > 1e-3 and errors["dclw"] > 1e-4, errors
