"""``rpm lds``: RP-GSSM's linear dynamical systems, learned by an RPM with a state-space prior
(:mod:`rpm.experiments.lds.command`)."""
