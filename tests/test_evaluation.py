"""Evaluation helpers against independent computations: kNN against a loop, the linear probe
against a float64 L-BFGS fit of its objective and on a separable set, stratified label draws,
frozen features in evaluation mode with the modes restored, the clustering accuracy against
a brute-force search over the matchings and k-means against its own inertia."""

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from rpm.evaluation import (
    draw_labelled_subset,
    fit_linear_probe,
    kmeans_clusters,
    knn_accuracy,
    label_efficiency,
    linear_probe_accuracy,
    match_clusters,
    representations,
)


def _toy(num, dim=3, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g)
    y = torch.arange(num) % classes
    return centres[y] + 0.8 * torch.randn(num, dim, generator=g), y


def _knn_loop(x, y, xt, k):
    """Cosine kNN written from its definition, float64, one test point at a time."""
    x, xt = x.double(), xt.double()
    out = []
    for q in xt:
        d = [1 - float(q @ p) / (float(q.norm()) * float(p.norm())) for p in x]
        nearest = sorted(range(len(d)), key=lambda i: d[i])[:k]
        votes = {}
        for i in nearest:
            votes[int(y[i])] = votes.get(int(y[i]), 0) + 1
        best = max(votes.values())
        out.append(min(c for c, v in votes.items() if v == best))
    return torch.tensor(out)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_knn_predicts_what_a_loop_over_cosine_distances_predicts(k):
    x, y = _toy(40)
    xt, yt = _toy(30, seed=1)
    pred = _knn_loop(x, y, xt, k)
    assert knn_accuracy(x, y, xt, yt, k=k) == pytest.approx(float((pred == yt).double().mean()), abs=1e-12)
    for i in range(30):  # prediction by prediction: accuracy 1 on a one-point set labelled pred[i]
        assert knn_accuracy(x, y, xt[i:i + 1], pred[i:i + 1], k=k) == 1.0


def test_linear_probe_reaches_full_accuracy_on_a_separable_set():
    def separable(num, seed):
        # class c: 4 e_c + noise in [-1, 1]^5, so x_c - x_other > 2 on coordinate c: separable
        g = torch.Generator().manual_seed(seed)
        y = torch.arange(num) % 3
        return 4.0 * nn.functional.one_hot(y, 5).float() + 2 * torch.rand(num, 5, generator=g) - 1, y

    x, y = separable(200, 0)
    xt, yt = separable(300, 1)
    assert linear_probe_accuracy(x, y, xt, yt) == 1.0
    assert linear_probe_accuracy(x, y, x, y) == 1.0


def test_linear_probe_minimises_its_stated_objective():
    x, y = _toy(60, dim=4, classes=3)
    C = 0.7
    pipeline = fit_linear_probe(x, y, C=C, max_iter=10000, tol=1e-12)
    # independent fit: standardise by hand, minimise C * sum CE + ||W||^2 / 2 with torch L-BFGS
    xd = x.double()
    xs = (xd - xd.mean(0)) / xd.std(0, unbiased=False)
    W = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=5000, tolerance_grad=1e-12, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = C * nn.functional.cross_entropy(xs @ W.T + b, y, reduction="sum") + 0.5 * (W**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    expected = torch.softmax(xs @ W.T + b, dim=1).detach().numpy()
    np.testing.assert_allclose(pipeline.predict_proba(x.double().numpy()), expected, atol=1e-5)


def test_probe_standardises_with_the_unlabelled_features_when_given():
    x, y = _toy(30)
    pool, _ = _toy(300, seed=5)
    pipeline = fit_linear_probe(x, y, unlabelled=pool)
    mean = pipeline.named_steps["scaler"].mean_
    np.testing.assert_allclose(mean, pool.double().mean(0).numpy(), atol=1e-12)


def test_label_draws_are_stratified_distinct_and_reproducible():
    y = torch.tensor([0] * 7 + [1] * 5 + [2] * 9)[torch.randperm(21)]
    g = torch.Generator().manual_seed(0)
    draws = [draw_labelled_subset(y, 3, g) for _ in range(20)]
    for d in draws:
        assert d.unique().shape[0] == 9
        assert torch.equal(torch.bincount(y[d]), torch.tensor([3, 3, 3]))
    assert len({tuple(d.tolist()) for d in draws}) > 10  # the draws are random
    again = torch.Generator().manual_seed(0)
    assert torch.equal(draw_labelled_subset(y, 3, again), draws[0])
    with pytest.raises(ValueError, match="class 1 has 5 examples, fewer than per_class=6"):
        draw_labelled_subset(y, 6, g)


def test_label_efficiency_repeats_the_single_classifier_calls_on_the_same_draws():
    x, y = _toy(80)
    xt, yt = _toy(40, seed=3)
    curve = label_efficiency(x, y, xt, yt, labels_per_class=(1, 3, None), num_draws=3, seed=4, knn_k=5)
    assert list(curve.linear_probe) == ["1", "3", "all"] and list(curve.knn) == ["1", "3", "all"]
    g = torch.Generator().manual_seed(4)
    for key, k in (("1", 1), ("3", 3)):
        draws = [draw_labelled_subset(y, k, g) for _ in range(3)]
        knn = [knn_accuracy(x[d], y[d], xt, yt, k=min(5, k)) for d in draws]
        probe = [linear_probe_accuracy(x[d], y[d], xt, yt, unlabelled=x) for d in draws]
        assert curve.knn[key].draws == pytest.approx(knn, abs=1e-12)
        assert curve.linear_probe[key].draws == pytest.approx(probe, abs=1e-12)
        assert curve.knn[key].mean == pytest.approx(np.mean(knn)) and curve.knn[key].std == pytest.approx(
            np.std(knn))
    assert curve.knn["all"].draws == pytest.approx([knn_accuracy(x, y, xt, yt, k=5)])
    assert curve.linear_probe["all"].std == 0.0


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.body(x)


def test_representations_use_eval_mode_without_gradients_and_restore_every_mode():
    net = _Net()
    net.train()
    net(torch.randn(64, 3) + 2.0)  # move the running statistics away from their start
    net.head.eval()  # a mixed state that must come back as it was
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(10, 3)
    feats = representations(net, x, batch_size=3)
    assert feats.shape == (10, 8) and not feats.requires_grad
    # independent: batch norm with its running statistics, dropout off, written out
    lin, bn = net.body[0], net.body[1]
    h = (x @ lin.weight.T + lin.bias - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps)
    expected = torch.relu(h * bn.weight + bn.bias)
    torch.testing.assert_close(feats, expected.detach())
    assert net.training and net.body.training and net.body[1].training and not net.head.training
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed"


@pytest.mark.parametrize("call, error, match", [
    (lambda: knn_accuracy(torch.zeros(3, 2), torch.arange(3), torch.zeros(1, 2), torch.zeros(1).long(), k=4),
     ValueError, "k must be <= the number of training features"),
    (lambda: knn_accuracy(torch.zeros(3), torch.arange(3), torch.zeros(1, 2), torch.zeros(1).long()),
     ValueError, r"shape \(num_samples, dim\)"),
    (lambda: linear_probe_accuracy(torch.full((2, 2), float("nan")), torch.arange(2), torch.zeros(1, 2),
                                   torch.zeros(1).long()), ValueError, "NaN"),
    (lambda: linear_probe_accuracy(torch.zeros(2, 2), torch.zeros(2).long(), torch.zeros(1, 2),
                                   torch.zeros(1).long()), ValueError, "at least two classes"),
    (lambda: knn_accuracy(torch.zeros(3, 2), torch.arange(2), torch.zeros(1, 2), torch.zeros(1).long()),
     ValueError, "2 labels for 3 feature rows"),
    (lambda: label_efficiency(torch.zeros(4, 2), torch.arange(4) % 2, torch.zeros(1, 2),
                              torch.zeros(1).long(), labels_per_class=(1, 1)), ValueError, "distinct"),
    (lambda: representations("net", torch.zeros(2, 3)), TypeError, "torch.nn.Module"),
    (lambda: match_clusters(torch.tensor([0, 1]), torch.tensor([0, 1, 1])), ValueError,
     "2 clusters and 3 labels"),
    (lambda: match_clusters(torch.tensor([0.0, 1.0]), torch.tensor([0, 1])), ValueError,
     "1-D integer tensor of clusters"),
    (lambda: match_clusters(torch.tensor([0, 3]), torch.tensor([0, 1]), num_clusters=3),
     ValueError, "holds 3, but there are 3 clusters"),
    (lambda: match_clusters(torch.tensor([0, -1]), torch.tensor([0, 1])), ValueError, ">= 0"),
    (lambda: match_clusters([0, 1], torch.tensor([0, 1])), TypeError, "torch.Tensor"),
    (lambda: kmeans_clusters(torch.zeros(3, 2), torch.zeros(1, 2), 4), ValueError,
     "num_clusters must be <= the number of training features"),
    (lambda: kmeans_clusters(torch.zeros(3, 2), torch.zeros(1, 3), 2), ValueError, "same dim"),
])
def test_bad_input_is_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


def _best_matching_by_brute_force(clusters, labels, num_clusters, num_classes):
    """The clustering accuracy from its definition: every injective map between the clusters
    and the labels, float64 counts, the best kept."""
    best = 0.0
    n = len(labels)
    if num_clusters <= num_classes:  # each cluster to a distinct label
        for image in itertools.permutations(range(num_classes), num_clusters):
            hits = sum(1 for k, y in zip(clusters, labels, strict=True) if image[k] == y)
            best = max(best, hits / n)
    else:  # each label to a distinct cluster
        for image in itertools.permutations(range(num_clusters), num_classes):
            hits = sum(1 for k, y in zip(clusters, labels, strict=True) if image[y] == k)
            best = max(best, hits / n)
    return best


@pytest.mark.parametrize("num_clusters, num_classes", [(4, 4), (3, 5), (5, 3), (2, 2)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clustering_accuracy_is_the_best_of_every_matching(num_clusters, num_classes, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (40,), generator=g)
    # clusters that follow the labels through a random map, with noise
    relabel = torch.randint(0, num_clusters, (num_classes,), generator=g)
    clusters = torch.where(torch.rand(40, generator=g) < 0.6, relabel[labels],
                           torch.randint(0, num_clusters, (40,), generator=g))
    match = match_clusters(clusters, labels, num_clusters, num_classes)
    expected = _best_matching_by_brute_force(clusters.tolist(), labels.tolist(), num_clusters,
                                             num_classes)
    assert match.accuracy == pytest.approx(expected, abs=1e-12)
    # the matching itself: distinct labels, and the matched counts give the accuracy
    matched = [k for k in range(num_clusters) if match.label_of_cluster[k] >= 0]
    assert len(matched) == min(num_clusters, num_classes)
    assert len({int(match.label_of_cluster[k]) for k in matched}) == len(matched)
    hits = sum(int(match.counts[match.label_of_cluster[k], k]) for k in matched)
    assert hits / 40 == pytest.approx(match.accuracy)
    # the counts are the confusion matrix
    for c in range(num_classes):
        for k in range(num_clusters):
            assert match.counts[c, k] == int(((labels == c) & (clusters == k)).sum())


def test_a_relabelled_clustering_is_perfect_and_clusters_without_samples_count():
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    assert match_clusters(torch.tensor([2, 2, 0, 0, 1, 1]), labels).accuracy == 1.0
    # one cluster for everything: a third right, whatever its label
    assert match_clusters(torch.zeros(6, dtype=torch.long), labels).accuracy == pytest.approx(1 / 3)
    match = match_clusters(torch.tensor([0, 0, 1, 1, 1, 1]), labels, num_clusters=4)
    assert match.counts.shape == (3, 4) and match.accuracy == pytest.approx(4 / 6)
    assert sorted(match.label_of_cluster.tolist()).count(-1) == 1


def test_kmeans_clusters_recover_separated_blobs_and_minimise_the_inertia():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    labels = torch.arange(300) % 3
    x = centres[labels] + 0.5 * torch.randn(300, 2, generator=g)
    xt = centres[labels[:60]] + 0.5 * torch.randn(60, 2, generator=g)
    clusters = kmeans_clusters(x, xt, 3, seed=1)
    assert clusters.dtype == torch.int64 and clusters.shape == (60,)
    assert match_clusters(clusters, labels[:60]).accuracy == 1.0
    # each test point is in the cluster of its nearest centre, the centres the cluster means of
    # the training points: the fixed point of Lloyd's algorithm, checked from the training
    # clusters
    train_clusters = kmeans_clusters(x, x, 3, seed=1)
    means = torch.stack([x[train_clusters == k].mean(0) for k in range(3)]).double()
    nearest = torch.cdist(xt.double(), means).argmin(1)
    assert torch.equal(nearest, clusters)
def _ece_loop(probabilities, labels, num_bins):
    """The expected calibration error written out: each input to the bin ((b-1)/M, b/M] of its
    largest probability (the first bin from 0), then sum_b |B_b|/N |accuracy_b - confidence_b|."""
    bins = [[] for _ in range(num_bins)]
    for row, label in zip(probabilities.tolist(), labels.tolist(), strict=True):
        confidence = max(row)
        predicted = row.index(confidence)
        b = 0
        while not confidence <= (b + 1) / num_bins:
            b += 1
        bins[b].append((confidence, predicted == label))
    total = 0.0
    for members in bins:
        if members:
            accuracy = sum(correct for _, correct in members) / len(members)
            confidence = sum(c for c, _ in members) / len(members)
            total += len(members) / len(labels) * abs(accuracy - confidence)
    return total, [len(m) for m in bins]


def test_expected_calibration_error_is_the_binned_gap_of_a_loop():
    from rpm.evaluation import expected_calibration_error, reliability_bins

    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(500, 4, generator=generator, dtype=torch.float64)
    probabilities = torch.softmax(logits, -1)
    labels = torch.randint(4, (500,), generator=generator)
    for num_bins in (15, 4):
        want, counts = _ece_loop(probabilities, labels, num_bins)
        assert expected_calibration_error(probabilities, labels, num_bins) == \
            pytest.approx(want, abs=1e-12)
        bins = reliability_bins(probabilities.numpy(), labels, num_bins)
        assert bins.counts.tolist() == counts and len(bins.edges) == num_bins + 1
    # a classifier whose confidence is its accuracy in every bin: ECE 0
    sure = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert expected_calibration_error(sure, torch.tensor([0, 1])) == 0.0
    assert expected_calibration_error(sure, torch.tensor([1, 0])) == 1.0


@pytest.mark.parametrize("probabilities, labels, message", [
    (torch.tensor([[0.5, 0.6]]), torch.tensor([0]), "sum to 1"),
    (torch.tensor([0.5, 0.5]), torch.tensor([0]), "shape"),
    (torch.tensor([[0.5, 0.5]]), torch.tensor([2]), "labels must lie in 0..1"),
    (torch.tensor([[0.5, 0.5]]), torch.tensor([0, 1]), "1 feature rows"),
])
def test_calibration_refuses_what_is_not_a_predictive(probabilities, labels, message):
    from rpm.evaluation import expected_calibration_error

    with pytest.raises(ValueError, match=message):
        expected_calibration_error(probabilities, labels)
