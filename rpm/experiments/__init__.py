"""Experiments of the source papers, each a subpackage runnable as an ``rpm`` sub-command
(:mod:`rpm.experiments.bouncing_balls` is ``rpm bouncing-balls``, :mod:`rpm.experiments.lds` is
``rpm lds`` ...), each with its own encoders, priors and objectives built from the core. What
several commands share sits beside them: :mod:`rpm.experiments.common` (flags, run folders,
seeds), :mod:`rpm.experiments.figures`, :mod:`rpm.experiments.trained` (the model records
:func:`rpm.load` reads), :mod:`rpm.experiments.data_file` (``--data``) and
:mod:`rpm.experiments.center_of_mass` (the read-out of the bouncing-balls and pendulum
encoders)."""
