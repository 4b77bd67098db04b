"""``rpm lds``: RP-GSSM's linear dynamical systems, learned by an RPM with a state-space prior
(:mod:`rpm.experiments.lds.command`); :func:`fit` trains and scores the same model on your own
sequences (:mod:`rpm.experiments.lds.fitting`)."""

__all__ = ["fit"]


def __getattr__(name: str):
    # imported on first use: the command line imports this package without torch
    if name == "fit":
        from rpm.experiments.lds.fitting import fit

        return fit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
