"""Experiments of the source papers, each a subpackage runnable as an ``rpm`` sub-command:
:mod:`rpm.experiments.bouncing_balls` (``rpm bouncing-balls``) and
:mod:`rpm.experiments.identifiability` (``rpm identifiability``)."""
