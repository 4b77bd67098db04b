"""``rpm peer-supervision``: clustering scikit-learn's digits with the discrete-latent RPM
(Walker et al., 2023) from J different images of the same digit, or from two augmentations of
one image (:mod:`.command`); :mod:`.model` builds the network and the model, :mod:`.views` draws
the views, :mod:`.train` trains and scores one setting, :mod:`.plots` draws the confusion
matrices."""

__all__: list[str] = []
