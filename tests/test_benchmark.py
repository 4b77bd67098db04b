"""``rpm benchmark``: the rows, the table and its resumption row by row, the MNIST-1D views, and
the refusals of bad input (one line, exit 2, nothing written)."""

import argparse
import importlib.util
import json
import math
import statistics

import numpy as np
import pytest
import torch

import rpm.experiments.benchmark.train as benchmark_train
from rpm.cli import main
from rpm.experiments.benchmark import command, data, model
from rpm.experiments.benchmark import table as benchmark_table

#: A tiny run on the digits (the bundled data, no optional package): 1 epoch, 2 seeds.
TINY = ["--datasets", "digits", "--objectives", "raw,untrained,simclr", "--seeds", "2", "--epochs",
        "1", "--batch-size", "128", "--no-progress"]


def _run(tmp_path, *argv):
    return main(["benchmark", "--out", str(tmp_path / "run"), *TINY, *argv])


@pytest.fixture
def counted(monkeypatch):
    """train_row, counting its calls (and able to stop the run at a given call, as Ctrl-C)."""
    calls = []
    state = {"interrupt_at": None}
    original = benchmark_train.train_row

    def train_row(dataset, objective, seed, *args, **kwargs):
        calls.append((dataset, objective, seed))
        if state["interrupt_at"] == len(calls):
            raise KeyboardInterrupt
        return original(dataset, objective, seed, *args, **kwargs)

    monkeypatch.setattr(benchmark_train, "train_row", train_row)
    return calls, state


def test_names_written_out_match_the_modules():
    assert command.DATASETS == data.DATASETS
    assert command.OBJECTIVES == model.OBJECTIVES
    assert command._LATENT_DIMS == model.LATENT_DIMS


def test_rows_table_and_resume_row_by_row(tmp_path, counted, capsys):
    calls, state = counted
    state["interrupt_at"] = 3  # Ctrl-C during the third row
    assert _run(tmp_path) == 130
    out = tmp_path / "run"
    saved = json.loads((out / command.ROWS_NAME).read_text())["rows"]
    assert [(r["objective"], r["seed"]) for r in saved] == [("raw", 0), ("untrained", 0)]

    calls.clear()
    state["interrupt_at"] = None
    assert main(["benchmark", "--out", str(out), "--resume", "--no-progress"]) == 0
    # the two finished rows are not recomputed, the other four are
    assert calls == [("digits", "simclr", 0), ("digits", "raw", 1), ("digits", "untrained", 1),
                     ("digits", "simclr", 1)]
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [(r["objective"], r["seed"]) for r in rows] == [
        (o, s) for s in (0, 1) for o in ("raw", "untrained", "simclr")]
    for row in rows:
        assert {"dataset", "objective", "seed", "knn", "linear", "seconds", "commit"} <= set(row)
        assert 0 <= row["knn"] <= 1 and 0 <= row["linear"] <= 1 and row["seconds"] > 0
        assert row["linear_converged"]
        assert row["steps"] == (0 if row["objective"] in model.BASELINES else 1347 // 128)
    assert rows[0]["linear"] == rows[3]["linear"]  # the raw inputs do not depend on the seed
    # the table: mean and s.d. over the seeds of each cell, recomputed from the rows
    table = (out / "table.md").read_text()
    for objective in ("raw", "untrained", "simclr"):
        knn = [100 * r["knn"] for r in rows if r["objective"] == objective]
        linear = [100 * r["linear"] for r in rows if r["objective"] == objective]
        line = next(line for line in table.splitlines() if line.startswith(f"| {objective} |"))
        assert line == (f"| {objective} | {statistics.fmean(knn):.1f} ± {statistics.stdev(knn):.1f} "
                        f"(2) | {statistics.fmean(linear):.1f} ± {statistics.stdev(linear):.1f} (2) |")
    assert (out / "table.png").stat().st_size > 0

    calls.clear()  # everything finished: a resumed run recomputes nothing
    assert main(["benchmark", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert calls == []


@pytest.mark.parametrize("argv, message", [
    (["--objectives", "simclr,moco"], "expected 'all' or distinct objectives from raw, untrained, "
     "simclr, ntxent, vmf, rbf, aninfonce, gaussian, vicreg, barlow, dcl"),
    (["--datasets", "cifar10"], "expected 'all' or distinct datasets from mnist1d, digits"),
    (["--seeds", "0"], "argument --seeds: expected a positive integer"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        main(["benchmark", "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_missing_mnist1d_names_the_extra(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mnist1d" else find_spec(name, *a))
    status = main(["benchmark", "--out", str(tmp_path / "run"), "--datasets", "mnist1d"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert "needs mnist1d, not installed" in err[0] and "pip install 'rpm-pyro[benchmark]'" in err[0]
    assert not (tmp_path / "run").exists()


def test_gaussian_needs_more_inputs_than_latent_dimensions(tmp_path, capsys):
    status = main(["benchmark", "--out", str(tmp_path / "run"), "--datasets", "digits",
                   "--objectives", "gaussian", "--batch-size", "64"])
    err = capsys.readouterr().err
    assert status == 2 and "use at least 65" in err
    assert not (tmp_path / "run").exists()


def test_mnist1d_views_are_a_shift_an_offset_and_a_slope():
    """Each view is a circular shift of its sequence by at most 10 plus a + b (t - 19.5), |a| <=
    0.3, |b| <= 0.04: found by trying every shift and fitting the residual's line (float64)."""
    x = torch.randn(32, 40, dtype=torch.float64)
    view = data.mnist1d_views(x, torch.Generator().manual_seed(3))
    t = torch.arange(40, dtype=torch.float64) - 19.5
    shifts_seen = set()
    for n in range(x.shape[0]):
        fits = []
        for shift in range(-10, 11):
            residual = view[n] - torch.roll(x[n], shift)
            a, b = residual.mean(), (residual * t).sum() / (t * t).sum()
            if torch.allclose(residual, a + b * t, atol=1e-9):
                fits.append((shift, float(a), float(b)))
        assert len(fits) == 1, n
        shift, a, b = fits[0]
        assert abs(a) <= 0.3 and abs(b) <= 0.04
        shifts_seen.add(shift)
    assert len(shifts_seen) > 5  # the shifts vary between sequences


@pytest.mark.skipif(importlib.util.find_spec("mnist1d") is None,
                    reason="needs the benchmark extra (mnist1d)")
def test_mnist1d_is_generated_offline_without_touching_global_generators(monkeypatch):
    import random

    import numpy as np
    import requests

    def refuse(*args, **kwargs):
        raise AssertionError("mnist1d tried to download")

    monkeypatch.setattr(requests, "get", refuse)
    random.seed(5)
    np.random.seed(5)
    before = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    split = data.load_dataset("mnist1d")
    assert (random.random(), np.random.rand()) == before
    assert split.train_x.shape == (4000, 40) and split.test_x.shape == (1000, 40)
    assert split.train_x.dtype == torch.float32
    assert set(split.train_y.tolist()) == set(range(10))


def test_mnist1d_encoder_is_the_notebooks_simclr_network():
    """Three convolutions to h (125 = 25 channels x 5 positions), then 125 ReLU units and 16
    outputs: the notebook's parameter counts (3,950 in the convolutions; with its one hidden
    projector layer 3,950 + 125 * 125 + 125 + 125 * 16 + 16)."""
    encoder = model.Mnist1dEncoder()
    x = torch.randn(3, 40)
    assert encoder.backbone(x).shape == (3, 125) and encoder(x).shape == (3, 16)
    conv = (1 * 25 * 5 + 25) + 2 * (25 * 25 * 3 + 25)
    assert sum(p.numel() for p in encoder.backbone.parameters()) == conv == 3950
    assert sum(p.numel() for p in encoder.parameters()) == conv + 125 * 125 + 125 + 125 * 16 + 16
    h = encoder.backbone(x)  # z is W2 relu(W1 h + b1) + b2
    first, last = encoder.head[0], encoder.head[2]
    expected = torch.relu(h @ first.weight.T + first.bias) @ last.weight.T + last.bias
    assert torch.allclose(encoder(x), expected, atol=1e-6)


def _cosines(z1, z2, kappa):
    u1, u2 = z1 / z1.norm(dim=1, keepdim=True), z2 / z2.norm(dim=1, keepdim=True)
    return [[kappa * float(u1[i] @ u2[j]) for j in range(len(z2))] for i in range(len(z1))]


def _one_direction(z1, z2, kappa):
    """The notebook's loss, a loop: each z_i against z'_1..z'_N (its positive z'_i)."""
    s = _cosines(z1, z2, kappa)
    n = len(s)
    return sum(math.log(sum(math.exp(v) for v in s[i])) - s[i][i] for i in range(n)) / n


def _ntxent(z1, z2, kappa):
    """SimCLR's NT-Xent, a loop over the 2N anchors, each against the 2N - 1 other latents."""
    z = torch.cat([z1, z2])
    s = _cosines(z, z, kappa)
    n = len(z1)
    total = 0.0
    for a in range(2 * n):
        positive = (a + n) % (2 * n)
        total += math.log(sum(math.exp(s[a][b]) for b in range(2 * n) if b != a)) - s[a][positive]
    return total / (2 * n)


@pytest.mark.parametrize("name, reference, candidates", [
    ("simclr", _one_direction, lambda n: n), ("ntxent", _ntxent, lambda n: 2 * n - 1)])
def test_simclr_is_the_notebooks_one_direction_loss_and_ntxent_the_pooled_one(name, reference,
                                                                             candidates):
    """The negative ELBO per pair is the loss minus the log of the candidates (float64):
    simclr the one-direction InfoNCE (N candidates), ntxent the pooled NT-Xent (2N - 1)."""
    torch.manual_seed(0)
    encoder = model.Mnist1dEncoder().double()
    objective = model.BenchmarkObjective(name, encoder, 16, temperature=0.5).double()
    x1, x2 = torch.randn(7, 40, dtype=torch.float64), torch.randn(7, 40, dtype=torch.float64)
    with torch.no_grad():
        loss = float(objective.loss([x1, x2]))
        expected = reference(encoder(x1), encoder(x2), 2.0) - math.log(candidates(7))
    assert loss == pytest.approx(expected, abs=1e-10)


def test_vmf_learns_its_concentration():
    """vmf is the one-direction loss at a learned kappa (initially 1/tau), trained with the
    encoder: one Adam step moves kappa, and the loss at the new kappa is the loop's."""
    torch.manual_seed(1)
    encoder = model.Mnist1dEncoder().double()
    objective = model.BenchmarkObjective("vmf", encoder, 16, temperature=0.5).double()
    energy = objective.rpm.prior.energy
    assert float(energy.kappa.detach()) == pytest.approx(2.0)
    x1, x2 = torch.randn(9, 40, dtype=torch.float64), torch.randn(9, 40, dtype=torch.float64)
    optimizer = torch.optim.Adam(objective.parameters(), lr=0.1)
    optimizer.zero_grad()
    objective.loss([x1, x2]).backward()
    optimizer.step()
    kappa = float(energy.kappa.detach())
    assert kappa != pytest.approx(2.0)
    with torch.no_grad():
        loss = float(objective.loss([x1, x2]))
        expected = _one_direction(encoder(x1), encoder(x2), kappa) - math.log(9)
    assert loss == pytest.approx(expected, abs=1e-10)


def test_renamed_rows_train_at_tiny_size(tmp_path):
    """simclr, ntxent and vmf each train one epoch on the digits and are scored."""
    status = main(["benchmark", "--out", str(tmp_path / "run"), "--datasets", "digits",
                   "--objectives", "simclr,ntxent,vmf", "--seeds", "1", "--epochs", "1",
                   "--batch-size", "256", "--no-progress"])
    assert status == 0
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    assert [r["objective"] for r in rows] == ["simclr", "ntxent", "vmf"]
    for row in rows:
        assert math.isfinite(row["final_loss"]) and 0 <= row["knn"] <= 1
        assert row["steps"] == 1347 // 256


#: The objectives over J views, the discrete RPM and MC-InfoNCE.
NEW_ROWS = ("star", "lejepa", "gaussian_star", "discrete", "mcinfonce")


@pytest.mark.parametrize("objective", NEW_ROWS)
def test_objective_trains_with_a_finite_loss_and_is_scored(tmp_path, objective):
    """One epoch on the digits: every step's loss finite and not constant, the row scored."""
    args = argparse.Namespace(epochs=1, batch_size=128, lr=1e-2, temperature=0.5,
                              checkpoint_every=0, progress=False, resume=False)
    split = data.load_dataset("digits")
    row = benchmark_train.train_row("digits", objective, 0, args, split, torch.device("cpu"),
                                    tmp_path / "row")
    losses = [value for _, value in json.loads((tmp_path / "row" / "history.json").read_text())
              ["losses"]]
    assert row["steps"] == len(losses) == 1347 // 128
    assert all(math.isfinite(value) for value in losses) and len(set(losses)) > 1
    assert math.isfinite(row["final_loss"])
    assert 0 <= row["knn"] <= 1 and 0 <= row["linear"] <= 1 and row["linear_converged"]


def _mnist1d_views(num_local, n=6, seed=0):
    x = torch.randn(n, 40, dtype=torch.float64)
    return data.multi_views("mnist1d", x, torch.Generator().manual_seed(seed), num_local)


def _objective(name):
    torch.manual_seed(0)
    dim = model.encoder_latent_dim("mnist1d", name)
    return model.BenchmarkObjective(name, model.build_encoder("mnist1d", 40, dim), dim,
                                    temperature=0.5).double()


def test_star_loss_is_the_multi_crop_star_elbo_of_a_loop():
    """star: minus the float64 loop of the star prior's ELBO (2 global views, 2 local ones whose
    positives and candidates are the global views only), per instance."""
    from tests.priors.test_multiview import elbo_loop

    objective, views = _objective("star"), _mnist1d_views(2)
    with torch.no_grad():
        z = torch.stack([objective.encoder(v) for v in views], 1).tolist()      # (N, J, D)

    def cosine(a, b):
        a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
        return 2.0 * float(a @ b / (a.norm() * b.norm()))  # kappa = 1 / temperature

    expected = -elbo_loop(z, cosine, "star", global_views=2) / len(z)
    assert float(objective.loss(views).detach()) == pytest.approx(expected, rel=1e-9)


def test_gaussian_star_loss_is_the_closed_form():
    from tests.helpers import gaussian_star_closed_form

    objective, views = _objective("gaussian_star"), _mnist1d_views(2, n=40)
    with torch.no_grad():
        z = torch.stack([objective.encoder(v) for v in views], 1).numpy()      # (N, J, D)
    expected = -gaussian_star_closed_form(z, 1.0 / 3.0)
    assert float(objective.loss(views).detach()) == pytest.approx(expected, rel=1e-9)


def test_discrete_loss_is_pyros_enumerated_elbo_and_knn_reads_probabilities():
    """discrete: TraceEnum_ELBO (Z summed out by Pyro) per instance; kNN's latent sums to 1."""
    from pyro.infer import TraceEnum_ELBO

    objective, views = _objective("discrete"), _mnist1d_views(0)
    assert objective.discrete is not None
    expected = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(
        objective.discrete.model, objective.discrete.guide, *views) / views[0].shape[0]
    assert float(objective.loss(views).detach()) == pytest.approx(float(expected.detach()), rel=1e-9)
    probs = objective.latent()(views[0])
    assert probs.shape == (6, model.DISCRETE_CLASSES)
    assert torch.allclose(probs.sum(-1), torch.ones(6, dtype=torch.float64))


def test_mnist1d_local_view_is_a_window_stretched_back_by_linear_interpolation():
    """Each local view is the augmented view (the same draws) at positions a + (t + 1/2) phi,
    phi in [0.5, 0.75], read by numpy's linear interpolation between samples at i + 1/2."""
    x = torch.randn(16, 40, dtype=torch.float64)
    local = data.mnist1d_local_views(x, torch.Generator().manual_seed(4))
    generator = torch.Generator().manual_seed(4)
    view = data.mnist1d_views(x, generator)
    fraction = 0.5 + 0.25 * torch.rand(16, 1, generator=generator).double()
    start = (1 - fraction) * 40 * torch.rand(16, 1, generator=generator).double()
    t = np.arange(40)
    for n in range(16):
        phi, a = float(fraction[n]), float(start[n])
        assert 0.5 <= phi <= 0.75 and 0 <= a <= (1 - phi) * 40
        expected = np.interp(a + (t + 0.5) * phi - 0.5, t, view[n].numpy())
        np.testing.assert_allclose(local[n].numpy(), expected, rtol=1e-12, atol=1e-12)


def test_default_epochs_are_each_datasets(tmp_path):
    """Without --epochs a dataset trains its DEFAULT_EPOCHS; --epochs N overrides it."""
    argv = ["benchmark", "--datasets", "digits", "--objectives", "simclr", "--seeds", "1",
            "--batch-size", "128", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "default")]) == 0
    results = json.loads((tmp_path / "default" / "results.json").read_text())
    assert results["epochs"] == {"digits": command.DEFAULT_EPOCHS["digits"]}
    assert results["rows"][0]["steps"] == command.DEFAULT_EPOCHS["digits"] * (1347 // 128)
    assert main([*argv, "--out", str(tmp_path / "two"), "--epochs", "2"]) == 0
    results = json.loads((tmp_path / "two" / "results.json").read_text())
    assert results["epochs"] == {"digits": 2} and results["rows"][0]["steps"] == 2 * (1347 // 128)


def test_table_figure_colours_each_column_from_its_lowest_to_its_highest_mean(tmp_path):
    # one dataset spread over 60 points, one within 2 (and missing a cell), and a constant column
    means = {"a": {"knn": [30.0, 60.0, 90.0], "linear": [50.0, 50.0, 50.0]},
             "b": {"knn": [97.0, 99.0, None], "linear": [98.0, 96.0, None]}}
    objectives = ["first", "second", "third"]
    summary: dict = {}
    for i, objective in enumerate(objectives):
        for dataset in ("a", "b"):
            if means[dataset]["knn"][i] is not None:
                summary.setdefault(objective, {})[dataset] = {
                    metric: {"mean": means[dataset][metric][i], "std": 1.0, "seeds": 2}
                    for metric in ("knn", "linear")}
    expected = {"knn": [[0.0, 0.0], [0.5, 1.0], [1.0, math.nan]],
                "linear": [[0.5, 1.0], [0.5, 0.0], [0.5, math.nan]]}
    fig = benchmark_table.plot_table(tmp_path / "table.png", summary, ["a", "b"], "title")
    assert (tmp_path / "table.png").stat().st_size > 0
    for ax, metric in zip(fig.axes, ("knn", "linear"), strict=True):
        shown = np.ma.filled(ax.images[0].get_array().astype(float), math.nan)
        np.testing.assert_allclose(shown, expected[metric], atol=1e-12)
        # every cell is labelled with its own mean ± s.d., not the shade
        labels = sorted(text.get_text() for text in ax.texts)
        assert labels == sorted(f"{m:.1f} ± 1.0" for column in ("a", "b")
                                for m in means[column][metric] if m is not None)
