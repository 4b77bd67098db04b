"""``rpm pendulum``: a swinging pendulum's videos (optionally over moving textured backgrounds)
learned by an RPM with a state-space prior (:mod:`rpm.experiments.pendulum.command`)."""
