"""Data generators for the experiments: synthetic identifiability data and bouncing balls."""
