"""``rpm benchmark``: every objective on MNIST-1D and scikit-learn's digits, scored by kNN on the
latent and a linear probe on the frozen backbone, one row per (dataset, objective, seed)
(:mod:`rpm.experiments.benchmark.command`)."""
