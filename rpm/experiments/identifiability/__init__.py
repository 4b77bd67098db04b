"""``rpm identifiability``: does contrastive learning recover the latents of an invertible
mixing (Zimmermann et al., 2021; Rusak et al., 2024) as an RPM? :mod:`.command` runs it,
:mod:`.data` draws the pairs, :mod:`.model` builds the energies and the RPM, :mod:`.train`
trains and scores one energy, :mod:`.plots` draws the figures."""
