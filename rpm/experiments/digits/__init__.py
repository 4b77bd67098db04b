"""``rpm digits``: self-supervised learning on scikit-learn's 8x8 digits, scored by label
efficiency (:mod:`rpm.experiments.digits.command`); :func:`fit` trains and scores the same
methods on your own images (:mod:`rpm.experiments.digits.fitting`)."""

__all__ = ["fit"]


def __getattr__(name: str):
    # imported on first use: the command line imports this package without torch
    if name == "fit":
        from rpm.experiments.digits.fitting import fit

        return fit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
