"""``rpm identifiability``: does contrastive learning recover the latents of an invertible
mixing (Zimmermann et al., 2021; Rusak et al., 2024) as an RPM? :mod:`.command` runs it,
:mod:`.data` draws the pairs, :mod:`.model` builds the energies and the RPM, :mod:`.train`
trains and scores one energy, :mod:`.plots` draws the figures, and :func:`fit`
(:mod:`.fitting`) trains and scores on your own pairs."""

__all__ = ["fit"]


def __getattr__(name: str):
    # imported on first use: the command line imports this package without torch
    if name == "fit":
        from rpm.experiments.identifiability.fitting import fit

        return fit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
