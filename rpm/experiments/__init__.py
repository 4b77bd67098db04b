"""Experiments of the source papers, each runnable as an ``rpm`` sub-command."""
