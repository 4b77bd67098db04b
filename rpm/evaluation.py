r"""Evaluation of learned representations by classification: kNN, a linear probe and a
label-efficiency curve, on frozen features.

The usual protocol of self-supervised learning (Chen et al., 2020, Section 4; Wu et al., 2018,
for kNN): train the encoder without labels, freeze it, take the *backbone's* representation
:math:`h = g(x)` (before the projection head, which the contrastive objective shapes most and
which transfers worst; Chen et al., 2020, Section 4.2) and fit a simple classifier on labelled
:math:`(h_i, y_i)`:

* **kNN** (:func:`knn_accuracy`): the majority label among the :math:`k` training features of
  smallest cosine distance :math:`1 - \langle h, h_i\rangle / (\lVert h\rVert\lVert h_i\rVert)`
  (scikit-learn's ``KNeighborsClassifier(metric="cosine")``, uniform votes, ties to the
  smallest label). Parameter-free once :math:`k` is chosen: :math:`k = 5` here, scikit-learn's
  default (Wu et al. and DINO use 20 or 200 neighbours on ImageNet's 1.3 million images; the
  digits have 1347 training images and 10 per class in the few-label regime).
* **Linear probe** (:func:`fit_linear_probe`, :func:`linear_probe_accuracy`): multinomial
  logistic regression on features standardised to zero mean and unit variance per
  coordinate, minimising

  .. math::

      C \sum_i -\log \operatorname{softmax}(W \tilde h_i + b)_{y_i} + \tfrac12 \lVert W\rVert_F^2,
      \qquad \tilde h = (h - \mu) / s,

  (scikit-learn's ``StandardScaler`` and ``LogisticRegression``, L-BFGS, :math:`C = 1`, the
  library's default: no validation set exists to tune it when only a few labels are known).
* **Calibration** (:func:`reliability_bins`, :func:`expected_calibration_error`): a
  classifier's predicted probabilities :math:`p_n` against the labels :math:`y_n`. The
  confidence :math:`c_n = \max_k p_{nk}` and prediction :math:`\hat y_n = \arg\max_k p_{nk}`;
  M equal bins :math:`B_b = \{n : c_n \in ((b-1)/M, b/M]\}` (the first includes 0); the
  expected calibration error (Guo et al., 2017; M = 15)

  .. math::

      \mathrm{ECE} = \sum_{b=1}^M \frac{|B_b|}{N} \Big| \frac1{|B_b|} \sum_{n \in B_b}
      [\hat y_n = y_n] - \frac1{|B_b|} \sum_{n \in B_b} c_n \Big|,

  the gap between accuracy and confidence averaged over the inputs (0: calibrated).
* **Label efficiency** (:func:`label_efficiency`): both classifiers trained on :math:`k`
  labelled images per class for several :math:`k` (each draw stratified, without
  replacement; several random draws; mean and standard deviation over draws) and on all
  labels. The standardisation statistics :math:`\mu, s` may come from all training features
  (``unlabelled``): they need no labels, and with one label per class ten points estimate them
  badly.
* **Clustering accuracy** (:func:`match_clusters`): an unsupervised model's cluster indices
  :math:`k_n \in \{0, \dots, K-1\}` against the labels :math:`y_n \in \{0, \dots, C-1\}`,
  after the best one-to-one matching of clusters to labels,

  .. math::

      \text{acc} = \max_{m} \frac1N \sum_{n=1}^N [m(k_n) = y_n],

  the maximum over the injective maps :math:`m` from clusters to labels (or from labels to
  clusters when :math:`K > C`; a cluster left unmatched counts as wrong): an assignment problem
  on the counts :math:`n_{ck}` of class c in cluster k, solved exactly by the Hungarian
  algorithm (``scipy.optimize.linear_sum_assignment``; Kuhn, 1955). :func:`kmeans_clusters`
  gives the k-means clusters of features, the usual baseline (scikit-learn's ``KMeans``,
  k-means++ starts, the best of ``n_init`` by inertia).

:func:`representations` computes features with the module in evaluation mode (batch
normalisation uses its running statistics, dropout is off) and without gradients, and puts
every submodule back in the mode it was in.

Features are torch tensors on any device; the classifiers run in float64 on the CPU. Accuracies
are fractions in [0, 1].

References:
    T. Chen, S. Kornblith, M. Norouzi and G. Hinton, "A simple framework for contrastive learning
    of visual representations", ICML 2020.
    Z. Wu, Y. Xiong, S. X. Yu and D. Lin, "Unsupervised feature learning via non-parametric
    instance discrimination", CVPR 2018.
    M. Caron et al., "Emerging properties in self-supervised vision transformers" (DINO), ICCV 2021.
    H. W. Kuhn, "The Hungarian method for the assignment problem", Naval Research Logistics
    Quarterly 2 (1955).
    C. Guo, G. Pleiss, Y. Sun and K. Q. Weinberger, "On calibration of modern neural networks",
    ICML 2017.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from rpm._validation import check_int, check_positive, check_positive_int

__all__ = [
    "ClusterMatch",
    "LabelEfficiency",
    "ReliabilityBins",
    "Score",
    "draw_labelled_subset",
    "expected_calibration_error",
    "fit_linear_probe",
    "kmeans_clusters",
    "knn_accuracy",
    "label_efficiency",
    "linear_probe_accuracy",
    "match_clusters",
    "reliability_bins",
    "representations",
]

#: kNN's number of neighbours (module docstring).
DEFAULT_KNN_K = 5


def _features(name: str, x: object) -> np.ndarray:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (num_samples, dim), got {tuple(x.shape)}; flatten "
                         "the features first (x.flatten(1))")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be floating point, got {x.dtype}")
    x = x.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(x).all()):
        rows = (~torch.isfinite(x)).any(dim=1).nonzero().flatten()[:5].tolist()
        raise ValueError(f"{name} contains NaN or infinite values (rows {rows}...); the encoder produced "
                         "them: check its training")
    return x.numpy()


def _labels(name: str, y: object, num_samples: int) -> np.ndarray:
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(y).__name__}")
    if y.ndim != 1 or y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"{name} must be a 1-D integer tensor of class labels, got shape {tuple(y.shape)} "
                         f"and dtype {y.dtype}")
    if y.shape[0] != num_samples:
        raise ValueError(f"{name} has {y.shape[0]} labels for {num_samples} feature rows")
    return y.detach().cpu().numpy().astype(np.int64)


def representations(module: nn.Module, images: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    r"""Features :math:`h = g(x)` of a frozen module: evaluation mode, no gradients, batched.

    Every submodule is put in evaluation mode (batch normalisation normalises with its running
    statistics, so a feature does not depend on the other images of its batch; dropout is off)
    and afterwards back in the mode it had, submodule by submodule. Pass the *backbone*, the
    part before any projection head (module docstring).

    :param nn.Module module: the backbone :math:`g`.
    :param torch.Tensor images: inputs; moved in batches to the device of the module's first
        parameter or buffer (left where they are if it has none). Shape: (N, ...).
    :param int batch_size: images per forward pass.
    :returns: the features, detached, flattened to two dimensions. Shape: (N, F).
    :rtype: torch.Tensor
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(images, torch.Tensor) or images.ndim < 1:
        raise TypeError(f"images must be a torch.Tensor with a batch axis, got {type(images).__name__}")
    batch_size = check_positive_int("batch_size", batch_size)
    tensors = list(module.parameters()) + list(module.buffers())
    device = tensors[0].device if tensors else images.device
    modes = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        with torch.no_grad():
            out = [module(images[i:i + batch_size].to(device)).flatten(1)  # (b, F)
                   for i in range(0, images.shape[0], batch_size)]
    finally:
        for m, training in modes:
            m.training = training
    return torch.cat(out) if out else torch.zeros(0, 0)


def knn_accuracy(train_features: torch.Tensor, train_labels: torch.Tensor, test_features: torch.Tensor,
                 test_labels: torch.Tensor, k: int = DEFAULT_KNN_K) -> float:
    r"""Accuracy of the :math:`k`-nearest-neighbour classifier under the cosine distance (module
    docstring): each test feature gets the most frequent label among its :math:`k` nearest
    training features (ties: the smallest label).

    :param torch.Tensor train_features: Shape: (N, F).
    :param torch.Tensor train_labels: integer labels. Shape: (N,).
    :param torch.Tensor test_features: Shape: (M, F).
    :param torch.Tensor test_labels: Shape: (M,).
    :param int k: number of neighbours, at most ``N``.
    :returns: the fraction of test labels predicted correctly.
    :rtype: float
    """
    from sklearn.neighbors import KNeighborsClassifier

    x, xt = _features("train_features", train_features), _features("test_features", test_features)
    y = _labels("train_labels", train_labels, x.shape[0])
    yt = _labels("test_labels", test_labels, xt.shape[0])
    k = check_positive_int("k", k)
    if k > x.shape[0]:
        raise ValueError(f"k must be <= the number of training features ({x.shape[0]}), got {k}")
    if x.shape[1] != xt.shape[1]:
        raise ValueError(f"train_features and test_features must have the same dim, got {x.shape[1]} and "
                         f"{xt.shape[1]}")
    classifier = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(x, y)
    return float((classifier.predict(xt) == yt).mean())


def fit_linear_probe(train_features: torch.Tensor, train_labels: torch.Tensor, C: float = 1.0,
                     unlabelled: torch.Tensor | None = None, max_iter: int = 1000, tol: float = 1e-4):
    r"""Fit the linear probe (module docstring): standardise, then L2-regularised multinomial
    logistic regression.

    :param torch.Tensor train_features: labelled features. Shape: (N, F).
    :param torch.Tensor train_labels: their labels, at least two classes. Shape: (N,).
    :param float C: inverse regularisation strength :math:`C` of the objective.
    :param unlabelled: features the standardisation's mean and standard deviation are computed
        from (``None``: ``train_features``). Shape: (U, F).
    :type unlabelled: torch.Tensor or None
    :param int max_iter: L-BFGS iterations at most.
    :param float tol: L-BFGS tolerance.
    :returns: the fitted ``sklearn.pipeline.Pipeline`` (``StandardScaler``, then
        ``LogisticRegression``); ``predict`` takes float64 NumPy features.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    x = _features("train_features", train_features)
    y = _labels("train_labels", train_labels, x.shape[0])
    C = check_positive("C", C)
    max_iter = check_positive_int("max_iter", max_iter)
    tol = check_positive("tol", tol)
    if np.unique(y).shape[0] < 2:
        raise ValueError("train_labels must hold at least two classes for a classifier")
    scaler = StandardScaler().fit(x if unlabelled is None else _features("unlabelled", unlabelled))
    if scaler.mean_.shape[0] != x.shape[1]:
        raise ValueError(f"unlabelled must have the features' dim {x.shape[1]}, got {scaler.mean_.shape[0]}")
    probe = LogisticRegression(C=C, max_iter=max_iter, tol=tol).fit(scaler.transform(x), y)
    return Pipeline([("scaler", scaler), ("probe", probe)])


def linear_probe_accuracy(train_features: torch.Tensor, train_labels: torch.Tensor,
                          test_features: torch.Tensor, test_labels: torch.Tensor, C: float = 1.0,
                          unlabelled: torch.Tensor | None = None) -> float:
    """Test accuracy of the linear probe fitted by :func:`fit_linear_probe`.

    :param torch.Tensor train_features: Shape: (N, F).
    :param torch.Tensor train_labels: Shape: (N,).
    :param torch.Tensor test_features: Shape: (M, F).
    :param torch.Tensor test_labels: Shape: (M,).
    :param float C: inverse regularisation strength.
    :param unlabelled: features for the standardisation statistics (``None``: the training ones).
    :type unlabelled: torch.Tensor or None
    :returns: the fraction of test labels predicted correctly.
    :rtype: float
    """
    pipeline = fit_linear_probe(train_features, train_labels, C=C, unlabelled=unlabelled)
    xt = _features("test_features", test_features)
    yt = _labels("test_labels", test_labels, xt.shape[0])
    if xt.shape[1] != pipeline.named_steps["scaler"].mean_.shape[0]:
        raise ValueError(f"test_features must have the training features' dim "
                         f"{pipeline.named_steps['scaler'].mean_.shape[0]}, got {xt.shape[1]}")
    return float((pipeline.predict(xt) == yt).mean())


def draw_labelled_subset(labels: torch.Tensor, per_class: int, generator: torch.Generator) -> torch.Tensor:
    """Indices of ``per_class`` examples of every class, drawn uniformly without replacement
    within each class (a stratified draw).

    :param torch.Tensor labels: integer labels. Shape: (N,).
    :param int per_class: examples per class; every class must have at least that many.
    :param torch.Generator generator: CPU generator of the draw.
    :returns: sorted distinct indices into ``labels``, int64. Shape: (per_class * num_classes,).
    :rtype: torch.Tensor
    """
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    y = torch.from_numpy(_labels("labels", labels, labels.shape[0]))
    per_class = check_positive_int("per_class", per_class)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    chosen = []
    for c in torch.unique(y).tolist():
        members = (y == c).nonzero().flatten()  # (n_c,)
        if members.shape[0] < per_class:
            raise ValueError(f"class {c} has {members.shape[0]} examples, fewer than per_class={per_class}")
        chosen.append(members[torch.randperm(members.shape[0], generator=generator)[:per_class]])
    return torch.cat(chosen).sort().values


class Score(NamedTuple):
    """Accuracy over random label draws: ``mean`` and ``std`` (population standard deviation,
    0 for one draw) of ``draws``."""

    mean: float
    std: float
    draws: tuple[float, ...]


class LabelEfficiency(NamedTuple):
    """Both classifiers' :class:`Score` per number of labels per class, keyed ``"1"``, ``"5"``,
    ..., ``"all"``."""

    linear_probe: dict[str, Score]
    knn: dict[str, Score]


def _score(values: Sequence[float]) -> Score:
    v = np.asarray(values, dtype=np.float64)
    return Score(float(v.mean()), float(v.std()), tuple(float(a) for a in v))


def label_efficiency(train_features: torch.Tensor, train_labels: torch.Tensor, test_features: torch.Tensor,
                     test_labels: torch.Tensor, labels_per_class: Sequence[int | None] = (1, 5, 10, None),
                     num_draws: int = 5, seed: int = 0, knn_k: int = DEFAULT_KNN_K, C: float = 1.0,
                     standardise_with_all: bool = True) -> LabelEfficiency:
    r"""kNN and linear-probe accuracy with :math:`k` labelled examples per class.

    For each :math:`k` in ``labels_per_class``, ``num_draws`` stratified draws
    (:func:`draw_labelled_subset`, one generator seeded with ``seed`` for the whole curve, so two
    encoders evaluated with the same seed see the same labelled images); ``None`` means all
    labels (one draw). On each draw: :func:`linear_probe_accuracy` and :func:`knn_accuracy` with
    :math:`\min(\text{knn\_k}, k)` neighbours (more neighbours than labelled examples per class
    would let the other classes outvote a correct one by construction).

    :param torch.Tensor train_features: the pool the labelled examples are drawn from. Shape: (N, F).
    :param torch.Tensor train_labels: Shape: (N,).
    :param torch.Tensor test_features: Shape: (M, F).
    :param torch.Tensor test_labels: Shape: (M,).
    :param labels_per_class: the values of :math:`k` (``None``: all labels), distinct.
    :type labels_per_class: Sequence[int or None]
    :param int num_draws: label draws per :math:`k`.
    :param int seed: seed of the draws.
    :param int knn_k: kNN's neighbours with all labels.
    :param float C: the linear probe's inverse regularisation strength.
    :param bool standardise_with_all: standardise the probe's features with the statistics of
        all of ``train_features`` (no labels needed) instead of the labelled ones only.
    :returns: scores keyed ``str(k)`` or ``"all"``.
    :rtype: LabelEfficiency
    """
    x = _features("train_features", train_features)
    y = _labels("train_labels", train_labels, x.shape[0])
    num_draws = check_positive_int("num_draws", num_draws)
    seed = check_int("seed", seed, minimum=0)
    knn_k = check_positive_int("knn_k", knn_k)
    keys = []
    for k in labels_per_class:
        if k is not None:
            check_positive_int("labels_per_class entries", k)
        keys.append("all" if k is None else str(int(k)))
    if not keys or len(set(keys)) != len(keys):
        raise ValueError(f"labels_per_class must be a non-empty sequence of distinct values, got "
                         f"{list(labels_per_class)!r}")
    train = torch.from_numpy(x)
    labels = torch.from_numpy(y)
    unlabelled = train if standardise_with_all else None
    generator = torch.Generator().manual_seed(seed)
    probe: dict[str, Score] = {}
    knn: dict[str, Score] = {}
    for key, k in zip(keys, labels_per_class, strict=True):
        draws = [torch.arange(x.shape[0])] if k is None else [
            draw_labelled_subset(labels, int(k), generator) for _ in range(num_draws)]
        neighbours = knn_k if k is None else min(knn_k, int(k))
        probe[key] = _score([linear_probe_accuracy(train[d], labels[d], test_features, test_labels, C=C,
                                                   unlabelled=unlabelled) for d in draws])
        knn[key] = _score([knn_accuracy(train[d], labels[d], test_features, test_labels, k=neighbours)
                           for d in draws])
    return LabelEfficiency(probe, knn)


class ClusterMatch(NamedTuple):
    """The best one-to-one matching of clusters to labels (:func:`match_clusters`).

    :ivar float accuracy: the fraction of samples whose cluster is matched to their label.
    :ivar torch.Tensor label_of_cluster: the label matched to each cluster, int64, -1 for a
        cluster left unmatched (more clusters than labels). Shape: (K,).
    :ivar torch.Tensor counts: ``counts[c, k]``, the samples of label c in cluster k, int64
        (the confusion matrix before matching). Shape: (C, K).
    """

    accuracy: float
    label_of_cluster: torch.Tensor
    counts: torch.Tensor


def _indices(name: str, values: object, bound: int | None, what: str) -> np.ndarray:
    """A 1-D integer tensor of indices in [0, bound) (any non-negative values when None)."""
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of {what}, got {type(values).__name__}")
    if values.ndim != 1 or values.dtype.is_floating_point or values.dtype.is_complex or \
            values.dtype == torch.bool:
        raise ValueError(f"{name} must be a 1-D integer tensor of {what}, got shape "
                         f"{tuple(values.shape)} and dtype {values.dtype}")
    array = values.detach().cpu().numpy().astype(np.int64)
    if array.size and array.min() < 0:
        raise ValueError(f"{name} must hold {what} >= 0, got {int(array.min())}")
    if bound is not None and array.size and array.max() >= bound:
        raise ValueError(f"{name} holds {int(array.max())}, but there are {bound} {what} "
                         f"(0 to {bound - 1}); raise num_{what} or check the values")
    return array


def match_clusters(clusters: torch.Tensor, labels: torch.Tensor, num_clusters: int | None = None,
                   num_classes: int | None = None) -> ClusterMatch:
    r"""The clustering accuracy after the best one-to-one matching of clusters to labels
    (module docstring): the assignment maximising the matched count
    :math:`\sum_k n_{m(k), k}` over the counts :math:`n_{ck}`, solved exactly by
    ``scipy.optimize.linear_sum_assignment``.

    :param torch.Tensor clusters: each sample's cluster, integers in [0, K). Shape: (N,).
    :param torch.Tensor labels: each sample's label, integers in [0, C). Shape: (N,).
    :param num_clusters: K (default: the largest cluster index + 1), for clusters that no
        sample falls in.
    :param num_classes: C (default: the largest label + 1).
    :returns: the accuracy, the label of each cluster and the counts.
    :rtype: ClusterMatch
    """
    from scipy.optimize import linear_sum_assignment

    if num_clusters is not None:
        num_clusters = check_positive_int("num_clusters", num_clusters)
    if num_classes is not None:
        num_classes = check_positive_int("num_classes", num_classes)
    k = _indices("clusters", clusters, num_clusters, "clusters")
    y = _indices("labels", labels, num_classes, "classes")
    if k.shape[0] != y.shape[0]:
        raise ValueError(f"clusters and labels must have one entry per sample, got {k.shape[0]} "
                         f"clusters and {y.shape[0]} labels")
    if k.shape[0] == 0:
        raise ValueError("match_clusters needs at least one sample")
    num_clusters = num_clusters or int(k.max()) + 1
    num_classes = num_classes or int(y.max()) + 1
    counts = np.zeros((num_classes, num_clusters), dtype=np.int64)
    np.add.at(counts, (y, k), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)  # rows: labels, cols: clusters
    label_of_cluster = np.full(num_clusters, -1, dtype=np.int64)
    label_of_cluster[cols] = rows
    accuracy = float(counts[rows, cols].sum()) / k.shape[0]
    return ClusterMatch(accuracy, torch.from_numpy(label_of_cluster), torch.from_numpy(counts))


def kmeans_clusters(train_features: torch.Tensor, test_features: torch.Tensor, num_clusters: int,
                    seed: int = 0, n_init: int = 10) -> torch.Tensor:
    r"""The k-means clusters of ``test_features``, with centres fitted to ``train_features``:
    Lloyd's algorithm minimising the inertia :math:`\sum_n \min_k \lVert h_n - \mu_k\rVert^2`
    over the training features from ``n_init`` k-means++ starts, the best kept (scikit-learn's
    ``KMeans``), then each test feature's nearest centre. No labels are used.

    :param torch.Tensor train_features: the features the centres are fitted to. Shape: (N, F).
    :param torch.Tensor test_features: the features clustered. Shape: (M, F).
    :param int num_clusters: K, at most N.
    :param int seed: seed of the starts.
    :param int n_init: number of starts.
    :returns: each test feature's cluster, int64 in [0, K). Shape: (M,).
    :rtype: torch.Tensor
    """
    from sklearn.cluster import KMeans

    x, xt = _features("train_features", train_features), _features("test_features", test_features)
    num_clusters = check_positive_int("num_clusters", num_clusters)
    seed = check_int("seed", seed, minimum=0, maximum=2**32 - 1)
    n_init = check_positive_int("n_init", n_init)
    if num_clusters > x.shape[0]:
        raise ValueError(f"num_clusters must be <= the number of training features ({x.shape[0]}), "
                         f"got {num_clusters}")
    if x.shape[1] != xt.shape[1]:
        raise ValueError(f"train_features and test_features must have the same dim, got {x.shape[1]} "
                         f"and {xt.shape[1]}")
    kmeans = KMeans(n_clusters=num_clusters, n_init=n_init, random_state=seed).fit(x)
    return torch.from_numpy(kmeans.predict(xt).astype(np.int64))
class ReliabilityBins(NamedTuple):
    """Per confidence bin (:func:`reliability_bins`): ``counts`` of inputs, their mean
    ``confidence`` and ``accuracy`` (NaN for an empty bin), and the bins' ``edges`` (M + 1)."""

    counts: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    edges: np.ndarray


def _probabilities(probabilities: object) -> np.ndarray:
    if isinstance(probabilities, torch.Tensor):
        probabilities = probabilities.detach().cpu().numpy()
    if not isinstance(probabilities, np.ndarray):
        raise TypeError(f"probabilities must be a torch.Tensor or a NumPy array, got "
                        f"{type(probabilities).__name__}")
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"probabilities must have shape (num_samples, classes >= 2), got "
                         f"{p.shape}")
    if not np.isfinite(p).all() or (p < 0).any() or not np.allclose(p.sum(1), 1.0, atol=1e-6):
        raise ValueError("probabilities must be finite, non-negative and sum to 1 in every row "
                         "(a softmax, not logits)")
    return p


def reliability_bins(probabilities, labels: torch.Tensor, num_bins: int = 15) -> ReliabilityBins:
    r"""The reliability diagram's bins of the module docstring: per bin of the confidence
    :math:`c_n = \max_k p_{nk}`, the number of inputs, their mean confidence and their accuracy.

    :param probabilities: predicted class probabilities, each row summing to 1 (torch tensor or
        NumPy array). Shape: (N, C).
    :param torch.Tensor labels: the true classes in ``0..C-1``. Shape: (N,).
    :param int num_bins: M, equal bins of [0, 1].
    :rtype: ReliabilityBins
    """
    p = _probabilities(probabilities)
    y = _labels("labels", labels, p.shape[0])
    if (y < 0).any() or (y >= p.shape[1]).any():
        raise ValueError(f"labels must lie in 0..{p.shape[1] - 1} (the columns of probabilities)")
    num_bins = check_positive_int("num_bins", num_bins)
    confidence = p.max(1)
    correct = (p.argmax(1) == y).astype(np.float64)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    index = np.clip(np.ceil(confidence * num_bins).astype(np.int64) - 1, 0, num_bins - 1)
    count = np.bincount(index, minlength=num_bins).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_confidence = np.bincount(index, confidence, num_bins) / count
        accuracy = np.bincount(index, correct, num_bins) / count
    return ReliabilityBins(count, mean_confidence, accuracy, edges)


def expected_calibration_error(probabilities, labels: torch.Tensor, num_bins: int = 15) -> float:
    r"""The expected calibration error of the module docstring, in [0, 1].

    :param probabilities: predicted class probabilities. Shape: (N, C).
    :param torch.Tensor labels: the true classes. Shape: (N,).
    :param int num_bins: M.
    """
    bins = reliability_bins(probabilities, labels, num_bins)
    filled = bins.counts > 0
    gaps = np.abs(bins.accuracy[filled] - bins.confidence[filled])
    return float((bins.counts[filled] * gaps).sum() / bins.counts.sum())
