"""``rpm pendulum``: a swinging pendulum's videos (optionally over moving textured backgrounds)
learned by an RPM with a state-space prior (:mod:`rpm.experiments.pendulum.command`); :func:`fit`
trains and scores the same model on your own videos (:mod:`rpm.experiments.pendulum.fitting`)."""

__all__ = ["fit"]


def __getattr__(name: str):
    # imported on first use: the command line imports this package without torch
    if name == "fit":
        from rpm.experiments.pendulum.fitting import fit

        return fit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
